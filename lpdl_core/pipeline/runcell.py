"""A paper cell + a profile -> one concrete, resumable training run.

Profiles:
  paper: the cell exactly as the paper ran it (real dataset, real model, all epochs).
  mini:  every axis of the cell kept (nodes, topology, skew, compression, eta, algorithm,
         precision, momentum, norm, optimizer, final gossip rounds), mapped onto embedded data and
         one small stand-in model per paper model, with a short protocol that learns
         (lpdl_core.pipeline.mini documents it). Mini numbers are never paper reproductions: every result
         records the mapping it used.
"""
from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from ..config import DATASET_SPECS, PROFILES, Fidelity
from ..executor_specs import DEFAULT_EXECUTOR
from ..decentral.algorithms.base import GossipCfg
from ..decentral.compress import CompressorCfg
from ..decentral.engine import EngineCfg
from ..decentral.optim import OptimCfg
from ..decentral.topology import Topology
from ..errors import ConfigError
from ..quant.quantizer import QuantCfg
from ..rehearsal_mark import data_kind, rehearsal_model
from ..training.schedule import ScheduleCfg
from ..training.run_cfg import RunCfg
from ..training.train import train
from .cell import Cell
from .mini import CURVE_EVAL_SAMPLES, TEXT_MAX_LENGTH, TINY_DISTILBERT, mini_run
from .own_momentum import OWN_MOMENTUM
from .ranks import Group
from .runlock import holds_run_folder
from .runsh import as_runsh
from .runstore import check_writable_dir  # noqa: F401  (re-exported)

# The paper's DistilBERT on the Hugging Face hub: its tokenizer and its pretrained encoder weights.
# A plan lists it in hub_models, so `lpdl prefetch` (lpdl_core.pipeline.prefetch) fetches exactly what
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
                    act_rounding=fidelity.act_rounding, eval_rounding=fidelity.act_rounding)


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


def _topology(cell: Cell) -> Topology:
    return Topology(name="complete" if cell.topology == "single" else cell.topology, n=cell.nodes)


def plan_cell(cell: Cell, profile: str = "mini", *, seed: int | None = None,
              fidelity: Fidelity = Fidelity(), data_root: str | None = None) -> Plan:
    if profile not in PROFILES:
        raise ConfigError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    paper_id, ratio, mapping = cell.cell_id, cell.drop, []
    if fidelity.cell_settings == "run.sh":  # the cell as the official run.sh ran it (pipeline/runsh.py)
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
        from ..quant.norms import NormSpec
        norm = NormSpec(norm, gate=fidelity.range_evonorm_fp)
    if cell.model == "distilbert":
        labels = DATASET_SPECS[cell.dataset].classes
        if profile == "paper":
            from ..models.transformer import SequenceClassifier, distilbert_classifier
            return lambda: SequenceClassifier(distilbert_classifier(labels, precision=precision, qcfg=qcfg,
                                                                    pretrained=pretrained))
        from ..models.mini import mini_distilbert
        return lambda: mini_distilbert(labels, precision=precision, qcfg=qcfg, max_length=TEXT_MAX_LENGTH,
                                       **TINY_DISTILBERT)
    classes = DATASET_SPECS[cell.dataset].classes
    if profile == "mini":
        from ..models.mini import build_standin
        return lambda: build_standin(cell.model, precision=precision, norm=norm, qcfg=qcfg, num_classes=classes)
    from ..models.registry import build_model
    return lambda: build_model(model, precision=precision, norm=norm, dataset=cell.dataset, qcfg=qcfg,
                               num_classes=classes)


