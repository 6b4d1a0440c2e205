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
