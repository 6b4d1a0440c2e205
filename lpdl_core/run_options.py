"""How a run is computed, never what: one object from the command line (`lpdl train`'s flags) or
the workflow config (its keys) through the run (`run_cell`, `run_cells_packed`, the engine's
config, the run folder's lock) to the record in metrics.json. None of it is part of a run's
identity, so changing it never reruns a finished cell. Torch-free.

Which options cannot go together is lpdl_core.compat's table (`incompatible`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .config import DEFAULT_DIST_TIMEOUT_S
from .specs.executors import DEFAULT_EXECUTOR


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """device: "auto", "cpu" or "cuda". executor: a registered executor (lpdl_core.specs.executors).
    compile: each training iteration as one torch.compile graph, with `compile_mode`.
    fused_quant: the 8-bit quantizers as fused kernels in eager steps. pack_size: cells trained as
    one pack (1: each alone). data_root: where the datasets are (None: $LPDL_DATA or ./data).
    offline: download nothing. dist_timeout: seconds a rank of a one-process-per-node run waits for
    another."""

    device: str = "auto"
    executor: str = DEFAULT_EXECUTOR
    compile: bool = False
    compile_mode: str = "auto"
    fused_quant: bool = False
    pack_size: int = 1
    data_root: str | None = None
    offline: bool = False
    dist_timeout: float = DEFAULT_DIST_TIMEOUT_S

    @property
    def packed(self) -> bool:
        return self.pack_size > 1

    @classmethod
    def from_config(cls, cfg: Mapping, *, offline: bool = False) -> RunOptions:
        """The options a workflow config's keys give (executor, device, compile, compile_mode,
        fused_quant, cells_per_job with pack_size, data_root, dist_timeout); unset keys keep the
        defaults above."""
        packed = cfg.get("cells_per_job") == "pack"
        return cls(device=cfg.get("device") or "auto", executor=cfg.get("executor") or DEFAULT_EXECUTOR,
                   compile=bool(cfg.get("compile")), compile_mode=cfg.get("compile_mode") or "auto",
                   fused_quant=bool(cfg.get("fused_quant")),
                   pack_size=int(cfg.get("pack_size", 4)) if packed else 1,
                   data_root=cfg.get("data_root") or None, offline=offline,
                   dist_timeout=float(cfg.get("dist_timeout") or DEFAULT_DIST_TIMEOUT_S))

    def argv(self) -> list[str]:
        """These options as `lpdl train` flags (what the workflow's train job passes)."""
        from .specs.executors import executor_spec

        return ["--device", self.device, "--executor", self.executor,
                *(("--compile", "--compile-mode", self.compile_mode) if self.compile else ()),
                *(("--fused-quant",) if self.fused_quant else ()),
                *(("--pack-size", str(self.pack_size)) if self.packed else ()),
                *(("--data-root", self.data_root) if self.data_root else ()),
                *(("--offline",) if self.offline else ()),
                *(("--dist-timeout", f"{self.dist_timeout:g}") if executor_spec(self.executor).per_node_process
                  else ())]

    def engine_fields(self) -> dict:
        """The engine config's how-to-run fields (lpdl_core.decentral.engine.EngineCfg)."""
        return {"executor": self.executor, "device": self.device, "compile": self.compile,
                "compile_mode": self.compile_mode, "fused_quant": self.fused_quant}

    def record(self) -> dict:
        """What a run's metrics.json records of how it ran (its "config")."""
        return {"executor": self.executor, "compile": self.compile, "fused_quant": self.fused_quant,
                "device_requested": self.device}
