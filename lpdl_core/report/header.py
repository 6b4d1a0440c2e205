"""The report's header: what was run, on what, from which code, with which fidelity options.

Everything is read from runs.csv (each run's provenance, fidelity options and wall time, as its
metrics.json recorded them), so the header describes the results it sits above, not the machine
that renders it.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from datetime import datetime, timezone

import pandas as pd

from ..config import Fidelity
from ..specs.fidelity import OPTIONS as FIDELITY_MEANING  # option -> value -> what it means
from ..pipeline.recipe import mini
from ..pipeline.aggregation.tidy import REAL_DATA
from .data import not_learned_cells
from .model import LEARNED_MARGIN, Header, ReportData

def mini_protocol(runs: pd.DataFrame) -> str:
    """The mini protocol the runs used, in a few words: the profile's epochs, or the epochs that the
    cells' mini_epochs column set (an extension grid sized to a time budget)."""
    col = runs["mini_epochs"] if "mini_epochs" in runs else pd.Series(dtype=float)
    own = col.fillna(0).astype(int)
    set_epochs = sorted({int(v) for v in own if v})
    base = f"global batch / {mini.BATCH_DIVISOR}"
    default = f"{mini.IMAGE_EPOCHS} epochs for images, {mini.TEXT_EPOCHS} for text"
    if not set_epochs:
        epochs = default
    elif len(own) and own.gt(0).all():
        epochs = f"{'/'.join(map(str, set_epochs))} epochs (the cells' mini_epochs)"
    else:
        epochs = f"{default}; {'/'.join(map(str, set_epochs))} where a cell's mini_epochs sets them"
    return f"{base}, {epochs}; lpdl_core/pipeline/recipe/mini.py"


def _profile_notes(protocol: str) -> dict[str, str]:
    return {
        "mini": ("Mini profile: every paper cell with all its axes (nodes, topology, skew, compression, "
                 "eta, algorithm, precision, momentum, norm, optimizer, final gossip rounds) kept, on "
                 "embedded stand-in data (8x8 digits, stdlib prose) with one small stand-in model per "
                 f"paper model and a short protocol ({protocol}). These numbers are NOT a reproduction "
                 "of the paper's accuracies and not comparable with them: compare the effects (FP - LP, "
                 "CHOCO - DS, skew, nodes, compression) in the effects view."),
        "paper": ("Paper profile: the paper's datasets, models and training protocol. The deltas "
                  "compare like with like; cells still running or never run are shown as missing."),
    }


FIDELITY_DEFAULTS = asdict(Fidelity())  # the paper's text, as every run defaults to


def _hms(seconds: float) -> str:
    h, rem = divmod(int(round(seconds)), 3600)
    return f"{h}h {rem // 60:02d}m {rem % 60:02d}s" if h else f"{rem // 60}m {rem % 60:02d}s"


def _counted(values) -> str:
    c = Counter(str(v) for v in values if not _blank(v))
    return ", ".join(f"{k} ({n})" if len(c) > 1 else str(k) for k, n in c.most_common()) or "unknown"


def _blank(v) -> bool:
    return v is None or v == "" or (isinstance(v, float) and v != v)


def fidelity_lines(runs: pd.DataFrame) -> list[tuple[str, str]]:
    """(option, 'value: meaning [n runs]') for each fidelity option, over all runs."""
    out = []
    for key, default in FIDELITY_DEFAULTS.items():
        col = f"fidelity_{key}"
        values = runs[col].tolist() if col in runs else []
        c = Counter(_typed(v, default) for v in values)
        parts = [f"{_show(v)}: {FIDELITY_MEANING[key].get(v, '')}" + (f" [{n} runs]" if len(c) > 1 else "")
                 for v, n in c.most_common()]
        out.append((f"fidelity: {key}", "; ".join(parts) if parts else f"{_show(default)} (no runs)"))
    return out


def _typed(v, default):
    """A fidelity value read back from CSV (a run without the column used the default)."""
    return default if pd.isna(v) else v


