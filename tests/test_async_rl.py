"""Asynchronous RL (rl.async_rollout): the tiny demo learns with two generator engines, each its own process beside
the trainer, both sampling their share of every round and taking in every push; every step reports its staleness,
each engine's share and the rollout correction's importance ratios; no more rounds are submitted than the run
trains; a run killed with kill -9 resumes with every prompt trained exactly once (the rounds in flight are sampled
again); a failing or killed engine ends the run in one paragraph naming the last checkpoint and the resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import RLCTL, injected, kill_after_checkpoint, records, rlctl, summary

ASYNC = ["--set", "rl.async_rollout.enabled=true"]
TWO = ["--set", "rl.async_rollout.generators=2"]
RL_ONLY = ["--preset", "tiny-demo", *ASYNC, "--set", "stages=[rl]", "--set", "rl.rewards=[{name: exact_match}]"]
# a run long enough to be stopped by a fault that waits for its first complete checkpoint (the marker's glob)
UNTIL_A_FAULT = [*RL_ONLY, "--set", "rl.max_steps=30", "--set", "rl.save_every=2"]


def _complete_checkpoint(run_dir: Path) -> str:
    return str(run_dir / "rl" / "checkpoints" / "checkpoint-*" / "rlctl_complete")


def _steps(run_dir: Path) -> dict[int, dict]:
    """The rl stage's step records, the last one of each step (a resumed run writes a step again)."""
    return {r["step"]: r for r in records(run_dir) if r.get("stage") == "rl" and "loss" in r}


def _per_step(run_dir: Path) -> int:
    return yaml.safe_load((run_dir / "config.yaml").read_text())["rl"]["prompts_per_step"]


