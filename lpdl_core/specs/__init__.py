"""One spec per kind, torch-free: every fact the planner, the cells, the bill and the report need
about an executor (executors.py), a gossip compressor (compressors.py), a decentralized algorithm
(algorithms.py), a model (models.py), a dataset (datasets.py), a graph (graphs.py) or a fidelity
option's values (fidelity.py), written once. Each kind's implementation registers under the same
name, or is named by its spec as "module:function" (`named`; a test holds each spec and its
implementation together), and code asks the spec what a kind can do instead of comparing its name."""
from __future__ import annotations

import importlib
from typing import Callable


def named(package: str, path: str) -> Callable:
    """The function a spec names as "module:function" in `package`, imported only now."""
    module, function = path.split(":")
    return getattr(importlib.import_module(f"{package}.{module}"), function)
