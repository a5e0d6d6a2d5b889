"""Rewards that cannot fail silently, checked directly: deadlines that stop a hanging reward in its worker process
(on_error raise / zero, the slow warning first), outputs that are not one finite number or None per completion,
NaN/inf values per on_error, and a batch where every reward is NaN. End-to-end runs: test_silent_failures.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlctl import rewards
from rlctl.config.rl import RewardSpec
from rlctl.errors import RewardError, UserError, is_out_of_memory
from rlctl.rewards import scoring, worker

PLUGIN = """
import math, os, signal, time
import numpy

def killed(prompts, completions, **_):
    os.kill(os.getpid(), signal.SIGKILL)  # as a kill -9 from outside, or the out-of-memory killer

def pid(prompts, completions, **_):
    return [float(os.getpid())] * len(completions)

def sleepy(prompts, completions, **_):
    print("printed by the reward")  # goes to the log, not into the worker's answers
    time.sleep(60)
    return [1.0] * len(completions)

def digits(prompts, completions, answer, **_):
    return [float(c == a) for c, a in zip(completions, answer)]

def words(prompts, completions, **_):
    return ["high"] * len(completions)

def nested(prompts, completions, **_):
    return [[0.5] for _ in completions]

def column(prompts, completions, **_):
    return numpy.ones((len(completions), 1))

def vector(prompts, completions, **_):
    return numpy.ones(len(completions))

def nan(prompts, completions, **_):
    return [math.nan] * len(completions)

def some_nan(prompts, completions, answer, **_):
    return [1.0 if c == a else math.inf for c, a in zip(completions, answer)]
