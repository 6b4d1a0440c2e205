"""`main`, the `lpdl` entry point: parse, set up logging, run the command, and turn an expected
failure into one line on stderr."""
from __future__ import annotations

import argparse
import difflib
import logging
import sys

from ..errors import LpdlError
from .parser import lpdl_version, build_parser

log = logging.getLogger("lpdl.cli")  # one logger, shared by the package's modules


class _CurrentStderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time of the record (tests swap it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):  # StreamHandler.__init__ assigns a stream: ignored, always the current one
        return


def _setup_logging(level: int = logging.INFO) -> None:
    """Progress and notices (the CLI's and the library's: a rebuilt cache, ...) as one `lpdl: ...`
    line each on stderr, from `level` up."""
    logger = logging.getLogger("lpdl")
    if not logger.handlers:
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("lpdl: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    return next(list(a.choices) for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    given = list(sys.argv[1:] if argv is None else argv)
    if not given:  # a bare `lpdl`: what it is and what it can do
        parser.print_help()
        return 2
    first = next((a for a in given if not a.startswith("-")), None)
    commands = _commands(parser)
    if first is not None and first not in commands:  # the global options take no values
        close = difflib.get_close_matches(first, commands, n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else f"; commands: {', '.join(commands)}"
        print(f"lpdl: error: unknown command '{first}'{hint}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as given (a launcher passes them on)
    _setup_logging(args.log_level)
    options = {k: v for k, v in vars(args).items() if k not in ("func", "command", "log_level", "argv")}
    log.debug("lpdl %s (python %s), command %s, options: %s", lpdl_version(), sys.version.split()[0], args.command,
              ", ".join(f"{k}={v!r}" for k, v in options.items()) or "none")
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `lpdl cells | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print(f"lpdl {args.command}: interrupted", file=sys.stderr)
        return 130
    except (LpdlError, ValueError, OSError) as e:  # expected failures: one clear line
        print(f"lpdl {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 2


def _one_line(e: BaseException) -> str:
    """An exception as one line: OSErrors name their file; line breaks become spaces."""
    if isinstance(e, OSError) and not isinstance(e, LpdlError) and e.filename is not None:
        text = f"{e.strerror or type(e).__name__}: {e.filename}"
    else:
        text = str(e) or type(e).__name__
    return " ".join(text.split())
