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
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Mapping, TypeVar

from ..errors import LpdlError

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 300.0  # the rendezvous, every message wait and every collective


def in_group(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is one rank of a started group: torchrun's RANK, or one task of a
    SLURM step of several tasks (srun -n N). environ: os.environ when not given."""
    environ = os.environ if environ is None else environ
    if "RANK" in environ:
        return True
    return "SLURM_PROCID" in environ and int(environ.get("SLURM_STEP_NUM_TASKS", "1")) > 1


def torchrun_argv(nodes: int, args: list[str], python: str = sys.executable) -> list[str]:
    """`torchrun --standalone --nproc-per-node N -m lpdl_core <args>` for this interpreter."""
    return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nodes}",
            "--max-restarts=0", "-m", "lpdl_core", *args]


def child_env(nodes: int, threads: int | None = None, environ: Mapping[str, str] | None = None) -> dict:
    """The ranks' environment: `threads`, else OMP_NUM_THREADS, else this machine's CPUs, shared
    among the n ranks (at least one thread each). environ: os.environ when not given."""
    environ = os.environ if environ is None else environ
    total = (threads or int(environ.get("OMP_NUM_THREADS") or 0)
             or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()))
    return {**environ, "OMP_NUM_THREADS": str(max(1, int(total or 1) // nodes))}


def run_children(argv: list[str], env: Mapping[str, str]) -> int:
    """Run argv (torchrun) to its end and return its exit status; SIGINT and SIGTERM received
    meanwhile are passed on (torchrun stops its ranks)."""
    proc = subprocess.Popen(argv, env=dict(env))
    forward = lambda sig, _frame: proc.send_signal(sig)  # noqa: E731
    old = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, forward)
    except ValueError:  # not the main thread: nothing to forward
        pass
    try:
        return proc.wait()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


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
        if executor != "distributed":
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
