"""Inductor's on-disk cache, kept apart for each version of lpdl's code.

torch keeps compiled graphs on disk (``TORCHINDUCTOR_CACHE_DIR``, by default
``<tmp>/torchinductor_<user>``) and finds them again by a key of the traced graph. That key does
not cover everything lpdl hands the compiler: the backward a custom operator registers
(`torch.library.register_autograd`) is traced from Python the key does not see. After an lpdl
update that changes such an operator's arguments, a graph compiled by the old code is found and
calls the operator the old way, and the run fails ("missing value for argument ..."); a changed
body would be worse, silently the old arithmetic.

So, unless ``TORCHINDUCTOR_CACHE_DIR`` is set (the user's choice is kept), lpdl points inductor at
a subfolder of its default named by a hash of lpdl's own sources: runs of one version share
their compilations, as before, and another version compiles afresh.
"""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

ENV = "TORCHINDUCTOR_CACHE_DIR"
PACKAGE = Path(__file__).resolve().parent


@functools.cache
def source_key(root: Path = PACKAGE) -> str:
    """12 hex digits of a hash of every .py file under root (its relative path and its bytes)."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def use_versioned_cache(root: Path = PACKAGE) -> str:
    """Set TORCHINDUCTOR_CACHE_DIR to the default folder's `lpdl-<source_key>` subfolder unless
    it is set already; returns the folder in effect. Call before compiling (inductor reads it
    each time it opens its cache)."""
    if os.environ.get(ENV):
        return os.environ[ENV]
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    os.environ[ENV] = os.path.join(default_cache_dir(), f"lpdl-{source_key(root)}")
    return os.environ[ENV]
