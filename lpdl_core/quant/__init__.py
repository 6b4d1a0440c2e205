"""8-bit training: fake quantizer, quantized layers with gradient bifurcation, normalization layers."""
from . import traced  # noqa: F401  (registers the traceable forms with the quantizer)
from .quantizer import QuantCfg, fake_quant, quantize, quantize_grad

__all__ = ["QuantCfg", "fake_quant", "quantize", "quantize_grad"]
