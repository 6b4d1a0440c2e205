"""The failures lpdl expects and explains in one line (bad input, missing or corrupt files).

Every `lpdl` subcommand turns these into `lpdl <cmd>: error: <message>` with exit code 2; the
workflow's scripts print the same line into their logs. Anything else is a bug and keeps its
traceback.
"""
from __future__ import annotations


class LpdlError(Exception):
    """An expected failure whose message is one self-contained line."""


class ConfigError(LpdlError, ValueError):
    """A setting, CSV row or command-line value is invalid (the message names the field)."""


class CorruptFile(LpdlError):
    """A file lpdl wrote (metrics.json, a checkpoint, a cache) cannot be read or is not what it
    claims to be. The message names the file."""


class RunMismatch(LpdlError):
    """A run folder holds a result of another cell, seed, profile or setting than asked for."""


class DeviceUnavailable(LpdlError, RuntimeError):
    """The requested device (CUDA) is not available in this process."""


class WriteFailed(LpdlError, OSError):
    """A file could not be written (a full disk, no permission, an I/O error). The message names
    the path; the previous file, if any, is intact and no temp file is left behind."""


class NotRegularFile(WriteFailed):
    """lpdl writes results only to regular files: the path holds a device, FIFO, socket, folder
    or dangling symbolic link, which an atomic write would replace."""
