"""How the simulator runs, never what it computes: the executor, device, seeding of the random
streams, compilation and fused quantizers (`EngineCfg`), and the device a name resolves to."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...config import DEFAULT_SEED, DEVICES, EXECUTORS, RNG_STREAMS
from ...specs.executors import DEFAULT_EXECUTOR
from ...compat import incompatible
from ...run_options import RunOptions
from ...errors import DeviceUnavailable
from .compiled import CompileCfg


@dataclass(frozen=True, kw_only=True)
class EngineCfg:
    """How the simulation runs (never what it computes).

    executor: how the n nodes are computed, the same math (lpdl_core.specs.executors): the in-process
        ones run all n nodes in this process (executors.py); the one-process-per-node one runs one
        node per process (`NodeProcess`, whose own forward/backward runs as its spec's node_step).
    device: "auto" picks CUDA when available, else CPU. All node state lives there.
    seed: seeds model initialisation (identical on all nodes, as the official code) and the
        compressors' random draws.
    compile: run each training iteration as one torch.compile graph (batched executor only;
        engine/compiled.py). compile_mode: torch.compile's mode, "auto" = CUDA graphs on CUDA.
    rng_streams: "per-node" (each node draws its own randomness: dropout masks, 8-bit rounding
        noise, and in training its sample order and augmentation) | "shared" (the official code,
        whose ranks all seed torch identically: every node draws the same values, so nodes with
        identical shards see identical batches and identical rounding noise).
    fused_quant: the 8-bit layers' quantizer chains as fused compiled kernels in an eager step
        (lpdl_core.quant.fused; the trainer switches them on around each step): a few kernels per
        quantizer instead of about a dozen launches. Same math, not bitwise (own rounding noise).
        Not with compile (which fuses the whole step) nor with shared streams under the batched
        executor (the fused kernels draw noise per node).
    """

    executor: str = DEFAULT_EXECUTOR     # one of lpdl_core.specs.executors.EXECUTORS
    device: str = "auto"                 # one of lpdl_core.config.DEVICES
    seed: int = DEFAULT_SEED
    compile: bool = False
    compile_mode: str = "auto"           # one of lpdl_core.config.COMPILE_MODES
    rng_streams: str = "per-node"        # one of lpdl_core.config.RNG_STREAMS
    fused_quant: bool = False

    def __post_init__(self) -> None:
        if self.rng_streams not in RNG_STREAMS:
            raise ValueError(f"engine.rng_streams must be one of {', '.join(RNG_STREAMS)}, got {self.rng_streams!r}")
        if self.executor not in EXECUTORS:
            raise ValueError(f"engine.executor must be one of {EXECUTORS}, got {self.executor!r}")
        if self.device not in DEVICES:
            raise ValueError(f"engine.device must be one of {DEVICES}, got {self.device!r}")
        CompileCfg(enabled=self.compile, mode=self.compile_mode)  # validates both
        why = incompatible(RunOptions(executor=self.executor, compile=self.compile, fused_quant=self.fused_quant),
                           rng_streams=self.rng_streams)
        if why:  # the one table of what cannot run together (the workflow and lpdl train read it too)
            raise ValueError(f"engine: {why}")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable("device 'cuda' was asked for but torch sees no CUDA device "
                                "(use device auto or cpu)")
    return torch.device(name)
