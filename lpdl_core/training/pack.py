"""Several runs trained as one pack (lpdl_core.decentral.engine.packed): the same protocol as
`train`, with each cell's own partition, sampler, augmentation stream, schedule, metrics and
divergence, and one checkpoint for the whole pack.

What a pack may hold (`pack_conflict`): cells with the same model, data, optimizer, algorithm,
node count and protocol (epochs, batch, learning rate and schedule, final rounds), whose
partitions give the same number and sizes of batches per epoch, so that their batches stack.
They may differ in seed, skew, graph, compression and η.

A packed cell computes what its solo run computes: the same x_0, batches, augmentation, mixing
and messages. The stacked kernels may sum in another order (floating-point rounding only), and
the 8-bit layers' stochastic rounding draws from one stream for the pack, so 8-bit packed runs
equal solo runs in distribution, not draw by draw.
"""
from __future__ import annotations

import itertools
import math
import os
import time
from dataclasses import dataclass, replace
from typing import Callable, Mapping

import torch
from torch import nn

from ..data.augment import augment_batch
from ..data.base import DataSplit
from ..decentral.algorithms.base import GossipCfg
from ..decentral.engine import EngineCfg, evaluate_cells
from ..decentral.engine.packed import PackedSimulator, PackMember
from ..decentral.optim import OptimCfg
from ..decentral.partition import histograms
from ..decentral.topology import Topology
from ..quant import arithmetic, fused
from ..quant.params import ParamQuant
from .checkpoint import Checkpoints, fingerprint
from .loop import Progress, curve_row, run_epochs
from .run_cfg import RunCfg
from .train import RunResult, run_final_rounds, shared_streams

# RunCfg fields every cell of a pack shares (the rest, the partition and partition_seed, may differ)
SHARED = ("epochs", "batch_size", "lr", "schedule", "final_gossip_rounds", "final_rounds", "data_on",
          "curve_eval_samples", "epoch_test", "final_round_limit", "final_trailing_forward", "test_batch")


@dataclass(frozen=True, kw_only=True)
class PackedRun:
    """One cell of a pack: what `train` takes per run, and its run identity (checkpoint fingerprint)."""

    topology: Topology
    gossip: GossipCfg
    run: RunCfg
    identity: Mapping | None = None


def batch_plan(split: DataSplit, topology: Topology, run: RunCfg) -> tuple[int, int]:
    """(iterations per epoch, samples per node per epoch) of a run: cells stack only when equal."""
    labels = split.y_train.numpy()
    s = run.sampler(run.partition(labels, topology.n))
    return s.iters_per_epoch, s.epoch_len


def pack_conflict(split: DataSplit, runs: list[PackedRun]) -> str | None:
    """Why `runs` cannot train as one pack (one line), or None."""
    first = runs[0]
    for r in runs[1:]:
        for name in SHARED:
            if getattr(r.run, name) != getattr(first.run, name):
                return f"run.{name} differs ({getattr(first.run, name)!r} vs {getattr(r.run, name)!r})"
    plans = {batch_plan(split, r.topology, r.run) for r in runs}
    if len(plans) > 1:
        return f"the partitions give different batch plans {sorted(plans)}"
    return None


class _Gens:
    """The cells' augmentation generators, saved and restored as one."""

    def __init__(self, gens: list[torch.Generator]):
        self.gens = gens

    def get_state(self) -> list:
        return [g.get_state() for g in self.gens]

    def set_state(self, states: list) -> None:
        if len(states) != len(self.gens):
            raise ValueError(f"checkpoint holds {len(states)} augmentation streams, this pack {len(self.gens)}")
        for g, s in zip(self.gens, states):
            g.set_state(s)


