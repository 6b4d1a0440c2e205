"""The workflow's config, read as Snakemake reads it, for the commands that must agree with it
(`lpdl status`) and for the workflow itself (workflow/rules/common.smk): one home for how a
config is checked, completed and turned into results folders. Torch-free.

Snakemake's order: the Snakefile's `configfile` (config/config.yaml), then each `--configfile`,
then `--config KEY=VALUE`, each updating the one before (nested mappings key by key).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from ...config import (CELLS_PER_JOB, COMPILE_MODES, DEFAULT_DIST_TIMEOUT_S, DEVICES, EXECUTORS, FIDELITY_CHOICES,
                      FIDELITY_PRESETS, GPU_REQUESTS, MAX_DEMO_EPOCHS, MAX_DIST_TIMEOUT_S, MAX_NODES, MAX_PACK_SIZE,
                      MAX_PATH, MAX_RUNTIME_MARGIN, MAX_RUNTIME_MIN, MAX_SEED, MAX_SEEDS, MAX_THREADS, PACKAGE_DIR,
                      PROFILES, ROUNDING_ONLY, TABLES, Fidelity, other_mode, results_name)
from ...bounded import check_values, load_yaml
from ...errors import ConfigError

SCHEMA = Path("workflow/schemas/config.schema.yaml")   # relative to the workflow's directory
CONFIGFILE = Path("config/config.yaml")                # the Snakefile's configfile


def _coerce(value: Any, schema: Mapping) -> Any:
    """Snakemake hands nested --config values over as strings ('[1,2]' -> ['1', '2']); turn a
    string into the integer, number or boolean the schema asks for, spelled exactly (booleans:
    true/false in any case; numbers finite). Anything else is left for validation to reject."""
    kind = schema.get("type")
    if kind == "array":
        if not isinstance(value, list):
            value = [value]  # seeds=7 means [7]
        return [_coerce(v, schema.get("items", {})) for v in value]
    if kind == "object" and isinstance(value, dict):
        props = schema.get("properties", {})
        return {k: _coerce(v, props.get(k, {})) for k, v in value.items()}
    if isinstance(value, str):
        text = value.strip()
        if kind == "integer" and re.fullmatch(r"[+-]?\d+", text):
            return int(text)
        if kind == "number" and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", text):
            return float(text)
        if kind == "boolean" and text.lower() in ("true", "false"):
            return text.lower() == "true"
    return value


def with_vocabulary(schema: Mapping) -> dict:
    """The workflow schema with this module's names as the enums of the keys that take them (the
    YAML schema does not repeat them)."""
    import copy

    out = copy.deepcopy(dict(schema))
    props = out["properties"]
    for key, names in (("profile", PROFILES), ("device", DEVICES), ("executor", EXECUTORS),
                       ("cells_per_job", CELLS_PER_JOB), ("gpu_request", GPU_REQUESTS),
                       ("compile_mode", COMPILE_MODES)):
        props[key]["enum"] = list(names)
    props["tables"]["items"]["enum"] = list(TABLES)
    props["tables"]["maxItems"] = len(TABLES)
    props["seeds"]["items"]["maximum"] = MAX_SEED
    props["seeds"]["maxItems"] = MAX_SEEDS
    props["demo"]["properties"]["nodes"]["maximum"] = MAX_NODES["demo"]
    props["demo"]["properties"]["epochs"]["maximum"] = MAX_DEMO_EPOCHS
    props["dist_timeout"]["maximum"] = MAX_DIST_TIMEOUT_S
    props["dist_timeout"]["default"] = DEFAULT_DIST_TIMEOUT_S
    props["threads_per_job"]["maximum"] = MAX_THREADS
    props["pack_size"]["maximum"] = MAX_PACK_SIZE
    props["max_runtime"]["maximum"] = MAX_RUNTIME_MIN
    props["runtime_margin"]["maximum"] = MAX_RUNTIME_MARGIN
    for key in ("paper_dir", "report_dir", "data_root", "step_times"):
        props[key]["maxLength"] = MAX_PATH
    fid = props["fidelity"]["oneOf"]
    fid[0]["enum"] = list(FIDELITY_PRESETS)
    for key, allowed in FIDELITY_CHOICES.items():
        fid[1]["properties"][key] = {"enum": list(allowed)}
    return out


def _check_finite(value: Any, key: str = "") -> None:
    """ConfigError naming the key of the first NaN or infinity: Snakemake parses `x=nan` and
    `x=inf` as floats, and NaN passes every minimum and maximum of a JSON schema."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key or '(top level)'}: {value} is not a finite number")
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        _check_finite(v, f"{key}/{k}" if key else str(k))


