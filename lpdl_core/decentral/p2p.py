"""Point-to-point gossip between processes (torch.distributed), and how the processes start.

One process per node, started by `torchrun` (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set), by
`srun` (SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID mapped onto them; MASTER_ADDR and MASTER_PORT
exported by the job script), or by `launch` (local processes, for tests). All rendezvous through
env:// with a timeout, and every wait on a message is bounded by it too: a dead or stuck peer
fails the job (RuntimeError, non-zero exit) instead of hanging it.

`exchange` sends each out-neighbour its bytes and receives each in-neighbour's, only along the
graph's edges (isend/irecv posted together through batch_isend_irecv), and counts the bytes that
crossed the wire from the tensors sent.
"""
from __future__ import annotations

import datetime
import os
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from ..config import DEFAULT_DIST_TIMEOUT_S

# SLURM's names for what env:// reads (srun starts one task per node)
_SLURM_ENV = {"RANK": "SLURM_PROCID", "WORLD_SIZE": "SLURM_NTASKS", "LOCAL_RANK": "SLURM_LOCALID"}


@dataclass(frozen=True, kw_only=True)
class P2PCfg:
    """How the processes talk.

    backend: "gloo" (CPU tensors, any machine) or "nccl" (CUDA tensors).
    timeout_s: bound on the rendezvous and on every wait for a message.
    """

    backend: str = "gloo"
    timeout_s: float = DEFAULT_DIST_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"p2p backend must be 'gloo' or 'nccl', got {self.backend!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"p2p timeout_s must be > 0, got {self.timeout_s}")

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout_s)


def env_from_slurm(environ=None) -> None:
    """Fill RANK / WORLD_SIZE / LOCAL_RANK from srun's variables where they are unset (in
    os.environ when environ is not given)."""
    environ = os.environ if environ is None else environ
    for key, slurm in _SLURM_ENV.items():
        if key not in environ and slurm in environ:
            environ[key] = environ[slurm]


def init(cfg: P2PCfg = P2PCfg()) -> tuple[int, int]:
    """Join the process group through env:// (torchrun, srun or `launch`); returns (rank, world)."""
    env_from_slurm()
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"env:// rendezvous needs {', '.join(missing)} (start with torchrun or srun)")
    dist.init_process_group(cfg.backend, init_method="env://", timeout=cfg.timeout)
    return dist.get_rank(), dist.get_world_size()


def exchange(sends: dict[int, torch.Tensor], recvs: dict[int, int], *,
             timeout: datetime.timedelta | None = None, device: torch.device | str = "cpu"
             ) -> tuple[dict[int, torch.Tensor], int]:
    """Send sends[peer] (1-D uint8) to each out-neighbour and receive recvs[peer] bytes from each
    in-neighbour (into buffers on `device`), each wait bounded by `timeout` (None: the process
    group's, from `init`). Returns the received buffers and the bytes sent (numel·element_size of
    every tensor that left this process)."""
    got = {peer: torch.empty(n, dtype=torch.uint8, device=device) for peer, n in recvs.items()}
    ops = [dist.P2POp(dist.isend, buf.contiguous(), peer) for peer, buf in sends.items()]
    ops += [dist.P2POp(dist.irecv, buf, peer) for peer, buf in got.items()]
    if ops:
        for work in dist.batch_isend_irecv(ops):
            if timeout is None:
                work.wait()
            else:
                work.wait(timeout)
    return got, sum(b.numel() * b.element_size() for b in sends.values())


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, cfg: P2PCfg, fn: Callable, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    try:
        init(cfg)
        fn(*args)
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001  (report, then leave without waiting on dead peers)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def launch(fn: Callable, *args, world_size: int, cfg: P2PCfg = P2PCfg(), join_s: float | None = None
           ) -> list[int | None]:
    """Run fn(*args) in world_size local processes (spawned, gloo on 127.0.0.1, env://), as
    torchrun would; fn must be importable (module level). Waits at most join_s seconds (default
    twice the timeout plus a minute), kills what is still running then, and returns every
    process's exit code (None: killed)."""
    ctx = torch.multiprocessing.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(rank, world_size, port, cfg, fn, args))
             for rank in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + (2 * cfg.timeout_s + 60 if join_s is None else join_s)
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    return codes
