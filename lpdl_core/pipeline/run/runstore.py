"""Run folders as a trustworthy store: what a run *is*, strict reading, and kept copies.

* Identity. A run is defined by its cell (every column that changes what is computed: not the
  paper's value, the notes or the CSV's seed column), its seed, its profile, its fidelity
  options, what a GUT cell's momentum column selects (`own_momentum`), a Dirichlet cell's epoch
  length rule (`partition.DIRICHLET_EPOCH`) and, in the mini profile,
  what the mini protocol makes of the cell (`mini.protocol`). `run_identity` builds it;
  `save_run` stores it in metrics.json; every reader (train, aggregate, report) compares the
  file's identity with the one it expects and refuses a mismatch with one line naming the file
  (`RunMismatch`). metrics.json files written before
  identities were stored are judged by their config, which holds the same facts.
* Strict reading. An unreadable, truncated or non-standard metrics.json is a `CorruptFile`
  naming the file, never a traceback and never a silently skipped cell.
* Kept copies. Snakemake deletes a job's outputs before it reruns the job, so a finished result
  would be gone if the rerun failed. Every finished run is therefore also hard-linked (copied
  where links are impossible) into `<run>/.kept/<key>/`, where key = hash(identity, library
  code). A rerun with the same identity and the same library code restores that copy instead of
  recomputing; any other rerun leaves it in place.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping

from ...config import Fidelity, identity_fidelity
from ...decentral.partition import DIRICHLET_EPOCH
from ..cells.cell import Cell, columns
from ..cells.tables import EXTENSION_DEFAULTS
from ..recipe.mini import protocol
from ..recipe.own_momentum import identity_part
from ...errors import ConfigError, CorruptFile, RunMismatch
from ...provenance import code_sha256

# Cell fields that do not change what a run computes, those without the "identity" role: paper_acc,
# notes, seed (the identity's own key) and id_suffix (a grid's id suffix is in the id itself).
NOT_IDENTITY = tuple(f.name for f in fields(Cell) if f.name not in columns("identity"))
ARTIFACTS = ("metrics.json", "curve.csv", "partition.csv")
KEPT = ".kept"


def _plain(obj: Any) -> Any:
    """JSON round trip: tuples become lists, so identities compare equal to what a file holds."""
    return json.loads(json.dumps(obj))


def _defining(cell_fields: Mapping, leave_out: tuple[str, ...]) -> dict:
    """The cell columns that define a run: all but `leave_out`, and an open-grid column only when it
    is not at its default (so the paper's runs keep the identity they had before those columns)."""
    return {k: v for k, v in cell_fields.items()
            if k not in leave_out and not (k in EXTENSION_DEFAULTS and v == EXTENSION_DEFAULTS[k])}


def run_identity(cell, *, profile: str, seed: int, fidelity: Fidelity | Mapping, data: str | None = None) -> dict:
    """What a run is: cell id, seed, profile, the cell's defining columns and fidelity, and
    `data` "rehearsal" for a run on rehearsal data (lpdl_core.rehearsal_mark.data_kind; real data
    adds no key, so the runs on real data keep their identities)."""
    fields = asdict(cell) if is_dataclass(cell) else dict(cell)
    fid = fidelity.as_dict() if isinstance(fidelity, Fidelity) else dict(fidelity)
    ident = {"cell_id": cell.cell_id if hasattr(cell, "cell_id") else fields["cell_id"],
             "seed": int(seed), "profile": profile,
             "cell": _defining(fields, NOT_IDENTITY + ("cell_id",)),
             "fidelity": identity_fidelity(fid)}
    own = identity_part(fields.get("algorithm", ""), fields.get("momentum", ""))
    if own is not None:  # GUT / QG-GUTm: the μ, β and optimizer the momentum column selects
        ident["own_momentum"] = own
    if fields.get("partition", "skew") != "skew":  # a Dirichlet split's epoch: its mean shard
        ident["epoch_samples"] = DIRICHLET_EPOCH
    if data is not None:
        ident["data"] = data
    if profile == "mini":
        ident["protocol"] = protocol(cell if is_dataclass(cell) else SimpleNamespace(**fields))
    return _plain(ident)


def run_data(cell, profile: str, data_root: str | os.PathLike | None) -> str | None:
    """run_identity's `data` for this cell: "rehearsal" when a paper-profile run reads its dataset
    from a rehearsal data root, else None (the mini profile reads embedded stand-ins only)."""
    from ...rehearsal_mark import data_kind

    return data_kind(cell.dataset, data_root) if profile == "paper" else None


def run_key(identity: Mapping) -> str:
    """A short name of an identity (a hash of its canonical JSON): equal keys, equal runs."""
    return hashlib.sha256(json.dumps(_plain(identity), sort_keys=True).encode()).hexdigest()[:16]


def identity_of(metrics: Mapping) -> dict:
    """The identity a metrics.json claims (stored, or derived from its config)."""
    if "identity" in metrics:
        ident = dict(metrics["identity"])
    else:
        cfg = metrics.get("config", {})
        ident = {"cell_id": cfg.get("cell_id"), "seed": cfg.get("seed"), "profile": cfg.get("profile"),
                 "cell": _defining(cfg.get("cell", {}), NOT_IDENTITY),
                 "fidelity": cfg.get("fidelity", {})}
    # options added to Fidelity later did not exist then: those runs used the default
    ident["fidelity"] = identity_fidelity(ident.get("fidelity", {}))
    return _plain(ident)


ANY_DATA = "any"   # a `want` whose "data" is this accepts a run on real or rehearsal data


def _differences(got: Mapping, want: Mapping) -> list[str]:
    out = []
    if want.get("data") != ANY_DATA and got.get("data") != want.get("data"):
        out.append(f"data {got.get('data') or 'real'!r} (asked: {want.get('data') or 'real'!r})")
    for part in ("cell", "fidelity", "protocol", "own_momentum"):
        g, w = got.get(part) or {}, want.get(part) or {}
        for k in sorted(set(g) | set(w)):
            if g.get(k) != w.get(k):
                out.append(f"{part + '.' if part != 'cell' else ''}{k} {g.get(k)!r} (asked: {w.get(k)!r})")
    return out


def check_identity(path: str | os.PathLike, metrics: Mapping, want: Mapping) -> None:
    """RunMismatch (one line naming the file) unless metrics is the run `want` describes.
    want may leave out 'fidelity' (then any fidelity is accepted)."""
    got = identity_of(metrics)
    who = f"cell {got.get('cell_id')} seed {got.get('seed')} (profile {got.get('profile')})"
    if (got.get("cell_id"), got.get("seed"), got.get("profile")) != \
            (want["cell_id"], want["seed"], want["profile"]):
        raise RunMismatch(f"{path}: holds the result of {who}, not of cell {want['cell_id']} seed "
                          f"{want['seed']} (profile {want['profile']}); use another folder or remove it")
    diffs = _differences(got, {**want, "fidelity": want.get("fidelity", got["fidelity"])})
    if diffs:
        raise RunMismatch(f"{path}: {who} was computed with other settings: {'; '.join(diffs)}; "
                          f"remove {Path(path).parent} to recompute it")


def read_metrics(path: str | os.PathLike) -> dict:
    """A metrics.json, strictly: standard JSON holding an object with status, final and config."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise CorruptFile(f"{path}: not a text file (corrupt metrics.json); remove it to recompute the run") from None
    try:
        m = json.loads(text, parse_constant=_reject_constant)
    except (json.JSONDecodeError, ValueError) as e:
        raise CorruptFile(f"{path}: corrupt or truncated metrics.json ({e}); remove it to recompute "
                          f"the run") from None
    if not isinstance(m, dict) or not {"status", "final", "config"} <= set(m):
        raise CorruptFile(f"{path}: not an lpdl metrics.json (status, final and config are required); "
                          f"remove it to recompute the run")
    why = _invalid(m)
    if why:
        raise CorruptFile(f"{path}: invalid metrics.json ({why}); remove it to recompute the run")
    return m


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _invalid(m: dict) -> str | None:
    """Why a parsed metrics.json cannot be a run lpdl wrote (None if it can)."""
    if m["status"] not in ("ok", "diverged"):
        return f"status {m['status']!r} is neither ok nor diverged"
    if not isinstance(m["config"], dict) or not isinstance(m["final"], dict):
        return "config and final must be objects"
    if m["status"] == "ok":
        for key in ("mean_acc", "avg_model_acc", "consensus_distance"):
            if not _number(m["final"].get(key)):
                return f"final.{key} of a finished run must be a finite number, got {m['final'].get(key)!r}"
        if not 0 <= m["final"]["mean_acc"] <= 100 or not 0 <= m["final"]["avg_model_acc"] <= 100:
            return "accuracies must lie in [0, 100]"
        if not _number(m.get("bytes_per_node")):
            return f"bytes_per_node must be a finite number, got {m.get('bytes_per_node')!r}"
    return None


def _reject_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")


def read_run_metrics(path: str | os.PathLike, want: Mapping) -> dict:
    """read_metrics + check_identity."""
    m = read_metrics(path)
    check_identity(path, m, want)
    return m


# ---- kept copies ---------------------------------------------------------------------------

def kept_key(identity: Mapping) -> str:
    blob = json.dumps(_plain(identity), sort_keys=True) + code_sha256()
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _link_or_copy(src: Path, dst: Path) -> None:
    if dst.exists() and os.path.samefile(src, dst):
        return  # already this file (rename() onto a hard link of itself would leave tmp behind)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def keep_run(run_dir: str | os.PathLike, identity: Mapping) -> Path:
    """Link the finished run's artifacts into run_dir/.kept/<key>/ (metrics.json last)."""
    run_dir = Path(run_dir)
    dst = run_dir / KEPT / kept_key(identity)
    dst.mkdir(parents=True, exist_ok=True)
    for name in ARTIFACTS[1:] + ARTIFACTS[:1]:
        if (run_dir / name).exists():
            _link_or_copy(run_dir / name, dst / name)
    return dst


def restore_kept(run_dir: str | os.PathLike, identity: Mapping) -> Path | None:
    """If run_dir/.kept holds a finished run of exactly this identity made by this library
    code, link it back into run_dir (metrics.json last) and return where it came from."""
    run_dir = Path(run_dir)
    src = run_dir / KEPT / kept_key(identity)
    if not (src / "metrics.json").is_file():
        return None
    try:
        read_run_metrics(src / "metrics.json", identity)
    except (CorruptFile, RunMismatch):
        return None  # not a usable copy: compute afresh (the copy stays for inspection)
    for name in ARTIFACTS[1:] + ARTIFACTS[:1]:
        if (src / name).exists():
            _link_or_copy(src / name, run_dir / name)
    return src


def check_writable_dir(path: str | Path, what: str = "output folder") -> Path:
    """ConfigError unless `path` is, or can be created as, a folder this process can write in.
    Creates nothing: the probe file goes into the nearest existing ancestor and is removed."""
    import tempfile

    path = Path(path)
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ConfigError(f"{what} {path}: {probe} is a file, not a folder")
    try:
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".lpdl-write-test."):
            pass
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot write in {probe} ({e.strerror or e})") from None
    return path
