"""One live run per run folder: the lock that refuses a second `lpdl train` into a folder a live
run still writes.

A run holds an exclusive `flock` on `<run folder>/.lpdl.lock` (LOCK_NAME) for the whole time
`run_cell` checks, trains and writes the folder (`holds_run_folder`; on rank 0 only, for the
distributed executor). The file holds the owner as one JSON line (pid, host, start time), for the
error message only: whether a run is live is the flock's answer, never the file's, and the kernel
drops a flock when its holder dies, so a run killed with kill -9 leaves a stale file that blocks
nothing. A second run is refused in one line before any work (`RunFolderBusy`, exit 2); the
distributed launcher asks the same question (`refuse_live_run`) before it starts torchrun.

The lock file is no run artifact: it is removed when the run ends (a killed run's stays, ignored),
its name starts with a dot (the aggregate step reads `seed*/metrics.json`, keep_run/restore_kept
copy the named artifacts only), and a folder created only to hold it is removed again, so a run
that fails before its first write leaves nothing behind.
"""
from __future__ import annotations

import functools
import json
import os
import socket
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ...errors import LpdlError
from ...run_options import RunOptions
from ...specs.executors import executor_spec
from ...training.group import LAUNCHER_ENV

try:
    import fcntl
except ImportError:  # no flock (Windows): runs are not locked
    fcntl = None

LOCK_NAME = ".lpdl.lock"
_TRIES, _PAUSE_S = 10, 0.05  # a checker's shared flock lasts microseconds: retry before refusing


class RunFolderBusy(LpdlError):
    """A live run holds the run folder's lock."""


@dataclass(frozen=True)
class Owner:
    """Who holds a run folder's lock, as its lock file says (pid 0: the file could not be read)."""

    pid: int = 0
    host: str = ""
    started: str = ""

    def describe(self) -> str:
        if not self.pid:
            return "pid unknown"
        return f"pid {self.pid}" + (f" on {self.host}" if self.host else "") + \
            (f", started {self.started}" if self.started else "")


def busy_error(run_dir: str | os.PathLike, owner: Owner) -> RunFolderBusy:
    return RunFolderBusy(f"{run_dir} is being written by a live run ({owner.describe()}); "
                         "wait for it to finish or stop it")


def live_owner(run_dir: str | os.PathLike) -> Owner | None:
    """The live run that holds run_dir's lock, or None. Writes and creates nothing."""
    if fcntl is None:
        return None
    try:
        fd = os.open(Path(run_dir) / LOCK_NAME, os.O_RDONLY)
    except OSError:  # no lock file (or none readable): no live run to name
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_owner(fd)
        return None
    finally:
        os.close(fd)


def refuse_live_run(run_dir: str | os.PathLike) -> None:
    """RunFolderBusy if a live run holds run_dir's lock."""
    owner = live_owner(run_dir)
    if owner is not None:
        raise busy_error(run_dir, owner)


@contextmanager
def hold_run_folder(run_dir: str | os.PathLike) -> Iterator[bool]:
    """Hold run_dir's lock for the body (RunFolderBusy first if a live run holds it); yields
    whether it is held. A folder this process cannot create or write in is not locked: the run's
    own checks (check_writable_dir) name the problem, and nothing can be written there anyway."""
    held = _take(Path(run_dir))
    try:
        yield held is not None
    finally:
        if held is not None:
            held.release()


def holds_run_folder(fn: Callable) -> Callable:
    """Decorates run_cell(cell, out_dir, ..., options=, group=): the call holds out_dir's lock,
    taken by the process that writes the folder (rank 0 of a one-process-per-node run, else the
    only one)."""
    @functools.wraps(fn)
    def call(cell, out_dir, *args, options: RunOptions = RunOptions(), group=None, **kwargs):
        if group is not None:
            writer = group.rank == 0
        else:  # joined inside fn: the rank its launcher gave this process
            writer = not executor_spec(options.executor).per_node_process or \
                int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) == 0
        with hold_run_folder(out_dir) if writer else nullcontext():
            return fn(cell, out_dir, *args, options=options, group=group, **kwargs)
    return call


@dataclass(frozen=True)
class _Held:
    fd: int
    path: Path
    made: tuple[Path, ...]  # the folders created to hold the lock, deepest first

    def release(self) -> None:
        try:
            self.path.unlink(missing_ok=True)  # while still held: a waiting taker sees the new file
        finally:
            os.close(self.fd)
            _remove_empty(self.made)


def _take(run_dir: Path) -> _Held | None:
    """The lock of run_dir, made if need be (RunFolderBusy if a live run holds it), or None where
    this process cannot create or lock it."""
    if fcntl is None:
        return None
    made = []
    probe = run_dir
    while not probe.exists() and probe.parent != probe:
        made.append(probe)
        probe = probe.parent
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / LOCK_NAME
        for attempt in range(_TRIES):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if _same_file(fd, path):
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, (json.dumps(_me()) + "\n").encode(), 0)
                    return _Held(fd, path, tuple(made))
                os.close(fd)  # locked a file its releasing holder had just removed: take the new one
            except BlockingIOError:
                owner = _read_owner(fd)
                os.close(fd)
                if attempt == _TRIES - 1:
                    _remove_empty(made)
                    raise busy_error(run_dir, owner) from None
                time.sleep(_PAUSE_S)
            except OSError:  # no flock here (some network file systems): run unlocked
                os.close(fd)
                raise
    except OSError:
        _remove_empty(made)
        return None
    _remove_empty(made)
    return None


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _me() -> dict:
    """This run as its lock file names it: the launcher's pid for a rank that `lpdl train` started
    (stopping it stops every rank), else this process's."""
    return {"pid": int(os.environ.get(LAUNCHER_ENV) or os.getpid()), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def _read_owner(fd: int) -> Owner:
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode())
        return Owner(pid=int(data["pid"]), host=str(data.get("host", "")), started=str(data.get("started", "")))
    except (OSError, ValueError, KeyError, TypeError):  # being written, or not ours
        return Owner()


def _remove_empty(folders) -> None:
    for d in folders:
        try:
            d.rmdir()
        except OSError:  # not empty (the run wrote something) or already gone
            pass
