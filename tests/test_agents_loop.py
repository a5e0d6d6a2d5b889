"""Multi-turn RL end to end on the tiny agent demo: the preset itself learns to call the calculator (held-out
accuracy after RL at least 0.10 above SFT's, tool use in summary.json); from its SFT model the rlctl loop rolls
out several turns, counts tool use and failures, resumes in the middle of the stage to exactly the weights of the
uninterrupted run, and runs its turns in step when the policy is sharded over two processes (FSDP2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import rlctl, summary

pytestmark = [pytest.mark.slow, pytest.mark.long]  # the demo's 1000 SFT steps: `make test-long`
ENV = {"OMP_NUM_THREADS": "1"}
SMALL_RL = ["rl.prompts_per_step=4", "rl.group_size=4", "rl.eval_samples=16"]


def _sets(*pairs: str) -> list[str]:
    return [x for p in pairs for x in ("--set", p)]


@pytest.fixture(scope="module")
def agent_demo(tmp_path_factory) -> Path:
    """`rlctl train --preset tiny-agent-demo` as a user runs it: SFT, then multi-turn RL with the calculator."""
    run_dir = tmp_path_factory.mktemp("agent") / "demo"
    proc = rlctl("train", "--preset", "tiny-agent-demo", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return run_dir


def test_the_agent_demo_learns_to_call_the_calculator(agent_demo):
    held = summary(agent_demo)["stages"]
    sft, rl = held["sft"], held["rl"]
    assert rl["eval_accuracy"] >= sft["eval_accuracy"] + 0.10, held
    assert rl["eval_tool_call_rate"] > sft["eval_tool_call_rate"] and rl["eval_turns"] > sft["eval_turns"], held
    assert rl["eval_tool_errors"] == 0, held
    steps = _steps(agent_demo)
    assert steps[-1]["tool_call_rate"] > steps[0]["tool_call_rate"], steps


def _rl(sft_run: Path, run_dir: Path, *extra: str):
    sets = [f"model.name_or_path={sft_run / 'sft' / 'final'}", "rl.max_steps=4", "rl.save_every=2", *SMALL_RL]
    args = ["train", "--preset", "tiny-agent-demo", "--stages", "rl", "--run-dir", str(run_dir)]
    return rlctl(*args, *_sets(*sets, *extra), env=ENV)


def _steps(run_dir: Path) -> list[dict]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r.get("stage") == "rl" and "step" in r and "event" not in r]


def test_multiturn_stage_resumes_exactly_and_counts_tool_failures(agent_demo, tmp_path):
    from safetensors.torch import load_file
    from torch import equal

    # a calculator that fails on every call: the failures reach the model and are counted, the run goes on
    broken = tmp_path / "broken.py"
    broken.write_text('def calculator(expression: str) -> str:\n    """Broken."""\n    raise OSError("down")\n')
    straight = tmp_path / "straight"
    room = ["rl.max_new_tokens=80", "rl.agent.max_tool_output_tokens=8"]  # a call, the error and a second turn fit
    proc = _rl(agent_demo, straight, f"rl.tools=['{broken}:calculator']", *room)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    steps = _steps(straight)
    assert any(s["turns"] > 1 for s in steps), steps
    assert any(s["tool_calls"] > 0 for s in steps) and all(s["tool_errors"] == s["tool_calls"] for s in steps)
    held = summary(straight)["stages"]["rl"]
    assert {"eval_tool_call_rate", "eval_turns", "eval_tool_calls"} <= held.keys(), held

    # a crash after checkpoint-2: the same run directory without what came after it
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed, ignore=shutil.ignore_patterns("checkpoint-4", "final", "run.lock"))
    s = summary(resumed)
    s["completed"].remove("rl")
    s["stages"].pop("rl")
    (resumed / "summary.json").write_text(json.dumps(s))
    (resumed / "config.yaml").write_text((resumed / "config.yaml").read_text().replace(str(straight), str(resumed)))
    proc = rlctl("resume", str(resumed), env=ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert [r["step"] for r in _steps(resumed)] == [1, 2, 3, 4, 3, 4]
    a = load_file(straight / "rl" / "final" / "model.safetensors")
    b = load_file(resumed / "rl" / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)

    # `rlctl eval` of a tool run rolls out with its tools, sampled here (2 per prompt, top-p), and reports tool use
    out = tmp_path / "eval.json"
    data = straight / "data" / "eval.jsonl"
    sampled = ["--limit", "6", "-k", "2", "--top-p", "0.9", "--out", str(out)]
    proc = rlctl("eval", str(straight), "--data", str(data), *sampled, env=ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    metrics = json.loads(out.read_text())
    assert metrics["samples_per_prompt"] == 2 and {"tool_call_rate", "turns", "tool_errors"} <= metrics.keys()
    assert "top_p 0.9" in metrics["decoding"], metrics["decoding"]
    assert metrics["tool_errors"] == metrics["tool_calls"]
    assert "tool_call_rate" in proc.stdout


def test_a_sharded_policy_runs_every_turn_in_step(agent_demo, tmp_path):
    """FSDP2 over two processes: each generate call gathers the shards on both, so a process whose rollouts have
    all answered still takes part in the other's later turns (without it the run would hang)."""
    run_dir = tmp_path / "sharded"
    sharded = ["hardware.num_processes=2", "hardware.strategy=fsdp2", "rl.max_steps=2", "rl.save_every=2"]
    args = ["train", "--preset", "tiny-agent-demo", "--stages", "rl", "--run-dir", str(run_dir)]
    sets = _sets(f"model.name_or_path={agent_demo / 'sft' / 'final'}", *sharded, *SMALL_RL)
    proc = rlctl(*args, *sets, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    record = summary(run_dir)
    assert record["layout"]["rl"]["observed"]["strategy"] == "fsdp2", record["layout"]
    assert all(0 < s["tool_call_rate"] < 1 for s in _steps(run_dir))  # some rollouts took two turns, some one
    assert record["stages"]["rl"]["eval_tool_call_rate"] > 0
