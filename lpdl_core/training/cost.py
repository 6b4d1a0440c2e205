"""Figure 3's data: memory and compute per node per training iteration, FP vs LP (paper Sec. 5).
The `cost` rule writes it to results/{profile}/cost.json (`lpdl cost --out ...`); the report
only reads that file.

Counts come from the real model (``build_model(..., precision="fp32")``; the LP model has the same
layer shapes) by forward hooks during one forward pass of a random batch:

* MACs: Conv2d ``out.numel() * C_in/groups * k_h * k_w``, Linear ``out.numel() * in_features``
  (bias adds, norms, pooling and residual adds are not counted).
* Training compute = 3 x forward MACs: forward ``y = W x``, backward-data ``g_x = W^T g_y`` (layer
  gradient) and backward-weight ``g_W = g_y x^T`` (weight gradient) each cost one forward's MACs.
* Stored activations: every distinct input tensor of a Conv2d/Linear layer and of a normalization
  layer (what their backward needs; in these ResNets a norm's input is a conv output). Tensors
  created inside a norm (gates, variances), residual sums and the logits are not counted.
* Weights: all trainable parameters. Gradients: one weight gradient per parameter. Not counted:
  optimizer state (momentum), gossip/CHOCO buffers, any float32 master copy of 8-bit weights.

Cost model: a b-bit MAC costs b/32 of a 32-bit MAC (linear in bits); with mixed operands the
wider one sets the width. The result is "32-bit-equivalent GMACs". Memory is bits/8 bytes per
element, MB = 10^6 bytes. Under this model a GEMM whose operands go 32 -> 8 bits costs 4x less,
which is where the paper's "~4x" comes from; with gradient bifurcation the weight-gradient GEMM
multiplies the 8-bit activations with the float32 output gradient, so as implemented it stays
32-bit and the compute ratio is 3 / (1/4 + 1/4 + 1) = 2. Both variants are returned.
"""
from __future__ import annotations

import torch
from torch import nn

from ..models.registry import build_model, input_size

FP_BITS = dict(weights=32, activations=32, layer_grads=32, weight_grads=32)
# LP as implemented (paper Sec. 3 + official code): 8-bit weights, activations and layer
# gradients; weight gradients float32 (the bifurcation's high-precision branch).
LP_BITS = dict(weights=8, activations=8, layer_grads=8, weight_grads=32)
# The uniform 8-bit assumption behind the paper's "~4x" (weight gradients 8-bit too).
LP_ALL8_BITS = dict(weights=8, activations=8, layer_grads=8, weight_grads=8)
_NORM_NAMES = ("EvoNormS0", "RangeEvoNorm", "RangeBatchNorm2d")


def _is_norm(m: nn.Module) -> bool:
    return isinstance(m, (nn.modules.batchnorm._NormBase, nn.GroupNorm)) or type(m).__name__ in _NORM_NAMES


def count_model(model: str = "resnet20", dataset: str = "cifar10", batch: int = 32) -> dict:
    """Forward MACs (per batch and per image), parameters and stored activation elements of one
    forward pass of `batch` seeded random inputs (FP model, train mode, no autograd, CPU)."""
    net = build_model(model, precision="fp32", dataset=dataset)
    net.train()
    macs = {"conv": 0, "linear": 0}
    saved: dict[int, torch.Tensor] = {}  # id -> tensor; references kept so ids stay unique

    def hook(m, inputs, out):
        x = inputs[0]
        saved[id(x)] = x
        if isinstance(m, nn.Conv2d):
            k = m.kernel_size[0] * m.kernel_size[1] * (m.in_channels // m.groups)
            macs["conv"] += out.numel() * k
        elif isinstance(m, nn.Linear):
            macs["linear"] += out.numel() * m.in_features

    handles = [m.register_forward_hook(hook) for m in net.modules()
               if isinstance(m, (nn.Conv2d, nn.Linear)) or _is_norm(m)]
    side = input_size(model, dataset)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, side, side, generator=gen)
    try:
        with torch.no_grad():
            net(x)
    finally:
        for h in handles:
            h.remove()
    fwd = macs["conv"] + macs["linear"]
    return dict(model=model, dataset=dataset, batch=batch, input_size=side,
                forward_macs=fwd, forward_macs_per_image=fwd / batch,
                params=sum(p.numel() for p in net.parameters() if p.requires_grad),
                activation_elems=sum(t.numel() for t in saved.values()))


def _mb(elems: int, bits: int) -> float:
    return elems * bits / 8 / 1e6


def _precision_cost(counts: dict, bits: dict) -> dict:
    """Memory (MB) and compute (32-bit-equivalent GMACs) of one iteration at the given bit widths."""
    f = counts["forward_macs"] / 1e9
    w, a, lg, wg = bits["weights"], bits["activations"], bits["layer_grads"], bits["weight_grads"]
    compute = dict(forward=f * max(w, a) / 32,          # W x: weights x activations
                   backward_data=f * max(w, lg) / 32,   # W^T g_y: weights x layer gradients
                   backward_weight=f * max(a, wg) / 32)  # g_y x^T: activations x output gradient
    memory = dict(weights=_mb(counts["params"], w), activations=_mb(counts["activation_elems"], a),
                  gradients=_mb(counts["params"], wg))
    return dict(bits=dict(bits), memory_mb=memory, memory_total_mb=sum(memory.values()),
                compute_gmacs=compute, compute_total_gmacs=sum(compute.values()))


