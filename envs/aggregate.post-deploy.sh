#!/usr/bin/env bash
# Generated from pyproject.toml by scripts/sync_envs.py: edit pyproject.toml, then rerun it.
# Runs once inside the new conda env: installs lpdl from this checkout (editable, no dependencies:
# the env file already pins them).
set -euo pipefail
root="$PWD"
until [ -f "$root/pyproject.toml" ] && grep -q '^name = "lpdl_core"' "$root/pyproject.toml"; do
  [ "$root" = / ] && { echo "lpdl post-deploy: no lpdl checkout at or above $PWD" >&2; exit 1; }
  root="$(dirname "$root")"
done
python -m pip install --no-deps -e "$root"
