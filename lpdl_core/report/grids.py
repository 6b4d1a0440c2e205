"""An extension grid's report section (config/extensions/<name>.yaml, run into
results/<profile>-<name>/): what changes when one of the grid's axes changes, and accuracy against
the bytes each node sent.

The section reads only what the DAG gives it: the grid's runs.csv and grid.json (its axes, their
labels in the grid's order, and each cell's labels; written by the grid's aggregate step).

Effects, per varying axis and per label v other than the axis's first (its baseline b): the pairs
of cells whose labels agree on every other axis, and for each seed s the mean over the pairs of
acc_s(v) − acc_s(b) (final mean accuracy over nodes). As in the paper's effects view
(report.effects), only learned runs count (more than LEARNED_MARGIN points above chance) and the
same noise rule applies; there is no paper to agree with, so the verdict is the direction:
  higher / lower   the effect is at least SIGN_EPS points and larger than its seed spread;
  no sign          under SIGN_EPS points (two cells computed as one run give exactly 0);
  within noise     the seed spread is at least as large as the effect (>= 2 seeds);
  not learned      no pair of learned runs;  missing  no pair with results.
"""
from __future__ import annotations

import io
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..errors import CorruptFile
from ..pipeline.cells.grids import LENGTH_AXIS
from .effects import seed_effects, seed_sign
from .model import Figure
from .trend import Point, grid_trend

GRID_FILE = "grid.json"
GRID_VERDICTS = ("higher", "lower", "no sign", "within noise", "not learned", "missing")


@dataclass(frozen=True, kw_only=True)
class GridSpec:
    name: str
    description: str
    axes: dict[str, list[str]]            # axis -> its labels, the first the baseline
    labels: dict[str, dict[str, str]]     # cell id -> axis -> label
    lengths: tuple[int, ...] = ()         # the length ladder (mini epochs), labels of LENGTH_AXIS
    claims: bool = False                  # its runs are evidence for the paper's claims

    def varying(self) -> list[str]:
        """The axes an effects row compares (the length ladder is not one: each effect is given
        at every length instead)."""
        return [a for a, values in self.axes.items() if len(values) > 1 and not (self.lengths and a == LENGTH_AXIS)]


@dataclass(frozen=True, kw_only=True)
class GridEffectRow:
    axis: str
    compared: str               # "v − b"
    pairs: int                  # pairs of learned runs behind `effect` (in any seed)
    effect: float | None        # mean over seeds (points); with a length ladder, at the longest length
    spread: float | None        # standard deviation over seeds (None with one seed)
    seeds: int
    verdict: str                # one of GRID_VERDICTS
    by_length: tuple[Point, ...] = ()  # with a length ladder: the effect at each length that has one
    trend: str = ""             # report.trend.grid_trend over them: settled, shrinking, growing, ...
    trend_words: str = ""


@dataclass(frozen=True, kw_only=True, eq=False)
class GridSection:
    spec: GridSpec
    cells: int
    finished: int               # cells with at least one finished (ok) run
    effects: list[GridEffectRow]
    figure: Figure | None
    runs: pd.DataFrame          # the grid's runs.csv (the claims read a claims grid's)


def spec_dict(grid) -> dict:
    """grid.json's content for a lpdl_core.pipeline.cells.grids.Grid."""
    return {"name": grid.name, "description": grid.description,
            "axes": {a: list(values) for a, values in grid.axes.items()}, "labels": grid.labels,
            "lengths": list(grid.lengths), "claims": grid.claims}


