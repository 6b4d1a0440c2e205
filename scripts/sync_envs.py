"""Write the conda environments of the workflow's rules from pyproject.toml, so they cannot drift.

    python scripts/sync_envs.py          # rewrite envs/* and environment.yml
    python scripts/sync_envs.py --check  # exit 1, naming the stale files, if any differs

Each rule's environment (used with `snakemake --sdm conda`) holds Python, pip and every runtime
dependency of lpdl_core as pinned in pyproject.toml; its post-deploy script (which Snakemake runs
once, inside the new environment, from the working directory) installs lpdl itself from the
checkout, editable and without dependencies, plus the rule's offline extras ([tool.lpdl] in
pyproject.toml: the pretrained MiniLM stand-in that the text cells load). environment.yml at the
root is the one environment for running Snakemake itself (the `workflow` extra included).
tests/test_envs.py runs --check.
"""
from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENVS = ROOT / "envs"
HEADER = "# Generated from pyproject.toml by scripts/sync_envs.py: edit pyproject.toml, then rerun it.\n"

# env name -> (the rules that use it, whether it installs the offline model extras, whether it
# holds only the light dependencies: the torch-free aggregate and report steps)
RULE_ENVS = {
    "train": ("every train_* job, download, demo, cost, partitions", True, False),
    "aggregate": ("aggregate", False, True),
    "report": ("report", False, True),
}


def _name(requirement: str) -> str:
    """'pandas>=2.2' -> 'pandas'."""
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()


def light(deps: list[str], names: list[str]) -> list[str]:
    """The requirements among deps whose package is in names (in deps' order); every name must be one."""
    missing = sorted(set(names) - {_name(d) for d in deps})
    if missing:
        raise SystemExit(f"[tool.lpdl] light-dependencies names packages not in dependencies: {', '.join(missing)}")
    return [d for d in deps if _name(d) in names]

# The post-deploy script finds the checkout from the working directory (the repository root, or a
# folder inside it such as .test/): Snakemake copies the script into .snakemake/conda/ first.
POST_DEPLOY = """#!/usr/bin/env bash
{header}# Runs once inside the new conda env: installs lpdl from this checkout (editable, no dependencies:
# the env file already pins them){extras_note}.
set -euo pipefail
root="$PWD"
until [ -f "$root/pyproject.toml" ] && grep -q '^name = "lpdl_core"' "$root/pyproject.toml"; do
  [ "$root" = / ] && {{ echo "lpdl post-deploy: no lpdl checkout at or above $PWD" >&2; exit 1; }}
  root="$(dirname "$root")"
done
python -m pip install --no-deps -e "$root"
{extras}"""


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _python(spec: str) -> str:
    """requires-python '>=3.11' -> conda's 'python>=3.11'."""
    return "python" + spec.replace(" ", "")


def _env_yaml(name: str, deps: list[str], python: str, used_by: str) -> str:
    lines = [HEADER.rstrip("\n"), f"# The conda env of: {used_by}.", "channels:", "  - conda-forge",
             "dependencies:", f"  - {python}", "  - pip", "  - pip:"]
    lines += [f"      - {d}" for d in deps]
    return "\n".join(lines) + "\n"


def expected_files() -> dict[Path, str]:
    """Every generated file and the text it must hold."""
    pp = _pyproject()
    project = pp["project"]
    deps = list(project["dependencies"])
    python = _python(project["requires-python"])
    extras = list(pp["tool"]["lpdl"]["offline-models"])
    lite = light(deps, list(pp["tool"]["lpdl"]["light-dependencies"]))
    out: dict[Path, str] = {}
    for name, (used_by, with_extras, is_light) in RULE_ENVS.items():
        out[ENVS / f"{name}.yaml"] = _env_yaml(name, lite if is_light else deps, python, used_by)
        extra_cmd = "".join(f"python -m pip install --no-deps {e}\n" for e in extras) if with_extras else ""
        note = f", and {', '.join(extras)} without its dependencies" if with_extras and extras else ""
        out[ENVS / f"{name}.post-deploy.sh"] = POST_DEPLOY.format(header=HEADER, extras_note=note,
                                                                  extras=extra_cmd)
    workflow = list(project["optional-dependencies"]["workflow"])
    root_env = [HEADER.rstrip("\n"),
                "# One conda env to run Snakemake (and lpdl) from; the rules' own envs are envs/*.",
                "# lpdl itself is installed from this checkout (-e ., the last pip line). After `conda env create",
                "# -f environment.yml`, the offline text model, which must come without its dependencies: "
                + " && ".join(f"pip install --no-deps {e}" for e in extras),
                "name: lpdl", "channels:", "  - conda-forge", "dependencies:", f"  - {python}", "  - pip",
                "  - pip:"] + [f"      - {d}" for d in deps + workflow] + ["      - -e ."]
    out[ROOT / "environment.yml"] = "\n".join(root_env) + "\n"
    return out


def stale() -> list[Path]:
    """Generated files whose text differs from pyproject.toml's (or that are missing)."""
    return [p for p, text in expected_files().items() if not p.is_file() or p.read_text() != text]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only report stale files (exit 1 if any)")
    a = ap.parse_args(argv)
    if a.check:
        bad = stale()
        for p in bad:
            print(f"stale: {p.relative_to(ROOT)} (run python scripts/sync_envs.py)", file=sys.stderr)
        return 1 if bad else 0
    ENVS.mkdir(parents=True, exist_ok=True)
    for p, text in expected_files().items():
        p.write_text(text)
        if p.suffix == ".sh":
            p.chmod(0o755)
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