@pytest.fixture(scope="module")
def async_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("async") / "run"
    proc = rlctl("train", "--preset", "tiny-demo", *ASYNC, *TWO, "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run_dir


def test_the_tiny_demo_learns_with_async_rollouts(async_run: Path):
    stages = summary(async_run)["stages"]
    assert stages["rl"]["eval_accuracy"] >= stages["sft"]["eval_accuracy"] + 0.1, stages


def test_every_step_reports_staleness_and_the_correction(async_run: Path):
    steps = _steps(async_run)
    assert sorted(steps) == list(range(1, 61))
    assert steps[1]["staleness_max"] == 0  # the first round was sampled with the starting weights
    assert {steps[k]["staleness_max"] for k in range(2, 61)} == {1}  # one-step-off, never more (max_staleness 1)
    assert all("time_push" in r and "is_ratio_mean" in r for r in steps.values())
    assert max(r["is_ratio_max"] for r in steps.values()) > 1.0  # one version behind: the ratios are not all 1
    prompts = [steps[k]["prompt_index"] for k in sorted(steps)]
    assert prompts == [_per_step(async_run) * i for i in range(60)]  # in stream order, none skipped


def test_two_engines_sample_their_share_of_every_round_and_take_every_push(async_run: Path):
    """The plan's two generator engines are the two that run: each samples half of every round, with the weights
    of the step before last (one-step-off), and receives every push; the run submits no round it does not train."""
    plan = json.loads((async_run / "plan.json").read_text())
    rollouts = plan["config"]["rl"]["prompts_per_step"] * plan["config"]["rl"]["group_size"]
    assert plan["async_split"]["engines"] == 2 and plan["async_split"]["rollouts_per_engine"] == rollouts // 2
    steps = _steps(async_run)
    for n, r in steps.items():
        for i in (0, 1):
            assert r[f"generator{i}_rollouts"] == rollouts // 2, (n, r)
            assert r[f"generator{i}_version"] == max(n - 2, 0), (n, r)  # staleness 1, the bound K=1
            assert r[f"generator{i}_pushes"] >= max(n - 1, 1), (n, r)  # the start's and one per step since
    (ended,) = [r for r in records(async_run) if r.get("event") == "generators"]
    assert ended["rounds_submitted"] == 60  # as many as steps: none sampled for nothing
    assert [g["index"] for g in ended["generators"]] == [0, 1]
    for g in ended["generators"]:
        assert g["engine"] == "transformers" and g["rounds"] == 60 and g["rollouts"] == 60 * rollouts // 2
        assert g["pushes"] == 60  # the start's and one after each of steps 1..59 (none after the last)
        assert g["loaded"] == list(range(59))  # every version a round was sampled with
    assert len({g["pid"] for g in ended["generators"]}) == 2
    layout = summary(async_run)["layout"]["rl"]
    assert layout["planned"]["generators"] == layout["observed"]["generators"] == 2 and not layout["mismatches"]


def test_kill_9_mid_async_run_resumes_with_every_prompt_trained_once(tmp_path: Path):
    run_dir = tmp_path / "run"
    args = ["--preset", "tiny-demo", *ASYNC, "--set", "rl.async_rollout.max_staleness=2", "--set", "stages=[sft,rl]"]
    args += ["--set", "rl.rewards=[{name: exact_match}]", "--set", "sft.max_steps=40", "--set", "rl.max_steps=12"]
    args += ["--set", "rl.save_every=4", "--run-dir", str(run_dir)]
    kill_after_checkpoint(run_dir, [RLCTL, "train", *args], "rl", 4)
    killed_at = max(_steps(run_dir))
    proc = rlctl("resume", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = _steps(run_dir)
    assert sorted(steps) == list(range(1, 13)) and killed_at < 12
    assert [steps[k]["prompt_index"] for k in range(1, 13)] == [_per_step(run_dir) * i for i in range(12)]
    staleness = [steps[k]["staleness_max"] for k in range(1, 13)]
    assert max(staleness) == 2 and staleness[:3] == [0, 1, 2], staleness  # a resumed run starts fresh again
    trained = [r for r in records(run_dir) if r.get("event") == "trained"][-1]
    ended = [r for r in records(run_dir) if r.get("event") == "generators"][-1]
    assert ended["rounds_submitted"] == trained["steps"] < 12  # K=2 rounds ahead, yet none past the last step


# Fault injection (sitecustomize, the generator process only): every load of the pushed weights leaves one MLP
# weight zeroed, as a parameter pushed under a wrong name or never refreshed would.
BROKEN_LOAD = """
import sys
if "--multiprocessing-fork" in sys.orig_argv:
    import torch
    original = torch.nn.Module.load_state_dict
    def broken(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        with torch.no_grad():
            self.get_parameter("model.layers.0.mlp.down_proj.weight").zero_()
        return out
    torch.nn.Module.load_state_dict = broken
"""


def test_a_push_the_generator_did_not_take_in_intact_stops_the_run(tmp_path: Path):
    injection = injected(tmp_path, BROKEN_LOAD)
    run_dir = tmp_path / "run"
    args = [*RL_ONLY, "--set", "rl.max_steps=4", "--run-dir", str(run_dir)]
    proc = rlctl("train", *args, env=injection)
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, text
    assert "the async generator sampled with weights other than the policy version 0" in text, text
    assert "Traceback" not in proc.stdout + proc.stderr
    assert _steps(run_dir) == {}  # stopped before the first step trained


# Fault injection (sitecustomize, the generator process only): once the rl stage has a complete checkpoint, the
# generator kills itself with SIGKILL, as a kill -9 from outside (or the kernel's OOM killer) would.
KILL_GENERATOR = """
import sys
if "--multiprocessing-fork" in sys.orig_argv:
    import glob, os, signal, threading, time
    def kill_after_checkpoint(pattern=os.environ["KILL_AFTER"]):
        while not glob.glob(pattern):
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=kill_after_checkpoint, daemon=True).start()
"""


def test_a_killed_generator_is_named_with_the_last_checkpoint_and_the_resume(tmp_path: Path):
    injection = injected(tmp_path, KILL_GENERATOR)
    run_dir = tmp_path / "run"
    marker = _complete_checkpoint(run_dir)
    args = [*UNTIL_A_FAULT, "--run-dir", str(run_dir)]
    proc = rlctl("train", *args, env={**injection, "KILL_AFTER": marker})
    out = proc.stdout + proc.stderr
    text = " ".join(out.split())
    assert proc.returncode == 1, text
    assert "Traceback" not in out and "ConnectionRefusedError" not in text, text
    assert "The async generator process of engine 0 (pid " in text and "SIGKILL" in text, text
    assert "checkpoint-" in text and f"rlctl resume {run_dir}" in text, text
    assert _steps(run_dir) and max(_steps(run_dir)) < 30


# Fault injection (the generator process only): once the rl stage has a complete checkpoint, sampling fails as a
# model whose weights went bad does.
FAILING_SAMPLER = """
import sys
if "--multiprocessing-fork" in sys.orig_argv:
    import glob, os, torch
    original = torch.multinomial
    def failing(*args, **kwargs):
        if glob.glob(os.environ["FAIL_AFTER"]):
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        return original(*args, **kwargs)
    torch.multinomial = failing
"""


def test_a_failing_generator_is_one_paragraph_with_the_last_checkpoint_and_the_resume(tmp_path: Path):
    injection = injected(tmp_path, FAILING_SAMPLER)
    run_dir = tmp_path / "run"
    marker = _complete_checkpoint(run_dir)
    args = [*UNTIL_A_FAULT, "--run-dir", str(run_dir)]
    proc = rlctl("train", *args, env={**injection, "FAIL_AFTER": marker}, timeout=900)
    out = proc.stdout + proc.stderr
    text = " ".join(out.split())
    assert proc.returncode == 1, text
    assert "Traceback" not in out, out
    assert "The async generator (engine 0) failed: RuntimeError: probability tensor contains" in text, text
    assert "(raised at " in text and "the last complete checkpoint, checkpoint-" in text, text
    assert f"rlctl resume {run_dir}" in text and "traceback is in" in text, text
    log = (run_dir / "logs" / "train.log").read_text()
    assert "async generator engine 0 failed" in log and "Traceback" in log  # the engine's, in full, in the log
    assert _steps(run_dir) and max(_steps(run_dir)) < 30
