"""The mini profile's protocol: how a paper cell becomes a run that learns on a laptop, and which
cells' mini runs are one and the same run. Torch-free (Snakemake plans with it).

Every axis of the cell is kept: nodes, topology, skew, compression, eta, algorithm, precision,
momentum, norm, optimizer, final gossip rounds. What changes, the same way for every cell of a
table (so cells stay comparable), and is recorded in each run's mapping:

* images: CIFAR-10 and Imagenette -> the digits stand-in at its native 8x8, no augmentation; each
  paper model -> its own stand-in of the same family (models/mini.py);
* text: AG News / Sentlen -> the stdlib-prose stand-ins (MiniLM tokenizer, 32 tokens); DistilBERT
  -> a tiny DistilBERT (dim 64, 1 layer) whose frozen word embeddings are MiniLM's pretrained
  ones projected on their top 64 principal components (the paper fine-tunes a pretrained model;
  a random-init one learns too little from 1,344 sentences);
* global batch / BATCH_DIVISOR (so batch per node / BATCH_DIVISOR: one rule for every table), at
  the paper's learning rate (docs/mini-profile.md says what a scaled one did), except where a node
  in effect trains alone on a tiny batch: per-node batch at most ALONE_BATCH and η at most
  ALONE_ETA (each round mixes in at most 1 % of the neighbours' difference). There no averaging
  makes up for the quarter batch, and a step of the paper's rate on 4 samples kills the
  classifier's ReLUs in the warm-up (Table 2's 16-node VGG-11 torus at 99 %), so the rate is
  scaled to the batch as the batch was (linear scaling: × mini batch / paper batch);
* epochs per data kind (a cell's `mini_epochs` column, where set, instead: an extension grid
  sized to a time budget), and a per-step schedule (linear warm-up over WARMUP_FRACTION of the steps,
  then cosine to 0) instead of the paper's 200-epoch milestones: a few hundred steps in all;
* text: Adam at TEXT_LR (3e-5 is a fine-tuning rate for a pretrained model).

Same run: with no compression and eta = 1, DS and CHOCO are both exactly D-PSGD/SGP (see their
docstrings), so their mini runs are computed once. So are any two cells whose mini runs are
defined by the same values (`run_key`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...config import DATASET_SPECS, MINI_IMAGE_SIZE, MINI_STANDINS, STANDIN_DATASETS
from ..cells.cell import columns

IMAGE_SIZE = MINI_IMAGE_SIZE
BATCH_DIVISOR = 4
IMAGE_EPOCHS = 6
ALONE_BATCH = 4      # per-node mini batch at most this ...
ALONE_ETA = 0.01     # ... and η at most this: the node in effect trains alone (linear lr scaling)
TEXT_EPOCHS = 6
WARMUP_FRACTION = 0.3
TEXT_LR = 5e-3
TEXT_MAX_LENGTH = 32
CURVE_EVAL_SAMPLES = 120
# paper text dataset -> its stand-in (lpdl_core.config.DATASET_SPECS)
TEXT_STANDINS = {paper: name for name, paper in STANDIN_DATASETS.items() if DATASET_SPECS[name].kind == "text"}
TINY_DISTILBERT = dict(dim=64, n_layers=1, n_heads=2, hidden_dim=128)
STANDINS = MINI_STANDINS  # paper model -> (stand-in, what it is)


def standin(model: str) -> tuple[str, str]:
    """(name, description) of a paper model's mini stand-in; ValueError for a model without one."""
    if model not in STANDINS:
        raise ValueError(f"no mini stand-in for model {model!r}; models with one: {', '.join(STANDINS)}")
    return STANDINS[model]


@dataclass(frozen=True, kw_only=True)
class MiniRun:
    """What a cell's mini run uses in place of the paper's protocol."""

    dataset: str
    dataset_kwargs: tuple[tuple[str, object], ...]
    model: str                  # the stand-in's name
    standin: str                # what the stand-in is (part of the runs' identity)
    epochs: int
    lr: float
    batch_per_node: int
    schedule: str               # "cosine"
    warmup_fraction: float
    mapping: tuple[str, ...]    # one line per changed value


