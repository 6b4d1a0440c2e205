"""A paper cell + a profile -> its plan: the library configs one run trains with (`plan_cell`).

Profiles:
  paper: the cell exactly as the paper ran it (real dataset, real model, all epochs).
  mini:  every axis of the cell kept (nodes, topology, skew, compression, eta, algorithm,
         precision, momentum, norm, optimizer, final gossip rounds), mapped onto embedded data and
         one small stand-in model per paper model, with a short protocol that learns
         (lpdl_core.pipeline.recipe.mini documents it). Mini numbers are never paper reproductions: every result
         records the mapping it used.
Running a plan: lpdl_core.pipeline.run.runcell.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from ...config import DATASET_SPECS, PROFILES, Fidelity
from ...decentral.algorithms.base import GossipCfg
from ...decentral.compress import CompressorCfg
from ...decentral.engine import EngineCfg
from ...decentral.optim import OptimCfg
from ...decentral.topology import Topology
from ...errors import ConfigError
from ...quant.quantizer import QuantCfg
from ...run_options import RunOptions
from ...rehearsal_mark import data_kind, rehearsal_model
from ...training.schedule import ScheduleCfg
from ...training.run_cfg import RunCfg
from ..cells.cell import Cell
from .mini import CURVE_EVAL_SAMPLES, TEXT_MAX_LENGTH, TINY_DISTILBERT, mini_run
from .own_momentum import OWN_MOMENTUM
from .runsh import as_runsh

# The paper's DistilBERT on the Hugging Face hub: its tokenizer and its pretrained encoder weights.
# A plan lists it in hub_models, so `lpdl prefetch` (lpdl_core.pipeline.workflow.prefetch) fetches exactly what
# the run will load.
PRETRAINED_TEXT = "distilbert-base-uncased"


def text_checkpoint(dataset: str, data_root) -> str | None:
    """The rehearsal stand-in of PRETRAINED_TEXT when the dataset is read from a rehearsal root
    (random weights: a rehearsal run, never an accuracy), else None: the hub checkpoint."""
    if data_kind(dataset, data_root) is None:
        return None
    return rehearsal_model(PRETRAINED_TEXT, data_root)


def quant_cfg(fidelity: Fidelity) -> QuantCfg:
    """The 8-bit layers' settings a fidelity asks for."""
    return QuantCfg(measure_as_parameters=fidelity.quant_ranges == "gossiped",
                    act_rounding=fidelity.act_rounding, eval_rounding=fidelity.act_rounding,
                    int8_arithmetic=fidelity.int8_arithmetic)


@dataclass(frozen=True, kw_only=True)
class Plan:
    cell_id: str
    profile: str
    dataset: str
    dataset_kwargs: dict
    model: str
    topology: Topology
    gossip: GossipCfg
    optim: OptimCfg
    run: RunCfg
    fidelity: Fidelity
    mapping: tuple[str, ...] = ()
    hub_models: tuple[str, ...] = ()  # Hugging Face hub repositories the run loads (tokenizer, weights)
    make_model: Callable | None = field(default=None, compare=False, repr=False)

    # The fidelity options that reach the data or the engine are wired here, once, for a solo run
    # (lpdl_core.pipeline.run.runcell) and a pack (lpdl_core.pipeline.run.runpack) alike.
    def load_data(self, *, offline: bool = False):
        """The plan's dataset (a DataSplit), with the fidelity's crop sampling."""
        from ...data.registry import load_dataset

        return load_dataset(self.dataset, offline=offline, crop_sampling=self.fidelity.crop_sampling,
                            **self.dataset_kwargs)

    def engine_cfg(self, options: RunOptions) -> EngineCfg:
        """The engine config: how the plan runs (`options`: executor, device, compile, ...; never
        what it computes), with the fidelity's random streams, seeded with the run's seed."""
        return EngineCfg(rng_streams=self.fidelity.rng_streams, seed=self.run.partition_seed,
                         **options.engine_fields())


def _topology(cell: Cell) -> Topology:
    return Topology(name="complete" if cell.topology == "single" else cell.topology, n=cell.nodes)


