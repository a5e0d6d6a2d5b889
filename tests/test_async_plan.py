"""The async RL split in the plan (rl.async_rollout, rlctl.plan.async_split): on GPUs the trainer processes run on
their own GPUs and the generator's engines on the others, each side sized per GPU; one GPU is refused with the
reason; on CPU the cores are split. Through the real `rlctl plan`, and the planner for the arithmetic."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from rlctl import config
from rlctl.errors import UserError
from rlctl.plan import planner as plan
from tests.helpers import plan_in_fresh_interpreter, rlctl

GiB = 2**30
ASYNC = ("--set", "rl.async_rollout.enabled=true")


def plan_json(*args: str) -> dict:
    proc = rlctl("plan", *args, *ASYNC, "--json", "--run-dir", "/tmp/rlctl-async-plan-test", timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def build(preset: str, spec: str, *sets: str) -> plan.Plan:
    sets = ("rl.async_rollout.enabled=true", *sets)
    return plan.build(config.resolve(preset, None, None, spec, list(sets)), "/tmp/rlctl-async-plan-test")


def test_8xh100_splits_trainers_and_generator_with_both_sides_memory():
    p = plan_json("--preset", "qwen7b-grpo", "--hardware", "8xH100-80GB")
    s = p["async_split"]
    # 512 rollouts: 6 and 5 trainers (a quarter, then more, to the generator) do not divide them, 4 do
    assert (s["generator_gpus"], s["trainer_gpus"]) == (4, 4)
    assert s["generator_gpu_ids"] == [4, 5, 6, 7] and s["trainer_gpu_ids"] == [0, 1, 2, 3]
    assert p["num_processes"] == 4 and p["layout"]["world_size"] == 4
    accel = p["accelerate"]
    assert accel["num_processes"] == 4 and accel["gpu_ids"] == "0,1,2,3"
    assert not set(accel["gpu_ids"].split(",")) & {str(i) for i in s["generator_gpu_ids"]}
    assert p["stages"][0]["micro_batch_size"] * p["stages"][0]["grad_accum"] == 512 // 4
    # the generator: 4 vLLM engines of one GPU each, 128 rollouts each; per GPU it reserves 0.9 x 79.65 GiB
    assert (s["engines"], s["tensor_parallel_size"], s["rollouts_per_engine"]) == (4, 1, 128)
    n = 7_615_487_488  # Qwen2.5-7B without biases (tests/test_planner.py)
    assert s["generator_gib_per_gpu"] == pytest.approx(0.9 * 79.65, abs=1e-3)  # 71.685
    assert s["generator_weights_gib"] == pytest.approx(2 * n / GiB, abs=1e-3)  # 14.185
    runtime = 1.0 + 128 * 152_064 * 4 / GiB  # vLLM's runtime + the sampler's fp32 logits of 128 sequences
    kv = 0.9 * 79.65 - 0.8 - 2 * n / GiB - runtime  # the rest of the reservation after the CUDA context: 55.628
    assert s["generator_kv_cache_gib"] == pytest.approx(kv, abs=2e-3)
    assert s["concurrent_per_engine"] == 128  # 55.6 GiB / (1,536 tokens x 57,344 B) = 678 sequences fit
    vllm = p["vllm"]
    assert (vllm["gpu_memory_utilization"], vllm["tensor_parallel_size"], vllm["sleep_level"]) == (0.9, 1, 0)
    assert vllm["max_num_seqs"] == 128 and vllm["max_model_length"] == 1536
    # the trainer side: no engine on its GPUs, so no generation phase and nothing of vLLM
    mem = p["memory"]
    assert s["trainer_gib_per_gpu"] == mem["peak_gib"] and 0 < mem["peak_gib"] <= mem["budget_gib"]
    assert s["budget_gib_per_gpu"] == mem["budget_gib"]
    assert [ph["phase"] for ph in mem["phases"]] != [] and "generation" not in {ph["phase"] for ph in mem["phases"]}
    assert not any("vLLM" in name for ph in mem["phases"] for name in ph["components_gib"])
    split = [d for d in p["decisions"] if d["setting"] == "rl.async_rollout split"]
    assert split and split[0]["value"] == "generator GPUs 4-7, trainer GPUs 0-3"


def test_plan_shows_the_split_at_80_columns():
    args = ("plan", "--preset", "qwen7b-grpo", "--hardware", "8xH100-80GB", *ASYNC, "--run-dir", "/tmp/x")
    proc = rlctl(*args, env={"COLUMNS": "80"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "Async RL split (rl.async_rollout)" in text, text
    gen = r"^generator +GPUs 4-7 +4 vLLM engine\(s\), TP 1 +71\.7 GiB reserved \(KV cache 55\.6\) *$"
    assert re.search(gen, text, re.M), text
    assert re.search(r"^trainer +GPUs 0-3 +4 process\(es\), fsdp2 +peak \d+\.\d of 75\.7 GiB *$", text, re.M), text
    assert "Strategy fsdp2, 4 process(es) per node" in text
    block = text[text.index("Async RL split") : text.index("Launch")]
    assert all(len(line) <= 80 for line in block.splitlines()), block
    narrow = rlctl(*args, env={"COLUMNS": "50"}, timeout=120).stdout  # too narrow: a block per side, words whole
    block = narrow[narrow.index("Async RL split") : narrow.index("Launch")]
    for cell in ("GPUs 4-7", "4 vLLM engine(s), TP 1", "GPUs 0-3", "4 process(es), fsdp2"):
        assert cell in block, block
    assert re.search(r"71\.7 GiB reserved", block) and re.search(r"of 75\.7 GiB", block), block


def test_one_gpu_is_refused_with_the_reason():
    proc = rlctl("plan", "--preset", "qwen7b-grpo", "--hardware", "1xH100-80GB", *ASYNC, "--run-dir", "/tmp/x")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr
    assert "one GPU per node" in err and "sleep mode" in err and "14.2 GiB of bf16 weights" in err, err
    assert "rl.async_rollout.enabled=false" in err and "--hardware 2xH100-80GB" in err, err


def test_cpu_splits_the_cores_between_generator_and_trainers():
    p = plan_json("--preset", "tiny-demo", "--hardware", "cpu")
    s = p["async_split"]
    cores = max(p["hardware"]["cpu_cores"], 2)
    assert (s["generator_gpus"], s["trainer_gpus"], s["generator_gpu_ids"]) == (0, 0, [])
    assert s["generator_engine"] == "transformers" and s["generator_threads"] >= 1 and s["trainer_threads"] >= 1
    assert s["generator_threads"] + s["trainer_threads"] * p["num_processes"] <= cores
    assert p["num_processes"] == 1 and "gpu_ids" not in p["accelerate"]
    assert any(d["setting"] == "rl.async_rollout split" for d in p["decisions"])
    proc = rlctl("plan", "--preset", "tiny-demo", "--hardware", "cpu", *ASYNC, "--run-dir", "/tmp/x", timeout=120)
    assert re.search(r"^generator +\d+ CPU thread\(s\) each +1 transformers process", proc.stdout, re.M), proc.stdout


def test_explicit_trainer_count_gets_the_rest_for_the_generator():
    # 48 prompts x 8 = 384 rollouts divide over 6 trainers; the generator takes GPUs 6 and 7
    p = build("qwen7b-grpo", "8xH100-80GB", "hardware.num_processes=6", "rl.prompts_per_step=48")
    s = p.async_split
    assert s is not None and (s.trainer_gpu_ids, s.generator_gpu_ids, s.engines) == ((0, 1, 2, 3, 4, 5), (6, 7), 2)
    assert p.num_processes == 6 and p.accelerate["gpu_ids"] == "0,1,2,3,4,5"
    with pytest.raises(UserError, match=r"leaves 0 of 8 GPUs per node for the generator.*num_processes=7"):
        build("qwen7b-grpo", "8xH100-80GB", "hardware.num_processes=8")


def test_engine_that_crowds_one_gpu_gets_tensor_parallel_and_whole_engines():
    # Llama-3.1-8B on L4s with 4,608-token sequences: one GPU holds 15 GiB of weights and room for 4 sequences,
    # fewer than 16, so each engine spans 2 GPUs; a quarter of the node (2 GPUs) leaves 6 trainers, which do not
    # divide 512, so the generator takes 4 GPUs: 2 engines
    p = build("llama8b-grpo", "8xL4-24GB", "rl.max_new_tokens=4096")
    s = p.async_split
    assert s is not None and (s.tensor_parallel_size, s.generator_gpus, s.engines) == (2, 4, 2)
    assert s.generator_weights_gib == pytest.approx(8_030_261_248 * 2 / 2 / GiB, abs=2e-2)
    assert s.concurrent_per_engine >= 16 and p.vllm.tensor_parallel_size == 2


def test_batch_no_split_divides_is_refused():
    with pytest.raises(UserError, match=r"no split of 8 GPUs per node .* tried: 6, 5, 4, 7"):
        build("qwen7b-grpo", "8xH100-80GB", "rl.prompts_per_step=11", "rl.group_size=2", "rl.ppo_mini_batches=1")


def test_synchronous_plan_is_unchanged():
    p = plan.build(config.resolve("qwen7b-grpo", None, None, "8xH100-80GB", []), "/tmp/rlctl-async-plan-test")
    assert p.async_split is None and p.num_processes == 8 and "gpu_ids" not in p.accelerate
    assert any(ph.phase == "generation" for ph in p.memory.phases)


def test_async_plan_is_torch_free():
    args = ("--preset", "qwen7b-grpo", "--hardware", "8xH100-80GB", "--set", "rl.async_rollout.enabled=true")
    result = plan_in_fresh_interpreter(*args, "--run-dir", "/tmp/rlctl-async-plan-test")
    assert (result["torch"], result["vllm"]) == (False, False) and result["plan"]["async_split"]["generator_gpus"]


def test_other_stages_are_told_they_train_on_the_trainer_gpus():
    p = build("tiny-demo", "8xH100-80GB")
    assert p.async_split is not None and p.num_processes == p.async_split.trainer_gpus
    assert any(w.startswith("rl.async_rollout: sft, rm train on the trainer GPUs (0-3)") for w in p.warnings)


def test_cpu_generator_runs_vllms_cpu_build_where_installed():
    """rl.use_vllm with vLLM installed (the stand-in here; the real CPU build in test_vllm_cpu.py): the generator
    process runs a vLLM engine on its cores, no sleep mode."""
    stub = str(Path(__file__).resolve().parent / "vllm_stub")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [stub, os.environ.get("PYTHONPATH")]))}
    args = ("--preset", "tiny-demo", "--hardware", "cpu", *ASYNC, "--set", "rl.use_vllm=true")
    proc = rlctl("plan", *args, "--json", "--run-dir", "/tmp/rlctl-async-plan-test", env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    p = json.loads(proc.stdout)
    assert p["async_split"]["generator_engine"] == "vllm" and p["generation_engine"] == "vllm"
    assert p["vllm"]["sleep_level"] == 0 and "vLLM's CPU build" in p["async_split"]["why"]
    proc = rlctl("plan", *args, "--run-dir", "/tmp/rlctl-async-plan-test", env=env, timeout=120)
    assert re.search(r"^generator +\d+ CPU thread\(s\) each +1 vllm process", proc.stdout, re.M), proc.stdout


def test_gpu_plan_runs_every_engine_it_sizes():
    """No engine of the plan stays idle: the plan's engine count is what the run starts (one per generator GPU
    or tensor-parallel group), and nothing warns otherwise."""
    p = build("qwen7b-grpo", "8xH100-80GB")
    assert p.async_split is not None and p.async_split.engines == 4 and p.async_split.rollouts_per_engine == 128
    assert not any("stay idle" in w or "runs one engine" in w for w in p.warnings), p.warnings


def test_generators_key_sets_the_engines_on_gpus():
    # 48 prompts x 8 = 384 rollouts: 2 engines of one GPU each leave 6 trainers, which divide them
    p = build("qwen7b-grpo", "8xH100-80GB", "rl.async_rollout.generators=2", "rl.prompts_per_step=48")
    s = p.async_split
    assert s is not None and (s.engines, s.generator_gpu_ids, s.trainer_gpu_ids) == (2, (6, 7), tuple(range(6)))
    assert s.rollouts_per_engine == 192 and p.num_processes == 6
    two_nodes = build("qwen7b-grpo", "2x8xH100-80GB", "rl.async_rollout.generators=4", "rl.prompts_per_step=48")
    assert two_nodes.async_split is not None and two_nodes.async_split.generator_gpu_ids == (6, 7)
    with pytest.raises(UserError, match=r"generators=3 engines of 1 GPU\(s\) over 2 node\(s\).*multiple of 2"):
        build("qwen7b-grpo", "2x8xH100-80GB", "rl.async_rollout.generators=3")
    with pytest.raises(UserError, match=r"generators=8 .* at least one trainer GPU.* up to 7"):
        build("qwen7b-grpo", "8xH100-80GB", "rl.async_rollout.generators=8")


def test_cpu_plans_several_generator_processes():
    """rl.async_rollout.generators on CPU: that many generator processes beside the trainer, each with its share of
    a round and of the cores (more threads than cores are shared, and the plan says so)."""
    p = plan_json("--preset", "tiny-demo", "--hardware", "cpu", "--set", "rl.async_rollout.generators=2")
    s = p["async_split"]
    rollouts = p["config"]["rl"]["prompts_per_step"] * p["config"]["rl"]["group_size"]
    assert (s["engines"], s["rollouts_per_engine"], s["generator_gpus"]) == (2, rollouts // 2, 0)
    cores = max(p["hardware"]["cpu_cores"], 2)
    assert s["generator_threads"] == max(1, cores // 3) and s["trainer_threads"] >= 1
    assert f"each of 2 generator process(es) (transformers, {rollouts // 2} rollouts each per step)" in s["why"]
    args = ("plan", "--preset", "tiny-demo", "--hardware", "cpu", *ASYNC, "--run-dir", "/tmp/x")
    proc = rlctl(*args, "--set", "rl.async_rollout.generators=2", timeout=120)
    assert re.search(r"^generator +\d+ CPU thread\(s\) each +2 transformers process\(es\)", proc.stdout, re.M)
    two_nodes = build("tiny-demo", "cpu", "hardware.nodes=2", "hardware.main_address=127.0.0.1")
    assert two_nodes.async_split is not None and two_nodes.async_split.engines == 2  # one per node by default
    with pytest.raises(UserError, match=r"generators=3 does not divide over 2 nodes"):
        build(
            "tiny-demo", "cpu", "hardware.nodes=2", "hardware.main_address=127.0.0.1", "rl.async_rollout.generators=3"
        )
    with pytest.raises(UserError, match=r"more than the 4 rollouts of a round"):
        build("tiny-demo", "cpu", "rl.prompts_per_step=2", "rl.group_size=2", "rl.async_rollout.generators=5")