class Pack:
    """A pack as the epoch loop drives it (lpdl_core.training.loop.Trainee): the cells' samplers
    stepped together, each batch augmented with its cell's stream; a cell whose loss is not finite
    is diverged (its rows go on, NaN, isolated by the mixing), and the pack stops when all are."""

    def __init__(self, sim, samplers, batch, diverged: list, progress, evaluate_live):
        self.sim, self.samplers, self.batch, self.diverged = sim, samplers, batch, diverged
        self.progress, self.evaluate_live, self.iters = progress, evaluate_live, samplers[0].iters_per_epoch

    @property
    def stopped(self) -> bool:
        return all(d is not None for d in self.diverged)

    def batches(self, epoch: int):
        for idxs in zip(*(s.epoch(epoch) for s in self.samplers)):
            yield self.batch(list(idxs))

    def check(self, losses, epoch: int, iteration: int) -> None:
        finite = torch.isfinite(losses.view(len(self.diverged), -1)).all(1).tolist()
        for k, ok in enumerate(finite):
            if self.diverged[k] is None and not ok:
                self.diverged[k] = {"epoch": epoch, "iteration": iteration}
                if self.progress is not None:
                    self.progress({"event": "diverged", "cell": k, "epoch": epoch, "iteration": iteration})

    def epoch_end(self, epoch: int, lr, loss_sum) -> tuple[dict, dict]:
        """{"rows": [row or None per cell], "diverged": [where or None per cell]}, and the cells' accuracies."""
        live = [k for k, d in enumerate(self.diverged) if d is None]
        rows: list[dict | None] = [None] * len(self.diverged)
        for k, ev in zip(live, self.evaluate_live(live)):
            r = self.sim.rows_of[k]
            rows[k] = curve_row(epoch, lr, float(loss_sum[r].mean()) / self.iters, ev,
                                float(self.sim.bytes_sent[r].mean()))
        return ({"rows": rows, "diverged": list(self.diverged)},
                {"epoch": epoch, "mean_acc": [None if r is None else r["mean_acc"] for r in rows]})


