"""`lpdl preflight`: each distinct job shape of the plan measured on this machine's device before the
bill is spent, a verdict per shape, and a step-times file that `lpdl plan` and the workflow's
`step_times` key read. Torch-free: each shape runs in a child process
(lpdl_core.pipeline.workflow.preflight_shape), so its peak memory is its own and one shape's failure is
one line, not the end of the preflight.

A shape is (model, dataset, precision, executor, nodes, pack, compile): the jobs the workflow
plans (lpdl_core.pipeline.workflow.jobs) that share it cost the same per step. Its verdict is "fits", or
"will not fit" with each reason:

    device memory    CUDA peak above 90 % of the card (or of --mem-cap-mb)
    host memory      peak RSS above the job's SLURM mem_mb request (or above --mem-cap-mb)
    runtime          with the measured steps, the job needs more attempts at max_runtime than
                     SLURM's retries allow (each attempt resumes from the last checkpoint)
    data loader      it makes fewer samples per second than the step consumes

The step-times file holds this machine's measurements only: each measured shape's step as a
measurement of its model, precision and column (normalised to ref_nodes as the runtime model reads
it back; the larger where two shapes share a column), each model's peak host memory (`host_mb`;
the SLURM mem_mb request becomes at least 1.25 x that, lpdl_core.pipeline.workflow.resources), the config's
file's MACs and data sizes for the models it scales, its provenance (device, torch, date, commit)
and the raw shape measurements under `preflight`.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Mapping

from ...config import Fidelity
from ...specs.executors import executor_spec
from ..cells.cell import Cell
from ..recipe.packing import pack_stacks
from .jobs import plan_jobs
from .runtime import PACKED, TRAIN_SAMPLES, StepTimes, job_runtime, step_kind

DEVICE_SHARE = 0.9      # of the card's memory a shape may use
SHAPE_TIMEOUT_S = 900   # seconds one shape may take (lpdl preflight --timeout)
SLURM_RETRIES = 3       # workflow/profiles/slurm/config.yaml: retries (attempts = retries + 1)


@dataclass(frozen=True, kw_only=True)
class Shape:
    model: str
    dataset: str
    precision: str
    executor: str
    nodes: int
    pack: int
    compile: bool

    @property
    def name(self) -> str:
        return (f"{self.model}/{self.dataset} {self.precision} {step_kind(self.executor, self.compile)} "
                f"n={self.nodes}" + (f" pack {self.pack}" if self.pack > 1 else ""))

    @property
    def column(self) -> str:
        """The step-times column this shape measures."""
        kind = step_kind(self.executor, self.compile)
        return f"{kind}{PACKED}{self.pack}" if self.pack > 1 else kind


def shapes(cfg: Mapping, cells: Iterable[Cell]) -> dict[Shape, list[list[Cell]]]:
    """Each shape of the config's jobs -> those jobs (their cells), in plan order."""
    cells = list(cells)
    by_id = {c.cell_id: c for c in cells}
    per = cfg.get("cells_per_job")
    packs = per == "pack" and executor_spec(cfg["executor"]).packable
    out: dict[Shape, list[list[Cell]]] = {}
    for job in plan_jobs(cells, cfg["profile"], per):
        job_cells = [by_id[c] for c in job.cells]
        stacks = pack_stacks(job_cells, cfg.get("pack_size", 4)) if packs else [[c] for c in job_cells]
        for stack in stacks:
            c = stack[0]
            shape = Shape(model=c.model, dataset=c.dataset, precision=c.precision, executor=cfg["executor"],
                          nodes=c.nodes, pack=len(stack), compile=bool(cfg.get("compile")))
            out.setdefault(shape, []).append(job_cells)
    return out


def preflight_resources(planner, found: Mapping[Shape, list], *, timeout_s: float = SHAPE_TIMEOUT_S,
                        max_minutes: int = 2880) -> dict:
    """The Snakemake resources of the preflight job (workflow rule `preflight`): one GPU, the host
    memory of the hungriest model's jobs, and every shape's timeout as its runtime (capped)."""
    return {"mem_mb": max(planner.host_request_mb(s.model) for s in found),
            "runtime": min(max_minutes, math.ceil(len(found) * timeout_s / 60) + 10),
            **planner.gpu_resources(1)}


def selected(found: Mapping[Shape, list], only: Iterable[str] = ()) -> dict[Shape, list]:
    """The shapes whose name contains one of the texts `only` (all when it is empty)."""
    only = tuple(only)
    return {s: jobs for s, jobs in found.items() if not only or any(t in s.name for t in only)}


