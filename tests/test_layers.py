"""The house rules of the code base (issue 14): subpackages in layers, no import climbing to a higher layer, no
import cycle, each package's docstring saying what it may import, and the code map generated from the imports."""

from __future__ import annotations

import ast
import re

from rlctl.cli import codemap


def test_no_import_climbs_to_a_higher_layer():
    assert codemap.upward(codemap.imports()) == []


def test_no_import_cycles():
    assert codemap.cycles(codemap.imports()) == []


def test_cycle_and_climb_detection_find_them():
    """The checks above can fail: a made-up graph with a cycle and a stage importing the CLI."""
    graph = {
        "rlctl.stages.a": {"rlctl.stages.b"},
        "rlctl.stages.b": {"rlctl.stages.a", "rlctl.cli"},
        "rlctl.cli": set(),
    }
    assert codemap.cycles(graph) == [["rlctl.stages.a", "rlctl.stages.b"]]
    assert codemap.upward(graph) == ["rlctl.stages.b -> rlctl.cli"]


def test_every_subpackage_is_in_a_layer_and_says_what_it_may_import():
    packages = {codemap.package(m) for m in codemap.modules()}
    assert packages == set(codemap.LAYER), "a new subpackage needs its place in codemap.LAYERS"
    for pkg in packages - {"base"}:
        doc = ast.get_docstring(ast.parse((codemap.PKG / pkg / "__init__.py").read_text())) or ""
        said = re.search(r"May import: ([^.]+)\.", doc)
        assert said, f"rlctl/{pkg}/__init__.py: the docstring says what the package may import"
        expected = "every other package" if pkg == codemap.LAYERS[-1][0] else ", ".join(codemap.may_import(pkg))
        assert " ".join(said[1].split()) == expected, pkg


def test_a_run_without_a_trl_stage_never_imports_transformers_trainer():
    """transformers' callback module pulls in its trainer utilities (peft, bitsandbytes: seconds at import): only the
    TRL stages (sft, rm, dpo, kto) import it, and the runner imports a stage's module only when that stage runs."""
    import importlib.util
    import subprocess
    import sys
    import typing

    from rlctl.config.sections import StageName
    from rlctl.launch import runner

    script = (
        "import sys\nimport rlctl.launch.runner, rlctl.stages.rl\n"
        "print([m for m in ('transformers.trainer_callback', 'trl') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", "the runner or the rl stage imports transformers' trainer"
    assert set(runner.STAGE_MODULES) == set(typing.get_args(StageName)), "every stage has its module in the table"
    assert all(importlib.util.find_spec(m) is not None for m in runner.STAGE_MODULES.values())
