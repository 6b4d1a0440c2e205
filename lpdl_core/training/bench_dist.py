"""Step-time benchmark of the distributed executor: n processes, one per node, on this host.

Each rank builds the same model, graph and gossip as `bench.bench_step` (directed ring, DS,
uncompressed or top-k, random inputs of the model's size), FP and 8-bit steps interleaved. A step starts on a
barrier; its time is the slowest rank's (the graph's gossip makes every step as slow as it), and
each rank's time is split into compute (forward/backward, local step, the algorithm's
arithmetic), compression (packing C(v), unpacking what came in) and communication (posting the
messages, waiting for the in-neighbours'), from `NodeProcess.step_split` over the timed steps.
The ranks start as `p2p.launch` does (spawned, gloo on 127.0.0.1, env://), each with
max(1, CPUs / n) threads; on CUDA, rank i uses GPU i mod the GPUs there are (NCCL).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from ..config import DEFAULT_DIST_TIMEOUT_S
from ..specs.executors import PER_NODE_EXECUTOR
from ..decentral import p2p
from ..errors import LpdlError
from ..decentral.algorithms.base import GossipCfg
from ..decentral.engine import EngineCfg, NodeProcess
from ..decentral.topology import Topology
from ..models.registry import build_model, input_size
from ..quant.quantizer import QuantCfg


def _rank(spec: dict, out: str) -> None:
    """One rank: build, warm up, time; rank 0 writes the gathered numbers to `out`."""
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(spec["threads"])
    device = spec["device"]
    if device != "cpu" and torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    nodes = {}
    for precision in spec["precisions"]:
        qcfg = QuantCfg() if precision == "int8" else None
        make = lambda: build_model(spec["model"], precision=precision, dataset=spec["dataset"], qcfg=qcfg)  # noqa: B023,E731
        nodes[precision] = NodeProcess(make, topology=Topology(name="directed-ring", n=n), gossip=spec["gossip"],
                                       engine=EngineCfg(executor=PER_NODE_EXECUTOR, device=device), loop_rng=False)
    node = next(iter(nodes.values()))
    gen = torch.Generator().manual_seed(0)
    size, batch = spec["size"], spec["batch"]
    x = torch.randn(n, batch, 3, size, size, generator=gen)[rank:rank + 1].to(node.device)
    y = torch.randint(0, 10, (n, batch), generator=gen)[rank:rank + 1].to(node.device)
    times = {p: [] for p in nodes}
    for i in range(spec["warmup"] + spec["steps"]):
        for precision, nd in nodes.items():
            if i == spec["warmup"]:
                nd.reset_clock()  # time the timed steps only
            dist.barrier()
            t0 = time.perf_counter()
            nd.train_step(x, y, 0.01)
            if nd.device.type == "cuda":
                torch.cuda.synchronize(nd.device)
            dt = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)  # the step ends when its slowest rank does
            if i >= spec["warmup"]:
                times[precision].append(float(dt))
        if rank == 0 and spec["progress"]:
            print(f"lpdl: bench: step {i + 1}/{spec['warmup'] + spec['steps']}"
                  f"{' (warm-up)' if i < spec['warmup'] else ''}", file=sys.stderr, flush=True)
    results = {}
    for precision, nd in nodes.items():
        ts, split = times[precision], nd.step_splits()
        results[precision] = {
            "median_s": statistics.median(ts), "min_s": min(ts), "mean_s": statistics.fmean(ts),
            "params": nd.layout.d,
            "bytes_per_step_per_node": float(nd.bytes_sent[0]) / (spec["warmup"] + spec["steps"]),
            "split_per_rank": split,
            "split_mean": {k: statistics.fmean(s[k] for s in split)
                           for k in ("compute", "compression", "communication", "total")}}
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def bench_distributed(*, model: str, nodes: int, batch: int, steps: int, warmup: int, device: str,
                      dataset: str | None, precisions: tuple[str, ...], gossip: GossipCfg = GossipCfg(),
                      timeout_s: float = DEFAULT_DIST_TIMEOUT_S) -> dict:
    """Median seconds per step of the n ranks for each precision, with each rank's phase split."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if cuda and torch.cuda.device_count() < nodes:  # NCCL refuses two ranks on one GPU
        raise LpdlError(f"the distributed bench on CUDA needs one GPU per node: {nodes} nodes, "
                        f"{torch.cuda.device_count()} GPUs here (use --device cpu, or fewer --nodes)")
    spec = {"model": model, "dataset": dataset, "size": input_size(model, dataset), "batch": batch,
            "steps": steps, "warmup": warmup, "precisions": list(precisions), "device": "cuda" if cuda else "cpu",
            "threads": max(1, cpus // nodes), "progress": True, "gossip": gossip}
    with tempfile.TemporaryDirectory(prefix="lpdl-bench-") as tmp:
        out = Path(tmp) / "results.json"
        codes = p2p.launch(_rank, spec, str(out), world_size=nodes,
                           cfg=p2p.P2PCfg(backend="nccl" if cuda else "gloo", timeout_s=timeout_s))
        if codes != [0] * nodes or not out.exists():
            raise RuntimeError(f"distributed bench: the ranks exited with {codes} (their errors are above)")
        results = json.loads(out.read_text())
    return {"threads_per_rank": spec["threads"], "processes": nodes, "device_kind": spec["device"],
            "results": results}
