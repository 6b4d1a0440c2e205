"""Does what the report shows match the run folders and the config? (torch-free)

For every cell and seed a config names, in each results folder it writes, the state of its run:

  current    its metrics.json is the run the config asks for (identity checked);
  missing    no metrics.json: the run has not been made (or was removed);
  damaged    its metrics.json cannot be read;
  other-run  its metrics.json holds another run: other settings (a changed config or cells CSV),
             or another cell, seed or profile;

and whether runs.csv, which the tables and the report are built from, holds exactly that file
(the same sha256; a damaged or other run is held as a marked row without numbers). Then the
report: built after its runs.csv and tables, or not.

`lpdl status` prints all this. The workflow checks it after every invocation that built the
default target (Snakefile, `onsuccess`): a file that runs.csv or the report does not reflect
fails the invocation, so "100% done" never stands beside a stale report; damaged and other runs,
which the report marks, are named in one line each.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from ...config import Fidelity
from ...errors import CorruptFile, RunMismatch
from ..cells.cell import Cell
from ..run.runstore import read_run_metrics, run_data, run_identity
from ..aggregation.tidy import RUNS_FILE, file_sha256, run_dir

STATES = ("current", "missing", "damaged", "other-run")
# what to do about each state that is not current
REMEDY = {"missing": "snakemake makes it", "damaged": "remove its run folder, then snakemake recomputes it",
          "other-run": "snakemake reruns it when the config asks for it; otherwise remove its run folder",
          "unaggregated": "snakemake rebuilds runs.csv and the report"}


@dataclass(frozen=True)
class RunState:
    cell_id: str
    seed: int
    state: str              # one of STATES
    why: str = ""
    aggregated: bool = False  # runs.csv holds exactly this metrics.json (False when missing)

    @property
    def reflected(self) -> bool:
        """Whether the report shows what the folder holds: the file is in runs.csv (a damaged or
        other run as a marked row without numbers)."""
        return self.aggregated


@dataclass(frozen=True)
class FolderStatus:
    """The states of one results folder's runs, and whether its report is built from them."""

    results: Path
    runs: tuple[RunState, ...]
    report: str | None = None  # None: no report checked; else "current" or why it is not
    extra: tuple[str, ...] = field(default_factory=tuple)  # runs.csv rows no cell of the config names

    @property
    def counts(self) -> Counter:
        return Counter(r.state for r in self.runs)

    @property
    def unreflected(self) -> list[RunState]:
        """Runs whose file runs.csv does not hold (missing runs included)."""
        return [r for r in self.runs if not r.reflected]

    @property
    def consistent(self) -> bool:
        """The report and runs.csv show exactly what the run folders hold (damaged and other runs
        as marked cells): nothing missing, nothing unaggregated, the report newer than its inputs."""
        return not self.unreflected and not self.extra and self.report in (None, "current")

    @property
    def current(self) -> bool:
        """Consistent, and every run is the one the config asks for."""
        return self.consistent and all(r.state == "current" for r in self.runs)

    def lines(self, limit: int | None = 20) -> list[str]:
        """A summary line, then one line per run that is not current or not in runs.csv (at most
        `limit`), then runs.csv rows the config does not name, then the report."""
        c = self.counts
        seeds = len({r.seed for r in self.runs})
        present = [r for r in self.runs if r.state != "missing"]
        unaggregated = sum(not r.aggregated for r in present)
        head = (f"{self.results}: {len({r.cell_id for r in self.runs})} cells x {seeds} seed{'s' * (seeds != 1)}: "
                + ", ".join(f"{c[s]} {s}" for s in STATES if c[s] or s == "current")
                + (f"; {unaggregated} not in runs.csv" if unaggregated else ""))
        out = [head]
        bad = [r for r in self.runs if r.state != "current" or not r.aggregated]
        for r in bad[:limit]:
            state, why = (r.state, r.why) if r.state != "current" else ("unaggregated", r.why)
            out.append(f"  {state:<12} {r.cell_id} seed {r.seed}: {why} ({REMEDY[state]})")
        if limit is not None and len(bad) > limit:
            out.append(f"  ... and {len(bad) - limit} more")
        if self.extra:
            out.append(f"  runs.csv holds {len(self.extra)} runs the config does not name, e.g. {self.extra[0]} "
                       f"({REMEDY['unaggregated']})")
        if self.report is not None:
            out.append(f"  report: {self.report}")
        return out


def _aggregated(results: Path) -> dict[tuple[str, int], str] | None:
    """(cell_id, seed) -> the metrics.json sha256 runs.csv was read from; None without runs.csv."""
    import csv

    path = results / RUNS_FILE
    if not path.is_file():
        return None
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error):
        return {}
    out = {}
    for r in rows:
        try:
            out[(r["cell_id"], int(r["seed"]))] = r.get("metrics_sha256") or ""
        except (KeyError, TypeError, ValueError):
            continue
    return out


