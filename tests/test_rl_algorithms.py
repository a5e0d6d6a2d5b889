"""The RL algorithm catalogue: every algorithm has a preset and one code path, bad algorithm settings stop the
run at plan time (exit 2) with the rule and the nearest valid setting, the rlctl loop checkpoints and resumes
exactly, and every algorithm learns: from one shared SFT checkpoint, a short run at a fixed seed lifts
held-out accuracy above the SFT starting point."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlctl import config
from rlctl.config import presets
from rlctl.errors import UserError
from tests.helpers import rlctl, summary

RL_ALGORITHMS = list(config.RL_ALGORITHMS)
ALL_ALGORITHMS = [*RL_ALGORITHMS, *config.OFFLINE_ALGORITHMS]
# Every RL algorithm preset sets all of these (keys under rl), so `--algorithm X` gives the same config whatever
# came before.
ALGORITHM_KEYS = (
    "algorithm",
    "advantage",
    "loss.policy",
    "loss.agg",
    "loss.clip_low",
    "loss.clip_high",
    "loss.cispo_cap",
    "loss.dual_clip",
    "loss.lm_coef",
    "beta",
    "kl.estimator",
    "kl.in_reward",
    "kl.target",
    "kl.horizon",
    "returns.gamma",
    "returns.lam",
    "returns.critic_lam",
    "returns.lam_alpha",
    "ppo_epochs",
    "ppo_mini_batches",
    "critic.init",
    "critic.warmup_steps",
    "critic.pretrain_steps",
    "critic.value_clip",
    "filters.dynamic_sampling",
    "filters.dynamic_sampling_rounds",
    "filters.overlong_buffer",
    "filters.overlong_penalty",
    "filters.mask_truncated",
    "filters.pf_ppo_mode",
    "filters.pf_ppo_weight_pow",
)


# ------------------------------------------------------------------------------------------ catalogue
def test_config_names_equal_the_algorithm_registries():
    import rlctl.algorithms as algos

    assert config.ADVANTAGE_NAMES == algos.ADVANTAGE_NAMES == tuple(algos.ADVANTAGE_ESTIMATORS)
    assert config.POLICY_LOSS_NAMES == algos.POLICY_LOSS_NAMES == tuple(algos.POLICY_LOSSES)
    assert config.KL_NAMES == algos.KL_NAMES == tuple(algos.KL_ESTIMATORS)
    assert config.AGG_MODES == algos.AGG_MODES
    assert config.PF_PPO_MODES == algos.PF_PPO_MODES


def test_every_algorithm_has_a_preset_and_presets_list_shows_it():
    shipped = {n for n, p in presets.all_presets().items() if p.kind == "algorithms"}
    assert shipped == set(ALL_ALGORITHMS)
    proc = rlctl("presets", "list")
    assert proc.returncode == 0, proc.stderr
    for name in ALL_ALGORITHMS:
        assert name in proc.stdout, name


@pytest.mark.parametrize("name", RL_ALGORITHMS)
def test_rl_presets_set_every_algorithm_key_and_resolve(name):
    layer = presets.load(name, kind="algorithms")["rl"]
    keys = {*layer, *(f"{k}.{sub}" for k, v in layer.items() if isinstance(v, dict) for sub in v)}
    assert set(ALGORITHM_KEYS) <= keys, set(ALGORITHM_KEYS) - keys
    assert "learning_rate" not in layer and "max_steps" not in layer, "scale-dependent knobs belong to recipes"
    cfg = config.resolve(preset="tiny-demo", algorithm=name)
    assert cfg.rl.algorithm == name
    # order independence: the same algorithm on top of any other gives the same rl section (but the learning rate,
    # which the recipe sets per algorithm: tiny-demo's for_algorithm)
    for other in ("ppo", "gspo", "dapo"):
        stacked = config.validate(
            presets.deep_merge(config.layered("tiny-demo", algorithm=other), presets.load(name, kind="algorithms"))
        )
        same = {"exclude": {"learning_rate"}}
        assert stacked.rl.model_dump(**same) == cfg.rl.model_dump(**same), (other, name)


def test_offline_algorithms_replace_rm_and_rl_with_their_stage():
    assert config.resolve(preset="tiny-demo", algorithm="dpo").stages == ["sft", "dpo"]
    assert config.resolve(preset="tiny-demo", algorithm="kto").stages == ["sft", "kto"]


def test_algorithm_presets_set_their_published_knobs():
    dr = config.resolve(preset="tiny-demo", algorithm="dr-grpo").rl
    assert (dr.advantage, dr.loss.agg, dr.beta) == ("dr_grpo", "seq-mean-token-sum-norm", 0.0)
    gspo = config.resolve(preset="tiny-demo", algorithm="gspo").rl
    assert (gspo.loss.policy, gspo.loss.clip_low, gspo.loss.clip_high) == ("gspo", 3e-4, 4e-4)
    dapo = config.resolve(preset="tiny-demo", algorithm="dapo").rl
    assert (dapo.loss.clip_low, dapo.loss.clip_high, dapo.loss.agg) == (0.2, 0.28, "token-mean")
    assert dapo.filters.dynamic_sampling and dapo.filters.overlong_buffer == 0.2 and dapo.beta == 0
    vapo = config.resolve(preset="tiny-demo", algorithm="vapo").rl  # its seven parts: tests/test_vapo.py
    assert (vapo.advantage, vapo.critic.init, vapo.critic.pretrain_steps, vapo.returns.critic_lam) == (
        "gae",
        "policy",
        50,
        1.0,
    )
    for name in set(RL_ALGORITHMS) - {"vapo"}:  # VAPO's own keys are off in every other preset
        rl = config.resolve(preset="tiny-demo", algorithm=name).rl
        assert (rl.critic.pretrain_steps, rl.returns.critic_lam, rl.returns.lam_alpha, rl.loss.lm_coef) == (
            0,
            None,
            None,
            0.0,
        ), name


# ------------------------------------------------------------------------------------------ validation
BAD = [
    # (overrides, words the message must contain: the rule and the nearest valid setting)
    (["rl.advantage=gea"], ["rl.advantage", "gea", "Did you mean: gae"]),
    (["rl.loss.policy=ppoo"], ["rl.loss.policy", "Did you mean: ppo"]),
    (["rl.loss.agg=token_mean"], ["rl.loss.agg", "token-mean"]),
    (["rl.kl.estimator=k4"], ["rl.kl.estimator", "k1, k2, k3, abs"]),
    (["rl.batch_size=100"], ["does not divide into groups", "rl.batch_size=96 or 104"]),
    (["rl.ppo_mini_batches=3"], ["rl.ppo_mini_batches=3", "nearest valid: rl.ppo_mini_batches=2 or 4"]),
    (["rl.loss.clip_low=1.5"], ["rl.loss.clip_low", "less than 1"]),
    (["rl.loss.clip_high=1.5"], ["rl.loss.clip_high=1.5", "nearest valid: rl.loss.clip_high=1.0"]),
    (["rl.loss.policy=cispo", "rl.loss.agg=token-mean", "rl.loss.clip_high=5.0"], ["moved", "rl.loss.cispo_cap=5.0"]),
    (["rl.loss.cispo_cap=0.5"], ["rl.loss.cispo_cap", "greater than 1"]),
    (["rl.algorithm=ppo", "rl.advantage=gae", "rl.critic.init=null"], ["needs a critic", "rl.critic.init=policy"]),
    (["rl.trainer=rlctl"], ["rl.trainer is gone", "rlctl's own loop now trains every RL algorithm"]),
    (["rl.algorithm=dpo"], ["offline preference algorithm", "--algorithm dpo"]),
    (["rl.loss.dual_clip=0.5"], ["rl.loss.dual_clip", "greater than 1"]),
]


@pytest.mark.parametrize(("sets", "words"), BAD)
def test_bad_algorithm_settings_are_refused_with_the_nearest_valid_setting(sets, words):
    with pytest.raises(UserError) as err:
        config.resolve(preset="tiny-demo", sets=sets)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_ppo_critic_from_a_reward_model_needs_the_rm_stage():
    with pytest.raises(UserError, match=r"critic.init=reward_model.*rm is not in stages.*rl.critic.init=policy"):
        config.resolve(
            preset="tiny-demo",
            algorithm="ppo",
            sets=["stages=[sft,rl]", "rl.rewards=[{name: exact_match}]", "rl.critic.init=reward_model"],
        )
    cfg = config.resolve(preset="tiny-demo", algorithm="ppo", sets=["rl.critic.init=reward_model"])
    assert cfg.rl.critic.init == "reward_model"


def test_batch_size_sets_prompts_per_step():
    cfg = config.resolve(preset="tiny-demo", sets=["rl.batch_size=64"])
    assert (cfg.rl.prompts_per_step, cfg.rl.group_size) == (8, 8)
    assert config.resolve(preset="tiny-demo").rl.batch_size == 16 * 8


def test_cli_exits_2_before_anything_starts(tmp_path):
    run_dir = tmp_path / "run"
    proc = rlctl("train", "--preset", "tiny-demo", "--algorithm", "ppo", "--set", "rl.critic.init=null",
                 "--run-dir", str(run_dir))  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "rl.critic.init=policy" in proc.stderr and "Traceback" not in proc.stderr
    assert not run_dir.exists()
    proc = rlctl("plan", "--preset", "tiny-demo", "--set", "rl.advantage=gea")
    assert proc.returncode == 2 and "Did you mean: gae" in proc.stderr


# ------------------------------------------------------------------------------------------ learning
# algorithm -> (steps, extra --set overrides). Each run must lift held-out accuracy by MARGIN over the SFT start.
# Measured gains at these settings (seeds 42 and 1, see docs/algorithms.md) are +0.22 to +0.34, so the margin
# leaves room. GSPO makes 4 updates per rollout (its paper's mini-batches), so it gets the demo's learning rate
# divided by 4, VAPO 16 (its paper's), divided by 16: the tiny demo's own for_algorithm block, no --set; dpo/kto
# need a learning rate for the tiny model (the tiny demo recipe tunes sft, rm and rl only).
MARGIN = 0.15
LEARNING: dict[str, tuple[int, list[str]]] = {
    **{name: (20, []) for name in RL_ALGORITHMS},
    "vapo": (20, ["rl.critic.pretrain_steps=10"]),  # 10 of the preset's 50: CI time
    **{
        name: (40, [f"{name}.learning_rate=5e-5", f"{name}.batch_size=32", f"{name}.max_length=16",
                    f"{name}.lr_scheduler=constant"])
        for name in config.OFFLINE_ALGORITHMS
    },
}  # fmt: skip


def train_from_sft(sft_run: Path, run_dir: Path, algorithm: str, steps: int, *extra: str) -> dict:
    """`rlctl train --preset tiny-demo --algorithm A` starting from the SFT model of the session's demo run
    (conftest's `demo_run`, shared with test_pipeline), single-threaded so runs stay fast on a busy CI box."""
    stage = algorithm if algorithm in config.OFFLINE_ALGORITHMS else "rl"
    sets = [f"model.name_or_path={sft_run / 'sft' / 'final'}", f"{stage}.max_steps={steps}"]
    sets.append(f"{stage}.save_every={steps}")
    if stage == "rl":
        sets.append("rl.rewards=[{name: exact_match}]")
    args = ["train", "--preset", "tiny-demo", "--algorithm", algorithm, "--stages", stage, "--run-dir", str(run_dir)]
    proc = rlctl(*args, *[x for s in [*sets, *extra] for x in ("--set", s)], env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return summary(run_dir)


# CI learns with these (a critic, the GRPO family's base and DAPO's filters, VAPO); the rest in `make test-long`
IN_CI = ("grpo", "ppo", "dapo", "vapo")


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", [a if a in IN_CI else pytest.param(a, marks=pytest.mark.long) for a in LEARNING])
def test_algorithm_learns_from_the_sft_checkpoint(algorithm, demo_run, tmp_path):
    steps, extra = LEARNING[algorithm]
    s = train_from_sft(demo_run, tmp_path / "run", algorithm, steps, *extra)
    stage = algorithm if algorithm in config.OFFLINE_ALGORITHMS else "rl"
    start, end = s["stages"]["base"]["eval_accuracy"], s["stages"][stage]["eval_accuracy"]
    sft = summary(demo_run)["stages"]["sft"]["eval_accuracy"]
    assert start == pytest.approx(sft), "the run starts from the shared SFT model"
    assert end > start + MARGIN, f"{algorithm}: held-out accuracy {start:.3f} -> {end:.3f} after {steps} steps"
    record = s["layout"][stage]
    assert record["mismatches"] == [], record
    if stage == "rl":  # the critic and the frozen reference copy of the algorithms that have them
        live = record["observed"]
        assert live["critic"] == (algorithm in ("ppo", "pf-ppo", "vapo")), live
        beta = json.loads((tmp_path / "run" / "plan.json").read_text())["config"]["rl"]["beta"]
        assert live["reference"] == ("cpu" if beta > 0 else "none"), live
    if stage != "rl":  # the held-out tenth of data.preference, scored at the end (rlctl report charts it)
        records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        (held,) = [r for r in records if r.get("event") == "heldout"]
        assert held["stage"] == stage and held["pairs"] > 0 and isinstance(held["preference_margin"], float), held
        assert (algorithm == "dpo") == (0 <= held.get("preference_accuracy", -1) <= 1), held
    if stage == "rl":
        records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        steps_logged = [r for r in records if r.get("stage") == "rl" and "step" in r]
        assert steps_logged and any("reward" in r for r in steps_logged)
        final = tmp_path / "run" / "rl" / "final"
        assert (final / "model.safetensors").exists()
        assert json.loads((final / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"], "policy only"


# ------------------------------------------------------------------------------------------ the rlctl loop
@pytest.mark.slow
def test_loop_resumes_exactly_where_it_stopped(demo_run, tmp_path):
    """PPO (policy, critic, both optimizers and schedulers, every RNG, prompt cursor, KL coefficient) interrupted
    after a checkpoint and resumed with `rlctl resume` ends with exactly the weights of the uninterrupted run."""
    from safetensors.torch import load_file

    straight = tmp_path / "straight"
    train_from_sft(demo_run, straight, "ppo", 6, "rl.save_every=3")
    ckpts = sorted(p.name for p in (straight / "rl" / "checkpoints").iterdir())
    assert ckpts == ["checkpoint-3", "checkpoint-6"], ckpts
    for name in ckpts:
        assert (straight / "rl" / "checkpoints" / name / "rlctl_complete").exists()

    # A crash after checkpoint-3: the same run directory without what came after it.
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed, ignore=shutil.ignore_patterns("checkpoint-6", "final", "run.lock"))
    s = summary(resumed)
    s["completed"].remove("rl")
    s["stages"].pop("rl")
    (resumed / "summary.json").write_text(json.dumps(s))
    config_text = (resumed / "config.yaml").read_text().replace(str(straight), str(resumed))
    (resumed / "config.yaml").write_text(config_text)
    proc = rlctl("resume", str(resumed), env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    records = [json.loads(x) for x in (resumed / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if r.get("stage") == "rl" and "step" in r and "event" not in r]
    assert steps == [1, 2, 3, 4, 5, 6, 4, 5, 6], "the resumed run continues from step 4"
    a = load_file(straight / "rl" / "final" / "model.safetensors")
    b = load_file(resumed / "rl" / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch_equal(a[k], b[k]), k


def test_micro_batch_weights_reproduce_the_mini_batch_loss():
    """Accumulating agg_loss over micro-batches, each weighted by its share of loss_units, gives the loss
    aggregated over the whole mini-batch, for every aggregation mode (one process)."""
    import torch

    from rlctl.algorithms import AGG_MODES, agg_loss, loss_units

    torch.manual_seed(0)
    loss_mat = torch.randn(12, 7)
    mask = (torch.rand(12, 7) > 0.3).float()
    mask[3] = 0  # an empty row
    for mode in AGG_MODES:
        whole = agg_loss(loss_mat, mask, mode, norm_len=7)
        total = loss_units(mask, mode)
        parts = sum(
            agg_loss(loss_mat[r], mask[r], mode, norm_len=7) * loss_units(mask[r], mode) / total
            for r in torch.arange(12).split(5)
        )
        assert torch.allclose(parts, whole, atol=1e-6), mode


def test_prompt_stream_is_seeded_and_resumable():
    from rlctl.rollout.samples import PromptStream

    rows = [{"prompt": str(i)} for i in range(5)]
    a = PromptStream(rows, seed=1).take(12)
    assert sorted(r["prompt"] for _, r in a[:5]) == [str(i) for i in range(5)], "each epoch sees every prompt"
    assert [g for g, _ in a] == list(range(12)), "group ids are stream positions"
    resumed = PromptStream(rows, seed=1, cursor=7).take(5)
    assert resumed == a[7:], "the cursor is the whole state"


@pytest.mark.slow
@pytest.mark.parametrize("init", ["policy", "reward_model"])
def test_critic_starts_from_the_policy_or_the_reward_model(init, demo_run):
    from safetensors.torch import load_file

    from rlctl.plan import planner as plan_mod
    from rlctl.runtime.context import MetricsLog
    from rlctl.stages.context import StageContext
    from rlctl.stages.rl import load_models

    cfg = config.resolve(preset="tiny-demo", algorithm="ppo", sets=[f"rl.critic.init={init}"])
    the_plan = plan_mod.build(cfg, demo_run)
    ctx = StageContext(cfg, the_plan, the_plan.stages[-1], demo_run, {}, MetricsLog(demo_run, False), True)
    _, ref, critic = load_models(ctx)
    assert ref is not None, "beta > 0: a frozen reference"
    source = load_file(demo_run / ("sft" if init == "policy" else "rm") / "final" / "model.safetensors")
    weights = critic.state_dict()
    backbone = [k for k in source if k.startswith("model.")]
    assert backbone and all(torch_equal(weights[k], source[k]) for k in backbone)
    if init == "reward_model":
        assert torch_equal(weights["score.weight"], source["score.weight"]), "the value head starts as the RM head"


def torch_equal(a, b) -> bool:
    return a.shape == b.shape and bool((a == b).all())


@pytest.mark.slow
def test_loop_runs_as_two_ddp_processes(demo_run, tmp_path):
    run_dir = tmp_path / "ddp"
    s = train_from_sft(demo_run, run_dir, "ppo", 3, "hardware.num_processes=2", "rl.prompts_per_step=8")
    assert s["world_size"] == 2 and s["completed"] == ["rl"]
    record = s["layout"]["rl"]
    assert record["mismatches"] == [] and record["processes_recorded"] == 2
    assert record["observed"]["strategy"] == "ddp" and record["observed"]["critic"]
    assert (run_dir / "rl" / "checkpoints" / "checkpoint-3" / "rlctl_complete").exists()
    assert sorted(p.name for p in (run_dir / "rl" / "checkpoints" / "checkpoint-3").glob("random_states_*")) == [
        "random_states_0.pkl",
        "random_states_1.pkl",
    ]
