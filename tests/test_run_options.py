"""One run-options object from the command line or the workflow config through the run: the
workflow's keys, `lpdl train`'s flags and the object agree (a round trip), and what cannot go
together is refused from the object alone."""
import dataclasses

import pytest

from lpdl_core.cli.parser import build_parser
from lpdl_core.cli.train import run_options
from lpdl_core.compat import incompatible
from lpdl_core.config import DEFAULT_DIST_TIMEOUT_S
from lpdl_core.decentral import p2p
from lpdl_core.run_options import RunOptions

CASES = [
    RunOptions(),
    RunOptions(device="cpu", executor="batched", compile=True, compile_mode="default"),
    RunOptions(executor="batched", fused_quant=True, pack_size=3, data_root="/data/here", offline=True),
    RunOptions(device="cuda", executor="distributed", dist_timeout=45.5),
]


@pytest.mark.parametrize("options", CASES, ids=lambda o: o.executor)
def test_options_survive_the_train_commands_flags(options):
    """What the workflow's train job passes (`argv`) is what `lpdl train` runs with."""
    a = build_parser().parse_args(["train", "--cell", "c", "--out", "o", *options.argv()])
    back = run_options(a)
    # the timeout is a flag of one-process-per-node runs only; the others keep the default
    want = options if options.executor == "distributed" else \
        dataclasses.replace(options, dist_timeout=back.dist_timeout)
    assert back == want


def test_the_workflow_configs_keys_give_the_options():
    cfg = {"device": "cpu", "executor": "batched", "compile": True, "compile_mode": "max-autotune",
           "fused_quant": False, "cells_per_job": "pack", "pack_size": 6, "data_root": "", "dist_timeout": 120}
    o = RunOptions.from_config(cfg, offline=True)
    assert o == RunOptions(device="cpu", executor="batched", compile=True, compile_mode="max-autotune",
                           pack_size=6, data_root=None, offline=True, dist_timeout=120.0)
    assert RunOptions.from_config(dict(cfg, cells_per_job="bundle")).pack_size == 1  # pack_size only with packing
    assert RunOptions.from_config({}) == RunOptions()


def test_the_default_timeout_is_written_once():
    assert RunOptions().dist_timeout == p2p.P2PCfg().timeout_s == DEFAULT_DIST_TIMEOUT_S


def test_a_combination_is_refused_from_the_options_and_the_streams():
    assert incompatible(RunOptions(executor="loop", compile=True)).startswith("compile (--compile) needs executor")
    assert "a pack runs in one process" in incompatible(RunOptions(executor="distributed", pack_size=2))
    fused = RunOptions(executor="batched", fused_quant=True)
    assert incompatible(fused) is None and "rng_streams shared" in incompatible(fused, rng_streams="shared")


def test_the_run_records_how_it_ran():
    o = RunOptions(device="cpu", executor="batched", compile=True)
    assert o.record() == {"executor": "batched", "compile": True, "fused_quant": False, "device_requested": "cpu"}
    assert {"executor", "device", "compile", "compile_mode", "fused_quant"} == set(o.engine_fields())
