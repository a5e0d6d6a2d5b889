"""Fixtures: one tiny-demo run shared by several tests, and how the suite spreads over pytest-xdist workers. Plain
helpers are in tests/helpers.py.

`make test` runs two workers (`-n 2`): tests go one by one to whichever worker is free, except that the tests of a
module that builds a module-scoped fixture (a trained run most often) stay on one worker, so the fixture is built
once (`pytest_xdist_make_scheduler`), and the longest modules start first. Session-scoped runs are built once for
all workers (`tests.helpers.run_once`). Every process, the tests' own and the `rlctl` runs they start, computes on
one thread: two workers then keep the two cores busy without contending for them, and a run killed and resumed
computes on the same thread count as the run it is compared with (a different count changes float sums, and
bit-exact resume compares them bit for bit)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before any test module imports torch

from pathlib import Path

import pytest

from tests.helpers import run_once

# The modules whose runs take minutes, longest first: they start first, so that the workers end together.
LONGEST_FIRST = (
    "test_agents_loop.py",
    "test_vllm_real_model.py",
    "test_vllm_cpu.py",
    "test_resume_exact.py",
    "test_launchers.py",
    "test_async_rl.py",
    "test_real_model.py",
    "test_rl_algorithms.py",
    "test_vlm.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist's scope scheduler, with a module as the scope of its tests only where the module builds a module- or
    class-scoped fixture (each other test is a scope of its own). xdist's own `loadgroup` would do it with markers,
    but on pytest 9 it no longer renames the tests it groups."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleFixtureScheduling(LoadScopeScheduling):
        def __init__(self, config: pytest.Config, log=None) -> None:
            super().__init__(config, log)
            self.shares_fixtures: dict[str, bool] = {}

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module not in self.shares_fixtures:
                path = config.rootpath / module
                text = path.read_text(encoding="utf-8") if path.is_file() else ""
                self.shares_fixtures[module] = 'scope="module"' in text or 'scope="class"' in text
            return module if self.shares_fixtures[module] else nodeid

    return ModuleFixtureScheduling(config, log)


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> Path:
    """The full tiny demo (SFT -> RM -> GRPO), run once for the whole test run."""
    return run_once(tmp_path_factory, "demo", "--preset", "tiny-demo")


def pytest_terminal_summary(terminalreporter) -> None:
    """Modules over 500 lines, named at the end of the run: a hint to split one by what it does, never a failure,
    so code goes where it belongs and no message users read is shortened to fit a count."""
    from rlctl.cli import codemap

    paths = codemap.modules().values()
    sizes = {str(p.relative_to(codemap.PKG.parent)): len(p.read_text().splitlines()) for p in paths}
    long = sorted((n, name) for name, n in sizes.items() if n > 500)
    if long:
        terminalreporter.write_sep("-", "modules over 500 lines (split them by what they do)")
        for n, name in reversed(long):
            terminalreporter.write_line(f"{name}: {n} lines")