def mini_batch(batch_per_node: int) -> int:
    """The mini batch per node: the paper's / BATCH_DIVISOR, at least 1."""
    return max(1, batch_per_node // BATCH_DIVISOR)


def _own_epochs(cell) -> int:
    """The cell's mini_epochs (0 where it has none: a cell read back from a run of before the column)."""
    return getattr(cell, "mini_epochs", 0)


def trains_alone(cell) -> bool:
    """Whether the mini run's nodes in effect train alone on a tiny batch (module docstring)."""
    return cell.nodes > 1 and mini_batch(cell.batch_per_node) <= ALONE_BATCH and cell.eta <= ALONE_ETA


def epochs_of(cell) -> int:
    """The epochs of the cell's mini run: its mini_epochs, or the protocol's for its data kind."""
    return _own_epochs(cell) or (TEXT_EPOCHS if cell.model == "distilbert" else IMAGE_EPOCHS)


def _epochs_line(cell, epochs: int) -> str:
    return f"epochs {cell.epochs} -> {epochs}" + (" (the cell's mini_epochs)" if _own_epochs(cell) else "")


def mini_run(cell) -> MiniRun:
    """The mini protocol of one cell (an lpdl_core.pipeline.cells.cell.Cell)."""
    batch = mini_batch(cell.batch_per_node)
    common = [f"batch per node {cell.batch_per_node} -> {batch} (global batch / {BATCH_DIVISOR}, every table)"]
    if cell.model == "distilbert":
        dataset = TEXT_STANDINS[cell.dataset]
        epochs, lr = epochs_of(cell), TEXT_LR
        tiny = ", ".join(f"{k} {v}" for k, v in TINY_DISTILBERT.items())
        mapping = [f"dataset {cell.dataset} -> {dataset} (MiniLM tokenizer, {TEXT_MAX_LENGTH} tokens)",
                   f"model distilbert -> tiny DistilBERT ({tiny}), frozen word embeddings = MiniLM's "
                   f"pretrained ones on their top {TINY_DISTILBERT['dim']} principal components",
                   _epochs_line(cell, epochs), f"lr {cell.lr:g} -> {lr:g}"]
        kwargs = (("max_length", TEXT_MAX_LENGTH), ("tokenizer", "minilm"))
        model, what = "distilbert-tiny", f"tiny DistilBERT ({tiny}), frozen MiniLM word embeddings"
    else:
        dataset, epochs, lr = "digits", epochs_of(cell), cell.lr
        name, note = standin(cell.model)
        mapping = [f"dataset {cell.dataset} -> digits stand-in (native {IMAGE_SIZE} px, no augmentation)",
                   f"model {cell.model} -> {name}: {note}", _epochs_line(cell, epochs)]
        if trains_alone(cell):
            lr = cell.lr * batch / cell.batch_per_node
            mapping.append(f"lr {cell.lr:g} -> {lr:g} (each node in effect trains alone, η {cell.eta:g} on a batch "
                           f"of {batch}: the rate scaled to the batch, × {batch}/{cell.batch_per_node})")
        kwargs = (("augment", "none"), ("image_size", IMAGE_SIZE), ("standin_for", cell.dataset))
        model, what = name, note
    schedule = (f"lr schedule {cell.lr_schedule} -> per-step linear warm-up over "
                f"{WARMUP_FRACTION:.0%} of the steps, then cosine to 0")
    mapping += common + [schedule,
                         f"per-epoch curve on {CURVE_EVAL_SAMPLES} test samples (final metrics on the whole test set)"]
    return MiniRun(dataset=dataset, dataset_kwargs=kwargs, model=model, standin=what, epochs=epochs, lr=lr,
                   batch_per_node=batch, schedule="cosine", warmup_fraction=WARMUP_FRACTION,
                   mapping=tuple(mapping))


def protocol(cell) -> dict:
    """What the mini protocol makes of a cell, as part of its runs' identity (runstore): a change
    of the protocol (epochs, lr, batch, schedule, stand-ins) makes the runs of the earlier one
    other runs, recomputed, never shown as current. A stand-in enters as its description
    (lpdl_core.specs.models (MINI_STANDINS)), so a change of its architecture is a change of that line.
    The rest of the mapping's wording is left out."""
    m = mini_run(cell)
    return {"dataset": m.dataset, "dataset_kwargs": {k: v for k, v in m.dataset_kwargs}, "model": m.model,
            "standin": m.standin,
            "epochs": m.epochs, "lr": m.lr, "batch_per_node": m.batch_per_node, "schedule": m.schedule,
            "warmup_fraction": m.warmup_fraction}


def gossip_kind(cell) -> str:
    """The gossip a cell's run computes: "dpsgd" where DS or CHOCO reduce to D-PSGD/SGP exactly
    (exact messages, eta = 1), else the cell's algorithm."""
    if cell.algorithm in ("ds", "choco", "dpsgd") and cell.exact_messages and cell.eta == 1.0:
        return "dpsgd"
    return cell.algorithm


# Every column a mini run depends on besides the algorithm (gossip_kind), the seed and its length
# (epochs_of: mini_epochs, 0 meaning the protocol's): Cell's "mini" columns; the others (table,
# block, notes, paper_acc, epochs, lr_schedule, milestones, seed) it does not read (a test holds
# this list and Cell's columns together).
RUN_AXES = columns("mini")


def run_key(cell, seed: int) -> tuple:
    """Everything a mini run is computed from: cells with equal keys have identical mini runs.
    (Table, block, epochs and schedule of the paper do not enter: the mini protocol sets them by
    data kind; a grid cell of 6 mini epochs is the paper cell whose protocol runs 6.)"""
    return (gossip_kind(cell), seed, epochs_of(cell)) + tuple(getattr(cell, k) for k in RUN_AXES)


def same_runs(cells, seed: int = 0) -> dict[str, str]:
    """cell_id -> the cell_id whose mini run it shares (the first in paper order), for every cell
    whose run is computed by another cell. Cells computed themselves are absent."""
    first: dict[tuple, str] = {}
    out = {}
    for c in cells:
        k = run_key(c, seed)
        if k in first:
            out[c.cell_id] = first[k]
        else:
            first[k] = c.cell_id
    return out


def twins(cells, others, seed: int = 0) -> dict[str, object]:
    """cell_id -> the first of `others` (e.g. the paper's cells) whose mini run is the cell's
    (equal run_key), for every cell that has one."""
    first: dict[tuple, object] = {}
    for o in others:
        first.setdefault(run_key(o, seed), o)
    return {c.cell_id: first[run_key(c, seed)] for c in cells if run_key(c, seed) in first}
