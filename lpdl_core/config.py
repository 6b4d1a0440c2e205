"""The vocabulary and settings shared by the command line, the workflow, the report and the
library, with no torch import (Snakemake plans the DAG with it).

Every name a paper cell, a config file or a command line may use is defined here once: the
library's registries (models, datasets, norms, algorithms, graphs, compressors, executors) are
checked against these tuples by tests, and everything that validates a name imports it from here.
`Fidelity`: where the official code differs from the paper's text (defaults follow the paper).
Every option has a closed set of values; parsing accepts exactly those (no guessing).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from .errors import ConfigError
# the executors (how a run's n nodes are computed; the same math), re-exported: lpdl_core.specs.executors
from .specs.executors import DEFAULT_EXECUTOR, EXECUTORS, IN_PROCESS_EXECUTORS  # noqa: F401
# the gossip compressors a cell names, re-exported: lpdl_core.specs.compressors
from .specs.compressors import COMPRESSORS  # noqa: F401
# the decentralized algorithms (UNCOMPRESSED: send whole models or updates), re-exported
from .specs.algorithms import ALGORITHMS, UNCOMPRESSED_ALGORITHMS  # noqa: F401
# the paper's models (CNNs and the text model) and the CNNs' mini stand-ins, re-exported
from .specs.models import CNN_MODELS, MINI_IMAGE_SIZE, MINI_STANDINS, TEXT_MODELS, SPECS as MODEL_SPECS  # noqa: F401
# the fidelity options' values (the paper's first, the official code's second), re-exported
from .specs.fidelity import BEFORE as FIDELITY_BEFORE, FIDELITY_CHOICES, ROUNDING_ONLY  # noqa: F401
# the communication graphs (a cell's topology), re-exported: lpdl_core.specs.graphs
from .specs.graphs import GRAPHS  # noqa: F401
# the datasets and their mini stand-ins (kind, classes, loader, fetcher, class sizes), re-exported
from .specs.datasets import (DATA_KINDS, DATASET_SPECS, DATASETS, IMAGE_DATASETS, PAPER_DATASETS,  # noqa: F401
                             STANDIN_DATASETS, DatasetSpec, dataset_spec)

# ---- the vocabulary ----------------------------------------------------------------------------
PROFILES = ("mini", "paper")           # mini: embedded stand-ins on a laptop; paper: the paper's protocol
TABLES = ("table1", "table2", "table3", "table4", "table5", "fig1")   # the paper's artifacts
PRECISIONS = ("fp32", "int8")          # full precision; 8-bit weights, activations and layer gradients


# model -> the paper datasets it is built for (its spec's, in paper order; a cell of another
# dataset is refused when the cells are loaded)
MODEL_DATASETS = {m: tuple(n for n in PAPER_DATASETS if n in MODEL_SPECS[m].datasets) for m in MODEL_SPECS}
MODELS = CNN_MODELS + TEXT_MODELS      # the paper's models (each has a mini stand-in)
NORMS = ("evonorm", "range-evonorm", "range-evonorm-fp", "range-bn", "bn", "gn")
MOMENTA = ("nesterov", "heavy-ball", "none", "qgm", "adam")
OPTIMIZERS = ("sgd", "adam")
SCHEDULES = ("resnet", "vgg", "multistep", "constant", "cosine")
COMPILE_MODES = ("auto", "default", "reduce-overhead", "max-autotune")  # auto: CUDA graphs on CUDA
DEVICES = ("auto", "cpu", "cuda")      # auto: CUDA when available
CELLS_PER_JOB = ("block", "pack", "cell")  # block: a block's cells of one precision per process, one after
#   another; pack: the same jobs, with cells that can share a stacked state trained together (pack_size
#   at a time; lpdl_core.training.pack); cell: one cell per job
MAX_PACK_SIZE = 64
LEARNED_MARGIN = 5.0  # points above chance (100 / classes) a result must reach to count as learned
DEFAULT_SEED = 1234  # the official code's --seed: every run's seed unless a cell or the user gives one
RNG_STREAMS = FIDELITY_CHOICES["rng_streams"]  # how nodes draw randomness (EngineCfg.rng_streams, Fidelity)
GPU_REQUESTS = ("gpus", "gres")  # how SLURM jobs ask for GPUs: sbatch --gpus=N | --gres=gpu:N
PACKAGE_DIR = Path(__file__).resolve().parent   # lpdl_core/, wherever it is installed

# ---- limits: the largest values lpdl accepts, one home for the command line (lpdl_core.cli.args),
# the cells CSVs (lpdl_core.pipeline.cells.tables) and the workflow config (pipeline.workflow.wfconfig) ----------
# A seed reaches numpy's legacy RandomState (scikit-learn's random_state), which takes 32 bits, and
# torch generators (64 bits; a run seeds seed, seed + 1 and seed + 2): 2**32 - 1 fits every one.
MAX_SEED = 2**32 - 1
MAX_SEEDS = 100              # seeds of one workflow run: each is a full run of every cell
# nodes per command: what a graph can still be printed for, a simulator still holds in memory
MAX_NODES = {"topology": 1024, "partition": 1024, "demo": 64, "bench": 256}
MAX_BATCH = 4096             # samples per node and step (lpdl bench)
MAX_DEMO_EPOCHS = 10000      # lpdl demo / snakemake demo: days of CPU time, far past any use
# seconds a distributed rank waits for another: a rank silent for a day is dead, and a paper job is
# cut at max_runtime anyway (its retry resumes from the checkpoint)
DEFAULT_DIST_TIMEOUT_S = 300.0  # distributed executor: a rank's wait (rendezvous, messages, collectives)
MAX_DIST_TIMEOUT_S = 86400.0
MAX_THREADS = 1024           # torch threads per job: more than the cores of any one machine
MAX_RUNTIME_MIN = 43200      # a job's SLURM runtime request (30 days): a longer job resumes on retry
MAX_RUNTIME_MARGIN = 100.0   # a job asking 100 x its estimated time: a typo, not a margin
MAX_PATH = 4096              # PATH_MAX of Linux: the longest path a system call takes


# one switch for the whole set: "paper" (every default) or "official" (every official-code value)
FIDELITY_PRESETS: dict[str, dict[str, Any]] = {
    "paper": {k: v[0] for k, v in FIDELITY_CHOICES.items()},
    "official": {k: v[1] for k, v in FIDELITY_CHOICES.items()},
}


@dataclass(frozen=True, kw_only=True)
class Fidelity:
    """Where the official code differs from the paper's text; defaults follow the paper
    (docs/paper-vs-code.md lists each difference, its code location and the cells it touches).

    quant_ranges: "buffers" (each node keeps its own activation ranges) | "gossiped" (official:
        QuantMeasure's running min/max are parameters, so they are gossiped, compressed, counted
        and updated by the final gossip rounds' train-mode forward passes).
    act_rounding: "nearest" | "stochastic" (official: a positional-argument bug rounds
        activations stochastically in training and evaluation alike).
    range_evonorm_fp: "hardsigmoid" (the paper's eq. 2) | "sigmoid" (official `RangeEN_full`),
        the gate of Figure 1's full-precision Range EvoNorm.
    choco_form: "paper" Σ_j (W_ij − I_ij)(x̂_j − x̂_i) | "code" Σ_j (W_ij − I_ij) x̂_j.
    choco_replicas: "per-neighbour" | "official-aggregate" (static graphs only).
    bytes_metric: "exact" | "legacy" (the official 4(d+1) / 6k+3 count).
    cell_settings: "paper" (each cell as the paper's text describes it) | "run.sh" (the settings
        the official run.sh used for the cells it ran: typo compression ratios, Table 4's graph,
        epochs and milestones, ...; lpdl_core.pipeline.recipe.runsh).
    final_rounds: "gossip-only" (the final gossip rounds only mix) | "train-forward" (official:
        each final round first runs a train-mode forward and backward on a batch, with no
        optimizer step, updating activation ranges and normalization statistics) | "allreduce"
        (neither: one exact average of the trained models and buffers in place of the rounds,
        to compare the merges; a cell with no final rounds has none).
    crop_sampling: how RandomResizedCrop draws a training crop's aspect ratio (Imagenette):
        "log-uniform" (current torchvision, the standard augmentation the paper names) |
        "uniform-swap" (the official code's torchvision 0.2.1: uniform in [3/4, 4/3], width and
        height swapped half the time).
    epoch_test: "after-gossip" (each epoch's test after its last gossip round) |
        "before-last-gossip" (official: the epoch's last transfer is applied at the next forward).
    final_round_limit: "cell" (the cell's final_gossip_rounds) | "epoch-batches" (official: at most
        L − 1, L the batches per epoch; 50 on CIFAR, 36 on Imagenette, fewer in the mini profile).
    final_trailing_forward: False | True (official: after the train-forward final rounds, one more
        train-mode forward whose gossip is never applied, so the test sees activation ranges
        0.1 gossiped + 0.9 local).
    test_batch: 1024 (lpdl's evaluation batch; the text gives none) | 64 (official). 8-bit Range
        EvoNorm quantizes per-sample scales over the batch, so 8-bit accuracy depends on it.
    rng_streams: "per-node" (each node its own random streams) | "shared" (official: every rank
        seeds torch identically, so all nodes share their shards' local index order, crop and flip
        draws, 8-bit rounding noise and dropout masks).
    int8_arithmetic: "integer" (the paper's GEMMLOWP integer quantization: 8-bit convolutions and
        linears as exact integer products where an exact int8 kernel exists, lpdl_core.quant.integer;
        elsewhere fake, said once) | "fake" (official: simulated in float32). The two differ only by
        float rounding, so it is not part of a run's identity or mode (ROUNDING_ONLY); each run
        records the arithmetic it took.
    """

    quant_ranges: str = "buffers"
    act_rounding: str = "nearest"
    range_evonorm_fp: str = "hardsigmoid"
    choco_form: str = "paper"
    choco_replicas: str = "per-neighbour"
    bytes_metric: str = "exact"
    cell_settings: str = "paper"
    final_rounds: str = "gossip-only"
    crop_sampling: str = "log-uniform"
    epoch_test: str = "after-gossip"
    final_round_limit: str = "cell"
    final_trailing_forward: bool = False
    test_batch: int = 1024
    rng_streams: str = "per-node"
    int8_arithmetic: str = "integer"

    def __post_init__(self) -> None:
        for f in fields(self):
            value, allowed = getattr(self, f.name), FIDELITY_CHOICES[f.name]
            # bool is checked by type: 1 == True would otherwise pass as a boolean
            if not any(type(value) is type(a) and value == a for a in allowed):
                raise ConfigError(f"fidelity {f.name}: {value!r} is not one of "
                                  f"{', '.join(_show(a) for a in allowed)}")
        if self.final_trailing_forward and self.final_rounds != "train-forward":
            raise ConfigError("fidelity final_trailing_forward: true needs final_rounds: train-forward "
                              "(the trailing forward is the last of the forward rounds)")

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def mode(self) -> str:
        """"paper" or "official" when every option is that preset's, else "mixed"."""
        return fidelity_mode(self.as_dict())

    @property
    def differences(self) -> tuple[str, ...]:
        """The options set away from the paper's text."""
        return tuple(k for k, v in self.as_dict().items() if v != FIDELITY_CHOICES[k][0])

    @classmethod
    def preset(cls, name: str) -> "Fidelity":
        if name not in FIDELITY_PRESETS:
            raise ConfigError(f"fidelity: {name!r} is not one of {', '.join(FIDELITY_PRESETS)} "
                              f"(or a mapping of options)")
        return cls(**FIDELITY_PRESETS[name])

    @classmethod
    def from_mapping(cls, values: "Mapping[str, Any] | str") -> "Fidelity":
        """A preset name ("paper", "official") or a mapping of options (missing ones: the paper's)."""
        if isinstance(values, str):
            return cls.preset(values)
        unknown = sorted(set(values) - set(FIDELITY_CHOICES))
        if unknown:
            raise ConfigError(f"unknown fidelity option {unknown[0]!r}; valid: {', '.join(FIDELITY_CHOICES)}")
        return cls(**values)

    @classmethod
    def from_pairs(cls, pairs) -> "Fidelity":
        """KEY=VALUE strings (the command line), or one preset name. Booleans are exactly true/false."""
        pairs = list(pairs or ())
        if len(pairs) == 1 and "=" not in pairs[0]:
            return cls.preset(pairs[0])
        kw: dict[str, Any] = {}
        for pair in pairs:
            key, sep, text = pair.partition("=")
            if not sep:
                raise ConfigError(f"fidelity: expected KEY=VALUE or one of {', '.join(FIDELITY_PRESETS)}, "
                                  f"got {pair!r}")
            if key not in FIDELITY_CHOICES:
                raise ConfigError(f"unknown fidelity option {key!r}; valid: {', '.join(FIDELITY_CHOICES)}")
            kw[key] = parse_choice(f"fidelity {key}", text, FIDELITY_CHOICES[key])
        return cls(**kw)


def fidelity_mode(values: Mapping[str, Any]) -> str:
    """The preset whose options are exactly `values` ("paper", "official"), else "mixed" (also for
    a recorded run whose options lpdl no longer knows). Options that change only float rounding
    (ROUNDING_ONLY) do not count."""
    def defining(v: Mapping[str, Any]) -> dict:
        return {k: x for k, x in v.items() if k not in ROUNDING_ONLY}
    return next((name for name, preset in FIDELITY_PRESETS.items() if defining(preset) == defining(values)),
                "mixed")


def identity_fidelity(values: Mapping[str, Any]) -> dict:
    """The fidelity part of a run's identity: every option (a recorded run's missing ones at their
    default), less those that change only float rounding (ROUNDING_ONLY)."""
    return {k: v for k, v in {**Fidelity().as_dict(), **values}.items() if k not in ROUNDING_ONLY}


def recorded_fidelity(values: Mapping[str, Any]) -> dict:
    """A run's recorded options, completed: an option it does not record did not exist when it
    ran, so it ran with the value of before (FIDELITY_BEFORE) or, where that is the default, the default."""
    return {**Fidelity().as_dict(), **FIDELITY_BEFORE, **values}


def results_name(profile: str, fidelity: Fidelity) -> str:
    """The results folder of a run, results/{name}: the profile's name, with "-official" in the
    official code's mode, so the two modes' results live side by side. A mixed fidelity shares the
    paper-text folder: each run records its options, and a changed option reruns it."""
    return f"{profile}-official" if fidelity.mode == "official" else profile


def other_mode(profile: str, fidelity: Fidelity) -> tuple[str, Fidelity]:
    """(results name, fidelity) of the mode shown beside this one: the official code beside the
    paper's text (or a mixed fidelity), the paper's text beside the official code."""
    other = Fidelity.preset("paper" if fidelity.mode == "official" else "official")
    return results_name(profile, other), other


def _show(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def parse_choice(field: str, text: str, allowed: tuple[Any, ...]) -> Any:
    """The allowed value whose spelling is exactly `text` (booleans: true/false)."""
    for a in allowed:
        if _show(a) == text:
            return a
    raise ConfigError(f"{field}: {text!r} is not one of {', '.join(_show(a) for a in allowed)}")
