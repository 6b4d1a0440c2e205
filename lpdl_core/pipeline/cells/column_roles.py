"""What each column of a cell is for, declared once: as field metadata on `Cell` (lpdl_core.pipeline.cells.cell).

Every list of cell columns elsewhere is `columns(Cell, role)`, in `Cell`'s field order: a paper CSV's
header, the run identity, what a mini run reads, what the cells of a pack share, the axes of the
results tables, what a grid sets, what the report pairs runs on. A new column is one field with its
roles, and every list follows. The roles:
"""
from __future__ import annotations

import math
from dataclasses import MISSING, Field, field, fields
from typing import Any

ROLES: dict[str, str] = {
    "csv": "a column of every paper cell CSV, in this order",
    "optional": "an open-grid column: optional in a cell CSV (after the paper's, in this order), its default "
                "the paper's; a run identity leaves it out at its default, so the paper's runs keep theirs",
    "identity": "changes what a run computes: part of the run identity (lpdl_core.pipeline.run.runstore)",
    "mini": "a mini run reads it, besides the algorithm's gossip kind, the seed and the length "
            "(lpdl_core.pipeline.recipe.mini.run_key)",
    "pack": "every cell of a pack shares it (lpdl_core.pipeline.recipe.packing.pack_key)",
    "table": "an axis of every results table, tables/<table>.csv (lpdl_core.pipeline.aggregation.aggregate)",
    "grid-table": "an axis of an extension grid's results table too (a grid may vary it)",
    "runs": "a column of runs.csv (lpdl_core.pipeline.aggregation.tidy)",
    "settable": "a grid may set it: fixed, derived or, unless `not_axis` says why not, as an axis",
    "pairing": "the report's effects pair runs that agree on it (lpdl_core.report.effects)",
    "setting": "a claims-study run's settings: pairs agree on all but the claim's axis (lpdl_core.report.claims)",
    "compare": "an axis of the fidelity-mode comparison (lpdl_core.report.modes)",
}
# how a CSV cell's text becomes the value: int, float (finite), ints (';'-separated), float? (empty:
# None), str
KINDS = ("str", "int", "float", "ints", "float?")


def column(*roles: str, kind: str = "str", default: Any = MISSING, not_axis: str = "",
           id_code: str = "") -> Any:
    """A `Cell` field with its roles. not_axis: why a grid may not vary it (settable columns only);
    id_code: the prefix a grid id gives its value where two cells differ in it (e.g. "len" for -len12)."""
    unknown = sorted(set(roles) - set(ROLES))
    if unknown or kind not in KINDS:
        raise ValueError(f"unknown role {unknown[0]!r}" if unknown else f"unknown kind {kind!r}")
    if not_axis and "settable" not in roles:
        raise ValueError("not_axis is for settable columns")
    return field(default=default, metadata={"roles": frozenset(roles), "kind": kind, "not_axis": not_axis,
                                            "id_code": id_code})


def _columns_of(cls) -> tuple[Field, ...]:
    return tuple(f for f in fields(cls) if "roles" in f.metadata)


def columns(cls, role: str) -> tuple[str, ...]:
    """The names of cls's columns with `role`, in field order."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}")
    return tuple(f.name for f in _columns_of(cls) if role in f.metadata["roles"])


def not_columns(cls) -> tuple[str, ...]:
    """cls's fields that are no column of a cell table (neither csv nor optional)."""
    return tuple(f.name for f in fields(cls)
                 if not {"csv", "optional"} & set(f.metadata.get("roles", ())))


def defaults(cls, role: str) -> dict[str, Any]:
    """name -> default of cls's columns with `role` (those that have one)."""
    return {f.name: f.default for f in _columns_of(cls) if role in f.metadata["roles"] and f.default is not MISSING}


def meta(cls, name: str, key: str) -> Any:
    """One metadata entry (kind, not_axis, id_code) of the column `name`."""
    return next(f.metadata[key] for f in _columns_of(cls) if f.name == name)


def _finite(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError("not a finite number")
    return v


def parse(cls, name: str, text: str) -> Any:
    """The value of column `name` from its text in a CSV or a grid spec (ValueError when malformed)."""
    text = text.strip()
    kind = meta(cls, name, "kind")
    if kind == "int":
        return int(text)
    if kind == "float":
        return _finite(text)
    if kind == "ints":
        return tuple(int(m) for m in text.split(";")) if text else ()
    if kind == "float?":
        return _finite(text) if text else None
    return text
