"""The `lpdl` command line follows the usual conventions: --version, help with defaults for every
option, -v/-q for stdlib logging on stderr, progress on stderr and results on stdout."""
import argparse
import importlib.metadata
import logging

import pytest

import lpdl_core
from lpdl_core.cli import build_parser, main
from lpdl_core.models import registry


@pytest.fixture(autouse=True)
def _keep_log_level():
    """main() sets the "lpdl" logger's level from -v/-q; leave it as found for other tests."""
    logger = logging.getLogger("lpdl")
    level = logger.level
    yield
    logger.setLevel(level)


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def test_version_prints_name_and_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    try:
        expected = importlib.metadata.version("lpdl_core")
    except importlib.metadata.PackageNotFoundError:
        expected = lpdl_core.__version__
    assert capsys.readouterr().out.strip() == f"lpdl {expected}"


def test_every_option_of_every_command_has_help():
    parser = build_parser()
    missing = [f"lpdl {name} {'/'.join(a.option_strings) or a.dest}"
               for name, sub in [("", parser), *_subparsers(parser)] for a in sub._actions
               if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
               and not (a.help or "").strip()]
    assert not missing, missing
    assert len(dict(_subparsers(parser))) >= 14


def test_help_shows_defaults_but_no_none_noise(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # unwrapped
    assert "cpu or cuda (default: auto)" in text and "the same math (default: loop)" in text
    assert "(default: mini)" in text and "default: None" not in text and "default: False" not in text
    assert "default: $LPDL_DATA or ./data" in text  # None: the help says what not giving it means
    for name, sub in _subparsers(build_parser()):
        assert "default: None" not in sub.format_help(), name


def test_verbose_and_quiet_are_exclusive_one_line_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["-v", "-q", "cells"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("lpdl: error: ")


@pytest.fixture
def two_models(monkeypatch):
    """`lpdl models` over two small CNNs only (all of them take 10-45 s)."""
    monkeypatch.setattr(registry, "MODELS", ("resnet20", "resnet54"))
    monkeypatch.setattr(registry, "_distilbert_rows", lambda qcfg: [])


def test_models_progress_goes_to_stderr_and_the_table_to_stdout(capsys, two_models):
    assert main(["models"]) == 0
    out, err = capsys.readouterr()
    assert "lpdl: models: building resnet20 (1/3)" in err and "lpdl: models: building resnet54 (2/3)" in err
    assert "building" not in out and "lpdl:" not in out
    lines = out.splitlines()
    assert lines[0].startswith("model ") and [l.split()[0] for l in lines[2:]] == ["resnet20", "resnet54"]


def test_quiet_suppresses_progress_lines(capsys, two_models):
    assert main(["-q", "models"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "resnet54" in out


def test_verbose_shows_debug_lines(capsys, two_models):
    assert main(["models"]) == 0
    assert "command models" not in capsys.readouterr().err  # debug: hidden by default
    assert main(["--verbose", "models"]) == 0
    err = capsys.readouterr().err
    assert "command models, options: none" in err and "building resnet20" in err


def test_bench_logs_each_step(capsys):
    assert main(["bench", "--nodes", "1", "--batch", "1", "--steps", "1", "--warmup", "1", "--device", "cpu",
                 "--precisions", "fp32"]) == 0
    out, err = capsys.readouterr()
    assert "lpdl: bench: step 1/2 (warm-up): fp32 " in err and "lpdl: bench: step 2/2: fp32 " in err
    assert out.lstrip().startswith("{") and "bench:" not in out


def test_a_bare_lpdl_prints_usage_and_every_command(capsys):
    assert main([]) == 2
    out = capsys.readouterr().out
    assert out.startswith("usage: lpdl") and all(c in out for c in ("train", "bench", "cells", "report", "plan"))


@pytest.mark.parametrize("typo,hint", [("trian", "did you mean 'train'?"), ("-q", None),
                                       ("xyzzy", "commands: topology")])
def test_a_mistyped_command_suggests_the_closest_one(typo, hint, capsys):
    argv = [typo] if typo != "-q" else ["-q", "bnech"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown command" in err
    assert hint is None and "did you mean 'bench'?" in err or hint is not None and hint in err


def test_bench_checks_its_precisions_before_building_anything(capsys, caplog):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--precisions", "fp32,int4", "--steps", "1"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "'int4' is not one of fp32, int8" in err and "building" not in err
    assert build_parser().parse_args(["bench", "--precisions", "int8"]).precisions == ("int8",)


def test_every_choice_option_lists_its_choices(capsys):
    """`cells --table` names its tables in --help (argparse shows the choices it checks)."""
    with pytest.raises(SystemExit):
        main(["cells", "--help"])
    assert "{table1,table2,table3,table4,table5,fig1}" in capsys.readouterr().out
