"""The official run.sh settings (lpdl_core.pipeline.recipe.runsh) and Fidelity cell_settings="run.sh" in
plan_cell: every override names an existing cell, the typo cells keep the official kept counts,
Table 4's ResNet-18 cells run on the ring for 200 epochs, and "paper" changes nothing."""
from dataclasses import replace

import pytest

from lpdl_core.config import Fidelity
from lpdl_core.decentral.compress import kept_counts
from lpdl_core.decentral.layout import Layout
from lpdl_core.models.registry import build_model
from lpdl_core.pipeline.cells.tables import cells_by_id, load_cells
from lpdl_core.pipeline.recipe.mini import IMAGE_EPOCHS, same_runs
from lpdl_core.pipeline.run.runcell import plan_cell
from lpdl_core.pipeline.recipe.runsh import (
    OVERRIDES,
    RUNSH_LINES,
    RUNSH_OVERRIDES,
    RUNSH_SAME,
    RUNSH_UNMAPPED,
    RunshOverride,
    apply_runsh,
    as_runsh,
    check_registry,
    runsh_settings,
)

CELLS = load_cells()
BY_ID = cells_by_id(CELLS)
RUNSH = Fidelity(cell_settings="run.sh")
TYPO = {"t2-resnet20-dring8-c99-s0.8-ds-fp32": 7, "t2-resnet20-dring8-c99-s0.8-choco-fp32": 19}
T4_R18 = [c for c in CELLS if c.table == "table4" and c.model == "resnet18"]


def test_every_override_and_line_maps_onto_an_existing_cell():
    check_registry(CELLS)  # raises for an unknown cell id or a line listed twice / missing
    assert all(o.cell_id in BY_ID for o in OVERRIDES) and all(c in BY_ID for c in RUNSH_SAME.values())
    assert sorted([o.line for o in OVERRIDES] + [*RUNSH_SAME, *RUNSH_UNMAPPED]) == list(range(1, RUNSH_LINES + 1))
    assert sorted(RUNSH_UNMAPPED) == [9, 10, 11, 12]  # VGG-11 8-ring: no paper cell
    assert len(RUNSH_OVERRIDES) == 10 and set(TYPO) | {c.cell_id for c in T4_R18} == set(RUNSH_OVERRIDES)
    with pytest.raises(ValueError, match="no paper cell"):
        check_registry([c for c in CELLS if c.cell_id not in TYPO])


@pytest.mark.parametrize("cell_id", sorted(TYPO))
def test_typo_cells_keep_the_official_counts(cell_id):
    """k=0.099 keeps max(1, int(numel * 0.901)) per tensor: 246,152 of ResNet-20's 273,258."""
    layout = Layout.from_module(build_model("resnet20", precision="fp32", dataset="cifar10"))
    assert layout.d == 273_258
    run, paper = (plan_cell(BY_ID[cell_id], "paper", fidelity=f).gossip.compressor for f in (RUNSH, Fidelity()))
    assert run.kind == "topk" and run.ratio == 0.099 and sum(kept_counts(layout, run.ratio)) == 246_152
    assert paper.ratio == 0.99 and sum(kept_counts(layout, paper.ratio)) == 2_767


def test_table4_90_percent_keeps_the_official_resnet18_count():
    """Line 25 passes k=0.99 for the paper's 90%: 111,845 of ResNet-18's 11,186,442 kept."""
    layout = Layout.from_module(build_model("resnet18", precision="fp32", dataset="imagenette"))
    ratio = plan_cell(BY_ID["t4-imagenette-resnet18-torus8-c90-s0-choco-fp32"], "paper",
                      fidelity=RUNSH).gossip.compressor.ratio
    assert (layout.d, ratio, sum(kept_counts(layout, ratio))) == (11_186_442, 0.99, 111_845)


@pytest.mark.parametrize("cell", T4_R18, ids=lambda c: c.cell_id)
def test_table4_resnet18_runs_on_the_ring_for_200_epochs(cell):
    p = plan_cell(cell, "paper", fidelity=RUNSH)
    assert p.cell_id == cell.cell_id  # the run stays the paper cell's run
    assert (p.topology.name, p.topology.n) == ("directed-ring", 8)
    assert p.run.epochs == 200 and p.run.schedule.kind == "multistep" and p.run.schedule.milestones == (100, 150)
    assert p.run.batch_size == 32 and p.run.final_gossip_rounds == 36
    if cell.compression:  # the "90%" block: k and eta from run.sh, skew 0.8 for 0.6
        assert p.gossip.eta == 0.01 and p.run.skew == (0.8 if cell.skew == 0.6 else 0.0)
        assert p.gossip.compressor.ratio == (0.099 if (cell.skew, cell.precision) == (0.6, "fp32") else 0.99)
    else:
        assert p.gossip.eta == 1.0 and p.run.skew == cell.skew and p.gossip.compressor.kind == "identity"


