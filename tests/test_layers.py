"""The package's folders are its layers, and imports only point down (or sideways within a layer):

    entry       cli, __main__
    report      report/             torch-free: reads the tidy files the DAG gives it
    pipeline    pipeline/           cells/ < recipe/ < run/ < aggregation/ < workflow/, the same rule inside
                                    (torch-free but a plan's model factory, the run modules and
                                    preflight_shape, which run a cell and measure a job shape)
    training    training/           one training run, benchmarks, cost model
    blocks      decentral/ models/ quant/ data/
    foundation  config, errors, atomic (the one file writer), bounded (bounded reading),
                run_options (how a run is computed) and compat (run options that cannot go
                together), specs/ (what each executor, compressor and algorithm is), provenance
                (git state, code hash, versions), rehearsal_mark (a rehearsal data root), the
                package itself

Read from the source with ast (every import, lazy ones inside functions included), so a new
module cannot add an upward arrow or a cycle without this test saying which."""
import ast
from pathlib import Path

import lpdl_core

ROOT = Path(lpdl_core.__file__).parent
LAYERS = ("foundation", "blocks", "training", "pipeline", "report", "entry")
TOP = {"config": "foundation", "errors": "foundation", "atomic": "foundation", "bounded": "foundation",
       "compat": "foundation", "run_options": "foundation", "specs": "foundation", "provenance": "foundation",
       "rehearsal_mark": "foundation", "compile_cache": "foundation", "decentral": "blocks",
       "models": "blocks", "quant": "blocks",
       "data": "blocks", "training": "training", "pipeline": "pipeline", "report": "report", "cli": "entry",
       "__main__": "entry"}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(dotted: str) -> bool:
    p = ROOT.parent / Path(*dotted.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def import_graph() -> dict[str, set[str]]:
    """module -> the lpdl_core modules it imports (a `from pkg import mod` counts as pkg.mod)."""
    graph = {}
    for path in ROOT.rglob("*.py"):
        mod = _module(path)
        pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != "lpdl_core":
                    continue
                subs = [f"{target}.{a.name}" for a in node.names if _exists(f"{target}.{a.name}")]
                deps.update(subs or [target])
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.split(".")[0] == "lpdl_core")
        graph[mod] = deps - {mod}
    return graph


def layer(mod: str) -> str:
    parts = mod.split(".")
    return "foundation" if len(parts) == 1 else TOP[parts[1]]


GRAPH = import_graph()


def test_every_module_has_a_layer():
    assert {m.split(".")[1] for m in GRAPH if "." in m} <= set(TOP)


def test_imports_never_point_up():
    up = [f"{m} ({layer(m)}) -> {d} ({layer(d)})" for m, deps in GRAPH.items() for d in deps
          if LAYERS.index(layer(d)) > LAYERS.index(layer(m))]
    assert not up, "\n".join(sorted(up))


def test_the_decentralized_math_needs_no_model_data_or_quantizer():
    bad = [f"{m} -> {d}" for m, deps in GRAPH.items() if m.startswith("lpdl_core.decentral")
           for d in deps if d.split(".")[1] in ("models", "data", "quant")]
    assert not bad, bad


PIPELINE = ("cells", "recipe", "run", "aggregation", "workflow")  # pipeline/'s subpackages, lowest first


def test_pipeline_subpackages_import_only_downwards():
    """cells/ (what a cell is) < recipe/ (its run's configs) < run/ (a run folder) < aggregation/ (tidy
    frames) < workflow/ (what Snakemake plans); every pipeline module lives in one of them."""
    def level(mod: str) -> int | None:
        parts = mod.split(".")
        return PIPELINE.index(parts[2]) if len(parts) > 2 and parts[1] == "pipeline" else None

    loose = [m for m in GRAPH if m.startswith("lpdl_core.pipeline.") and level(m) is None]
    assert not loose, f"pipeline modules outside its subpackages: {loose}"
    up = [f"{m} -> {d}" for m, deps in GRAPH.items() if level(m) is not None
          for d in deps if level(d) is not None and level(d) > level(m)]
    assert not up, up


def test_the_report_reads_results_not_training_code():
    allowed = ("lpdl_core.report", "lpdl_core.config", "lpdl_core.errors", "lpdl_core.atomic", "lpdl_core.provenance",
               "lpdl_core.specs",
               "lpdl_core.pipeline")
    running = ("lpdl_core.pipeline.run", "lpdl_core.pipeline.workflow")
    bad = [f"{m} -> {d}" for m, deps in GRAPH.items() if m.startswith("lpdl_core.report")
           for d in deps if not d.startswith(allowed) or d.startswith(running)]
    assert not bad, bad


def test_no_import_cycles():
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(GRAPH.get(m, ())):
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(d):] + [m, d]))
            if d not in state:
                visit(d, path + [m])
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m, [])


def test_no_private_name_is_imported_across_modules():
    """What one module takes from another is that module's public name: a leading underscore means
    "only here", so renaming it can never break another module."""
    private = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("lpdl_core")):
                private += [f"{path.relative_to(ROOT.parent)}:{node.lineno}: {a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
    assert not private, private


def test_no_library_module_is_over_300_lines():
    """One concept per module, 100-300 lines (the house style)."""
    long = [f"{p.relative_to(ROOT.parent)}: {n}" for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 300]
    assert not long, long
