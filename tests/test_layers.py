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
