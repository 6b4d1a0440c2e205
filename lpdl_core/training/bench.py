"""Step-time benchmark of the n-node simulator: full precision vs 8-bit training (the distributed
executor, one process per node with the time split by phase: lpdl_core.training.bench_dist).

A step is one training iteration of all n nodes (forward, backward, local SGD step and one
gossip round: DS, uncompressed or with top-k at `compression` %) on random inputs of the model's
size; data loading and evaluation are
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

from ..compat import incompatible
from ..run_options import RunOptions
from ..config import MINI_IMAGE_SIZE, PRECISIONS
from ..specs.executors import DEFAULT_EXECUTOR, executor_spec
from ..decentral.algorithms.base import GossipCfg
from ..decentral.compress import CompressorCfg
from ..decentral.engine import EngineCfg, Simulator
from ..decentral.engine.packed import PackedSimulator, PackMember
from ..decentral.topology import Topology
from ..models.mini import build_standin
from ..models.registry import build_model, input_size
from ..quant import arithmetic, fused
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
    return GossipCfg(eta=0.01, compressor=CompressorCfg.top_k(compression / 100))


def bench_step(*, model: str = "resnet20", nodes: int = 8, batch: int = 32, steps: int = 10,
               warmup: int = 2, executor: str = DEFAULT_EXECUTOR, device: str = "auto",
               dataset: str | None = None, precisions: tuple[str, ...] = PRECISIONS,
               compression: float = 0.0, compile: bool = False, compile_mode: str = "auto", pack: int = 1,
               fused_quant: bool = False, int8_arithmetic: str = "fake", standin: bool = False,
               progress: Callable[[dict], None] | None = None) -> dict:
    """Median seconds per step for each precision, and the LP/FP ratio.

    compile: also time each precision's step compiled as one graph (engine.compile, batched
    executor), interleaved with the eager steps: results[p]["compiled"] holds its times, the
    first call's seconds (`compile_s`, compilation included) and the kernels inductor generated
    for it; `compiled_lp_over_fp` and `compiled_speedup` (eager / compiled, per precision) sum up.

    compile_mode: torch.compile's mode for the compiled steps (auto: CUDA graphs on CUDA).
    fused_quant: the eager steps with the 8-bit quantizer chains as fused kernels
        (engine.fused_quant, lpdl_core.quant.fused); their compilation happens in the warmup steps.
    int8_arithmetic: the 8-bit layers' arithmetic ("fake", float32 simulation; "integer", exact
        integer products where this machine has an exact int8 kernel, lpdl_core.quant.integer);
        `int8_arithmetic_taken` says what the LP steps' layer calls took.
    standin: time the model's mini-profile stand-in (lpdl_core.models.mini) on the stand-ins'
        8×8 input, the step `make reproduce` trains, instead of the paper model (dataset ignored).
    pack: time a pack of that many cells of `nodes` nodes each (engine/packed.py: one stacked
    state, block-diagonal mixing) instead of one cell; the medians are of the whole pack's step,
    and `per_cell_median_s` divides by the cells.

    The precisions' steps are interleaved (FP step, LP step, FP step, ...), so a slow spell of a
    shared machine slows both alike instead of skewing the ratio. progress, if given, is called
    with {"event": "build", "precision"} before each simulator is built and with {"event": "step",
    "step" (1-based), "total", "warmup" (bool), "seconds": {precision: s}} after each step.
    """
    report = progress or (lambda ev: None)
    size = MINI_IMAGE_SIZE if standin else input_size(model, dataset)
    gossip = gossip_for(compression)
    out: dict = {"model": model, "dataset": dataset, "nodes": nodes, "batch_per_node": batch,
                 "compression": compression, "steps": steps, "warmup": warmup, "executor": executor,
                 "compile": compile, "pack": pack, "interleaved": True,
                 "fused_quant": fused_quant, "int8_arithmetic": int8_arithmetic, "standin": standin,
                 "torch": torch.__version__, "threads": torch.get_num_threads(),
                 "machine": platform.machine(), "results": {}}
    why = incompatible(RunOptions(executor=executor, compile=compile, fused_quant=fused_quant, pack_size=pack))
    if why:  # lpdl_core.compat: what cannot run together, as the workflow and lpdl train refuse it
        raise ValueError(f"bench: {why}")
    if executor_spec(executor).per_node_process:  # n processes; each step: compute, compression, communication
        from .bench_dist import bench_distributed

        dist = bench_distributed(model=model, nodes=nodes, batch=batch, steps=steps, warmup=warmup,
                                 device=device, dataset=dataset, precisions=precisions, gossip=gossip)
        out.update(dist, threads=dist["threads_per_rank"], device=dist.pop("device_kind"))
        _ratio(out)
        return out
    if pack < 1:
        raise ValueError(f"bench --pack must be >= 1, got {pack}")
    if fused_quant and warmup < 1:
        raise ValueError("bench --fused-quant needs --warmup >= 1 "
                         "(the first step compiles the kernels; it is never timed)")
    if compile and warmup < 1:
        raise ValueError("bench --compile needs --warmup >= 1 (the first step compiles; it is never timed)")
    sims, times, first, kernels = {}, {}, {}, {}
    gen = torch.Generator().manual_seed(0)
    variants = [(p, c) for p in precisions for c in ((False, True) if compile else (False,))]
    for precision, compiled in variants:
        qcfg = QuantCfg(int8_arithmetic=int8_arithmetic) if precision == "int8" else None
        report({"event": "build", "precision": precision + (" compiled" if compiled else "")})
        make = (lambda precision=precision, qcfg=qcfg: build_standin(model, precision=precision, qcfg=qcfg)) \
            if standin else (lambda precision=precision, qcfg=qcfg: build_model(model, precision=precision,
                                                                               dataset=dataset, qcfg=qcfg))
        engine = EngineCfg(executor=executor, device=device, compile=compiled, compile_mode=compile_mode)
        if pack > 1:
            members = [PackMember(topology=Topology(name="directed-ring", n=nodes), gossip=gossip, seed=engine.seed + k)
                       for k in range(pack)]
            sims[precision, compiled] = PackedSimulator(make, members=members, engine=engine,
                                                        param_transform=ParamQuant)
        else:
            sims[precision, compiled] = Simulator(make, topology=Topology(name="directed-ring", n=nodes), gossip=gossip,
                                                  engine=engine, param_transform=ParamQuant)
        times[precision, compiled] = []
    sim = next(iter(sims.values()))
    rows = nodes * pack
    arithmetic.reset(sim.device)
    x = torch.randn(rows, batch, 3, size, size, generator=gen).to(sim.device)
    y = torch.randint(0, 10, (rows, batch), generator=gen).to(sim.device)
    for i in range(warmup + steps):
        seconds = {}
        for (precision, compiled), s in sims.items():
            if i == 0 and compiled:
                before = kernel_count()
            with fused.enabled(fused_quant and not compiled):
                seconds[precision + (" compiled" if compiled else "")] = dt = _time_step(s, x, y)
            if i == 0 and compiled:
                first[precision], kernels[precision] = dt, kernel_count() - before
            if i >= warmup:
                times[precision, compiled].append(dt)
        report({"event": "step", "step": i + 1, "total": warmup + steps, "warmup": i < warmup,
                "seconds": seconds})
    out["device"] = str(sim.device) if sim.device.type == "cpu" else torch.cuda.get_device_name(sim.device)
    out["int8_arithmetic_taken"] = arithmetic.taken()
    for (precision, compiled), ts in times.items():
        summary = {"median_s": statistics.median(ts), "min_s": min(ts), "mean_s": statistics.fmean(ts),
                   "per_node_median_s": statistics.median(ts) / rows, "per_cell_median_s": statistics.median(ts) / pack}
        if compiled:
            out["results"][precision]["compiled"] = {
                **summary, "mode": sims[precision, True].compiled.mode, "compile_s": first[precision],
                "generated_kernels": kernels[precision], "graphs": 1 if sims[precision, True].compiled.one_graph else 2,
                # CUDA graphs that inductor declined (reduce-overhead only; the reason is logged)
                "cudagraph_skips": torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]}
            continue
        with fused.enabled(fused_quant):  # one more step each, counted, not timed
            ops = step_op_counts(sims[precision, False], x, y)
        out["results"][precision] = {**summary, "params": sims[precision, False].layout.d,
                                     "aten_ops": ops["aten_ops"], "non_view_ops": ops["non_view_ops"],
                                     "fused_ops": ops["fused_ops"], "host_syncs": ops["host_syncs"]}
    _ratio(out)
    return out


def kernel_count() -> int:
    """Kernels inductor has generated in this process so far (torch._inductor.metrics)."""
    from torch._inductor import metrics
    return metrics.generated_kernel_count


def _ratio(out: dict) -> None:
    """LP/FP of the medians, beside the target (ResNet-20, batch 32 per node, 2-core CPU; official
    code: 2.3-2.75)."""
    if "fp32" in out["results"] and "int8" in out["results"]:
        fp, lp = out["results"]["fp32"], out["results"]["int8"]
        if "aten_ops" in lp:
            out["lp_over_fp_aten_ops"] = lp["aten_ops"] / fp["aten_ops"]
        if "compiled" in lp and "compiled" in fp:
            out["compiled_lp_over_fp"] = lp["compiled"]["median_s"] / fp["compiled"]["median_s"]
            out["compiled_speedup"] = {p: r["median_s"] / r["compiled"]["median_s"]
                                       for p, r in out["results"].items()}
        ratio = lp["median_s"] / fp["median_s"]
        out["lp_over_fp"] = ratio
        out["target_lp_over_fp"] = LP_OVER_FP_TARGET
        out["meets_target"] = ratio <= LP_OVER_FP_TARGET
