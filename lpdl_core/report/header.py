"""The report's header: what was run, on what, from which code, with which fidelity options.

Everything is read from the runs' own metrics.json (provenance, config, wall time), so the header
describes the results it sits above, not the machine that renders it.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from datetime import datetime, timezone

from .. import mini
from ..config import Fidelity
from .data import not_learned_cells
from .model import LEARNED_MARGIN, Header, ReportData


PROFILE_NOTES = {
    "mini": ("Mini profile: every paper cell with all its axes (nodes, topology, skew, compression, "
             "eta, algorithm, precision, momentum, norm, optimizer, final gossip rounds) kept, on "
             "embedded stand-in data (8x8 digits, stdlib prose) with one small stand-in model per "
             f"paper model and a short protocol (global batch / {mini.BATCH_DIVISOR}, {mini.IMAGE_EPOCHS} epochs "
             f"for images, {mini.TEXT_EPOCHS} for text; "
             "lpdl_core/mini.py). These numbers are NOT a reproduction of the paper's accuracies and "
             "not comparable with them: compare the effects (FP - LP, CHOCO - DS, skew, nodes, compression) in the effects view."),
    "paper": ("Paper profile: the paper's datasets, models and training protocol. The deltas "
              "compare like with like; cells still running or never run are shown as missing."),
}
FIDELITY_DEFAULTS = asdict(Fidelity())  # the paper's text, as every run defaults to
FIDELITY_MEANING = {
    "official_quant": {False: "paper text (QuantMeasure ranges are buffers; nearest rounding at eval)",
                       True: "official code (ranges gossiped as parameters; stochastic rounding in "
                             "train and eval)"},
    "choco_form": {"paper": "paper's CHOCO update", "code": "official code's CHOCO update"},
    "choco_replicas": {"per-neighbour": "one replica per neighbour (paper)",
                       "official-aggregate": "official code's aggregate replica"},
    "bytes_metric": {"exact": "exact bytes on the wire", "legacy": "official 6k+3 byte count"},
}


def _hms(seconds: float) -> str:
    h, rem = divmod(int(round(seconds)), 3600)
    return f"{h}h {rem // 60:02d}m {rem % 60:02d}s" if h else f"{rem // 60}m {rem % 60:02d}s"


def _counted(values) -> str:
    c = Counter(v for v in values if v not in (None, ""))
    return ", ".join(f"{k} ({n})" if len(c) > 1 else str(k) for k, n in c.most_common()) or "unknown"


def fidelity_lines(metrics: list[dict]) -> list[tuple[str, str]]:
    """(option, 'value: meaning [n runs]') for each fidelity option, over all runs."""
    out = []
    for key, default in FIDELITY_DEFAULTS.items():
        c = Counter(m.get("config", {}).get("fidelity", {}).get(key, default) for m in metrics)
        parts = [f"{v}: {FIDELITY_MEANING[key].get(v, '')}" + (f" [{n} runs]" if len(c) > 1 else "")
                 for v, n in c.most_common()]
        out.append((f"fidelity: {key}", "; ".join(parts) if parts else f"{default} (no runs)"))
    return out


def shared_cells(data: ReportData) -> list[str]:
    """Cells whose run was computed once for another cell (metrics config.same_run_as; runs
    without the key are their own)."""
    return [cid for cid, runs in data.runs.items()
            if any(r.metrics.get("config", {}).get("same_run_as") for r in runs)]


def build_header(data: ReportData, *, generated_by: dict | None = None) -> Header:
    """generated_by: provenance of the process rendering the report (git SHA, versions)."""
    metrics = [r.metrics for runs in data.runs.values() for r in runs]
    computed = [m for m in metrics if not m.get("config", {}).get("same_run_as")]
    shared = shared_cells(data)
    prov = [m.get("provenance", {}) for m in metrics]
    total = len(data.cells)
    done = sum(1 for c in data.cells if c.cell_id in data.runs)
    statuses = Counter(r["status"] for rows in data.rows.values() for r in rows)
    seeds = sorted({r.seed for runs in data.runs.values() for r in runs})
    shas = Counter(p.get("git_sha") for p in prov if p.get("git_sha"))
    facts = [
        ("profile", data.profile),
        ("cells with results", f"{done} of {total} ({statuses.get('ok', 0)} ok, "
                               f"{statuses.get('diverged', 0) + statuses.get('partly-diverged', 0)} "
                               f"diverged, {statuses.get('missing', 0)} missing)"),
        ("seeds", ", ".join(map(str, seeds)) or "none"),
        ("runs", f"{len(metrics)}" + (f" ({len(metrics) - len(computed)} recorded as the same run as "
                                      f"another cell, computed once)" if len(computed) < len(metrics) else "")),
        ("shared runs", f"{len(shared)} cells share a run with another cell (computed once, marked "
                        f"'same run as' in the tables)" if shared else "none: every cell is its own run"),
        ("git SHA of the runs", _counted(s[:12] for s in shas.elements())),
        ("python / torch", _counted(f"{p.get('python')} / {p.get('torch')}" for p in prov)),
        ("devices", _counted(f"{m.get('device', '?')} ({m.get('provenance', {}).get('device_name', '?')})"
                             for m in metrics)),
        ("executor", _counted(m.get("executor") for m in metrics)),
        ("total compute time (sum of run wall times)",
         _hms(sum(m.get("wall_time_s") or 0.0 for m in computed))),
        *fidelity_lines(metrics),
        ("report generated", datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
         + (f" from git {str(generated_by.get('git_sha'))[:12]}" if generated_by else "")),
    ]
    warnings = []
    if statuses.get("missing"):
        warnings.append(f"{statuses['missing']} of {total} cells have no result yet and are shown "
                        f"as missing.")
    diverged = statuses.get("diverged", 0) + statuses.get("partly-diverged", 0)
    if diverged:
        warnings.append(f"{diverged} cells diverged (NaN/inf loss) in at least one seed.")
    flat = not_learned_cells(data)
    if flat:
        left_out = ("left out of the effects and claims" if data.profile == "mini"
                    else "still used by the claims")
        warnings.append(f"{len(flat)} of {total} cells did not learn: their accuracy is within "
                        f"{LEARNED_MARGIN:g} points of chance, 100 / classes of the data they ran on "
                        f"(marked in the tables; {left_out}).")
    if len(shas) > 1:
        warnings.append(f"Runs come from {len(shas)} different git commits.")
    if any(p.get("git_dirty") for p in prov):
        warnings.append("Some runs were made from a working tree with uncommitted changes.")
    return Header(title=f"lpdl report: Low Precision Decentralized Training with Heterogeneous "
                        f"Data ({data.profile} profile)",
                  profile=data.profile, profile_note=PROFILE_NOTES.get(data.profile, ""),
                  facts=tuple(facts), warnings=tuple(warnings))