def training_cost(model: str = "resnet20", dataset: str = "cifar10", batch: int = 32, *,
                  fp_bits: dict | None = None, lp_bits: dict | None = None,
                  lp_all8_bits: dict | None = None) -> dict:
    """Memory and compute per node per iteration for FP, LP (as implemented: float32 weight
    gradients) and LP-all-8 (the paper's uniform 8-bit assumption); see the module docstring for
    what is counted and the linear-in-bits cost model. Bit dicts have keys weights, activations,
    layer_grads, weight_grads (defaults FP_BITS, LP_BITS, LP_ALL8_BITS).

    Returns {counts: count_model(...), precisions: {fp, lp, lp_all8: {bits, memory_mb{weights,
    activations, gradients}, memory_total_mb, compute_gmacs{forward, backward_data,
    backward_weight}, compute_total_gmacs}}, ratios: {compute, memory, compute_all8,
    memory_all8} (fp / lp), cost_model: str} plus flat keys model, compute_ratio, memory_ratio
    (= ratios compute, memory) and assumption (= cost_model) for report.claims."""
    counts = count_model(model, dataset, batch)
    precs = {"fp": _precision_cost(counts, fp_bits or FP_BITS),
             "lp": _precision_cost(counts, lp_bits or LP_BITS),
             "lp_all8": _precision_cost(counts, lp_all8_bits or LP_ALL8_BITS)}
    fp = precs["fp"]
    ratios = dict(compute=fp["compute_total_gmacs"] / precs["lp"]["compute_total_gmacs"],
                  memory=fp["memory_total_mb"] / precs["lp"]["memory_total_mb"],
                  compute_all8=fp["compute_total_gmacs"] / precs["lp_all8"]["compute_total_gmacs"],
                  memory_all8=fp["memory_total_mb"] / precs["lp_all8"]["memory_total_mb"])
    lpb = precs["lp"]["bits"]
    assumption = (f"b-bit MAC = b/32 of a 32-bit MAC (wider operand sets b); training = forward + "
                  f"backward-data + backward-weight, each one forward's MACs; LP = {lpb['weights']}-bit "
                  f"weights, {lpb['activations']}-bit activations, {lpb['layer_grads']}-bit layer gradients, "
                  f"{lpb['weight_grads']}-bit weight gradients; all 8-bit: compute "
                  f"{ratios['compute_all8']:.2f}x, memory {ratios['memory_all8']:.2f}x")
    return dict(counts=counts, precisions=precs, ratios=ratios, cost_model=assumption,
                # flat keys read by report.claims (claim 6): the LP-as-implemented ratios
                model=model, compute_ratio=ratios["compute"], memory_ratio=ratios["memory"],
                assumption=assumption)


def measured_peak_memory_mb(model: str = "resnet20", precision: str = "fp32", batch: int = 32,
                            device: str = "cuda", dataset: str = "cifar10") -> float | None:
    """Peak CUDA memory (MB) of one forward + backward of the model at `precision`, measured with
    torch.cuda.max_memory_allocated (weights, every tensor autograd saves, cuDNN workspaces).
    None on CPU / without CUDA. LP is simulated in float32 (fake quantization), so any difference
    from FP comes from which intermediates the layers save, not from 8-bit storage. Measured on
    an H100 (ResNet-20, batch 32): FP 198.7 MB, LP 132.5 MB, against the analytic 51.9 / 13.8 MB
    of training_cost, which counts conv/linear/norm inputs only."""
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return None
    dev = torch.device(device)
    net = build_model(model, precision=precision, dataset=dataset).to(dev).train()
    side = input_size(model, dataset)
    x = torch.randn(batch, 3, side, side, device=dev)
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    net(x).sum().backward()
    torch.cuda.synchronize(dev)
    return torch.cuda.max_memory_allocated(dev) / 1e6


def figure3_cost(model: str = "resnet20", dataset: str = "cifar10", batch: int = 32, *,
                 device: str = "auto") -> dict:
    """What cost.json holds: training_cost(...) plus `measured_peak_mb`, the peak CUDA memory of
    one forward + backward per precision ({"fp32": MB, "int8": MB, "device": name}) where a GPU
    is used, else None."""
    out = training_cost(model, dataset, batch)
    use = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    fp = measured_peak_memory_mb(model, "fp32", batch, device=use, dataset=dataset)
    out["measured_peak_mb"] = None if fp is None else {
        "fp32": fp, "int8": measured_peak_memory_mb(model, "int8", batch, device=use, dataset=dataset),
        "device": torch.cuda.get_device_name(torch.device(use))}
    return out
