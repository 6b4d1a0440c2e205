"""The command line's building blocks: its parser and help classes, argument types, size limits
and the early check of an output file."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..config import DEFAULT_DIST_TIMEOUT_S, MAX_BATCH, MAX_DEMO_EPOCHS, MAX_DIST_TIMEOUT_S, MAX_NODES, MAX_SEED  # noqa: F401

# Upper bounds that stop absurd sizes before anything is allocated: lpdl_core.config's MAX_*, the
# one home of each limit (the workflow config and the cells CSVs check the same ones).
DEFAULT_TIMEOUT_S = DEFAULT_DIST_TIMEOUT_S  # lpdl_core.config's, as training.group uses it


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's help ends with `(default: X)` where X says something: not for flags, nor for
    None (not given; the help says what that means), nor where the help already names its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        d, text = action.default, action.help or ""
        if d is None or d is False or d == [] or d == argparse.SUPPRESS or "default" in text:
            return text
        return super()._get_help_string(action)


class OneLineParser(argparse.ArgumentParser):
    """argparse with its usage errors as one line: `lpdl <cmd>: error: <why>`, exit 2, and help
    that shows defaults."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def choice_list(choices: tuple[str, ...]):
    """An argparse type: comma-separated values, each one of `choices`, none twice (a tuple)."""
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(v.strip() for v in text.split(","))
        for v in values:
            if v not in choices:
                raise argparse.ArgumentTypeError(f"{v!r} is not one of {', '.join(choices)}")
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"{text!r} names a value twice")
        return values
    parse.__name__ = "list"
    return parse


def count_arg(lo: int, hi: int | None = None):
    """An argparse type: an integer in [lo, hi]."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{v} is outside [{lo}, {hi if hi is not None else '...'}]")
        return v
    parse.__name__ = "integer"
    return parse


def real_arg(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False):
    """An argparse type: a number in the interval from lo to hi (each end closed unless open);
    NaN is never in it."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not ((lo < v if lo_open else lo <= v) and (v < hi if hi_open else v <= hi)):
            raise argparse.ArgumentTypeError(f"{v} is outside {'(' if lo_open else '['}{lo}, {hi}"
                                             f"{')' if hi_open else ']'}")
        return v
    parse.__name__ = "number"
    return parse


unit_arg = real_arg(0, 1)                                          # a fraction, e.g. the skew
percent_arg = real_arg(0, 100, hi_open=True)                       # a percentage dropped
timeout_seconds = real_arg(0, MAX_DIST_TIMEOUT_S, lo_open=True)  # a rank's wait for another
seed_arg = count_arg(0, MAX_SEED)                                  # a run's seed


def path_arg(text: str) -> str:
    """An argparse type: a path, never empty (an empty --out would write into the working folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (give a file or folder)")
    return text


path_arg.__name__ = "path"


def out_file(path: str | None, what: str = "output file") -> None:
    """One line before any work unless lpdl's atomic writer could write `path`: NotRegularFile
    when something else than a regular file is there (a device such as /dev/null, a FIFO, a
    folder; a symbolic link counts as its target), ConfigError unless its folder is writable (or
    creatable)."""
    if path:
        from ..atomic import write_target
        from ..pipeline.run.runstore import check_writable_dir

        target = write_target(path)
        check_writable_dir(target.parent if target.parent != Path("") else Path("."), what)