@holds_run_folder  # one live run per run folder: a second one is refused (lpdl_core.pipeline.runlock)
def run_cell(cell: Cell, out_dir: str | Path, profile: str = "mini", *, seed: int | None = None,
             fidelity: Fidelity = Fidelity(), device: str = "auto", executor: str = DEFAULT_EXECUTOR,
             compile: bool = False, compile_mode: str = "auto", fused_quant: bool = False,
             data_root: str | None = None, progress: Callable[[dict], None] | None = None,
             offline: bool = False, group: Group | None = None) -> dict:
    """Run (or resume, or skip if finished) one cell; writes out_dir/{metrics.json, curve.csv,
    partition.csv}. metrics.json is written last, so its presence means the cell is complete.
    offline: download nothing (the workflow's jobs; `lpdl prefetch` fetched the data beforehand).
    compile: each training iteration as one torch.compile graph (executor "batched"; how it runs,
    not what it computes: same run identity). fused_quant: the 8-bit quantizers as fused kernels
    in eager steps (engine.fused_quant; also how it runs, not what it computes).
    With a one-process-per-node executor (distributed) this process is one of the cell's n ranks
    (`group`, joined if not given: lpdl_core.pipeline.ranks); rank 0 checks and writes the run folder.

    A finished run in out_dir is returned only if it is this run (same cell, seed, profile,
    defining settings and fidelity); anything else is a RunMismatch or CorruptFile naming the
    file. Before any work, out_dir must be writable and the device available. A finished copy
    of exactly this run by this library code in out_dir/.kept is restored instead of recomputed.
    """
    from ..data.registry import load_dataset
    from ..decentral.engine import resolve_device
    from .runstore import run_data, run_identity

    out = Path(out_dir)
    if profile not in PROFILES:
        raise ConfigError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    seed = cell.seed if seed is None else seed
    identity = run_identity(cell, profile=profile, seed=seed, fidelity=fidelity,
                            data=run_data(cell, profile, data_root))
    group = group or Group.join(executor, device=device)
    if group.distributed and group.world != cell.nodes:
        raise ConfigError(f"{cell.cell_id} has {cell.nodes} nodes but runs on {group.world} processes")

    done = group.first(lambda: finished_run(out, identity, progress))
    if done is not None:
        return done
    resolve_device(device)  # no CUDA: one line now, not after loading the data
    plan = plan_cell(cell, profile, seed=seed, fidelity=fidelity, data_root=data_root)
    split = load_dataset(plan.dataset, offline=offline, crop_sampling=plan.fidelity.crop_sampling,
                         **plan.dataset_kwargs)
    engine = EngineCfg(executor=executor, device=device, seed=plan.run.partition_seed, compile=compile,
                       compile_mode=compile_mode, rng_streams=plan.fidelity.rng_streams, fused_quant=fused_quant)
    ckpt = out / "checkpoint.pt"
    result = train(plan.make_model, split, topology=plan.topology, gossip=plan.gossip, optim_cfg=plan.optim,
                   engine=engine, run=plan.run, progress=progress, checkpoint=ckpt, identity=identity)
    config = run_config(cell, plan, split, executor=executor, compile=compile, device=device,
                        fused_quant=fused_quant)
    if group.distributed:
        config["processes"] = group.world
    group.barrier()  # every rank has finished (and saved its last checkpoint)
    return group.first(lambda: write_run(out, result, config, split, identity))


def finished_run(out: Path, identity: dict, progress: Callable[[dict], None] | None = None) -> dict | None:
    """The finished run of this identity in out (or restored from out/.kept), or None when it
    must be computed; another run's result there is a RunMismatch, a damaged one CorruptFile.
    Checks that out is writable before saying None."""
    from .runstore import read_run_metrics, restore_kept

    if (out / "metrics.json").exists():
        return read_run_metrics(out / "metrics.json", identity)
    check_writable_dir(out, "run folder")
    source = restore_kept(out, identity)
    if source is None:
        return None
    if progress is not None:
        progress({"event": "restored", "source": str(source)})
    return read_run_metrics(out / "metrics.json", identity)


def run_config(cell: Cell, plan: Plan, split, *, executor: str, compile: bool, device: str,
               fused_quant: bool = False) -> dict:
    """The `config` record of a run's metrics.json: the cell, its resolved plan and how it ran."""
    return {"cell": asdict(cell), "cell_id": cell.cell_id, "profile": plan.profile, "seed": plan.run.partition_seed,
            "dataset": split.label, "model": plan.model, "mapping": list(plan.mapping),
            "fidelity": plan.fidelity.as_dict(), "executor": executor, "compile": compile,
            "fused_quant": fused_quant, "device_requested": device,
            "gossip": asdict(plan.gossip), "optim": asdict(plan.optim), "run": asdict(plan.run)}


