"""Atomic writes of regular files: the one writer behind every result, table, manifest and
checkpoint lpdl writes, and its text and standard-JSON forms (torch-free).

A write goes to a temp file in the destination's folder, is flushed to disk, then renamed over the
destination (os.replace): a reader, or a rerun after kill -9, sees the old file or the new one,
never half of one. Two rules keep that rename from hurting the machine or hiding a failure:

* only a regular file (or nothing) is replaced. Run as root, a rename over /dev/null or /dev/full
  would put a regular file where the device was; a FIFO, socket or folder is refused alike. A
  symbolic link to a regular file is followed: its target is written and the link kept.
* a failed write (a full disk, no permission, an I/O error) is one line naming the path
  (`WriteFailed`), with the previous file intact and the temp file removed.
"""
from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator, Mapping

import numpy as np

from .errors import NotRegularFile, WriteFailed

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _not_regular(path: str | os.PathLike, what: str) -> NotRegularFile:
    return NotRegularFile(f"{os.fspath(path)}: not a regular file ({what}); lpdl writes results only to "
                          f"regular files")


def write_target(path: str | os.PathLike) -> Path:
    """The file an atomic write of `path` replaces: `path` itself when it is a regular file or
    nothing is there, the link's target when it is a symbolic link to a regular file.
    NotRegularFile otherwise (a device, FIFO, socket, folder, a link to one of them or to nothing).
    Creates nothing. A path under a non-folder is returned as it is: creating its folder fails."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError:  # e.g. ENOTDIR: a component is a file; the write names it
        return path
    if stat.S_ISREG(mode):
        return path
    if not stat.S_ISLNK(mode):
        raise _not_regular(path, _kind(mode))
    try:
        target = os.stat(path).st_mode
    except OSError:  # dangling, a loop, or a target this process cannot reach
        raise _not_regular(path, "a symbolic link to nothing") from None
    if not stat.S_ISREG(target):
        raise _not_regular(path, f"a symbolic link to {_kind(target)}")
    return Path(os.path.realpath(path))


def write_failed(path: str | os.PathLike, e: BaseException) -> WriteFailed:
    """`cannot write <path>: <why>` for an OSError (or an exception that wraps one, as torch's
    writer does), keeping its errno."""
    cause = e
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, OSError):
        why = cause.strerror or str(cause) or type(cause).__name__
    else:
        why = (str(e).splitlines() or [type(e).__name__])[0]
    err = WriteFailed(f"cannot write {os.fspath(path)}: {why}")
    err.errno = getattr(cause, "errno", None)
    return err


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def replacing(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """`with replacing(path) as f: f.write(...)`: the bytes written to f become `path` atomically
    when the block ends (see the module docstring). NotRegularFile before anything is created; an
    OSError in the block or while saving is WriteFailed naming `path`; whatever goes wrong, the
    previous file stays and the temp file is removed. Folders above `path` are created."""
    target = write_target(path)
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # a full disk may only show here (delayed allocation, NFS)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; results are ordinary files
        os.replace(tmp, target)
        tmp = None
    except WriteFailed:
        raise
    except OSError as e:
        raise write_failed(path, e) from e
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """`data` as the content of `path`, atomically; returns `path`."""
    with replacing(path) as f:
        f.write(data)
    return Path(path)


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """`text` (UTF-8) as the content of `path`, atomically and only over a regular file
    (lpdl_core.atomic): NotRegularFile or WriteFailed in one line naming the path otherwise."""
    return write_bytes(path, text.encode("utf-8"))


def finite(obj):
    """obj with every non-finite float (NaN, inf) replaced by None, so the JSON is standard."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def write_json(path, obj) -> Path:
    """Standard JSON (strict parsers accept it): non-finite floats become null."""
    plain = json.loads(json.dumps(obj, default=_jsonable))  # numpy / dataclasses -> plain types
    return write_atomic(path, json.dumps(finite(plain), indent=2, sort_keys=True, allow_nan=False) + "\n")


def _jsonable(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if hasattr(o, "__dataclass_fields__"):
        from dataclasses import asdict
        return asdict(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")