def check_workflow_config(config: Mapping, schema: Mapping) -> dict:
    """The config with --config strings coerced to the schema's types, validated against the
    schema with the vocabulary's enums (with_vocabulary); ConfigError naming the first bad key
    otherwise."""
    import jsonschema

    check_values(dict(config), "config")  # before any walk expands a YAML alias bomb
    schema = with_vocabulary(schema)
    cfg = _coerce(dict(config), schema)
    _check_finite(cfg)
    err = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(cfg))
    if err is not None:
        key = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        if err.validator in ("maxLength", "maxItems"):  # jsonschema would repeat the whole value
            unit = "characters" if err.validator == "maxLength" else "items"
            raise ConfigError(f"{key}: {len(err.instance)} {unit}, more than the maximum of {err.validator_value}")
        raise ConfigError(f"{key}: {err.message}")
    _check_compatible(cfg)
    return cfg


def _check_compatible(cfg: Mapping) -> None:
    """ConfigError for a combination of how-to-run keys a job would refuse (lpdl_core.compat), in
    each fidelity mode the config runs."""
    from ...compat import incompatible
    from ...run_options import RunOptions

    fidelity = Fidelity.from_mapping(cfg.get("fidelity", "paper"))
    fidelities = [fidelity] + ([other_mode(cfg.get("profile", "mini"), fidelity)[1]]
                               if cfg.get("compare_modes") else [])
    options = RunOptions.from_config(cfg)
    for fid in fidelities:
        why = incompatible(options, rng_streams=fid.rng_streams)
        if why:
            mode = f" (fidelity mode {fid.mode})" if fid.rng_streams != "per-node" else ""
            raise ConfigError(why + mode)


def resolve(config: Mapping, schema: Mapping) -> dict:
    """The config checked against the schema (ConfigError naming the key), with the schema's
    defaults filled in for the optional keys."""
    cfg = check_workflow_config(config, schema)
    if not cfg.get("tables") and not cfg.get("extensions"):
        raise ConfigError("tables: empty and no extensions: nothing to run (name paper tables, "
                          "extension grids, or both)")
    # the defaults of the schema as checked (with_vocabulary adds those that live in config.py)
    for key, spec in with_vocabulary(schema)["properties"].items():
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


def defining_fidelity_json(fidelity: Fidelity) -> str:
    """A mode's fidelity as the train job's params (typed JSON): the options that define its runs.
    The rounding-only ones (ROUNDING_ONLY) are left out, so changing them, or lpdl gaining one,
    never reruns a finished job; the job adds them from the config (`job_fidelity_json`)."""
    return json.dumps({k: v for k, v in fidelity.as_dict().items() if k not in ROUNDING_ONLY}, sort_keys=True)


def job_fidelity_json(params_json: str, config: Mapping, results: str) -> str:
    """The train job's whole fidelity: its params' options and the rounding-only ones of the mode
    whose folder `results` is (or, for an extension grid's folder, the folder it extends)."""
    config = {"fidelity": "paper", **config}  # the schema's default
    folders = {name: f for name, f in modes(config).items() if results == name or results.startswith(name + "-")}
    fidelity = folders[max(folders, key=len)]  # results/mini-official-<grid> extends mini-official, not mini
    return json.dumps({**json.loads(params_json), **{k: getattr(fidelity, k) for k in ROUNDING_ONLY}},
                      sort_keys=True)


def _update(base: dict, new: Mapping) -> dict:
    for k, v in new.items():
        base[k] = _update(dict(base[k]), v) if isinstance(v, Mapping) and isinstance(base.get(k), dict) else v
    return base


def _yaml(path: Path) -> dict:
    data = load_yaml(path, "config file")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a mapping of config keys")
    return data


def load(directory: str | Path = ".", configfiles: Iterable[str] = (), overrides: Iterable[str] = ()) -> dict:
    """The resolved config of `snakemake [--directory D] [--configfile F ...] [--config K=V ...]`
    started here: as Snakemake does, each F is read relative to where it was started (this
    process's working folder), the Snakefile's config/config.yaml and the config's relative paths
    relative to the working directory D."""
    import yaml

    directory = Path(directory)
    # the schema sits beside the Snakefile: in the folder, or (snakemake --directory .test) in the
    # checkout this lpdl_core belongs to
    schema_path = next((d / SCHEMA for d in (directory, PACKAGE_DIR.parent) if (d / SCHEMA).is_file()), None)
    if schema_path is None:
        raise ConfigError(f"{directory}: no {SCHEMA} (run in the lpdl checkout, or give its folder)")
    cfg = _yaml(directory / CONFIGFILE)
    for f in configfiles:
        cfg = _update(cfg, _yaml(Path(f).absolute()))  # as snakemake's ConfigSettings: before its chdir
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