def train_pack(make_model: Callable[[], nn.Module], split: DataSplit, runs: list[PackedRun], *,
               optim_cfg: OptimCfg, engine: EngineCfg, progress: Callable[[dict], None] | None = None,
               checkpoint: str | os.PathLike | None = None) -> list[RunResult]:
    """Train the runs as one pack; one RunResult per run, in order. engine.seed is ignored: each
    cell's x_0 and compressor seed is its run.partition_seed, as in its solo run.

    checkpoint: one file for the whole pack, written after every epoch (as `train`'s); it is
    resumed only when every cell's identity and plan are this pack's, so a pack killed halfway
    resumes every cell. Progress events carry "cell": the cell's index, where they concern one.
    """
    why = pack_conflict(split, runs)
    if why:
        raise ValueError(f"these {len(runs)} runs cannot share a pack: {why}")
    t0 = time.perf_counter()
    run = runs[0].run  # the shared protocol (SHARED)
    labels = split.y_train.numpy()
    parts = [r.run.partition(labels, r.topology.n) for r in runs]
    hists = [histograms(p, labels, num_classes=split.num_classes) for p in parts]
    members = [PackMember(topology=r.topology, gossip=r.gossip, seed=r.run.partition_seed) for r in runs]
    engine = replace(engine, seed=members[0].seed)

    def fresh():
        s = PackedSimulator(make_model, members=members, optim_cfg=optim_cfg, engine=engine,
                            param_transform=ParamQuant)
        return s, _Gens([torch.Generator(device=s.device).manual_seed(r.run.partition_seed + 2) for r in runs])

    sim, gens = fresh()
    dev = sim.device
    store = dev if run.data_on == "device" else torch.device("cpu")
    x_tr, y_tr = split.x_train.to(store), split.y_train.to(store)
    x_te, y_te = split.x_test.to(store), split.y_test.to(store)

    def batch(idxs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Each cell's node-stacked batch, augmented with its own stream, stacked cell after cell."""
        xs, ys = [], []
        for idx, g in zip(idxs, gens.gens):
            xb, yb = x_tr[idx.to(store)].to(dev), y_tr[idx.to(store)].to(dev)
            xs.append(augment_batch(xb, split, train=True, generator=g, shared=shared))
            ys.append(yb)
        return torch.cat(xs), torch.cat(ys)

    shared = engine.rng_streams == "shared"
    samplers = [r.run.sampler(p, shared=shared) for p, r in zip(parts, runs)]
    to_test = lambda xb: augment_batch(xb.to(dev), split, train=False)  # noqa: E731
    fp = fingerprint(identity={"pack": [r.identity for r in runs]},
                     data=f"{split.name} ({len(split.x_train)} training samples)",
                     plans=[fingerprint(identity=None, topology=r.topology, gossip=r.gossip, run=r.run) for r in runs],
                     optim=optim_cfg, layout=sim.layout, architecture=sim.architecture, **shared_streams(engine))
    state, diverged = Progress(t0=t0), [None] * len(runs)
    ckpt = Checkpoints(checkpoint, sim) if checkpoint is not None else None
    if ckpt is not None:
        resumed = ckpt.resume(fp, run.epochs, sim, gens, progress)
        if resumed is None:
            if ckpt.dirty:
                sim, gens = fresh()
        else:
            state.curve, state.start_epoch, state.elapsed_before = resumed
            diverged = list(state.curve[-1]["diverged"])
            if progress is not None:
                progress({"event": "resumed", "epoch": state.start_epoch, "epochs": run.epochs})
    k_eval = run.curve_eval_samples or len(x_te)
    pack = Pack(sim, samplers, batch, diverged, progress,
                lambda live: evaluate_cells(sim, live, x_te[:k_eval], y_te[:k_eval].to(dev),
                                            batch_size=run.test_batch, transform=to_test))
    run_epochs(sim, run, pack, state, fused_quant=engine.fused_quant, checkpoint=ckpt, fingerprint=fp, aug=gens,
               progress=progress)
    curve = state.curve
    return _finish(sim, runs, samplers, batch, curve, diverged, hists, x_te, y_te.to(dev), to_test,
                   state.elapsed(), engine)


def _finish(sim, runs, samplers, batch, curve, diverged, hists, x_te, y_te, to_test, elapsed, engine):
    """The final rounds (every cell still training), the final evaluation and one RunResult per cell."""
    run = runs[0].run
    live = [k for k in range(len(runs)) if diverged[k] is None]
    streams = [itertools.chain.from_iterable(s.epoch(e) for e in itertools.count(run.epochs)) for s in samplers]
    before = {}
    if live and run.final_round_count(samplers[0].iters_per_epoch):
        before = dict(zip(live, evaluate_cells(sim, live, x_te, y_te, batch_size=run.test_batch, transform=to_test)))
        with fused.enabled(engine.fused_quant):
            run_final_rounds(sim, run, samplers[0].iters_per_epoch, lambda: batch([next(s) for s in streams]))
    # every cell, a diverged one included (its NaN model, as its solo run evaluates it)
    finals = evaluate_cells(sim, list(range(len(runs))), x_te, y_te, batch_size=run.test_batch, transform=to_test)
    results = []
    for k, _ in enumerate(runs):
        rows = [e["rows"][k] for e in curve if e["rows"][k] is not None]
        status, where = ("ok", None) if diverged[k] is None else ("diverged", diverged[k])
        final = finals[k].as_dict()
        if status == "ok" and not math.isfinite(final["mean_loss"]):
            status, where = "diverged", {"epoch": run.epochs - 1, "iteration": None}
        results.append(RunResult(
            status=status, epochs_done=len(rows), curve=rows, final=final,
            bytes_per_node=float(sim.bytes_sent[sim.rows_of[k]].mean()), partition=hists[k],
            wall_time_s=elapsed, executor=engine.executor, device=str(sim.device), diverged_at=where,
            before_final=before[k].as_dict() if k in before else None, int8_arithmetic=arithmetic.taken()))
    return results

