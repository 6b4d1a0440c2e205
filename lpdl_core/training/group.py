"""The run's process group (`Group`): rank 0 of 1 for the in-process executors, rank i of n for
a one-process-per-node executor, joined through the standard env:// rendezvous
(lpdl_core.decentral.p2p) when this process is one of n started ranks (`in_group`).

Everything that writes a run folder (finished-run checks, restoring kept copies, the result
files) happens on rank 0 only (`Group.first`), and the other ranks take its answer, or its
error, from a broadcast. A rank that dies or stops answering fails the job within the timeout
(every message wait and collective is bounded by `timeout_s`). Who starts the ranks:
lpdl_core.cli.launch (torchrun) or srun.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping, TypeVar

from ..config import DEFAULT_DIST_TIMEOUT_S
from ..errors import LpdlError
from ..specs.executors import executor_spec

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
