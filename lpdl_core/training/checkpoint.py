"""Checkpoints of a training run: written atomically after every epoch, read strictly on resume.

A run whose n nodes live in one process keeps one file, `checkpoint.pt`. A distributed run (one
process per node, `NodeProcess`) keeps one file per rank, `checkpoint.rank<i>of<n>.pt`, and the
rank's previous one beside it (`.prev`): the ranks save one after another, so a kill can land
between two ranks' saves of the same epoch. On resume every rank lists the epochs it can load,
and all ranks continue from the latest epoch that every rank saved (an all-gather of the lists);
each rank restores its own row, its wire state (the messages a receiver has not had yet, each
edge's last active round) and its RNGs, so a resumed run equals an uninterrupted one.

Which run a checkpoint belongs to is its fingerprint (`fingerprint`): the caller's run identity
(for a paper cell: the same record its metrics.json carries, lpdl_core.pipeline.run.runstore) and
the resolved plan (data, graph, gossip, optimizer, protocol, the model's tensors and
architecture). A checkpoint is resumed only when every part is equal; otherwise the notice names
the first part that differs.

A file that cannot be used (truncated, random bytes, another run's, another rank's) is renamed
aside, never deleted, and reported through a "checkpoint-set-aside" event.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

Progress = Callable[[dict], None]


def fingerprint(*, identity: Mapping | None, **plan: Any) -> str:
    """What a checkpoint must match, as canonical JSON: the run identity (None for a run that has
    none) and each part of the resolved plan by its repr (frozen dataclass reprs are stable)."""
    parts = {"identity": json.loads(json.dumps(identity, sort_keys=True, default=str)),
             **{k: v if isinstance(v, (str, int, float)) else repr(v) for k, v in plan.items()}}
    return json.dumps(parts, sort_keys=True)


# what a notice names first: who the run is, before how it is computed
_FIRST = {k: i for i, k in enumerate(("identity", "cell_id", "seed", "profile", "fidelity"))}


def _first_difference(old: Any, new: Any, where: str = "") -> str | None:
    """The first key path at which two decoded fingerprints differ, with both values."""
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(set(old) | set(new), key=lambda k: (_FIRST.get(k, len(_FIRST)), k)):
            d = _first_difference(old.get(k), new.get(k), f"{where}.{k}" if where else k)
            if d:
                return d
        return None
    if old == new:
        return None
    show = lambda v: repr(v) if len(repr(v)) <= 60 else repr(v)[:57] + "..."  # noqa: E731
    return f"{where}: {show(old)}, this run: {show(new)}"


def mismatch(old: str, new: str) -> str:
    """Why a checkpoint's fingerprint is not this run's, in a few words."""
    try:
        d = _first_difference(json.loads(old), json.loads(new))
    except (TypeError, ValueError):  # a checkpoint of an older lpdl: its fingerprint was a repr
        d = None
    return f"written for another run ({d})" if d else "written for another run (an older checkpoint format)"


def save_atomic(path: Path, state: dict) -> None:
    """A kill -9 mid-write leaves the previous file intact (lpdl_core.atomic: only a regular file
    is replaced). A failed write, a full disk included, is WriteFailed `cannot write <path>: <why>`:
    torch.save writes through our file object, so its RuntimeError carries the OSError it met."""
    from ..atomic import replacing, write_failed

    try:
        with replacing(path) as f:
            torch.save(state, f)
    except RuntimeError as e:  # torch's stream writer: "[enforce fail at inline_container.cc] ..."
        raise write_failed(path, e) from e


def set_aside(path: Path, tag: str) -> Path:
    """Rename path to <name>.<tag>-<UTC time> beside it (kept, never deleted)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.{tag}-{stamp}")
    n = 1
    while aside.exists():
        aside, n = path.with_name(f"{path.name}.{tag}-{stamp}.{n}"), n + 1
    os.replace(path, aside)
    return aside


