"""Models: the paper's CNNs and transformers (FP and 8-bit LP variants) and small demo nets."""
from .tiny import tiny_cnn

__all__ = ["tiny_cnn"]