def load_spec(path: Path) -> GridSpec:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        return GridSpec(name=str(d["name"]), description=str(d.get("description", "")),
                        axes={str(a): [str(v) for v in vs] for a, vs in d["axes"].items()},
                        labels={str(c): {str(a): str(v) for a, v in ls.items()} for c, ls in d["labels"].items()},
                        lengths=tuple(int(n) for n in d.get("lengths", ())), claims=bool(d.get("claims", False)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptFile(f"{path}: not a grid description ({type(e).__name__}: {e})") from None


def _acc(runs: pd.DataFrame) -> tuple[dict[tuple[str, int], float], dict[str, int | None]]:
    if runs.empty:  # no run yet (an empty runs.csv has no columns)
        return {}, {}
    ok = runs[(runs["status"] == "ok") & runs["mean_acc"].notna()]
    acc = {(r.cell_id, int(r.seed)): float(r.mean_acc) for r in ok.itertuples()}
    classes = {r.cell_id: (int(r.num_classes) if pd.notna(r.num_classes) else None) for r in runs.itertuples()}
    return acc, classes


def _verdict(values: list[float]) -> str:
    sign = seed_sign(values)
    return sign if isinstance(sign, str) else ("higher" if sign > 0 else "lower")


def grid_effects(spec: GridSpec, runs: pd.DataFrame) -> list[GridEffectRow]:
    """One row per varying axis and non-baseline label, in the grid's order (module docstring);
    with a length ladder, each at every length, its verdict at the longest and its trend."""
    acc, classes = _acc(runs)
    seeds = sorted({int(s) for s in runs["seed"]}) if len(runs) else []
    lengths = [str(n) for n in spec.lengths] or [""]
    rows = []
    for axis in spec.varying():
        base = spec.axes[axis][0]
        by_rest: dict[tuple, dict[str, str]] = {}
        for cid, labels in spec.labels.items():
            rest = tuple(sorted((a, v) for a, v in labels.items() if a != axis))
            by_rest.setdefault(rest, {})[labels[axis]] = cid
        for v in spec.axes[axis][1:]:
            pairs = [(g[v], g[base]) for g in by_rest.values() if v in g and base in g]
            points, last = [], None
            for L in lengths:
                at = [p for p in pairs if not L or spec.labels[p[0]].get(LENGTH_AXIS) == L]
                last = seed_effects(at, acc, seeds, classes, key=str)
                if last[0] and L:
                    points.append(Point(length=int(L), mean=statistics.fmean(last[0]), seeds=len(last[0]),
                                        spread=statistics.stdev(last[0]) if len(last[0]) > 1 else None,
                                        pairs=len(last[1])))
            if spec.lengths and points:  # the verdict at the longest length that has an effect
                last = seed_effects([p for p in pairs if spec.labels[p[0]].get(LENGTH_AXIS) == str(points[-1].length)],
                                    acc, seeds, classes, key=str)
            per_seed, used, with_results = last
            if per_seed:
                verdict, effect = _verdict(per_seed), statistics.fmean(per_seed)
                spread = statistics.stdev(per_seed) if len(per_seed) > 1 else None
            else:
                verdict, effect, spread = ("not learned" if with_results else "missing"), None, None
            trend, words = grid_trend(points)
            rows.append(GridEffectRow(axis=axis, compared=f"{v} − {base}", pairs=len(used), effect=effect,
                                      spread=spread, seeds=len(per_seed), verdict=verdict, by_length=tuple(points),
                                      trend=trend, trend_words=words))
    return rows


def bytes_figure(spec: GridSpec, runs: pd.DataFrame) -> Figure | None:
    """Final mean accuracy against MB sent per node (log scale), one point per finished run, colour
    by the grid's first varying axis, marker by its second. None without finished runs."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if runs.empty:
        return None
    ok = runs[(runs["status"] == "ok") & runs["mean_acc"].notna() & (runs["mb_per_node"] > 0)]
    if ok.empty:
        return None
    varying = spec.varying()
    colour_axis = varying[0] if varying else None
    marker_axis = varying[1] if len(varying) > 1 else None
    markers = "osD^v<>Pp*Xh"
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    groups: dict[tuple[str, str], list] = {}
    for r in ok.itertuples():
        labels = spec.labels.get(r.cell_id, {})
        key = (labels.get(colour_axis, ""), labels.get(marker_axis, ""))
        groups.setdefault(key, []).append((r.mb_per_node, r.mean_acc))
    colours = {v: f"C{k % 10}" for k, v in enumerate(spec.axes.get(colour_axis, [""]))}
    marks = {v: markers[k % len(markers)] for k, v in enumerate(spec.axes.get(marker_axis, [""]))}
    for (c, m), pts in groups.items():
        xs, ys = zip(*pts)
        ax.scatter(xs, ys, s=22, c=colours.get(c, "C0"), marker=marks.get(m, "o"), alpha=0.8,
                   label=" · ".join(x for x in (c, m) if x))
    ax.set_xscale("log")
    ax.set_xlabel("MB sent per node (training and final rounds)")
    ax.set_ylabel("final mean accuracy over nodes (%)")
    ax.grid(alpha=0.3)
    if any(k != ("", "") for k in groups):
        ax.legend(fontsize=7, ncol=2, loc="best")
    fig.tight_layout()
    png, pdf = io.BytesIO(), io.BytesIO()
    fig.savefig(png, format="png")
    fig.savefig(pdf, format="pdf")
    plt.close(fig)
    title = f"Grid {spec.name}: accuracy against bytes"
    caption = (f"{len(ok)} finished runs of the {spec.name} grid; colour: {colour_axis or '-'}, "
               f"marker: {marker_axis or '-'}.")
    return Figure(name=f"grid-{spec.name}-accuracy-bytes", title=title, caption=caption,
                  png=png.getvalue(), pdf=pdf.getvalue())


def grid_section(results_dir: str | Path) -> GridSection:
    """The section of the grid whose aggregated results are in results_dir (runs.csv, grid.json)."""
    d = Path(results_dir)
    spec = load_spec(d / GRID_FILE)
    try:
        runs = pd.read_csv(d / "runs.csv")
    except pd.errors.EmptyDataError:
        runs = pd.DataFrame()
    except (OSError, ValueError) as e:
        raise CorruptFile(f"{d / 'runs.csv'}: cannot be read ({type(e).__name__}: {e})") from None
    finished = runs[runs["status"] == "ok"]["cell_id"].nunique() if not runs.empty else 0
    return GridSection(spec=spec, cells=len(spec.labels), finished=int(finished),
                       effects=grid_effects(spec, runs), figure=bytes_figure(spec, runs), runs=runs)
