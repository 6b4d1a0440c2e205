"""The fidelity options (torch-free): for each, its values with what each means, the paper"s text
first (the default), then the official code"s. Where a run follows the official code instead, a
fidelity option names the difference (docs/fidelity.md); lpdl_core.config.Fidelity holds one
value per option, and the report prints each value's meaning."""
from __future__ import annotations

from typing import Any

# option -> {value: what it means}, the paper"s value first, then the official code"s
OPTIONS: dict[str, dict[Any, str]] = {
    "quant_ranges": {
        "buffers": "each node keeps its own activation ranges (paper)",
        "gossiped": "activation ranges gossiped with the model (official code)",
    },
    "act_rounding": {
        "nearest": "nearest activation rounding (paper)",
        "stochastic": "stochastic activation rounding in training and eval (official code)",
    },
    "range_evonorm_fp": {
        "hardsigmoid": "FP Range EvoNorm with the paper's hardsigmoid",
        "sigmoid": "FP Range EvoNorm with the official sigmoid",
    },
    "choco_form": {
        "paper": "paper's CHOCO update",
        "code": "official code's CHOCO update",
    },
    "choco_replicas": {
        "per-neighbour": "one replica per neighbour (paper)",
        "official-aggregate": "official code's aggregate replica",
    },
    "bytes_metric": {
        "exact": "exact bytes on the wire",
        "legacy": "official 6k+3 byte count",
    },
    "cell_settings": {
        "paper": "cells as the paper's text gives them",
        "run.sh": "the official run.sh settings where it ran the cell",
    },
    "final_rounds": {
        "gossip-only": "final rounds only gossip",
        "train-forward": "final rounds run a train-mode forward first (official code)",
        "allreduce": "one exact average (all-reduce) in place of the final rounds",
    },
    "crop_sampling": {
        "log-uniform": "Imagenette crops with current torchvision's sampling",
        "uniform-swap": "Imagenette crops with the official torchvision 0.2.1 sampling",
    },
    "epoch_test": {
        "after-gossip": "each epoch tested after its last gossip",
        "before-last-gossip": "each epoch tested before its last gossip (official code)",
    },
    "final_round_limit": {
        "cell": "the cell's final gossip rounds",
        "epoch-batches": "at most L - 1 final rounds, L batches per epoch (official code)",
    },
    "final_trailing_forward": {
        False: "no forward after the final rounds",
        True: "one train-mode forward after the final rounds (official code)",
    },
    "test_batch": {
        1024: "test batch 1024",
        64: "test batch 64 (official code)",
    },
    "int8_arithmetic": {
        "integer": "8-bit convolutions and linears as exact integer products where this machine has "
                   "an exact int8 kernel (the paper's GEMMLOWP integer quantization)",
        "fake": "8-bit arithmetic simulated in float32 (official code)",
    },
    "rng_streams": {
        "per-node": "each node draws its own random streams",
        "shared": "all nodes share one random stream (official code)",
    },
}
# option -> its allowed values, in that order
FIDELITY_CHOICES: dict[str, tuple[Any, ...]] = {k: tuple(v) for k, v in OPTIONS.items()}

# Options that change a run's numbers only by float rounding (as the executor does): they are not
# part of a run's identity or of the fidelity mode, so a finished run is kept when they change;
# each run records what it took (metrics.json `int8_arithmetic`).
ROUNDING_ONLY: tuple[str, ...] = ("int8_arithmetic",)
# The value a run recorded before the option existed ran with, where that is not the default.
BEFORE: dict[str, Any] = {"int8_arithmetic": "fake"}