def rule_resources(cfg: Mapping, cells: Iterable[Cell], planner) -> dict:
    """The workflow's preflight rule's resources for this config (its `preflight:` options)."""
    opts = cfg.get("preflight") or {}
    found = selected(shapes(cfg, cells), opts.get("shapes") or ())
    if cfg["profile"] != "paper" or not found:  # lpdl preflight refuses it, in one line
        return {"runtime": 10}
    return preflight_resources(planner, found, timeout_s=opts.get("timeout", SHAPE_TIMEOUT_S),
                               max_minutes=cfg["max_runtime"])


def cli_args(cfg: Mapping) -> list[str]:
    """The `lpdl preflight` options the config's `preflight:` mapping sets."""
    opts = cfg.get("preflight") or {}
    return ([f"--{k}={opts[k]}" for k in ("steps", "warmup", "timeout") if k in opts]
            + [f"--shape={t}" for t in opts.get("shapes") or ()])


def measure_shape(shape: Shape, cell: Cell, *, cfg: Mapping, root: str, steps: int, warmup: int,
                  timeout: float) -> dict:
    """The child process's measurements of the shape, or {"error": one line}."""
    data_root = cfg.get("data_root") or None
    if data_root and not os.path.isabs(data_root):
        data_root = os.path.join(root, data_root)
    spec = {"cell": asdict(cell), "profile": cfg["profile"], "fidelity": Fidelity.from_mapping(
        cfg.get("fidelity", "paper")).as_dict(), "data_root": data_root, "device": cfg.get("device", "auto"),
        "executor": shape.executor, "compile": shape.compile, "compile_mode": cfg.get("compile_mode", "auto"),
        "pack": shape.pack, "steps": steps, "warmup": warmup}
    threads = min(int(cfg.get("threads_per_job") or os.cpu_count() or 1), os.cpu_count() or 1)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads),  # as a job has them, never more than the cores
           "HF_HUB_OFFLINE": "1"}
    try:
        p = subprocess.run([sys.executable, "-m", "lpdl_core.pipeline.workflow.preflight_shape", json.dumps(spec)],
                           capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {timeout:.0f} s"}
    if p.returncode < 0:  # SIGKILL: the kernel's out-of-memory killer, most often
        return {"error": f"killed by signal {-p.returncode}" + (" (out of memory?)" if p.returncode == -9 else "")}
    if p.returncode != 0:
        lines = [line for line in p.stderr.strip().splitlines() if line.strip()]
        return {"error": lines[-1] if lines else f"exit {p.returncode}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def verdict(m: Mapping, *, mem_request_mb: float, attempts_needed: int, mem_cap_mb: float | None = None) -> list[str]:
    """The reasons a measured shape will not fit (none: it fits)."""
    why = []
    if "device_peak_mb" in m:
        cap = min(DEVICE_SHARE * m["device_total_mb"], mem_cap_mb or float("inf"))
        if m["device_peak_mb"] > cap:
            why.append(f"device memory {m['device_peak_mb']:,.0f} MB above {cap:,.0f} MB")
    host_cap = min(mem_request_mb, mem_cap_mb or float("inf"))
    if m["peak_rss_mb"] > host_cap:
        what = "the SLURM request" if host_cap == mem_request_mb else "the cap"
        why.append(f"host memory {m['peak_rss_mb']:,.0f} MB above {what} of {host_cap:,.0f} MB")
    if attempts_needed > SLURM_RETRIES + 1:
        why.append(f"runtime: {attempts_needed} attempts at max_runtime, more than the {SLURM_RETRIES + 1} "
                   "SLURM allows")
    if m["loader_samples_per_s"] < m["step_samples_per_s"]:
        why.append(f"data loader {m['loader_samples_per_s']:,.0f} samples/s, slower than the step's "
                   f"{m['step_samples_per_s']:,.0f}")
    return why


def measured_times(base: StepTimes, results: Mapping[Shape, Mapping], *, provenance: str) -> dict:
    """The step-times mapping of this machine: the measured shapes' steps only (normalised to
    ref_nodes, the larger of two shapes in one column; another device's numbers never mix in),
    base's MACs, sizes and eval share for what is scaled, and the raw measurements. ValueError
    when no shape was measured."""
    measured: dict = {}
    for shape, m in results.items():
        if "error" in m:
            continue
        col = measured.setdefault(shape.model, {}).setdefault(shape.precision, {})
        t = m["step_s"] * base.ref_nodes / shape.nodes
        col[shape.column] = round(max(t, col.get(shape.column, 0.0)), 6)
    if not measured:
        raise ValueError("no shape was measured")
    host: dict[str, float] = {}
    for shape, m in results.items():
        if "error" not in m:
            host[shape.model] = round(max(m["peak_rss_mb"], host.get(shape.model, 0.0)), 1)
    ref = base.ref_model if base.ref_model in measured else next(iter(measured))
    others = "not measured by this preflight: scaled from " + ref + " by forward MACs per sample"
    own = {k: v for k, v in base.train_samples.items() if TRAIN_SAMPLES.get(k) != v}  # beyond the specs'
    return {"ref_model": ref, "ref_nodes": base.ref_nodes, "ref_batch": base.ref_batch, "measured": measured,
            "macs_per_sample": dict(base.macs_per_sample), **({"train_samples": own} if own else {}),
            "eval_share": base.eval_share,
            "provenance": {**{model: provenance for model in measured}, "others": others},
            "host_mb": host,
            "preflight": {s.name: dict(m) for s, m in results.items()}}


def _provenance(results: Mapping[Shape, Mapping], steps: int, warmup: int, stamp: str) -> str:
    first = next(m for m in results.values() if "error" not in m)
    return (f"lpdl preflight, {steps} step(s) after {warmup} per shape, on {first['device']} "
            f"(torch {first['torch']}, {first['threads']} threads), {stamp}")


def run_preflight(cfg: Mapping, cells: Iterable[Cell], base: StepTimes, *, root: str, planner,
                  steps: int = 3, warmup: int = 1, timeout: float = SHAPE_TIMEOUT_S, mem_cap_mb: float | None = None,
                  stamp: str = "", only: tuple[str, ...] = (), say: Callable[[str], None] = print,
                  save: Callable[[dict], None] | None = None) -> tuple[dict, dict]:
    """Measure every shape (with `only`: those whose name contains one of its texts); say one line
    per shape as it is measured and one per verdict at the end; `save` gets the step-times mapping
    of what is measured so far after each shape (an interrupted preflight keeps it). Returns
    (step-times mapping, a summary {shape name: {"verdict", "why", **measurements}}). ValueError
    when `only` matches no shape."""
    every = shapes(cfg, cells)
    found = selected(every, only)
    if not found:
        raise ValueError(f"no shape of the plan matches {' or '.join(map(repr, only))}; its shapes: "
                         + "; ".join(s.name for s in every))
    results, summary = {}, {}
    for k, (shape, jobs) in enumerate(found.items(), 1):
        say(f"preflight {k}/{len(found)}: {shape.name} ({len(jobs)} job(s)) ...")
        m = measure_shape(shape, jobs[0][0], cfg=cfg, root=root, steps=steps, warmup=warmup, timeout=timeout)
        results[shape] = m
        if "error" in m:
            summary[shape.name] = {"verdict": "not measured", "why": [m["error"]]}
            say(f"  {shape.name}: not measured: {m['error']}")
            continue
        say(f"  {shape.name}: step {m['step_s']:.4f} s (first {m['first_step_s']:.1f} s), loader "
            f"{m['loader_samples_per_s']:,.0f} samples/s, host peak {m['peak_rss_mb']:,.0f} MB"
            + (f", device peak {m['device_peak_mb']:,.0f} MB" if "device_peak_mb" in m else ""))
        if save is not None:
            save(measured_times(base, results, provenance=_provenance(results, steps, warmup, stamp)))
    done = [m for m in results.values() if "error" not in m]
    if not done:
        return {}, summary
    provenance = _provenance(results, steps, warmup, stamp)
    times = StepTimes.from_mapping(measured_times(base, results, provenance=provenance))
    kind = step_kind(cfg["executor"], bool(cfg.get("compile")))
    pack_size = cfg.get("pack_size", 4) if cfg.get("cells_per_job") == "pack" else 1
    for shape, jobs in found.items():
        m = results[shape]
        if "error" in m:
            continue
        requests = [(job_runtime(cs, times, executor=kind, margin=cfg.get("runtime_margin", 1.5),
                                 max_minutes=cfg.get("max_runtime", 2880), pack_size=pack_size), cs) for cs in jobs]
        request, worst = max(requests, key=lambda rc: rc[0].estimate_minutes)
        mem = planner.resources(worst)["mem_mb"]
        why = verdict(m, mem_request_mb=mem, attempts_needed=request.attempts_needed, mem_cap_mb=mem_cap_mb)
        summary[shape.name] = {"verdict": "will not fit" if why else "fits", "why": why, "mem_request_mb": mem,
                               "attempts_needed": request.attempts_needed, **m}
        say(f"  {shape.name}: {'WILL NOT FIT: ' + '; '.join(why) if why else 'fits'} (host peak "
            f"{m['peak_rss_mb']:,.0f} MB of {mem:,} MB asked, {request.attempts_needed} attempt(s) at max_runtime)")
    return measured_times(base, results, provenance=provenance), summary
