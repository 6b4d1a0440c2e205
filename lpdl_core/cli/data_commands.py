"""Commands that prepare data or measure jobs before the bill: rehearsal-data, preflight."""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Callable

from ..errors import ConfigError
from ..specs.executors import executor_spec
from .args import count_arg, path_arg, real_arg

log = logging.getLogger("lpdl.cli")


def add_data_commands(command: Callable[[str, str], argparse.ArgumentParser],
                      workflow_config_args: Callable[[argparse.ArgumentParser, str], None]) -> None:
    from ..data.rehearsal import REHEARSED
    from ..pipeline.workflow.preflight import SHAPE_TIMEOUT_S

    rd = command("rehearsal-data", "write the paper's datasets in their real on-disk formats and full sizes, "
                 "filled with synthetic class-dependent images and sentences, for offline rehearsals and "
                 "measurements (never for accuracies); point data_root at --out")
    rd.add_argument("--out", type=path_arg, required=True, help="the data root to write (created if missing)")
    rd.add_argument("--scale", type=real_arg(0, 1, lo_open=True), default=1.0,
                    help="fraction of each split's full size, every class kept (default 1: the full sizes)")
    rd.add_argument("--dataset", action="append", choices=REHEARSED,
                    help="only this dataset (repeatable; default all)")
    rd.set_defaults(func=cmd_rehearsal_data)

    pf = command("preflight", "measure each job shape of the paper plan on this machine's device (step time, "
                 "data loader, peak memory, compile time), say per shape whether it fits, and write a "
                 "step-times file for lpdl plan and the workflow's step_times key")
    workflow_config_args(pf, "config/config.yaml, the step-time table and data_root are read there")
    pf.add_argument("--out", type=path_arg, required=True, help="the step-times YAML file to write")
    pf.add_argument("--steps", type=count_arg(1, 1000), default=3, help="timed steps per shape (default 3)")
    pf.add_argument("--warmup", type=count_arg(1, 1000), default=1,
                    help="untimed steps first (default 1; with compile: the compilation)")
    pf.add_argument("--timeout", type=real_arg(0, 86_400, lo_open=True), default=SHAPE_TIMEOUT_S,
                    help=f"seconds one shape may take (default {SHAPE_TIMEOUT_S})")
    pf.add_argument("--mem-cap-mb", type=real_arg(0, 1e9, lo_open=True), default=None,
                    help="also hold each shape's peak memory to this many MB (a smaller card or node)")
    pf.add_argument("--shape", action="append", metavar="TEXT",
                    help="only the shapes whose name (as printed: 'vgg11/imagenette int8 batched n=4 pack 2') "
                    "contains TEXT, e.g. --shape vgg11/ (repeatable; default every shape of the plan)")
    pf.set_defaults(func=cmd_preflight)


def cmd_rehearsal_data(a: argparse.Namespace) -> int:
    """Write the rehearsal sets; their manifest on stdout."""
    from ..data.rehearsal import MANIFEST, REHEARSED, write_rehearsal

    out = Path(a.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        # a real data root: rehearsal files beside real ones would be read as real
        raise ConfigError(f"--out {out}: a folder with other files and no {MANIFEST}; "
                          "give an empty or new folder (rehearsal data never mixes with real data)")
    seen: dict[str, int] = {}

    def progress(name: str, done: int, total: int) -> None:
        if seen.get(name) != done:
            seen[name] = done
            log.info("rehearsal-data: %s %d/%d", name, done, total)

    manifest = write_rehearsal(out, scale=a.scale, datasets=tuple(a.dataset or REHEARSED), progress=progress)
    log.info("rehearsal-data: wrote %s (scale %g); set data_root: %s", ", ".join(manifest["datasets"]),
             a.scale, out)
    print(json.dumps(manifest, indent=2, sort_keys=True))
    return 0


def cmd_preflight(a: argparse.Namespace) -> int:
    """Measure the paper plan's job shapes; exit 1 when one will not fit or could not be measured."""
    import datetime

    import yaml

    from ..pipeline.workflow.preflight import run_preflight
    from ..pipeline.workflow.resources import Planner
    from ..atomic import write_atomic
    from ..provenance import git
    from ..pipeline.workflow.runtime import StepTimes, step_kind
    from .args import out_file
    from .pipeline_commands import workflow_config

    out_file(a.out)
    cfg, root, cells = workflow_config(a)
    if cfg["profile"] != "paper":
        raise ConfigError(f"the {cfg['profile']} profile trains on this machine's CPUs and asks for no GPU: "
                          "preflight measures the paper profile's jobs (give --configfile config/paper.yaml)")
    base = StepTimes.load(root / cfg["step_times"])
    packed = cfg.get("cells_per_job") == "pack"
    planner = Planner(profile="paper", distributed=executor_spec(cfg["executor"]).per_node_process,
                      gpu_request=cfg.get("gpu_request", "gpus"), step_times=base,
                      step_kind=step_kind(cfg["executor"], cfg.get("compile", False)), margin=cfg["runtime_margin"],
                      max_minutes=cfg["max_runtime"], pack_size=cfg.get("pack_size", 4) if packed else 1)
    stamp = f"{datetime.date.today().isoformat()}, commit {(git('rev-parse', '--short', 'HEAD') or 'unknown')}"
    header = ("# lpdl preflight: step times measured on this machine's device (see provenance and preflight);\n"
              "# give it to lpdl plan and the workflow as step_times\n")

    def save(times: dict) -> None:  # after each measured shape: an interrupted preflight keeps them
        write_atomic(a.out, header + yaml.safe_dump(times, sort_keys=False, width=110))

    try:
        times, summary = run_preflight(cfg, cells, base, root=str(root), planner=planner, steps=a.steps,
                                       warmup=a.warmup, timeout=a.timeout, mem_cap_mb=a.mem_cap_mb,
                                       stamp=stamp, only=tuple(a.shape or ()),
                                       say=lambda line: log.info("%s", line), save=save)
    except ValueError as e:  # --shape matched nothing
        raise ConfigError(f"--shape: {e}") from None
    if not times:
        for name, v in summary.items():
            print(f"{name}: {v['verdict']}: {'; '.join(v['why'])}")
        raise ConfigError(f"no shape could be measured ({len(summary)} tried): no step-times file written")
    save(times)
    bad = {k: v for k, v in summary.items() if v["verdict"] != "fits"}
    devices = {v["device"] for v in summary.values() if "device" in v}
    if devices and all(d == "cpu" for d in devices):
        log.warning("preflight: measured on this machine's CPU, no GPU: the step times and runtimes are "
                    "the CPU's; run it on the cluster's GPU node for the bill")
    for name, v in summary.items():
        print(f"{name}: {v['verdict']}" + (f": {'; '.join(v['why'])}" if v["why"] else ""))
    print(f"lpdl preflight: {len(summary) - len(bad)} of {len(summary)} shapes fit; step times written to {a.out}")
    return 1 if bad else 0
