"""The rendezvous of a SLURM job's ranks (srun starts them): the host and port they meet at."""
from __future__ import annotations

import os
import subprocess
from typing import Mapping


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