def run_state(cell: Cell, seed: int, results: Path, *, profile: str, fidelity: Fidelity,
              aggregated: Mapping | None, data_root: str | None = None) -> RunState:
    path = run_dir(results, cell.cell_id, seed) / "metrics.json"
    if not path.exists():
        return RunState(cell.cell_id, seed, "missing", f"no {path}")
    try:
        sha = file_sha256(path)
    except OSError as e:
        return RunState(cell.cell_id, seed, "damaged", f"{path}: unreadable ({e.strerror})")
    held = aggregated is not None and aggregated.get((cell.cell_id, seed)) == sha
    try:
        read_run_metrics(path, run_identity(cell, profile=profile, seed=seed, fidelity=fidelity,
                                            data=run_data(cell, profile, data_root)))
    except CorruptFile as e:
        return RunState(cell.cell_id, seed, "damaged", str(e), held)
    except RunMismatch as e:
        return RunState(cell.cell_id, seed, "other-run", str(e), held)
    why = "" if held else (f"no {results / RUNS_FILE}" if aggregated is None
                           else f"{results / RUNS_FILE} does not hold this result")
    return RunState(cell.cell_id, seed, "current", why, held)


def report_state(report_dir: Path, results: Path, tables: Iterable[str], inputs: Iterable[Path] = ()) -> str:
    """"current" when report.html is at least as new as runs.csv and every table CSV it shows, and
    those are at least as new as the files they are built from besides the runs (`inputs`: the
    cells CSVs, whose paper values the tables copy, or a grid's spec)."""
    html = report_dir / "report.html"
    if not html.is_file():
        return f"no {html}"
    built = [results / RUNS_FILE, *(results / "tables" / f"{t}.csv" for t in tables)]
    for table in (p for p in built if p.is_file()):
        newer = [p for p in inputs if p.is_file() and p.stat().st_mtime > table.stat().st_mtime]
        if newer:
            return f"{table} is older than {newer[0]}, which it is built from"
    older = [p for p in built if p.is_file() and p.stat().st_mtime > html.stat().st_mtime]
    return f"{html} is older than {older[0]}" if older else "current"


def folder_status(cells: Iterable[Cell], results: str | Path, *, profile: str, seeds: Iterable[int],
                  fidelity: Fidelity, report_dir: str | Path | None = None,
                  tables: Iterable[str] = (), inputs: Iterable[Path] = (),
                  data_root: str | None = None) -> FolderStatus:
    """The state of every (cell, seed) of a results folder (and of its report, when given; inputs:
    the files its tables are built from besides the runs, report_state)."""
    results, cells, seeds = Path(results), list(cells), [int(s) for s in seeds]
    aggregated = _aggregated(results)
    states = tuple(run_state(c, s, results, profile=profile, fidelity=fidelity, aggregated=aggregated,
                             data_root=data_root)
                   for c in cells for s in seeds)
    named = {(c.cell_id, s) for c in cells for s in seeds}
    extra = tuple(sorted(f"{c} seed {s}" for c, s in (aggregated or {}) if (c, s) not in named))
    report = report_state(Path(report_dir), results, tables, inputs) if report_dir is not None else None
    return FolderStatus(results=results, runs=states, report=report, extra=extra)


def config_status(config: Mapping, cells: Iterable[Cell], grids: Mapping[str, Iterable[Cell]],
                  root: str | Path = ".") -> list[FolderStatus]:
    """The state of every results folder a resolved workflow config writes (wfconfig.resolve), in
    the workflow's directory root: the paper cells' folder in each mode (none with tables: []),
    then each extension grid's folder (grids: name -> its cells) in the config's mode. The report
    is checked with the folder it shows first and with every grid's. One home for the list that
    `lpdl status` and the check after `snakemake` (hooks.check_results_current) both hold."""
    from ..cells.tables import paper_dir_path
    from ..cells.grids import grid_folder, grid_path
    from .wfconfig import modes

    root, folder_modes, cells = Path(root), modes(config), list(cells)
    main = next(iter(folder_modes))
    report_dir = root / config["report_dir"]
    common = dict(profile=config["profile"], seeds=config["seeds"], data_root=_root_path(root, config["data_root"]))
    paper = paper_dir_path(config["paper_dir"])
    csvs = [(root / paper if not paper.is_absolute() else paper) / f"{t}.csv" for t in config["tables"]]
    out = [folder_status(cells, root / "results" / name, fidelity=fid, tables=config["tables"], inputs=csvs,
                         report_dir=report_dir if name == main else None, **common)
           for name, fid in (folder_modes.items() if config["tables"] else ())]
    out += [folder_status(list(grid_cells), root / "results" / grid_folder(main, name), fidelity=folder_modes[main],
                          report_dir=report_dir, tables=[name], inputs=[grid_path(name, root)], **common)
            for name, grid_cells in grids.items()]
    return out


def _root_path(root: Path, data_root: str | None) -> str | None:
    """The data root the workflow's jobs read (lpdl_core.rehearsal_mark.resolve_root, run in the
    working directory `root`)."""
    from ...rehearsal_mark import resolve_root

    path = resolve_root(data_root)
    return str(path if path.is_absolute() else root / path)
