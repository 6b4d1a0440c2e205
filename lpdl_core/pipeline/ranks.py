"""How a training command runs its cells on the distributed executor: n processes, one per node.

`lpdl train --executor distributed` started by hand (no rank of its own) starts its n processes
with `torchrun` (`torchrun_argv`, `run_children`): the same command, once per node, on this
host. Started as one of them, by torchrun or by `srun -n N` in a SLURM job of N tasks (the
workflow's train job; `slurm_master_env` names the rendezvous host), it joins the group through
the standard env:// rendezvous (`Group.join`, lpdl_core.decentral.p2p) and trains node `rank`.

Everything that writes a run folder (finished-run checks, restoring kept copies, the result
files) happens on rank 0 only (`Group.first`), and the other ranks take its answer, or its
error, from a broadcast. A rank that dies or stops answering fails the job within the timeout
(torchrun and `srun --kill-on-bad-exit` stop the others at once; every message wait and
collective is bounded by `timeout_s`).

No orphans: torchrun dies with the `lpdl train` that started it, and each rank with torchrun
(`die_with_parent`: Linux's parent-death signal), so a launcher killed with kill -9 (an OOM
killer) leaves no process writing its run folder. Under SLURM (srun starts the ranks) nothing
changes.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Mapping, TypeVar

from ..config import DEFAULT_DIST_TIMEOUT_S
from ..executor_specs import executor_spec
from ..errors import LpdlError

T = TypeVar("T")
DEFAULT_TIMEOUT_S = DEFAULT_DIST_TIMEOUT_S  # the rendezvous, every message wait and every collective
LAUNCHER_ENV = "LPDL_LAUNCHER_PID"  # set by `lpdl train` for the ranks it starts: the pid to stop


def in_group(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is one rank of a started group: torchrun's RANK, or one task of a
    SLURM step of several tasks (srun -n N). environ: os.environ when not given."""
    environ = os.environ if environ is None else environ
    if "RANK" in environ:
        return True
    return "SLURM_PROCID" in environ and int(environ.get("SLURM_STEP_NUM_TASKS", "1")) > 1


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


def slurm_master_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """MASTER_ADDR (the job's first host) and MASTER_PORT (from the job id, so two jobs sharing a
    host differ) for the ranks of a SLURM job, unless already set. environ: os.environ when not given."""
    environ = os.environ if environ is None else environ
    out = {}
    if "MASTER_ADDR" not in environ:
        nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
        host = None
        if nodelist:
            try:
                host = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                                      text=True, timeout=30, check=True).stdout.split()[0]
            except (OSError, subprocess.SubprocessError, IndexError):
                host = None
        out["MASTER_ADDR"] = host or "127.0.0.1"
    if "MASTER_PORT" not in environ:
        out["MASTER_PORT"] = str(20000 + int(environ.get("SLURM_JOB_ID", "0")) % 20000)
    return out


@dataclass
class Group:
    """This process's place among the run's processes: rank 0 of 1 for the in-process executors."""

    rank: int = 0
    world: int = 1
    distributed: bool = False

    @classmethod
    def join(cls, executor: str, *, device: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S) -> "Group":
        """The group of this run: joined once (env://) for the distributed executor; NCCL when the
        ranks train on CUDA (each on GPU LOCAL_RANK mod the GPUs it sees), gloo otherwise."""
        if not executor_spec(executor).per_node_process:
            return cls()
        import torch
        import torch.distributed as dist

        from ..decentral import p2p
        from ..decentral.engine import resolve_device

        if not dist.is_initialized():
            if not in_group():
                raise LpdlError("the distributed executor runs as one of n processes: start it with "
                                "`lpdl train --executor distributed` (it starts them), torchrun or srun -n N")
            cuda = resolve_device(device).type == "cuda"
            if cuda:
                p2p.env_from_slurm()
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
            p2p.init(p2p.P2PCfg(backend="nccl" if cuda else "gloo", timeout_s=timeout_s))
        return cls(rank=dist.get_rank(), world=dist.get_world_size(), distributed=True)

    def first(self, fn: Callable[[], T]) -> T:
        """fn() on rank 0; every rank returns its value, or raises its LpdlError/ValueError/OSError
        (the other ranks as an LpdlError with the same message)."""
        if not self.distributed:
            return fn()
        import torch.distributed as dist

        box: list = [None]
        err = None
        if self.rank == 0:
            try:
                box[0] = ("ok", fn())
            except (LpdlError, ValueError, OSError) as e:
                err, box[0] = e, ("error", str(e))
        dist.broadcast_object_list(box, src=0)
        if err is not None:
            raise err
        kind, value = box[0]
        if kind == "error":
            raise LpdlError(value)
        return value

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()

    def leave(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
