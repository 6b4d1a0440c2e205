"""The gossip compressors as a cell sees them (torch-free): each kind's name, how a cell id names it,
whether it drops the cell's compression percent, and the parameter it takes after a colon.

A cell's `compressor` column is a kind, with its parameter after a colon where it takes one
(`qsgd:4`, `minmax8:8`). The arithmetic of each kind (how it compresses a tensor, its exact wire
bytes) is registered under the same name in lpdl_core.decentral.compress.REGISTRY, and the packed
format the distributed executor sends in lpdl_core.decentral.wire.CODECS; a test holds the three
together. Everything that validates, names or configures a cell's compressor reads the spec.
"""
from __future__ import annotations

from dataclasses import dataclass



@dataclass(frozen=True, kw_only=True)
class Param:
    """A compressor's parameter: its name in messages, its range, and the CompressorCfg field it sets."""

    name: str
    lo: int
    hi: int
    field: str


@dataclass(frozen=True, kw_only=True)
class CompressorSpec:
    """name: the kind, as in a cell's compressor column. cell_id: the cell id's compression part,
    a format of `percent` (the compression column) and `param`. sparse: keeps a share of each
    tensor, dropping the compression column's percent (CompressorCfg.ratio = percent / 100; the
    legacy byte metric counts it 6K+3). param: the parameter it takes after a colon, if any."""

    name: str
    cell_id: str
    sparse: bool = False
    param: Param | None = None

    def settings(self, drop: float, param: int | None) -> dict:
        """The CompressorCfg fields a cell's drop fraction and parameter set."""
        if self.sparse:
            return {"ratio": drop}
        return {self.param.field: param} if self.param else {}


SPECS: dict[str, CompressorSpec] = {s.name: s for s in (
    CompressorSpec(name="identity", cell_id="ident"),
    CompressorSpec(name="topk", cell_id="c{percent}", sparse=True),
    CompressorSpec(name="randomk", cell_id="rk{percent}", sparse=True),
    CompressorSpec(name="minmax8", cell_id="mm{param}", param=Param(name="bits", lo=1, hi=16, field="bits")),
    CompressorSpec(name="qsgd", cell_id="qsgd{param}",
                   param=Param(name="level", lo=1, hi=32, field="qsgd_level")),
)}
COMPRESSORS = tuple(SPECS)
SPARSIFIERS = tuple(n for n, s in SPECS.items() if s.sparse)   # drop the compression column's percent

