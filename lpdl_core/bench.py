"""Step-time benchmark of the n-node simulator: full precision vs 8-bit training.

A step is one training iteration of all n nodes (forward, backward, local SGD step and one
uncompressed gossip round) on random inputs of the model's size; data loading and evaluation are
excluded. CPU timing uses perf_counter; CUDA timing uses CUDA events after a synchronize. The
first `warmup` steps are excluded.
"""
from __future__ import annotations

import platform
import statistics
import time

import torch

from .algorithms.base import GossipCfg
from .engine import EngineCfg, Simulator
from .models.registry import build_model, input_size
from .quant.quantizer import QuantCfg
from .topology import Topology


LP_OVER_FP_TARGET = 1.5


def _time_steps(sim: Simulator, x: torch.Tensor, y: torch.Tensor, steps: int, warmup: int) -> list[float]:
    cuda = sim.device.type == "cuda"
    times = []
    for i in range(warmup + steps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
        else:
            t0 = time.perf_counter()
        sim.train_step(x, y, 0.01)
        if cuda:
            end.record()
            torch.cuda.synchronize()
            dt = start.elapsed_time(end) / 1e3
        else:
            dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
    return times


def bench_step(*, model: str = "resnet20", nodes: int = 8, batch: int = 32, steps: int = 10,
               warmup: int = 2, executor: str = "loop", device: str = "auto",
               dataset: str = "cifar", precisions: tuple[str, ...] = ("fp", "lp")) -> dict:
    """Median seconds per step for each precision, and the LP/FP ratio."""
    size = input_size(model, dataset)
    out: dict = {"model": model, "dataset": dataset, "nodes": nodes, "batch_per_node": batch,
                 "steps": steps, "warmup": warmup, "executor": executor,
                 "torch": torch.__version__, "threads": torch.get_num_threads(),
                 "machine": platform.machine(), "results": {}}
    for precision in precisions:
        qcfg = QuantCfg() if precision == "lp" else None
        make = lambda: build_model(model, precision=precision, dataset=dataset, qcfg=qcfg)
        sim = Simulator(make, topology=Topology(name="directed-ring", n=nodes), gossip=GossipCfg(),
                        engine=EngineCfg(executor=executor, device=device))
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(nodes, batch, 3, size, size, generator=gen).to(sim.device)
        y = torch.randint(0, 10, (nodes, batch), generator=gen).to(sim.device)
        times = _time_steps(sim, x, y, steps, warmup)
        out["device"] = str(sim.device) if sim.device.type == "cpu" else torch.cuda.get_device_name(sim.device)
        out["results"][precision] = {"median_s": statistics.median(times), "min_s": min(times),
                                     "mean_s": statistics.fmean(times), "per_node_median_s":
                                     statistics.median(times) / nodes, "params": sim.layout.d}
    if "fp" in out["results"] and "lp" in out["results"]:
        ratio = out["results"]["lp"]["median_s"] / out["results"]["fp"]["median_s"]
        out["lp_over_fp"] = ratio
        # Issue target for ResNet-20, batch 32 per node, 2-core CPU; official code: 2.3-2.75.
        out["target_lp_over_fp"] = LP_OVER_FP_TARGET
        out["meets_target"] = ratio <= LP_OVER_FP_TARGET
    return out
