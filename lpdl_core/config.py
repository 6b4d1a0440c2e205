"""Settings shared by the command line, the workflow and the library, with no torch import.

`Fidelity`: where the official code differs from the paper's text (defaults follow the paper).
Every option has a closed set of values; parsing accepts exactly those (no guessing).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from .errors import ConfigError

LEARNED_MARGIN = 5.0  # points above chance (100 / classes) a result must reach to count as learned
EXECUTORS = ("loop", "batched")        # how the n nodes' forward/backward runs (same math)
DEVICES = ("auto", "cpu", "cuda")      # auto: CUDA when available

# option -> its allowed values, the paper's text first (the default)
FIDELITY_CHOICES: dict[str, tuple[Any, ...]] = {
    "official_quant": (False, True),
    "choco_form": ("paper", "code"),
    "choco_replicas": ("per-neighbour", "official-aggregate"),
    "bytes_metric": ("exact", "legacy"),
}


@dataclass(frozen=True, kw_only=True)
class Fidelity:
    """Where the official code differs from the paper's text; defaults follow the paper.

    official_quant: QuantMeasure ranges as gossiped parameters + stochastic activation rounding
        in train and eval (the official code) instead of buffers + nearest rounding.
    choco_form: "paper" Σ_j (W_ij − I_ij)(x̂_j − x̂_i) | "code" Σ_j (W_ij − I_ij) x̂_j.
    choco_replicas: "per-neighbour" | "official-aggregate" (static graphs only).
    bytes_metric: "exact" | "legacy" (the official 4(d+1) / 6k+3 count).
    """

    official_quant: bool = False
    choco_form: str = "paper"
    choco_replicas: str = "per-neighbour"
    bytes_metric: str = "exact"

    def __post_init__(self) -> None:
        for f in fields(self):
            value, allowed = getattr(self, f.name), FIDELITY_CHOICES[f.name]
            # bool is checked by type: 1 == True would otherwise pass as a boolean
            if not any(type(value) is type(a) and value == a for a in allowed):
                raise ConfigError(f"fidelity {f.name}: {value!r} is not one of "
                                  f"{', '.join(_show(a) for a in allowed)}")

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "Fidelity":
        unknown = sorted(set(values) - set(FIDELITY_CHOICES))
        if unknown:
            raise ConfigError(f"unknown fidelity option {unknown[0]!r}; valid: {', '.join(FIDELITY_CHOICES)}")
        return cls(**values)

    @classmethod
    def from_pairs(cls, pairs) -> "Fidelity":
        """KEY=VALUE strings (the command line). Booleans are exactly true/false."""
        kw: dict[str, Any] = {}
        for pair in pairs or ():
            key, sep, text = pair.partition("=")
            if not sep:
                raise ConfigError(f"fidelity: expected KEY=VALUE, got {pair!r}")
            if key not in FIDELITY_CHOICES:
                raise ConfigError(f"unknown fidelity option {key!r}; valid: {', '.join(FIDELITY_CHOICES)}")
            kw[key] = parse_choice(f"fidelity {key}", text, FIDELITY_CHOICES[key])
        return cls(**kw)


def _show(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def parse_choice(field: str, text: str, allowed: tuple[Any, ...]) -> Any:
    """The allowed value whose spelling is exactly `text` (booleans: true/false)."""
    for a in allowed:
        if _show(a) == text:
            return a
    raise ConfigError(f"{field}: {text!r} is not one of {', '.join(_show(a) for a in allowed)}")


# ---- the workflow's config (config/*.yaml + --config) ---------------------------------------

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


def check_workflow_config(config: Mapping, schema: Mapping) -> dict:
    """The config with --config strings coerced to the schema's types, validated against the
    schema; ConfigError naming the first bad key otherwise."""
    import jsonschema

    cfg = _coerce(dict(config), schema)
    err = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(cfg))
    if err is not None:
        key = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        raise ConfigError(f"{key}: {err.message}")
    return cfg
