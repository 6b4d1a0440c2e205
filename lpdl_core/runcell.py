"""A paper cell + a profile -> one concrete, resumable training run.

Profiles:
  paper: the cell exactly as the paper ran it (real dataset, real model, all epochs).
  mini:  every axis of the cell kept (nodes, topology, skew, compression, eta, algorithm,
         precision, momentum, norm, optimizer, final gossip rounds, batch per node) but mapped onto
         embedded data and small models so the whole grid runs on a laptop:
           CIFAR-10 / Imagenette -> the digits stand-in at 16 px; every CNN -> ResNet-8, width 8
           (FP or LP, same norm kind), 3 epochs without the warm-up epoch; AG News / Sentlen -> the stdlib-prose stand-ins (MiniLM
           tokenizer, 32 tokens); DistilBERT -> a tiny random-init DistilBERT (dim 32, 1 layer) at
           Adam lr 1e-3 (3e-5 is a fine-tuning rate for a pretrained model); few epochs.
Mini numbers are never paper reproductions: every result records the mapping it used.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from .algorithms.base import GossipCfg
from .cells import Cell
from .compress import CompressorCfg
from .config import Fidelity
from .errors import ConfigError
from .engine import EngineCfg
from .optim import OptimCfg
from .quant.quantizer import QuantCfg
from .schedule import ScheduleCfg
from .topology import Topology
from .train import RunCfg, train

PROFILES = ("mini", "paper")
MINI = {"image_size": 16, "resnet_depth": 8, "resnet_width": 8, "image_epochs": 3, "text_epochs": 2,
        "text_max_length": 32, "text_lr": 1e-3, "curve_eval_samples": 120}
MINI_TEXT = {"agnews": "topics-standin", "sentlen": "sentlen-standin"}


def quant_cfg(fidelity: Fidelity) -> QuantCfg:
    """The 8-bit layers' settings a fidelity asks for."""
    if fidelity.official_quant:
        return QuantCfg(measure_as_parameters=True, act_rounding="stochastic", eval_rounding="stochastic")
    return QuantCfg()


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
    make_model: Callable | None = field(default=None, compare=False, repr=False)


def _topology(cell: Cell) -> Topology:
    return Topology(name="complete" if cell.topology == "single" else cell.topology, n=cell.nodes)


def plan_cell(cell: Cell, profile: str = "mini", *, seed: int | None = None,
              fidelity: Fidelity = Fidelity(), data_root: str | None = None) -> Plan:
    if profile not in PROFILES:
        raise ConfigError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    text = cell.model == "distilbert"
    lp = cell.precision == "int8"
    qcfg = quant_cfg(fidelity) if lp else None
    mapping: list[str] = []
    comp = CompressorCfg(kind="topk", ratio=cell.compression / 100, bytes_metric=fidelity.bytes_metric) \
        if cell.compression else CompressorCfg(bytes_metric=fidelity.bytes_metric)
    gossip = GossipCfg(algorithm="dpsgd" if cell.algorithm == "none" else cell.algorithm, eta=cell.eta,
                       compressor=comp, choco_form=fidelity.choco_form, choco_replicas=fidelity.choco_replicas)
    if cell.optimizer == "adam":
        optim = OptimCfg(momentum="adam", beta=0.9, beta2=0.9, weight_decay=1e-4)
    else:
        optim = OptimCfg(momentum=cell.momentum, beta=0.9, weight_decay=1e-4)
    # official 0.1x warm-up epoch for CNNs (dropped in the mini profile, where it would be 1/3 of training)
    warmup = 0 if text or profile == "mini" else 1
    sched = ScheduleCfg(kind=cell.lr_schedule, milestones=cell.milestones, warmup_epochs=warmup)
    epochs, lr = cell.epochs, cell.lr
    seed = cell.seed if seed is None else seed
    if profile == "paper":
        dataset, dkw, model = cell.dataset, {"root": data_root}, cell.model
        if text:
            dkw["tokenizer"] = "distilbert-base-uncased"
    elif text:
        dataset, model = MINI_TEXT[cell.dataset], "distilbert-tiny"
        dkw = {"tokenizer": "minilm", "max_length": MINI["text_max_length"]}
        epochs, lr = MINI["text_epochs"], MINI["text_lr"]
        mapping += [f"dataset {cell.dataset} -> {dataset}", "model distilbert -> tiny random-init DistilBERT",
                    f"epochs {cell.epochs} -> {epochs}", f"lr {cell.lr:g} -> {lr:g}"]
    else:
        dataset, model = "digits", f"resnet{MINI['resnet_depth']}-w{MINI['resnet_width']}"
        dkw = {"image_size": MINI["image_size"], "standin_for": cell.dataset}
        epochs = min(cell.epochs, MINI["image_epochs"])
        mapping += [f"dataset {cell.dataset} -> digits stand-in ({MINI['image_size']} px)",
                    f"model {cell.model} -> {model}", f"epochs {cell.epochs} -> {epochs}",
                    "no 0.1x warm-up epoch"]
    curve_k = MINI["curve_eval_samples"] if profile == "mini" else None
    if curve_k:
        mapping.append(f"per-epoch curve on {curve_k} test samples (final metrics on the whole test set)")
    run = RunCfg(epochs=epochs, batch_size=cell.batch_per_node, lr=lr, schedule=sched, skew=cell.skew,
                 partition_seed=seed, final_gossip_rounds=cell.final_gossip_rounds,
                 curve_eval_samples=curve_k)
    return Plan(cell_id=cell.cell_id, profile=profile, dataset=dataset, dataset_kwargs=dkw, model=model,
                topology=_topology(cell), gossip=gossip, optim=optim, run=run, fidelity=fidelity,
                mapping=tuple(mapping), make_model=_model_factory(cell, profile, model, lp, qcfg))