def plan_cell(cell: Cell, profile: str = "mini", *, seed: int | None = None,
              fidelity: Fidelity = Fidelity(), data_root: str | None = None) -> Plan:
    if profile not in PROFILES:
        raise ConfigError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    paper_id, ratio, mapping = cell.cell_id, cell.drop, []
    if fidelity.cell_settings == "run.sh":  # the cell as the official run.sh ran it (pipeline/recipe/runsh.py)
        cell, ratio, mapping = as_runsh(cell)
    text = cell.model == "distilbert"
    lp = cell.precision == "int8"
    qcfg = quant_cfg(fidelity) if lp else None
    comp = CompressorCfg.make(cell.compressor_kind, drop=ratio, param=cell.compressor_param,
                              bytes_metric=fidelity.bytes_metric)
    gossip = GossipCfg(algorithm="dpsgd" if cell.algorithm == "none" else cell.algorithm, eta=cell.eta,
                       compressor=comp, choco_form=fidelity.choco_form, choco_replicas=fidelity.choco_replicas)
    if cell.optimizer == "adam":
        optim = OptimCfg(momentum="adam", beta=0.9, beta2=0.9, weight_decay=1e-4)
    else:
        optim = OptimCfg(momentum=cell.momentum, beta=0.9, weight_decay=1e-4)
    own = OWN_MOMENTUM.get(cell.algorithm)
    if own is not None:  # the algorithm's momentum replaces the optimizer's (QG-GUTm)
        gossip = replace(gossip, **own["gossip"][cell.momentum])
        optim = OptimCfg(**own["optim"])
        mapping = [*mapping, f"{cell.algorithm}: momentum {cell.momentum} -> {own['says'][cell.momentum]}"]
    seed = cell.seed if seed is None else seed
    curve_k, hub, pretrained = None, (), PRETRAINED_TEXT
    if profile == "paper":
        # official 0.1x warm-up epoch for CNNs
        sched = ScheduleCfg(kind=cell.lr_schedule, milestones=cell.milestones, warmup_epochs=0 if text else 1)
        dataset, dkw, model = cell.dataset, {"root": data_root}, cell.model
        epochs, lr, batch = cell.epochs, cell.lr, cell.batch_per_node
        if text:
            local = text_checkpoint(cell.dataset, data_root)
            pretrained, hub = (local, ()) if local else (PRETRAINED_TEXT, (PRETRAINED_TEXT,))
            dkw["tokenizer"] = pretrained
    else:
        m = mini_run(cell)
        dataset, dkw, model, epochs, lr, batch = (m.dataset, dict(m.dataset_kwargs), m.model, m.epochs, m.lr,
                                                 m.batch_per_node)
        sched = ScheduleCfg(kind=m.schedule, warmup_epochs=0, warmup_fraction=m.warmup_fraction)
        mapping += m.mapping
        curve_k = CURVE_EVAL_SAMPLES
    run = RunCfg(epochs=epochs, batch_size=batch, lr=lr, schedule=sched, skew=cell.skew,
                 dirichlet_alpha=cell.dirichlet_alpha, partition_seed=seed,
                 final_gossip_rounds=cell.final_gossip_rounds,
                 final_rounds=fidelity.final_rounds, curve_eval_samples=curve_k,
                 epoch_test=fidelity.epoch_test, final_round_limit=fidelity.final_round_limit,
                 final_trailing_forward=fidelity.final_trailing_forward,
                 test_batch=fidelity.test_batch)
    return Plan(cell_id=paper_id, profile=profile, dataset=dataset, dataset_kwargs=dkw, model=model,
                topology=_topology(cell), gossip=gossip, optim=optim, run=run, fidelity=fidelity,
                mapping=tuple(mapping), hub_models=hub,
                make_model=_model_factory(cell, profile, model, lp, qcfg, fidelity, pretrained))


def _model_factory(cell: Cell, profile: str, model: str, lp: bool, qcfg, fidelity: Fidelity,
                   pretrained: str = PRETRAINED_TEXT) -> Callable:
    """pretrained: the paper text cells' checkpoint (the hub's, or a rehearsal root's stand-in)."""
    precision = cell.precision
    norm = None if cell.norm == "none" else cell.norm
    if norm == "range-evonorm-fp":  # the models hand `norm` to make_norm unread: the gate rides along
        from ...quant.norms import NormSpec
        norm = NormSpec(norm, gate=fidelity.range_evonorm_fp)
    if cell.model == "distilbert":
        labels = DATASET_SPECS[cell.dataset].classes
        if profile == "paper":
            from ...models.transformer import SequenceClassifier, distilbert_classifier
            return lambda: SequenceClassifier(distilbert_classifier(labels, precision=precision, qcfg=qcfg,
                                                                    pretrained=pretrained))
        from ...models.mini import mini_distilbert
        return lambda: mini_distilbert(labels, precision=precision, qcfg=qcfg, max_length=TEXT_MAX_LENGTH,
                                       **TINY_DISTILBERT)
    classes = DATASET_SPECS[cell.dataset].classes
    if profile == "mini":
        from ...models.mini import build_standin
        return lambda: build_standin(cell.model, precision=precision, norm=norm, qcfg=qcfg, num_classes=classes)
    from ...models.registry import build_model
    return lambda: build_model(model, precision=precision, norm=norm, dataset=cell.dataset, qcfg=qcfg,
                               num_classes=classes)
