"""Step-time benchmark of the n-node simulator: full precision vs 8-bit training (the distributed
executor, one process per node with the time split by phase: lpdl_core.training.bench_dist).

A step is one training iteration of all n nodes (forward, backward, local SGD step and one
gossip round: DS, uncompressed or with top-k at `compression` %) on random inputs of the model's size; data loading and evaluation are
excluded. CPU timing uses perf_counter; CUDA timing uses CUDA events after a synchronize. The
first `warmup` steps are excluded. In-process executors also report what one step dispatches
(lpdl_core.training.opcount: aten operators, those that are not views, host synchronisations),
counted on one extra step after the timed ones.
"""
from __future__ import annotations

import platform
import statistics
import time
from typing import Callable

import torch

from ..decentral.algorithms.base import GossipCfg
from ..decentral.compress import CompressorCfg
from ..decentral.engine import EngineCfg, Simulator
from ..decentral.topology import Topology
from ..models.registry import build_model, input_size
from ..quant.params import ParamQuant
from ..quant.quantizer import QuantCfg
from .opcount import step_op_counts

LP_OVER_FP_TARGET = 1.5


def _time_step(sim: Simulator, x: torch.Tensor, y: torch.Tensor) -> float:
    """Seconds of one training step of all nodes."""
    if sim.device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        sim.train_step(x, y, 0.01)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    sim.train_step(x, y, 0.01)
    return time.perf_counter() - t0


def gossip_for(compression: float) -> GossipCfg:
    """The bench's gossip: DS, uncompressed at η = 1, or layer-wise top-k dropping `compression` %
    at η = 0.01 (the paper's 99 % setting)."""
    if not 0 <= compression < 100:
        raise ValueError(f"compression must be a percentage in [0, 100), got {compression}")
    if compression == 0:
        return GossipCfg()
    return GossipCfg(eta=0.01, compressor=CompressorCfg(kind="topk", ratio=compression / 100))


def bench_step(*, model: str = "resnet20", nodes: int = 8, batch: int = 32, steps: int = 10,
               warmup: int = 2, executor: str = "loop", device: str = "auto",
               dataset: str | None = None, precisions: tuple[str, ...] = ("fp32", "int8"),
               compression: float = 0.0, progress: Callable[[dict], None] | None = None) -> dict:
    """Median seconds per step for each precision, and the LP/FP ratio.

    The precisions' steps are interleaved (FP step, LP step, FP step, ...), so a slow spell of a
    shared machine slows both alike instead of skewing the ratio. progress, if given, is called
    with {"event": "build", "precision"} before each simulator is built and with {"event": "step",
    "step" (1-based), "total", "warmup" (bool), "seconds": {precision: s}} after each step.
    """
    report = progress or (lambda ev: None)
    size = input_size(model, dataset)
    gossip = gossip_for(compression)
    out: dict = {"model": model, "dataset": dataset, "nodes": nodes, "batch_per_node": batch,
                 "compression": compression, "steps": steps, "warmup": warmup, "executor": executor, "interleaved": True,
                 "torch": torch.__version__, "threads": torch.get_num_threads(),
                 "machine": platform.machine(), "results": {}}
    if executor == "distributed":  # n processes, each step split into compute / compression / communication
        from .bench_dist import bench_distributed

        dist = bench_distributed(model=model, nodes=nodes, batch=batch, steps=steps, warmup=warmup,
                                 device=device, dataset=dataset, precisions=precisions, gossip=gossip)
        out.update(dist, threads=dist["threads_per_rank"], device=dist.pop("device_kind"))
        _ratio(out)
        return out
    sims, times = {}, {}
    gen = torch.Generator().manual_seed(0)
    for precision in precisions:
        qcfg = QuantCfg() if precision == "int8" else None
        report({"event": "build", "precision": precision})
        make = lambda: build_model(model, precision=precision, dataset=dataset, qcfg=qcfg)
        sims[precision] = Simulator(make, topology=Topology(name="directed-ring", n=nodes), gossip=gossip,
                                    engine=EngineCfg(executor=executor, device=device), param_transform=ParamQuant)
        times[precision] = []
    sim = next(iter(sims.values()))
    x = torch.randn(nodes, batch, 3, size, size, generator=gen).to(sim.device)
    y = torch.randint(0, 10, (nodes, batch), generator=gen).to(sim.device)
    for i in range(warmup + steps):
        seconds = {}
        for precision, s in sims.items():
            seconds[precision] = dt = _time_step(s, x, y)
            if i >= warmup:
                times[precision].append(dt)
        report({"event": "step", "step": i + 1, "total": warmup + steps, "warmup": i < warmup,
                "seconds": seconds})
    out["device"] = str(sim.device) if sim.device.type == "cpu" else torch.cuda.get_device_name(sim.device)
    for precision, ts in times.items():
        ops = step_op_counts(sims[precision], x, y)  # one more step each, counted, not timed
        out["results"][precision] = {"median_s": statistics.median(ts), "min_s": min(ts),
                                     "mean_s": statistics.fmean(ts), "per_node_median_s":
                                     statistics.median(ts) / nodes, "params": sims[precision].layout.d,
                                     "aten_ops": ops["aten_ops"], "non_view_ops": ops["non_view_ops"],
                                     "host_syncs": ops["host_syncs"]}
    _ratio(out)
    return out


def _ratio(out: dict) -> None:
    """LP/FP of the medians, beside the target (ResNet-20, batch 32 per node, 2-core CPU; official
    code: 2.3-2.75)."""
    if "fp32" in out["results"] and "int8" in out["results"]:
        fp, lp = out["results"]["fp32"], out["results"]["int8"]
        if "aten_ops" in lp:
            out["lp_over_fp_aten_ops"] = lp["aten_ops"] / fp["aten_ops"]
        ratio = lp["median_s"] / fp["median_s"]
        out["lp_over_fp"] = ratio
        out["target_lp_over_fp"] = LP_OVER_FP_TARGET
        out["meets_target"] = ratio <= LP_OVER_FP_TARGET
