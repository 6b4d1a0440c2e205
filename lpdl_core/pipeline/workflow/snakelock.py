"""Clear Snakemake's working-directory lock only when no live Snakemake holds it.

Snakemake locks its working directory (`.snakemake/locks/`) while it runs. A run killed with
kill -9 leaves the lock behind, and the next run refuses to start until `snakemake --unlock`.
Unlocking blindly is dangerous: if a pipeline is still running, a second one would train the
same cells at the same time. The lock files hold no process id, so liveness is read from the
process table: a live process whose command line is Snakemake's and whose working directory
(or --directory) is this folder. Linux reads /proc; elsewhere `ps` and `lsof` are used.
"""
from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from ...errors import LpdlError


def _is_snakemake(argv: list[str]) -> bool:
    """`snakemake ...`, `python [opts] /path/snakemake ...` or `python [opts] -m snakemake ...`
    (not, say, `grep snakemake`)."""
    if not argv:
        return False
    if os.path.basename(argv[0]) == "snakemake":
        return True
    if not os.path.basename(argv[0]).startswith("python"):
        return False
    rest = argv[1:]
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        rest = rest[1:]
    if rest[:1] == ["-m"]:
        return len(rest) > 1 and rest[1].split(".")[0] == "snakemake"
    return bool(rest) and os.path.basename(rest[0]) == "snakemake"


def _workdir(argv: list[str], cwd: Path) -> Path:
    """The directory a Snakemake command line works in (--directory/-d, else its cwd)."""
    for i, a in enumerate(argv):
        for flag in ("--directory", "-d"):
            if a == flag and i + 1 < len(argv):
                return (cwd / argv[i + 1]).resolve()
            if a.startswith(flag + "="):
                return (cwd / a.split("=", 1)[1]).resolve()
    return cwd.resolve()


def _processes_proc() -> list[tuple[int, list[str], Path]]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            argv = [a for a in argv if a]
            if argv and _is_snakemake(argv):
                out.append((int(entry.name), argv, Path(os.readlink(entry / "cwd"))))
        except OSError:  # gone, or another user's process we cannot inspect
            continue
    return out


def _processes_ps() -> list[tuple[int, list[str], Path]]:
    try:
        table = subprocess.run(["ps", "-Ao", "pid=,args="], capture_output=True, text=True,
                               check=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise LpdlError(f"cannot list processes ({e}); run `snakemake --unlock` yourself if no "
                        f"Snakemake is running here") from None
    out = []
    for line in table.splitlines():
        pid_text, _, args = line.strip().partition(" ")
        try:
            argv = shlex.split(args)
        except ValueError:
            argv = args.split()
        if not pid_text.isdigit() or int(pid_text) == os.getpid() or not _is_snakemake(argv):
            continue
        try:
            lsof = subprocess.run(["lsof", "-a", "-d", "cwd", "-p", pid_text, "-Fn"],
                                  capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError) as e:
            raise LpdlError(f"cannot read the working directory of Snakemake pid {pid_text} ({e}); "
                            f"not clearing the lock") from None
        cwd = next((l[1:] for l in lsof.splitlines() if l.startswith("n")), None)
        if cwd is None:
            raise LpdlError(f"cannot read the working directory of Snakemake pid {pid_text}; "
                            f"not clearing the lock")
        out.append((int(pid_text), argv, Path(cwd)))
    return out


def live_snakemakes(workdir: str | os.PathLike) -> list[tuple[int, str]]:
    """(pid, command line) of every live Snakemake working in workdir: its --directory read against
    the folder it started in, or its working folder now (Snakemake changes into its --directory
    once started, so the process table shows that folder, not the one its arguments are relative to)."""
    target = Path(workdir).resolve()
    procs = _processes_proc() if Path("/proc/self/cmdline").exists() else _processes_ps()
    return [(pid, " ".join(argv)) for pid, argv, cwd in procs
            if target in (_workdir(argv, cwd), cwd.resolve())]


def lock_files(workdir: str | os.PathLike) -> list[Path]:
    d = Path(workdir) / ".snakemake" / "locks"
    return sorted(p for p in d.iterdir() if p.is_file()) if d.is_dir() else []


def unlock_if_stale(workdir: str | os.PathLike = ".") -> str:
    """Remove a lock left by a dead run; LpdlError (one line) if a live Snakemake works here.
    Returns what was done, as one line."""
    locks = lock_files(workdir)
    live = live_snakemakes(workdir)
    if live:
        pid, cmd = live[0]
        more = f" and {len(live) - 1} more" if len(live) > 1 else ""
        raise LpdlError(f"a Snakemake run is still working in {Path(workdir).resolve()} (pid {pid}{more}: "
                        f"{cmd[:80]}); not clearing its lock. Wait for it, or stop it first")
    if not locks:
        return "no lock to clear"
    for p in locks:
        p.unlink(missing_ok=True)
    return f"cleared a stale lock left by a run that is no longer alive ({len(locks)} lock files)"
