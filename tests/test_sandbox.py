"""Model-written code runs confined: loops, memory bombs, escapes, network and subprocesses all fail safely."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.rewards import sandbox

LIMITS = sandbox.Limits(wall_s=3.0, cpu_s=2, memory_mb=256)
TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"


def test_correct_solution_passes():
    result = sandbox.run("def add(a, b):\n    return a + b\n", TESTS, LIMITS)
    assert result.passed, result.output


def test_wrong_solution_fails():
    result = sandbox.run("def add(a, b):\n    return a - b\n", TESTS, LIMITS)
    assert not result.passed and "AssertionError" in result.reason


def test_infinite_loop_is_stopped():
    result = sandbox.run("while True:\n    pass\n", TESTS, LIMITS)
    assert not result.passed
    assert "timeout" in result.reason or "exit code" in result.reason


def test_memory_bomb_is_contained():
    result = sandbox.run("x = bytearray(2 * 1024**3)\n", TESTS, LIMITS)
    assert not result.passed and "MemoryError" in result.reason


def test_write_outside_directory_is_refused(tmp_path: Path):
    target = tmp_path / "escaped.txt"
    code = f"open({str(target)!r}, 'w').write('pwned')\ndef add(a, b):\n    return a + b\n"
    result = sandbox.run(code, TESTS, LIMITS)
    assert not result.passed and "PermissionError" in result.reason
    assert not target.exists()


def test_writing_inside_directory_is_allowed():
    code = "open('scratch.txt', 'w').write('ok')\ndef add(a, b):\n    return a + b\n"
    assert sandbox.run(code, TESTS, LIMITS).passed


@pytest.mark.parametrize(
    "escape",
    [
        "import socket\nsocket.create_connection(('127.0.0.1', 9))",
        "import subprocess\nsubprocess.run(['true'])",
        "import os\nos.system('true')",
        "import ctypes",
    ],
)
def test_escapes_are_refused(escape):
    result = sandbox.run(escape + "\ndef add(a, b):\n    return a + b\n", TESTS, LIMITS)
    assert not result.passed and "PermissionError" in result.reason, result.reason


# Destructive attempts only ever aim at a victim folder the test owns, never at real system paths.
@pytest.mark.parametrize(
    "attack",
    [
        "import shutil\nshutil.rmtree({victim!r})",
        "import os\nos.remove({victim!r} + '/keep.txt')",
        "import os\nos.rename({victim!r} + '/keep.txt', 'stolen.txt')",
        "import os\nfd = os.open({victim!r}, os.O_RDONLY)\nos.unlink('keep.txt', dir_fd=fd)",
        "import os\nfd = os.open({victim!r}, os.O_RDONLY)\nos.open('new.txt', os.O_WRONLY | os.O_CREAT, dir_fd=fd)",
        "import pathlib\npathlib.Path({victim!r}, 'new.txt').write_text('x')",
    ],
)
def test_destructive_escapes_are_refused(tmp_path: Path, attack: str):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    code = attack.format(victim=str(victim)) + "\ndef add(a, b):\n    return a + b\n"
    result = sandbox.run(code, TESTS, LIMITS)
    assert not result.passed and "PermissionError" in result.reason, result.reason
    assert (victim / "keep.txt").read_text() == "precious"
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"]


def test_code_tests_reward_scores_each_attempt_in_the_sandbox(tmp_path: Path):
    from rlctl import rewards

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    fn = rewards.resolve("code_tests(timeout_s=3, memory_mb=256)")
    good = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```"
    attempts = [
        good,
        "```python\ndef add(a, b):\n    while True:\n        pass\n```",
        "```python\nx = bytearray(2 * 1024**3)\ndef add(a, b):\n    return a + b\n```",
        f"```python\nopen({str(victim)!r}, 'w').write('pwned')\ndef add(a, b):\n    return a + b\n```",
        "def add(a, b):\n    return a * b\n",
    ]
    scores = fn(prompts=["p"] * len(attempts), completions=attempts, tests=[TESTS] * len(attempts), answer=[""] * 5)
    assert scores == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert victim.read_text() == "precious"
