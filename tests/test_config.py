"""One vocabulary (lpdl_core.config): every registry, validator, schema and command-line choice
uses exactly its names, so a name is added or renamed in one place."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lpdl_core import config
from lpdl_core.pipeline.workflow.wfconfig import with_vocabulary

ROOT = Path(__file__).resolve().parents[1]


def test_config_imports_no_torch():
    code = ("import sys, lpdl_core.config, lpdl_core.pipeline.cells.tables, lpdl_core.pipeline.workflow.jobs, "
            "lpdl_core.pipeline.recipe.mini, lpdl_core.pipeline.run.runstore\n"
            "print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_registries_hold_exactly_the_vocabulary():
    from lpdl_core.decentral import algorithms
    from lpdl_core.models.registry import MODEL_DATASETS

    assert all(set(MODEL_DATASETS[m]) <= set(config.IMAGE_DATASETS) for m in config.CNN_MODELS)
    assert set(config.STANDIN_DATASETS.values()) <= set(config.PAPER_DATASETS)
    assert tuple(algorithms.REGISTRY) == config.ALGORITHMS


def test_every_name_builds():
    from lpdl_core.decentral.optim import OptimCfg
    from lpdl_core.decentral.topology import Topology
    from lpdl_core.quant.norms import make_norm
    from lpdl_core.quant.quantizer import QuantCfg
    from lpdl_core.training.schedule import ScheduleCfg

    for g in config.GRAPHS:
        assert Topology(name=g, n=8).W(0).shape == (8, 8)
    for k in config.SCHEDULES:
        ScheduleCfg(kind=k, milestones=(2,) if k == "multistep" else ())
    for m in config.MOMENTA:
        OptimCfg(momentum=m)
    fp_only, lp_only = {"evonorm", "range-evonorm-fp", "bn", "gn"}, {"range-evonorm"}
    for n in config.NORMS:
        if n not in lp_only:
            make_norm(n, 16)
        if n not in fp_only:
            make_norm(n, 16, qcfg=QuantCfg())


def test_the_library_names_are_the_vocabulary():
    """Modules that name their own choices re-export the vocabulary's tuples (no copies)."""
    from lpdl_core.decentral import optim, topology
    from lpdl_core.models import registry as models
    from lpdl_core.pipeline.cells import cell
    from lpdl_core.pipeline.cells import tables as cells
    from lpdl_core.pipeline.workflow import jobs
    from lpdl_core.quant import norms
    from lpdl_core.training import schedule

    assert tuple(topology.REGISTRY) == config.GRAPHS and schedule.SCHEDULES is config.SCHEDULES
    assert optim.MOMENTA is config.MOMENTA and norms.NORMS is config.NORMS
    assert jobs.CELLS_PER_JOB is config.CELLS_PER_JOB and models.MODELS is config.CNN_MODELS
    from lpdl_core.decentral.algorithms import ALGORITHMS
    assert ALGORITHMS is config.ALGORITHMS
    assert cell.valid_names()["precision"] is config.PRECISIONS and set(cells.expected_counts) == set(config.TABLES)
    assert set(cell.valid_names()["model"]) == set(config.MODELS)


def test_schema_takes_its_enums_from_the_vocabulary():
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    assert "enum:" not in (ROOT / "workflow/schemas/config.schema.yaml").read_text()  # no sixth copy
    props = with_vocabulary(schema)["properties"]
    assert props["profile"]["enum"] == list(config.PROFILES)
    assert props["tables"]["items"]["enum"] == list(config.TABLES)
    assert props["device"]["enum"] == list(config.DEVICES) and props["executor"]["enum"] == list(config.EXECUTORS)
    assert props["fidelity"]["oneOf"][0]["enum"] == ["paper", "official"]
    assert props["fidelity"]["oneOf"][1]["properties"]["quant_ranges"]["enum"] == ["buffers", "gossiped"]
    assert "enum" not in schema["properties"]["profile"]                                  # not mutated


def test_command_line_choices_are_the_vocabulary():
    from lpdl_core.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices
    train = {a.dest: a for a in sub["train"]._actions}
    assert tuple(train["profile"].choices) == config.PROFILES
    assert tuple(train["device"].choices) == config.DEVICES and tuple(train["executor"].choices) == config.EXECUTORS
    bench = {a.dest: a for a in sub["bench"]._actions}
    assert tuple(bench["model"].choices) == config.CNN_MODELS


