"""The workflow's config, read as Snakemake reads it, for the commands that must agree with it
(`lpdl status`) and for the workflow itself (workflow/rules/common.smk): one home for how a
config is checked, completed and turned into results folders. Torch-free.

Snakemake's order: the Snakefile's `configfile` (config/config.yaml), then each `--configfile`,
then `--config KEY=VALUE`, each updating the one before (nested mappings key by key).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

from ..config import PACKAGE_DIR, Fidelity, check_workflow_config, other_mode, results_name
from ..errors import ConfigError

SCHEMA = Path("workflow/schemas/config.schema.yaml")   # relative to the workflow's directory
CONFIGFILE = Path("config/config.yaml")                # the Snakefile's configfile


def resolve(config: Mapping, schema: Mapping) -> dict:
    """The config checked against the schema (ConfigError naming the key), with the schema's
    defaults filled in for the optional keys."""
    cfg = check_workflow_config(config, schema)
    if not cfg.get("tables") and not cfg.get("extensions"):
        raise ConfigError("tables: empty and no extensions: nothing to run (name paper tables, "
                          "extension grids, or both)")
    for key, spec in schema["properties"].items():
        if "default" in spec:
            cfg.setdefault(key, spec["default"])
    return cfg


def modes(config: Mapping) -> dict[str, Fidelity]:
    """results name -> fidelity of every results folder the config writes: its mode's, and with
    compare_modes the other mode's too (results/mini and results/mini-official)."""
    fidelity = Fidelity.from_mapping(config["fidelity"])
    out = {results_name(config["profile"], fidelity): fidelity}
    if config.get("compare_modes"):
        name, other = other_mode(config["profile"], fidelity)
        out[name] = other
    return out


def _update(base: dict, new: Mapping) -> dict:
    for k, v in new.items():
        base[k] = _update(dict(base[k]), v) if isinstance(v, Mapping) and isinstance(base.get(k), dict) else v
    return base


def _yaml(path: Path) -> dict:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a mapping of config keys")
    return data


def load(directory: str | Path = ".", configfiles: Iterable[str] = (), overrides: Iterable[str] = ()) -> dict:
    """The resolved config of `snakemake [--configfile F ...] [--config K=V ...]` run in directory
    (its working directory: config files and the config's relative paths are relative to it)."""
    import yaml

    directory = Path(directory)
    # the schema sits beside the Snakefile: in the folder, or (snakemake --directory .test) in the
    # checkout this lpdl_core belongs to
    schema_path = next((d / SCHEMA for d in (directory, PACKAGE_DIR.parent) if (d / SCHEMA).is_file()), None)
    if schema_path is None:
        raise ConfigError(f"{directory}: no {SCHEMA} (run in the lpdl checkout, or give its folder)")
    cfg = _yaml(directory / CONFIGFILE)
    for f in configfiles:
        cfg = _update(cfg, _yaml(directory / f if not Path(f).is_absolute() else Path(f)))
    for pair in overrides:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--config: expected KEY=VALUE, got {pair!r}")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        cfg = _update(cfg, {key: value})
    return resolve(cfg, _yaml(schema_path))
