"""Models: the paper's CNNs and transformers (FP and 8-bit LP variants) and small demo nets."""
from .mobilenetv2 import mobilenetv2
from .registry import MODELS, build_model, count_params, format_model_table, input_size, model_table
from .resnet_cifar import resnet_cifar
from .resnet_imagenet import resnet18
from .tiny import tiny_cnn
from .vgg import vgg11

__all__ = ["tiny_cnn", "resnet_cifar", "resnet18", "vgg11", "mobilenetv2", "MODELS", "build_model",
           "input_size", "count_params", "model_table", "format_model_table"]