@pytest.mark.parametrize("profile", ["paper", "mini"])
def test_paper_settings_leave_every_plan_unchanged(profile):
    for c in CELLS:
        p = plan_cell(c, profile)
        assert p == plan_cell(c, profile, fidelity=Fidelity(cell_settings="paper"))
        assert p.topology.n == c.nodes and p.gossip.eta == c.eta and p.run.skew == c.skew
        assert p.gossip.compressor.ratio == c.compression / 100
        assert not any("run.sh" in m for m in p.mapping)
        if profile == "paper":
            assert p.mapping == () and p.run.epochs == c.epochs and p.run.schedule.milestones == c.milestones
        if runsh_settings(c) is None:  # run.sh mode changes only the cells run.sh changed
            assert replace(plan_cell(c, profile, fidelity=RUNSH), fidelity=p.fidelity) == p


def test_mapping_names_the_runsh_line():
    p = plan_cell(BY_ID["t2-resnet20-dring8-c99-s0.8-ds-fp32"], "paper", fidelity=Fidelity.preset("official"))
    assert "run.sh line 7: compression 99% -> k=0.099 (keeps 90.1%)" in p.mapping
    assert any(m.startswith("run.sh line 7: why: typo") for m in p.mapping)
    c = BY_ID["t4-imagenette-resnet18-torus8-c90-s0.6-choco-int8"]
    m = plan_cell(c, "paper", fidelity=RUNSH).mapping
    for line in ("compression 90% -> k=0.99 (keeps 1%)", "skew 0.6 -> 0.8",
                 "topology torus (8 nodes) -> directed-ring (8 nodes)", "epochs 100 -> 200",
                 "milestones 50/75 -> 100/150", "eta 0.1 (lpdl's assumption; the paper gives none) -> 0.01"):
        assert f"run.sh line 28: {line}" in m


def test_mini_profile_applies_runsh_then_its_own_epochs():
    c = BY_ID["t4-imagenette-resnet18-torus8-c0-s0-choco-fp32"]
    p = plan_cell(c, "mini", fidelity=RUNSH)
    assert p.topology.name == "directed-ring" and p.run.epochs == IMAGE_EPOCHS and p.dataset == "digits"
    assert p.mapping[:4] == ("run.sh line 21: topology torus (8 nodes) -> directed-ring (8 nodes)",
                             "run.sh line 21: epochs 100 -> 200", "run.sh line 21: milestones 50/75 -> 100/150",
                             "run.sh line 21: why: " + RUNSH_OVERRIDES[c.cell_id].reason)
    assert f"epochs 200 -> {IMAGE_EPOCHS}" in p.mapping  # the mini rule applies to the run.sh cell
    typo = plan_cell(BY_ID["t2-resnet20-dring8-c99-s0.8-choco-fp32"], "mini", fidelity=RUNSH)
    assert typo.gossip.compressor.ratio == 0.099 and typo.mapping[0].startswith("run.sh line 19:")


def test_overridden_cells_share_no_mini_run():
    """A mini run shared by two cells would be wrong if run.sh changed only one of them."""
    shared = same_runs(CELLS)
    assert not set(RUNSH_OVERRIDES) & (set(shared) | set(shared.values()))


def test_apply_is_validated():
    c = BY_ID["t2-resnet20-dring8-c99-s0.8-ds-fp32"]
    o = RUNSH_OVERRIDES[c.cell_id]
    run = as_runsh(c)
    assert run.cell.compression == 10 and run.ratio == 0.099 and run.cell.cell_id != c.cell_id
    assert as_runsh(BY_ID[RUNSH_SAME[1]]) == (BY_ID[RUNSH_SAME[1]], 0.0, [])
    with pytest.raises(ValueError, match="applied to"):
        apply_runsh(BY_ID["t2-resnet20-dring8-c99-s0.8-choco-fp32"], o)
    with pytest.raises(ValueError, match="paper's"):
        apply_runsh(c, replace(o, k=None, skew=0.8))
    with pytest.raises(ValueError, match="at least one"):
        RunshOverride(cell_id=c.cell_id, line=7, reason="nothing")
    with pytest.raises(ValueError, match="28 training lines"):
        RunshOverride(cell_id=c.cell_id, line=29, k=0.5, reason="x")
    with pytest.raises(ValueError, match="fraction"):
        RunshOverride(cell_id=c.cell_id, line=7, k=1.0, reason="x")