def _model_factory(cell: Cell, profile: str, model: str, lp: bool, qcfg) -> Callable:
    precision = "lp" if lp else "fp"
    norm = None if cell.norm == "none" else cell.norm
    if model.startswith("resnet8-w"):
        from .models.resnet_cifar import resnet_cifar
        return lambda: resnet_cifar(MINI["resnet_depth"], precision=precision, norm=norm, qcfg=qcfg,
                                    width=MINI["resnet_width"])
    if model == "distilbert-tiny" or model == "distilbert":
        from .models.transformer import SequenceClassifier, distilbert_classifier, tiny_distilbert_config
        labels = {"agnews": 4, "sentlen": 6}[cell.dataset]
        if model == "distilbert":
            return lambda: SequenceClassifier(distilbert_classifier(labels, precision=precision, qcfg=qcfg))
        conf = tiny_distilbert_config(vocab_size=30522, num_labels=labels, dim=32, n_layers=1, n_heads=2,
                                      hidden_dim=64)
        return lambda: SequenceClassifier(distilbert_classifier(labels, precision=precision, qcfg=qcfg,
                                                                pretrained=None, config_overrides=conf))
    from .models.registry import build_model
    dataset = "imagenette" if cell.dataset == "imagenette" else "cifar"
    return lambda: build_model(model, precision=precision, norm=norm, dataset=dataset, qcfg=qcfg,
                               num_classes=100 if cell.dataset == "cifar100" else 10)


def check_writable_dir(path: str | Path, what: str = "output folder") -> Path:
    """ConfigError unless `path` is, or can be created as, a folder this process can write in.
    Creates nothing: the probe file goes into the nearest existing ancestor and is removed."""
    import tempfile

    path = Path(path)
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ConfigError(f"{what} {path}: {probe} is a file, not a folder")
    try:
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".lpdl-write-test."):
            pass
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot write in {probe} ({e.strerror or e})") from None
    return path


def run_cell(cell: Cell, out_dir: str | Path, profile: str = "mini", *, seed: int | None = None,
             fidelity: Fidelity = Fidelity(), device: str = "auto", executor: str = "loop",
             data_root: str | None = None, progress: Callable[[dict], None] | None = None) -> dict:
    """Run (or resume, or skip if finished) one cell; writes out_dir/{metrics.json, curve.csv,
    partition.csv}. metrics.json is written last, so its presence means the cell is complete.

    A finished run in out_dir is returned only if it is this run (same cell, seed, profile,
    defining settings and fidelity); anything else is a RunMismatch or CorruptFile naming the
    file. Before any work, out_dir must be writable and the device available. A finished copy
    of exactly this run by this library code in out_dir/.kept is restored instead of recomputed.
    """
    from .data.registry import load_dataset
    from .engine import resolve_device
    from .results import save_run
    from .runstore import keep_run, read_run_metrics, restore_kept, run_identity

    out = Path(out_dir)
    if profile not in PROFILES:
        raise ConfigError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    seed = cell.seed if seed is None else seed
    identity = run_identity(cell, profile=profile, seed=seed, fidelity=fidelity)
    if (out / "metrics.json").exists():
        return read_run_metrics(out / "metrics.json", identity)
    check_writable_dir(out, "run folder")
    source = restore_kept(out, identity)
    if source is not None:
        if progress is not None:
            progress({"event": "restored", "source": str(source)})
        return read_run_metrics(out / "metrics.json", identity)
    resolve_device(device)  # no CUDA: one line now, not after loading the data
    plan = plan_cell(cell, profile, seed=seed, fidelity=fidelity, data_root=data_root)
    split = load_dataset(plan.dataset, **plan.dataset_kwargs)
    engine = EngineCfg(executor=executor, device=device, seed=plan.run.partition_seed)
    ckpt = out / "checkpoint.pt"
    result = train(plan.make_model, split, topology=plan.topology, gossip=plan.gossip, optim_cfg=plan.optim,
                   engine=engine, run=plan.run, progress=progress, checkpoint=ckpt)
    config = {"cell": asdict(cell), "cell_id": cell.cell_id, "profile": profile, "seed": plan.run.partition_seed,
              "dataset": split.label, "model": plan.model, "mapping": list(plan.mapping),
              "fidelity": fidelity.as_dict(), "executor": executor, "device_requested": device,
              "gossip": asdict(plan.gossip), "optim": asdict(plan.optim), "run": asdict(plan.run)}
    save_run(result, out, config=config, class_names=split.class_names, identity=identity)
    keep_run(out, identity)
    ckpt.unlink(missing_ok=True)
    return read_run_metrics(out / "metrics.json", identity)