"""
ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plugins") / "plug.py"
    path.write_text(PLUGIN)
    return path


@pytest.fixture
def stage():
    """`stage(plugin, *(function, on_error, timeout_s))`: the stage's reward functions; their workers are stopped
    when the test ends (a worker left running would outlive the test, as the sandbox tests would notice)."""
    workers = worker.Workers()

    def make(plugin: Path, *specs: tuple[str, str, float], notify=None, errors=None) -> list:
        entries = [RewardSpec(name=f"{plugin}:{fn}", on_error=on_error, timeout_s=t) for fn, on_error, t in specs]
        return rewards.stage_rewards(entries, "answer", {} if errors is None else errors, workers, notify)

    yield make
    workers.stop_all()


def test_a_hanging_reward_is_stopped_at_its_deadline_and_named(plugin: Path, stage):
    events: list = []
    (fn,) = stage(plugin, ("sleepy", "raise", 2), notify=lambda event, **f: events.append((event, f)))
    with pytest.raises(RewardError) as info:
        fn(prompts=["1+1=", "2+2=", "3+3="], completions=["2", "4", "6"], answer=["2", "4", "6"])
    text = str(info.value)
    assert f"Reward '{plugin}:sleepy' did not return within its timeout_s=2 s on a batch of 3 completions" in text
    assert "stopped after 2." in text and "on_error: zero" in text
    [(event, fields)] = events  # one warning, then the error
    assert event == "reward_slow" and fields.pop("seconds") >= 1.0  # at half its deadline, never before
    assert fields == {"reward": f"{plugin}:sleepy", "timeout_s": 2}


def test_a_reward_worker_that_dies_is_named_with_its_pid_and_signal(plugin: Path, stage):
    (fn,) = stage(plugin, ("killed", "raise", 30))
    with pytest.raises(RewardError) as info:
        fn(prompts=["1+1="], completions=["2"], answer=["2"])
    text = str(info.value)
    assert f"Reward '{plugin}:killed'" in text and "worker process (pid " in text, text
    assert "was killed by signal 9 (SIGKILL: a kill -9, or the system's out-of-memory killer)" in text, text


def test_on_error_zero_scores_a_timed_out_batch_zero_counts_it_and_the_next_call_works(plugin: Path, stage):
    errors: dict[str, int] = {}
    sleepy, digits = stage(plugin, ("sleepy", "zero", 1), ("digits", "raise", 5), errors=errors)
    assert sleepy(prompts=["a", "b"], completions=["1", "2"], answer=["1", "3"]) == [0.0, 0.0]
    assert errors == {f"{plugin}:sleepy": 2}
    assert digits(prompts=["a", "b"], completions=["1", "2"], answer=["1", "3"]) == [1.0, 0.0]
    assert sleepy(prompts=["a"], completions=["1"], answer=["1"]) == [0.0], "a fresh worker after the stop"
    assert errors == {f"{plugin}:sleepy": 3}


@pytest.mark.parametrize(
    "fn, shown",
    [
        ("words", "it returned 'high' (a str) for completion 1"),
        ("nested", "it returned '[0.5]' (a list) for completion 1"),
        ("column", "it returned a ndarray of shape (2, 1), not (2,)"),
        ("nan", "returned nan for the completion '2' (the ground truth of row 1)"),
    ],
)
def test_the_dry_run_refuses_anything_but_one_finite_number_per_completion(plugin: Path, fn: str, shown: str):
    with pytest.raises(UserError) as info:
        rewards.dry_run([f"{plugin}:{fn}"], ROWS)
    assert f"Reward '{plugin}:{fn}'" in str(info.value) and shown in str(info.value)


def test_the_dry_run_accepts_a_tensor_of_the_right_shape_and_times_out_a_hang(plugin: Path):
    rewards.dry_run([f"{plugin}:vector", f"{plugin}:digits"], ROWS)
    with pytest.raises(UserError, match="did not return within its timeout_s on 2 completions of your data"):
        rewards.dry_run([f"{plugin}:sleepy"], ROWS, timeouts=[1])


def test_judges_outside_training_run_in_their_worker_within_the_deadline(plugin: Path):
    """`rlctl eval`, `rlctl rewards test` and held-out scoring judge as training does: in a worker process, stopped
    at the deadline and named (sleepy sleeps 60 s; the deadline is 1 s)."""
    columns = {"answer": ["2", "5"]}
    with pytest.raises(UserError, match=f"Reward '{plugin}:sleepy' did not return within its timeout_s on 2"):
        scoring.correct(f"{plugin}:sleepy", "answer", ["1+1=", "2+2="], ["2", "4"], columns, timeout_s=1)
    assert scoring.correct(f"{plugin}:digits", "answer", ["1+1=", "2+2="], ["2", "4"], columns) == [True, False]
    per, _ = rewards.score([(f"{plugin}:pid", 1.0)], ["1+1="], ["2"], {})
    assert per[f"{plugin}:pid"] != [float(os.getpid())]
    many = 2 * rewards.JUDGE_BATCH + 1  # eval's thousands go in batches the deadline fits, their columns sliced
    got = rewards.judged(
        f"{plugin}:digits", "answer", ["p"] * many, ["1", "2"] * (many // 2) + ["1"], {"answer": ["1"] * many}
    )
    assert got == [1.0, 0.0] * (many // 2) + [1.0]


def test_nan_and_inf_follow_on_error(plugin: Path, stage):
    errors: dict[str, int] = {}
    (zero,) = stage(plugin, ("some_nan", "zero", 5), errors=errors)
    assert zero(prompts=["a", "b"], completions=["2", "5"], answer=["2", "4"]) == [1.0, 0.0]
    assert errors == {f"{plugin}:some_nan": 1}
    (strict,) = stage(plugin, ("some_nan", "raise", 0))  # timeout_s 0: in this process
    with pytest.raises(RewardError, match=r"some_nan' returned inf for the completion '5' of the prompt 'b'"):
        strict(prompts=["a", "b"], completions=["2", "5"], answer=["2", "4"])


def test_a_batch_where_every_reward_is_nan_stops_even_with_on_error_zero(plugin: Path, stage):
    nan, digits = stage(plugin, ("nan", "zero", 5), ("digits", "zero", 5))
    kwargs = {"prompts": ["a"], "completions": ["2"], "answer": ["2"]}
    assert nan(**kwargs) == [0.0] and digits(**kwargs) == [1.0], "one NaN reward beside a finite one: counted"
    nan, other_nan = stage(plugin, ("nan", "zero", 5), ("nan", "zero", 0))
    nan(**kwargs)
    with pytest.raises(RewardError, match="Every reward returned NaN/inf for all 1 completions of a batch"):
        other_nan(**kwargs)


def test_wrong_outputs_during_training_follow_on_error(plugin: Path, stage):
    errors: dict[str, int] = {}
    (words,) = stage(plugin, ("words", "zero", 5), errors=errors)
    assert words(prompts=["a", "b"], completions=["1", "2"]) == [0.0, 0.0] and errors == {f"{plugin}:words": 2}
    (words,) = stage(plugin, ("words", "raise", 5))
    with pytest.raises(RewardError, match=r"words' returned 'high' \(a str\) for completion 1 on the completion '1'"):
        words(prompts=["a", "b"], completions=["1", "2"])


def test_out_of_memory_in_a_worker_still_reads_as_out_of_memory(tmp_path: Path, stage):
    (tmp_path / "oom.py").write_text(
        "class OutOfMemoryError(RuntimeError):  # torch's, by name (importing torch here would take seconds)\n"
        "    pass\n"
        "def score(prompts, completions, **_):\n"
        "    raise OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')\n"
    )
    (fn,) = stage(tmp_path / "oom.py", ("score", "zero", 30))
    with pytest.raises(Exception) as info:
        fn(prompts=["a"], completions=["b"])
    assert is_out_of_memory(info.value) and "Tried to allocate 2.00 GiB" in str(info.value)
