"""What a hand-started distributed run shows: rank 0's lpdl lines on the console, everything in
one log file, and a failure as one line that names the rank, the way to resume and the log.

`lpdl train --executor distributed` runs torchrun with every rank's output tee'd and each line
prefixed with its rank (`torchrun_options`: `--tee 3`, `[rank<k>] `), and torchrun's own output
piped to it (`ranks.run_children`). `RankLog.line` copies every line, as it comes, to the log
file (`log_path`: `<run folder>/.logs/distributed-<UTC time>.log`, the first cell's folder when
one launch trains several) and passes to the console only rank 0's result lines (its stdout)
and its `lpdl: ...` notices (progress, warnings): a successful run shows what a single process
would. Tracebacks, the other ranks' output and torchrun's own messages (its ChildFailedError
block) go to the log only.

When torchrun fails, `RankLog.failure` says which rank: one killed by a signal torchrun did not
send (kill -9, the OOM killer), else the root cause of torchrun's failure block (rank 0 when the
error is rank 0's, broadcast to all); how it ended (its own `lpdl <cmd>: error: ...` line if it
printed one, else the signal or the exit code and its last exception line); and that rerunning
the same command resumes from the last epoch every rank saved.
"""
from __future__ import annotations

import re
import signal
import sys
import threading
import time
from pathlib import Path

RANK_PREFIX = "[rank${rank}] "  # torchrun's --log-line-prefix-template
_RANK_LINE = re.compile(r"\[rank(\d+)\] (.*)", re.S)
_OWN_ERROR = re.compile(r"lpdl \w+: error: (.*)")
_EXCEPTION = re.compile(r"(?:\[rank\d+\]: )?([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)(?::.*)?)$")
_ENTRY = re.compile(r"\s*\[\d+\]:\s*")
_FAILURE_FIELD = re.compile(r"\s*(rank|exitcode)\s*:\s*(-?\d+)")
RESUME = "rerun the same command to resume from the last epoch every rank saved"


def torchrun_options(tee_dir: str | Path) -> tuple[str, ...]:
    """Every rank's stdout and stderr tee'd through torchrun, each line prefixed with the rank.
    tee_dir: where torchrun keeps its own per-rank copies (removed once the log holds them)."""
    return ("--log-dir", str(tee_dir), "--tee", "3", f"--log-line-prefix-template={RANK_PREFIX}")


def log_path(run_dir: str | Path) -> Path:
    """Where a launch into run_dir logs: `<run_dir>/.logs/distributed-<UTC time>.log` (a dot
    folder: no run artifact, never read by the aggregate step, survives a failed job)."""
    return Path(run_dir) / ".logs" / f"distributed-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.log"


class RankLog:
    """The log file of one launch, and the console's share of it (see the module docstring).
    `line` is called from one thread per stream: it takes a lock."""

    def __init__(self, path: Path, header: str):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8", errors="replace")
        self._lock = threading.Lock()
        self._own_error: dict[int, str] = {}  # rank -> its `lpdl <cmd>: error:` message
        self._last_exception: dict[int, str] = {}  # rank -> the last exception line it wrote
        self._failures: list[dict] = []  # the entries of torchrun's failure block
        self._section: str | None = None  # where in that block torchrun's output is
        self._write(header if header.endswith("\n") else header + "\n")

    def line(self, stream: str, text: str) -> None:
        if not text.endswith("\n"):
            text += "\n"
        with self._lock:
            self._write(text)
            m = _RANK_LINE.fullmatch(text)
            if m is None:
                self._torchrun_line(text)
                return
            rank, body = int(m.group(1)), m.group(2)
            if stream == "stderr":
                self._rank_stderr(rank, body.rstrip("\n"))
            if rank == 0 and (stream == "stdout" or body.startswith("lpdl: ")):
                console = sys.stdout if stream == "stdout" else sys.stderr
                try:
                    console.write(body)
                    console.flush()
                except (OSError, ValueError):  # the console went away (`| head`): the log still has it
                    pass

    def close(self, outcome: str = "") -> None:
        with self._lock:
            if outcome:
                self._write(outcome + "\n")
            self._file.close()

    def failure(self, code: int, received: int | None, nodes: int) -> tuple[str, int]:
        """The one error line (without the `lpdl train: error: ` prefix) of a failed launch, and
        its exit status: 128 + the signal when interrupted (130: Ctrl-C), 2 when the failed rank
        gave its own lpdl error (as any lpdl error), 1 otherwise."""
        where = f"full output in {self.path}"
        if received is not None:
            return (f"interrupted ({_signal_name(received)}): all {nodes} processes stopped; {RESUME}; {where}",
                    128 + received)
        rank, exitcode = self._culprit()
        if rank is not None and rank in self._own_error:
            if self._own_error.get(0) == self._own_error[rank]:
                rank = 0  # rank 0's error, which every rank takes from its broadcast (Group.first)
            return f"rank {rank} of {nodes} stopped: {self._own_error[rank]}; once that is fixed, {RESUME}; {where}", 2
        if rank is None:
            how = f"torchrun ended with exit status {code} without naming a failed rank"
        elif exitcode is not None and exitcode < 0:
            how = f"rank {rank} of {nodes} was killed by {_signal_name(-exitcode)}"
        else:
            how = f"rank {rank} of {nodes} failed" + (f" with exit code {exitcode}" if exitcode is not None else "")
            if rank in self._last_exception:
                how += f" ({_short(self._last_exception[rank])})"
        return f"{how}; {RESUME}; {where}", 1

    # ------------------------------------------------------------------ parsing
    def _write(self, text: str) -> None:
        self._file.write(text)
        self._file.flush()  # a launcher killed mid-run leaves its log complete up to that line

    def _rank_stderr(self, rank: int, body: str) -> None:
        own = _OWN_ERROR.fullmatch(body)
        if own and rank not in self._own_error:
            self._own_error[rank] = own.group(1)
        exc = _EXCEPTION.match(body)
        if exc:
            self._last_exception[rank] = exc.group(1)

    def _torchrun_line(self, text: str) -> None:
        """torchrun's ChildFailedError block: `[i]:` entries of `rank : k (local_rank: k)` and
        `exitcode : -9 (pid: ...)`, under `Failures:` and `Root Cause (first observed failure):`."""
        if "ChildFailedError" in text:
            self._section, self._failures = "failures", []
        elif "Root Cause" in text and self._section:
            self._section = "root"
        elif self._section and _ENTRY.fullmatch(text):
            self._failures.append({"root": self._section == "root"})
        elif self._section and self._failures and (m := _FAILURE_FIELD.match(text)):
            self._failures[-1][m.group(1)] = int(m.group(2))

    def _culprit(self) -> tuple[int | None, int | None]:
        """The failed rank and its exit code: one killed by a signal other than those torchrun
        stops the others with, else torchrun's root cause, else (no block: torchrun itself failed)
        the lowest rank that printed its own error line."""
        entries = [f for f in self._failures if "rank" in f]
        for f in entries:
            if f.get("exitcode", 0) < 0 and -f["exitcode"] not in (signal.SIGTERM, signal.SIGINT):
                return f["rank"], f["exitcode"]
        if entries:
            f = ([f for f in entries if f["root"]] or entries)[0]
            return f["rank"], f.get("exitcode")
        if self._own_error:
            return min(self._own_error), None
        return None, None


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
