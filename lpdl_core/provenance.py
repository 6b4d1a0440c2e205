"""Where a result came from: the library's git state and code hash, versions and device (torch-free
at import: torch is read only when `provenance()` is called)."""
from __future__ import annotations

import functools
import hashlib

from .config import PACKAGE_DIR


def git(*args: str) -> str | None:
    """A git command's output in the library's own checkout (None outside one). Torch-free."""
    import subprocess

    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                              cwd=PACKAGE_DIR, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


@functools.cache
def code_sha256() -> str:
    """sha256 over the library's Python sources (paths and contents), git or not: kept copies of
    finished runs are restored only for the same library code."""
    h = hashlib.sha256()
    for p in sorted(PACKAGE_DIR.rglob("*.py")):
        h.update(p.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def provenance() -> dict:
    """Git SHA (and dirty flag), versions and devices, stored with every run."""
    import platform

    import torch


    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_sha": git("rev-parse", "HEAD"), "git_dirty": bool(status) if status is not None else None,
            "code_sha256": code_sha256(),
            "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "device_name": (torch.cuda.get_device_name() if torch.cuda.is_available()
                            else platform.processor() or platform.machine())}