def _show(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def compute_seconds(runs: pd.DataFrame) -> float:
    """The wall seconds the runs took, each pack counted once: a packed run records the whole
    pack's wall time (its cells trained together), so summing its cells would count it once per cell."""
    if not len(runs):
        return 0.0
    packed = runs["packed_with"].fillna("").astype(str) if "packed_with" in runs else pd.Series("", index=runs.index)
    keys = pd.Series([f"{seed}|" + (";".join(sorted([cell, *p.split(";")])) if p else cell)
                      for seed, cell, p in zip(runs["seed"], runs["cell_id"], packed)], index=runs.index)
    return float(runs["wall_time_s"].fillna(0).groupby(keys).first().sum())


def _grids_only_notes(protocol: str) -> dict[str, str]:
    """A report of extension grids alone (config `tables: []`): no paper table, claim or paper figure."""
    return {
        "mini": ("Extension grids alone, mini profile: each grid cell with all its axes kept, on embedded "
                 f"stand-in data with the paper models' stand-ins and the mini protocol ({protocol}). "
                 "Not a reproduction of anything the paper reports: read the effects in each grid's section."),
        "paper": "Extension grids alone, paper profile: the paper's datasets, models and training protocol.",
    }


def build_header(data: ReportData, *, generated_by: dict | None = None, grids_only: bool = False) -> Header:
    """generated_by: provenance of the process rendering the report (git SHA). grids_only: the
    data are extension grids' (report.data.load_grids_data): its cells are their tables' rows."""
    summary = data.summary
    runs = data.runs[data.runs["status"] != "damaged"]  # the provenance of the runs that could be read
    computed = runs[runs["same_run_as"] == ""]
    shared = sorted(set(runs.loc[runs["same_run_as"] != "", "cell_id"]))
    total = len(summary) if grids_only else len(data.cells)
    done = int((summary["status"] != "missing").sum()) if len(summary) else 0
    statuses = Counter(summary["status"]) if len(summary) else Counter()
    seeds = sorted({int(s) for s in runs["seed"]})
    shas = Counter(str(s) for s in runs["git_sha"].dropna())
    int8 = [v for v in runs["int8_arithmetic"] if not _blank(v)] if "int8_arithmetic" in runs else []
    facts = [
        ("profile", data.profile),
        ("cells with results", f"{done} of {total} ({statuses.get('ok', 0)} ok, "
                               f"{statuses.get('diverged', 0) + statuses.get('partly-diverged', 0)} "
                               f"diverged, {statuses.get('damaged', 0) + statuses.get('partly-damaged', 0)} "
                               f"with a damaged run, {statuses.get('missing', 0)} missing)"),
        ("seeds", ", ".join(map(str, seeds)) or "none"),
        ("data", _counted(runs["data"]) if "data" in runs else REAL_DATA),
        ("runs", f"{len(runs)}" + (f" ({len(runs) - len(computed)} recorded as the same run as "
                                   f"another cell, computed once)" if len(computed) < len(runs) else "")),
        ("shared runs", f"{len(shared)} cells share a run with another cell (computed once, marked "
                        f"'same run as' in the tables)" if shared else "none: every cell is its own run"),
        ("git SHA of the runs", _counted(s[:12] for s in shas.elements())),
        ("python / torch", _counted(f"{p} / {t}" for p, t in zip(runs["python"], runs["torch"]))),
        ("devices", _counted(f"{d} ({n})" for d, n in zip(runs["device"], runs["device_name"]))),
        ("executor", _counted(runs["executor"])),
        # what the 8-bit runs' layers computed: the integer products, or fake quantization (and why)
        ("8-bit arithmetic", _counted(int8) if int8 else "no 8-bit runs"),
        ("total compute time (sum of run wall times, a pack's once)", _hms(compute_seconds(computed))),
        *fidelity_lines(runs),
        ("report generated", datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
         + (f" from git {str(generated_by.get('git_sha'))[:12]}" if generated_by and generated_by.get("git_sha")
            else "")),
    ]
    warnings = []
    if statuses.get("missing"):
        warnings.append(f"{statuses['missing']} of {total} cells have no result yet and are shown "
                        f"as missing.")
    diverged = statuses.get("diverged", 0) + statuses.get("partly-diverged", 0)
    if diverged:
        warnings.append(f"{diverged} cells diverged (NaN/inf loss) in at least one seed.")
    damaged = summary[summary["status"].isin(("damaged", "partly-damaged"))] if len(summary) else summary
    if len(damaged):
        first = damaged.iloc[0]
        warnings.append(f"{len(damaged)} cells have a run whose files cannot be used, shown as damaged with no "
                        f"number from it (`lpdl status` lists them); the first, {first['cell_id']}: "
                        f"{str(first.get('problem') or '').split(' | ')[0]}")
    rehearsed = int((~runs["data"].fillna("").isin(("", REAL_DATA))).sum()) if "data" in runs else 0
    if rehearsed:
        warnings.append(f"{rehearsed} of {len(runs)} runs trained on rehearsal data (`lpdl rehearsal-data`: "
                        f"synthetic images and sentences in the real formats, and for text a DistilBERT with "
                        f"random weights): their accuracies measure the machinery, not the paper's claims.")
    flat = not_learned_cells(data)
    if flat:
        left_out = ("left out of the grids' effects" if grids_only
                    else "marked in the tables; left out of the effects and claims" if data.profile == "mini"
                    else "marked in the tables; still used by the claims")
        warnings.append(f"{len(flat)} of {total} cells did not learn: their accuracy is within "
                        f"{LEARNED_MARGIN:g} points of chance, 100 / classes of the data they ran on "
                        f"({left_out}).")
    if len(shas) > 1:
        warnings.append(f"Runs come from {len(shas)} different git commits.")
    if runs["git_dirty"].astype(str).str.lower().eq("true").any():
        warnings.append("Some runs were made from a working tree with uncommitted changes.")
    warnings += data.notes
    title = "Extension grids" if grids_only else "Low Precision Decentralized Training with Heterogeneous Data"
    return Header(title=f"lpdl report: {title} ({data.profile} profile)", profile=data.profile,
                  profile_note=(_grids_only_notes if grids_only else _profile_notes)(mini_protocol(runs)).get(
                      data.profile, ""),
                  facts=tuple(facts), warnings=tuple(warnings))
