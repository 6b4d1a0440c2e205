"""Bounded reading of the files a user hands lpdl: config files, grid specs, step-time tables and
cell CSVs. Torch-free.

A YAML file is small text that may still stand for a huge value: anchors and aliases ("a YAML
alias bomb") let 1 kB describe 10^9 strings. PyYAML builds such a document quickly, sharing the
repeated parts, so the danger is in walking it: checking, validating or printing it expands every
alias. Every file is therefore read under a size limit and every loaded value is walked once
under a budget of MAX_VALUES values, counted as a walk of the expanded document sees them; past
either limit the error is one line naming the file and the limit, in well under a second.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import ConfigError

MAX_FILE_BYTES = 1_000_000     # a config file, grid spec or step-time table
MAX_CSV_BYTES = 20_000_000     # a cell table (the paper's six are 60 kB in all)
MAX_VALUES = 100_000           # values in one expanded YAML document (the largest shipped: under 2,000)


def read_text(path: str | Path, what: str, limit: int = MAX_FILE_BYTES) -> str:
    """The file's text, read only if it is at most `limit` bytes; ConfigError in one line
    otherwise (or if it cannot be read or is not UTF-8)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > limit:
            raise ConfigError(f"{path}: {size:,} bytes, more than a {what} may have ({limit:,})")
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def check_values(value: Any, where: str, limit: int = MAX_VALUES) -> None:
    """ConfigError naming `where` when the value, walked with every alias expanded, holds more than
    `limit` values; the walk stops at the limit, so the check costs at most `limit` steps."""
    budget = [limit]

    def walk(v: Any) -> None:
        budget[0] -= 1
        if budget[0] < 0:
            raise ConfigError(f"{where}: more than {limit:,} values once its YAML aliases are expanded "
                              f"(a YAML alias bomb?)")
        if isinstance(v, dict):
            for k, x in v.items():
                walk(k)
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)

    walk(value)


def load_yaml(path: str | Path, what: str, limit: int = MAX_FILE_BYTES) -> Any:
    """A YAML file's value, read under the size limit and checked under the value budget;
    ConfigError in one line otherwise (or when it is not YAML)."""
    import yaml

    text = read_text(path, what, limit)
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not YAML ({str(e).splitlines()[0]})") from None
    check_values(value, str(path))
    return value
