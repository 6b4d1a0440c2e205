"""One job shape measured on this machine's device, for `lpdl preflight` (lpdl_core.pipeline.workflow.preflight
runs each shape in a child process of its own, `python -m lpdl_core.pipeline.workflow.preflight_shape
SPEC_JSON`, so that the peak memory it reports is that shape's alone).

A shape is what a paper job's step costs: the model, dataset, precision, executor, nodes, pack
size and compile of a representative cell of the job. Measured with the run's own pieces: the
cell's plan (lpdl_core.pipeline.recipe.plan.plan_cell: model, graph, gossip, optimizer, batch), the
real loader reading the data root (`lpdl rehearsal-data` writes one offline), the simulator the
train loop builds, and its batches made as the train loop makes them (index the node-stacked
uint8 tensors, copy to the device, augment there):

    load_s                  the dataset loaded (decoded, or read from its decoded cache)
    loader_samples_per_s    batches alone: index + copy + augment, timed over the same steps
    first_step_s            the first step (with compile: the compilation)
    step_s                  median of `steps` timed steps after `warmup` untimed ones (loader excluded)
    step_samples_per_s      nodes x pack x batch / step_s: what the loader must keep up with
    peak_rss_mb             the process's peak resident memory (getrusage)
    device_peak_mb, device_total_mb   CUDA: torch.cuda.max_memory_allocated and the card's size
"""
from __future__ import annotations

import json
import platform
import resource
import statistics
import sys
import time

import torch


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def measure(spec: dict) -> dict:
    """The shape's measurements (see the module docstring). spec: cell (a Cell's fields), profile,
    fidelity (a Fidelity mapping), data_root, device, executor, compile, compile_mode, pack,
    steps, warmup."""
    from ...config import Fidelity
    from ...data.augment import augment_batch
    from ...decentral.engine import Simulator
    from ...decentral.engine.packed import PackedSimulator, PackMember
    from ..cells.cell import Cell
    from ..recipe.plan import plan_cell
    from ...quant.params import ParamQuant
    from ...run_options import RunOptions

    cell = Cell(**spec["cell"])
    fidelity = Fidelity.from_mapping(spec.get("fidelity") or {})
    plan = plan_cell(cell, spec["profile"], seed=cell.seed, fidelity=fidelity, data_root=spec.get("data_root"))
    t0 = time.perf_counter()
    split = plan.load_data(offline=True)
    load_s = time.perf_counter() - t0
    options = RunOptions(executor=spec["executor"], device=spec.get("device", "auto"),
                         compile=bool(spec.get("compile")), compile_mode=spec.get("compile_mode", "auto"))
    engine = plan.engine_cfg(options)
    pack = int(spec.get("pack", 1))
    if pack > 1:
        members = [PackMember(topology=plan.topology, gossip=plan.gossip, seed=engine.seed + k) for k in range(pack)]
        sim = PackedSimulator(plan.make_model, members=members, optim_cfg=plan.optim, engine=engine,
                              param_transform=ParamQuant)
    else:
        sim = Simulator(plan.make_model, topology=plan.topology, gossip=plan.gossip, optim_cfg=plan.optim,
                        engine=engine, param_transform=ParamQuant)
    dev = sim.device
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    rows, b = cell.nodes * pack, plan.run.batch_size
    x_all, y_all = split.x_train.to(dev), split.y_train.to(dev)
    gen = torch.Generator().manual_seed(0)
    aug = torch.Generator(device=dev).manual_seed(1)
    warmup, steps = int(spec.get("warmup", 1)), int(spec.get("steps", 3))
    load_times, step_times, first = [], [], None
    for i in range(warmup + steps):
        idx = torch.randint(len(x_all), (rows, b), generator=gen).to(dev)
        _sync(dev)
        t = time.perf_counter()
        xb, yb = augment_batch(x_all[idx], split, train=True, generator=aug), y_all[idx]
        _sync(dev)
        load_times.append(time.perf_counter() - t)
        t = time.perf_counter()
        sim.train_step(xb, yb, plan.run.lr)
        _sync(dev)
        dt = time.perf_counter() - t
        first = dt if first is None else first
        if i >= warmup:
            step_times.append(dt)
    step_s = statistics.median(step_times)
    out = {"device": str(dev) if dev.type != "cuda" else torch.cuda.get_device_name(dev),
           "torch": torch.__version__, "machine": platform.machine(), "threads": torch.get_num_threads(),
           "load_s": load_s, "first_step_s": first, "step_s": step_s, "steps": steps, "warmup": warmup,
           "rows": rows, "batch_per_node": b,
           "loader_samples_per_s": rows * b / statistics.median(load_times),
           "step_samples_per_s": rows * b / step_s,
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "rehearsal": bool(split.extras.get("rehearsal"))}
    if dev.type == "cuda":
        out["device_peak_mb"] = torch.cuda.max_memory_allocated(dev) / 2**20
        out["device_total_mb"] = torch.cuda.get_device_properties(dev).total_memory / 2**20
    return out


if __name__ == "__main__":
    print(json.dumps(measure(json.loads(sys.argv[1]))))
