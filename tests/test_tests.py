"""The suite's own rules: plain helpers come from tests/helpers.py and fixtures from conftest.py, so no test module
imports conftest or another test module; and no test asserts on wall-clock or CPU time (timings belong in bench/)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CLOCKS = {"time", "monotonic", "perf_counter", "process_time", "thread_time"}


def _modules() -> list[tuple[str, ast.Module]]:
    return [(p.relative_to(TESTS).as_posix(), ast.parse(p.read_text())) for p in sorted(TESTS.rglob("*.py"))]


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module]
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return []


def test_no_test_module_imports_conftest_or_another_test_module():
    found = [
        f"{rel}:{node.lineno}: {name}"
        for rel, tree in _modules()
        for node in ast.walk(tree)
        for name in _imported(node)
        if name.split(".")[-1] == "conftest" or name.split(".")[-1].startswith("test_")
    ]
    assert found == []


def test_no_assertion_reads_a_clock():
    found = [
        f"{rel}:{node.lineno}: {ast.unparse(node)}"
        for rel, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Assert)
        and any(
            isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in CLOCKS
            for call in ast.walk(node.test)
        )
    ]
    assert found == []
