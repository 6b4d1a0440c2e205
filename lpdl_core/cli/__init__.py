"""`lpdl` command line: the only package that parses argv or prints.

Command results (tables, JSON, written paths) go to stdout; progress and notices go to stderr
through stdlib logging (logger "lpdl", one `lpdl: ...` line each; -v adds debug lines, -q keeps
only warnings); errors are one `lpdl <cmd>: error: ...` line on stderr.

Modules:

    entry.py                main: logging set-up, the command's run, errors as one line
    parser.py               build_parser: every command and option, with its help; --version
    args.py                 the parser classes, argument types, size limits, the output-file check
    train.py                lpdl train (one process, several cells, or one process per node)
    library_commands.py     topology, partition, demo, bench, models
    data_commands.py        rehearsal-data (and the other commands that prepare or measure data)
    pipeline_commands.py    prefetch, cells, report, aggregate, cost, partition-figures, timing,
                            targets, unlock

Importing this package imports no torch: each command imports what it needs when it runs."""
from __future__ import annotations

from .args import DEFAULT_TIMEOUT_S, MAX_BATCH, MAX_NODES, HelpFormatter, OneLineParser
from .entry import main
from .parser import build_parser

__all__ = ["DEFAULT_TIMEOUT_S", "MAX_BATCH", "MAX_NODES", "HelpFormatter", "OneLineParser", "build_parser", "main"]