def write_run(out: Path, result, config: dict, split, identity: dict) -> dict:
    """Save a finished run into out (metrics.json last), keep a copy, drop its checkpoints; the
    metrics as read back."""
    from .results import save_run
    from .runstore import keep_run, read_run_metrics

    save_run(result, out, config=config, class_names=split.class_names, identity=identity)
    keep_run(out, identity)
    for path in out.glob("checkpoint*.pt*"):  # this run's, every rank's (not the set-aside ones)
        if path.name.endswith((".pt", ".pt.prev")):
            path.unlink(missing_ok=True)
    return read_run_metrics(out / "metrics.json", identity)


def share_run(cell: Cell, primary: Cell, primary_dir: str | Path, out_dir: str | Path, profile: str = "mini", *,
              seed: int | None = None, fidelity: Fidelity = Fidelity()) -> dict:
    """Record in out_dir that `cell`'s run is the finished run of `primary` in primary_dir, whose
    mini run is identical (lpdl_core.pipeline.mini.same_runs): the primary's curve, partition and metrics,
    relabelled with this cell's identity and `config.same_run_as` = the primary's id. Nothing
    is trained. Like run_cell, a finished out_dir is returned only if it is this run."""
    from .mini import run_key
    from .results import write_json
    from .runstore import ARTIFACTS, keep_run, read_run_metrics, run_identity

    out, src = Path(out_dir), Path(primary_dir)
    seed = cell.seed if seed is None else seed
    if profile != "mini" or run_key(cell, seed) != run_key(primary, seed):
        raise ConfigError(f"{cell.cell_id}: its {profile} run is not the run of {primary.cell_id}")
    identity = run_identity(cell, profile=profile, seed=seed, fidelity=fidelity)
    if (out / "metrics.json").exists():
        return read_run_metrics(out / "metrics.json", identity)
    check_writable_dir(out, "run folder")
    m = read_run_metrics(src / "metrics.json", run_identity(primary, profile=profile, seed=seed, fidelity=fidelity))
    config = dict(m["config"], cell=asdict(cell), cell_id=cell.cell_id, same_run_as=primary.cell_id)
    why = ("DS and CHOCO are both D-PSGD/SGP without compression at eta = 1"
           if {cell.algorithm, primary.algorithm} != {cell.algorithm} else "its mini run is defined by the same values")
    config["mapping"] = list(m["config"].get("mapping", [])) + [f"same run as {primary.cell_id} ({why}): computed once"]
    out.mkdir(parents=True, exist_ok=True)
    for name in ARTIFACTS[1:]:
        if (src / name).exists():
            shutil.copyfile(src / name, out / name)
    write_json(out / "metrics.json", dict(m, config=config, identity=identity))
    keep_run(out, identity)
    return read_run_metrics(out / "metrics.json", identity)


def reuse_paper_runs(cells, paper_cells, template: str, out_of, *, seed: int | None = None,
                     fidelity: Fidelity = Fidelity()) -> tuple[dict, list]:
    """Grid cells whose mini run is a paper cell's (mini.twins) and whose twin's finished run is
    in `template` (a run folder holding {cell}), each recorded in out_of(its id) as that run
    (share_run, which checks the twin's files are exactly that paper cell's run for this seed and
    fidelity): ({cell id: (paper id, metrics, source folder)}, [(cell id, why not reused)])."""
    from ..errors import CorruptFile, RunMismatch
    from .mini import twins

    by_id = {c.cell_id: c for c in cells}
    reused, refused = {}, []
    for cid, paper in twins(cells, paper_cells).items():
        src = Path(template.replace("{cell}", paper.cell_id))
        if not (src / "metrics.json").is_file():
            continue
        try:
            m = share_run(by_id[cid], paper, src, out_of(cid), "mini", seed=seed, fidelity=fidelity)
        except (RunMismatch, CorruptFile) as e:
            refused.append((cid, f"{src}: {e}"))
            continue
        reused[cid] = (paper.cell_id, m, src)
    return reused, refused