def _first_line(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"


def read(path: Path, fingerprint: str, epochs: int) -> tuple[dict | None, str]:
    """(the checkpoint, "") or (None, why it cannot be used). Any failure counts: a truncated,
    random or edited file."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001  (zip, pickle, EOF, unicode, ... errors alike)
        return None, f"unreadable ({_first_line(e)})"
    if not isinstance(ck, dict) or "fingerprint" not in ck:
        return None, "not an lpdl checkpoint"
    if ck["fingerprint"] != fingerprint:
        return None, mismatch(ck["fingerprint"], fingerprint)
    try:
        epoch, curve = int(ck["epoch"]), list(ck["curve"])
    except Exception as e:  # noqa: BLE001
        return None, f"inconsistent ({_first_line(e)})"
    if not 0 <= epoch < epochs or len(curve) != epoch + 1:
        return None, f"inconsistent (epoch {epoch}, {len(curve)} curve rows)"
    return ck, ""


def restore(ck: dict, sim, aug_gen: torch.Generator) -> tuple[list, int, float]:
    """Load ck into sim and the RNGs: (curve, next epoch, elapsed seconds)."""
    sim.load_state_dict(ck["sim"])
    torch.set_rng_state(ck["torch_rng"])
    if sim.device.type == "cuda" and ck.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(ck["cuda_rng"], sim.device)
    aug_gen.set_state(ck["aug_gen"])
    return list(ck["curve"]), int(ck["epoch"]) + 1, float(ck["elapsed"])


class Checkpoints:
    """The checkpoint file(s) of one run at `path` (a `Simulator` or a `NodeProcess` in `sim`)."""

    def __init__(self, path: str | os.PathLike, sim):
        path = Path(path)
        self.dirty = False  # a restore failed halfway: the simulator must be rebuilt
        self.rank = getattr(sim, "rank", None)  # None: all n nodes in this process
        if self.rank is None:
            self.file, self.prev = path, None
        else:
            self.file = path.with_name(f"{path.stem}.rank{self.rank}of{sim.n}{path.suffix}")
            self.prev = self.file.with_name(self.file.name + ".prev")

    def save(self, state: dict) -> None:
        if self.prev is not None and self.file.exists():
            os.replace(self.file, self.prev)  # kept until every rank has saved the next epoch
        save_atomic(self.file, state)

    def resume(self, fingerprint: str, epochs: int, sim, aug_gen: torch.Generator,
               progress: Progress | None) -> tuple[list, int, float] | None:
        """Restore the latest usable epoch (every rank's, for a distributed run) into sim and the
        RNGs: (curve, next epoch, elapsed), or None (start from scratch; rebuild sim first if
        `dirty`). Unusable files are set aside. A distributed run calls this on every rank (it
        gathers the ranks' epochs)."""
        found: dict[int, dict] = {}
        for path in (self.file, self.prev):
            if path is None or not path.exists():
                continue
            ck, why = read(path, fingerprint, epochs)
            if ck is None:
                self._aside(path, why, progress)
            else:
                found.setdefault(int(ck["epoch"]), ck)
        common = set(found)
        if self.rank is not None:
            import torch.distributed as dist

            every: list = [None] * dist.get_world_size()
            dist.all_gather_object(every, sorted(found))
            common = set.intersection(*(set(e) for e in every))
        if not common:
            for path in (self.file, self.prev):
                if path is not None and path.exists():  # usable alone, but not every rank has its epoch
                    self._aside(path, "no epoch that every rank saved", progress)
            return None
        try:
            return restore(found[max(common)], sim, aug_gen)
        except Exception as e:  # noqa: BLE001
            if self.rank is not None:
                raise  # the other ranks have restored: one rank cannot start over alone
            self.dirty = True
            self._aside(self.file, f"inconsistent ({_first_line(e)})", progress)
            return None

    def _aside(self, path: Path, why: str, progress: Progress | None) -> None:
        aside = set_aside(path, "corrupt" if why.startswith("unreadable") else "unusable")
        if progress is not None:
            progress({"event": "checkpoint-set-aside", "path": str(path), "moved_to": str(aside), "reason": why})

    def remove(self) -> None:
        for path in (self.file, self.prev):
            if path is not None:
                path.unlink(missing_ok=True)
