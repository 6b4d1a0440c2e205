"""How `lpdl train --executor distributed` runs its cells: n processes, one per node.

Started by hand (no rank of its own), it starts its n processes with `torchrun` (`torchrun_argv`,
`run_children`): the same command, once per node, on this host. Started as one of them, by
torchrun or by `srun -n N` in a SLURM job of N tasks (the workflow's train job), it joins the
group (lpdl_core.training.group) and trains node `rank`.

No orphans: torchrun dies with the `lpdl train` that started it, and each rank with torchrun
(`die_with_parent`: Linux's parent-death signal), so a launcher killed with kill -9 (an OOM
killer) leaves no process writing its run folder. Under SLURM (srun starts the ranks) nothing
changes.
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Mapping

from ..errors import LpdlError
from ..training.group import LAUNCHER_ENV

log = logging.getLogger("lpdl.cli")


def torchrun_argv(nodes: int, args: list[str], python: str = sys.executable,
                  options: tuple[str, ...] = ()) -> list[str]:
    """`torchrun --standalone --nproc-per-node N [options] -m lpdl_core <args>` for this interpreter."""
    return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nodes}",
            "--max-restarts=0", *options, "-m", "lpdl_core", *args]


def child_env(nodes: int, threads: int | None = None, environ: Mapping[str, str] | None = None) -> dict:
    """The ranks' environment: `threads`, else OMP_NUM_THREADS, else this machine's CPUs, shared
    among the n ranks (at least one thread each). environ: os.environ when not given."""
    environ = os.environ if environ is None else environ
    total = (threads or int(environ.get("OMP_NUM_THREADS") or 0)
             or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()))
    return {**environ, "OMP_NUM_THREADS": str(max(1, int(total or 1) // nodes))}


@dataclass(frozen=True)
class Ended:
    """How torchrun ended: its exit status, and the signal (SIGINT, SIGTERM) this process received
    and passed on to it meanwhile, if any."""

    code: int
    signal: int | None = None


def run_children(argv: list[str], env: Mapping[str, str],
                 on_line: Callable[[str, str], None] | None = None) -> Ended:
    """Run argv (torchrun) to its end. It dies with this process (`die_with_parent`); SIGINT and
    SIGTERM received meanwhile are passed on (torchrun stops its ranks). on_line: called with
    ("stdout" or "stderr", line) for each line torchrun writes, from one thread per stream;
    without it, its output goes where this process's goes."""
    parent, pipe = os.getpid(), subprocess.PIPE if on_line else None
    proc = subprocess.Popen(argv, env=dict(env), stdout=pipe, stderr=pipe, encoding="utf-8", errors="replace",
                            preexec_fn=lambda: die_with_parent(parent))
    readers = [threading.Thread(target=_pump, args=(name, stream, on_line), daemon=True)
               for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr)) if stream is not None]
    for t in readers:
        t.start()
    received: list[int] = []

    def forward(sig, _frame):
        received.append(sig)
        proc.send_signal(sig)

    old = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, forward)
    except ValueError:  # not the main thread: nothing to forward
        pass
    try:
        code = proc.wait()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    for t in readers:  # the rest of what torchrun wrote before it exited
        t.join(timeout=30)
    return Ended(code, received[0] if received else None)


def _pump(name: str, stream, on_line: Callable[[str, str], None]) -> None:
    """Read the stream to its end, whatever on_line does: a pipe left full would stop torchrun."""
    with stream:
        for line in stream:
            try:
                on_line(name, line)
            except Exception:  # noqa: BLE001  (e.g. a full disk: the line is lost, the run goes on)
                pass


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int | None = None, sig: int = signal.SIGKILL) -> None:
    """Have the kernel send `sig` to this process when its parent dies (Linux prctl
    PR_SET_PDEATHSIG; elsewhere nothing). parent: the pid the parent must still have, else this
    process already lost it before asking and ends now (the race of a parent killed meanwhile)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):  # no libc prctl: nothing to ask for
        return
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)


def die_with_torchrun(environ: Mapping[str, str] | None = None) -> None:
    """In a rank torchrun started (TORCHELASTIC_RUN_ID set): die with torchrun. If `lpdl train`
    started that torchrun (LAUNCHER_ENV), torchrun's parent must still be it: otherwise
    torchrun died, or is dying with its launcher, before this rank asked, and the rank ends now.
    A rank that srun started is left alone. environ: os.environ when not given."""
    environ = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" not in environ:
        return
    die_with_parent()
    launcher = environ.get(LAUNCHER_ENV)
    if launcher and sys.platform.startswith("linux") and _parent_of(os.getppid()) not in (int(launcher), None):
        os.kill(os.getpid(), signal.SIGKILL)


def _parent_of(pid: int) -> int | None:
    """pid's parent (Linux /proc), or None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def launch_ranks(a, todo) -> int:
    """`lpdl train --executor distributed` started by hand: the same command in n processes, one
    per node, under torchrun (this module), which die with this process. Refused in
    one line (exit 2) before any process starts if a live run writes one of the run folders
    (lpdl_core.pipeline.run.runlock). The console shows rank 0's output; everything goes to the log
    (lpdl_core.cli.ranklog). A failure is one line naming the rank, how to resume and the
    log; exit status 1 for a failed rank (2 if it gave its own lpdl error), 128 + the signal
    (130: Ctrl-C) when interrupted."""
    import shutil
    import time

    from .ranklog import RankLog, log_path, torchrun_options
    from ..pipeline.run.runlock import refuse_live_run
    from ..pipeline.run.runstore import check_writable_dir

    nodes = {c.nodes for c in todo}
    if len(nodes) > 1:
        raise LpdlError("the cells of one distributed launch must have the same number of nodes, got "
                        + ", ".join(f"{c.cell_id} ({c.nodes})" for c in todo))
    n = nodes.pop()
    outs = [a.out.replace("{cell}", c.cell_id) for c in todo]
    for out in outs:
        refuse_live_run(out)
    check_writable_dir(outs[0], "run folder")
    path = log_path(outs[0])  # one launch, one log: in its first cell's run folder
    tee_dir = path.with_suffix(".torchrun")
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    rank_log = RankLog(path, f"lpdl train (pid {os.getpid()}), {started}: {n} processes under torchrun; "
                             f"argv: {a.argv}")
    log.info("train: starting %d processes (one per node) with torchrun", n)
    ended, line, status = None, "", 0
    try:
        ended = run_children(torchrun_argv(n, a.argv, options=torchrun_options(tee_dir)),
                             {**child_env(n), LAUNCHER_ENV: str(os.getpid())}, on_line=rank_log.line)
        if ended.code != 0:
            why, status = rank_log.failure(ended.code, ended.signal, n)
            line = f"lpdl train: error: {why}"
    finally:
        rank_log.close(line or (f"exit status {ended.code}" if ended else ""))
        shutil.rmtree(tee_dir, ignore_errors=True)  # torchrun's per-rank copies: the log holds them
    if line:
        print(line, file=sys.stderr, flush=True)
    return status