@pytest.mark.parametrize("text, why", [
    ("{not json", "--fidelity-json: not JSON"),
    ("[1, 2]", "expected a JSON object or a preset name, got list"),
    ('{"quant_ranges": 1}', "quant_ranges: 1 is not one of buffers, gossiped"),   # typed: a number is no name
    ('"officiall"', "'officiall' is not one of paper, official"),
    ('{"nope": 1}', "unknown fidelity option 'nope'"),
])
def test_fidelity_json_is_typed_and_checked(tmp_path, text, why):
    r = subprocess.run([sys.executable, "-m", "lpdl_core", "train", "--cell", "t1-resnet20-single-c0-s0-none-fp32",
                        "--out", str(tmp_path / "x"), "--fidelity-json", text], capture_output=True, text=True)
    assert r.returncode == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "x").exists()


def test_fidelity_values_have_one_home():
    """The components validate a fidelity option's value against config.FIDELITY_CHOICES itself,
    never a second copy: a value added there is accepted everywhere, a typo rejected everywhere."""
    import pytest

    from lpdl_core.config import FIDELITY_CHOICES
    from lpdl_core.decentral import compress
    from lpdl_core.decentral.algorithms.base import GossipCfg
    from lpdl_core.quant import quantizer
    from lpdl_core.quant.norms import GATES
    from lpdl_core.training.run_cfg import RunCfg

    assert quantizer.ROUNDINGS is FIDELITY_CHOICES["act_rounding"]
    assert compress.BYTES_METRICS is FIDELITY_CHOICES["bytes_metric"]
    assert set(FIDELITY_CHOICES["range_evonorm_fp"]) <= set(GATES)
    for name in ("choco_form", "choco_replicas"):
        for v in FIDELITY_CHOICES[name]:
            GossipCfg(**{name: v})
        with pytest.raises(ValueError, match=f"gossip.{name} must be one of"):
            GossipCfg(**{name: "nope"})
    for name in ("final_rounds", "epoch_test", "final_round_limit"):
        for v in FIDELITY_CHOICES[name]:
            RunCfg(epochs=1, batch_size=8, lr=0.1, **{name: v})
        with pytest.raises(ValueError, match=f"run.{name} must be one of"):
            RunCfg(epochs=1, batch_size=8, lr=0.1, **{name: "nope"})


def test_no_module_declares_a_vocabulary_name_again():
    """PROFILES, PRECISIONS, the timeouts, DEFAULT_SEED and every other upper-case name of
    lpdl_core.config are assigned there only; other modules import them."""
    import ast

    pkg = ROOT / "lpdl_core"
    own = {t.id for node in ast.parse((pkg / "config.py").read_text()).body
           if isinstance(node, (ast.Assign, ast.AnnAssign))
           for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
           if isinstance(t, ast.Name) and t.id.isupper()}
    again = []
    for path in pkg.rglob("*.py"):
        if path.name == "config.py" and path.parent == pkg:
            continue
        for node in ast.parse(path.read_text()).body:
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) else [])
            again += [f"{path.relative_to(ROOT)}:{node.lineno}: {t.id}" for t in targets
                      if isinstance(t, ast.Name) and t.id in own]
    assert not again, again


def test_no_literal_type_repeats_a_vocabulary():
    """A config field is typed str and validated against lpdl_core.config's tuple (or
    FIDELITY_CHOICES), never given a Literal[...] copy of it that nothing compares with config."""
    import ast

    vocabularies = {frozenset(v) for k, v in vars(config).items() if k.isupper() and isinstance(v, tuple)
                    and len(v) > 1 and all(isinstance(x, str) for x in v)}
    vocabularies |= {frozenset(v) for v in config.FIDELITY_CHOICES.values()}
    copies = []
    for path in (ROOT / "lpdl_core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "Literal":
                elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
                values = frozenset(e.value for e in elts if isinstance(e, ast.Constant))
                if values in vocabularies:
                    copies.append(f"{path.relative_to(ROOT)}:{node.lineno}: Literal{sorted(values)}")
    assert not copies, copies


def test_the_distributed_timeout_has_one_home():
    from lpdl_core.cli import args
    from lpdl_core.training import group
    assert args.DEFAULT_TIMEOUT_S == group.DEFAULT_TIMEOUT_S == config.DEFAULT_DIST_TIMEOUT_S
    schema = with_vocabulary(yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text()))
    assert schema["properties"]["dist_timeout"]["default"] == config.DEFAULT_DIST_TIMEOUT_S
