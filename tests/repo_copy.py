"""A copy of the repository for tests that run the pipeline in a scratch folder."""
from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ignore(folder: str, names: list[str]) -> set[str]:
    """Leave out environments, caches, and the generated results and reports of the top level and
    of .test/ (workflow/report/ holds the report's caption and is kept)."""
    top = {"results", "report"} if Path(folder) == ROOT else set()
    if Path(folder) == ROOT / ".test":  # the catalog test config's own outputs
        top = {"results", "report", "data"}
    return {n for n in names if n in {".venv", ".git", ".snakemake", "__pycache__"} | top}


def copy_repo(dst: Path) -> Path:
    shutil.copytree(ROOT, dst, ignore=_ignore, symlinks=True)
    return dst


def small_paper_dir(dst: Path, n: int = 2, table: str = "table3", cell: str | None = None,
                    mini_epochs: int | None = None) -> None:
    """A paper dir whose `table` holds only its first n cells, or only `cell` (same header and
    validation). The other tables are copied whole: the workflow only reads `table`
    (tables=[table]), but `lpdl train` may read every table of the paper dir to find its cell.
    mini_epochs: the kept cells' mini run length (the optional mini_epochs column), so a test of
    the machinery trains 1 or 2 epochs instead of the protocol's 6."""
    import csv

    from lpdl_core.pipeline.cells.tables import PAPER_DIR, load_cells

    dst.mkdir(parents=True)
    ids = [c.cell_id for c in load_cells(None, tables=[table])]
    for src in PAPER_DIR.glob("*.csv"):
        if src.name != f"{table}.csv":
            shutil.copy(src, dst / src.name)
            continue
        with src.open(newline="") as f:
            rows = list(csv.DictReader(f))
        rows = rows[:n] if cell is None else [rows[ids.index(cell)]]
        fields = list(rows[0])
        if mini_epochs is not None:
            fields += [] if "mini_epochs" in fields else ["mini_epochs"]
            rows = [{**r, "mini_epochs": str(mini_epochs)} for r in rows]
        with (dst / src.name).open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
            w.writeheader()
            w.writerows(rows)


def snakemake_on_rehearsal(repo: Path, data: Path, *config: str, targets: tuple[str, ...] = (),
                           timeout: float = 1200):
    """The venv's snakemake in `repo` with the paper profile on Table 3 of the paper dir `small`,
    over a scaled-down rehearsal CIFAR-10 written to `data` first (compile off); `config` adds
    --config pairs. Returns the CompletedProcess."""
    import os
    import subprocess
    import sys

    from lpdl_core.cli import main

    assert main(["-q", "rehearsal-data", "--out", str(data), "--scale", "0.005", "--dataset", "cifar10"]) == 0
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([str(bin_dir / "snakemake"), "-c2", "--configfile", "config/paper.yaml", "--config",
                           "paper_dir=small", "tables=[table3]", f"data_root={data}", "compile=false", *config,
                           *(("--", *targets) if targets else ())],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
