"""VAPO (`--algorithm vapo`, arXiv 2504.05118): each of its parts against a hand computation or a plain reference
loop, each switched off by its key to show the test sees it; then the loop: value pretraining moves the critic and
leaves the policy bit-identical, resume is bit-exact during value pretraining and after it, the planner counts the
critic and the value-pretraining phase, and VAPO runs with LoRA, async rollouts and a vision-language policy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rlctl import config
from rlctl.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AdvantageConfig,
    explained_variance,
    gae_lambdas,
    length_adaptive_lam,
    positive_lm_loss,
    returns_to_go,
)
from tests.helpers import plan_in_fresh_interpreter, records, rlctl, summary

T = torch.tensor


def gae(rewards, mask, values, cfg: AdvantageConfig):
    return ADVANTAGE_ESTIMATORS["gae"](rewards, mask, index=torch.arange(len(rewards)), values=values, cfg=cfg)


def reference_gae(rewards, values, mask, gamma, lams):
    """Plain-Python GAE, one λ per row, over the valid positions of each row (masked ones skipped, outputs 0)."""
    adv = [[0.0] * len(row) for row in rewards]
    for i, row in enumerate(rewards):
        running, next_value = 0.0, 0.0
        for t in reversed([t for t in range(len(row)) if mask[i][t]]):
            delta = row[t] + gamma * next_value - values[i][t]
            running = delta + gamma * lams[i] * running
            adv[i][t], next_value = running, values[i][t]
    return adv


# ------------------------------------------------------------------------------------- length-adaptive GAE
def test_length_adaptive_lambda_and_what_short_responses_get():
    lengths = T([0, 1, 10, 20, 21, 40, 100, 1000])
    # 1 - 1/(0.05 l): l=21 -> 1 - 1/1.05 = 0.047619; 40 -> 0.5; 100 -> 0.8; 1000 -> 0.98. At l <= 1/α = 20 the
    # formula gives <= 0 (l=10: -1, l=1: -19): those get `short` (an empty response too).
    long = [1 - 1 / 1.05, 0.5, 0.8, 0.98]
    torch.testing.assert_close(length_adaptive_lam(lengths, 0.05, 0.95), T([0.95] * 4 + long), atol=1e-6, rtol=0)
    torch.testing.assert_close(length_adaptive_lam(lengths, 0.05, 0.0), T([0.0] * 4 + long), atol=1e-6, rtol=0)
    mask = torch.zeros(3, 50)
    mask[0, :40], mask[1, :3], mask[2, :26] = 1, 1, 1
    mask[2, 5:10] = 0  # tool tokens inside a response do not count: 21 tokens the model wrote
    on = AdvantageConfig(lam=0.95, lam_alpha=0.05)
    torch.testing.assert_close(gae_lambdas(mask, on), T([0.5, 0.95, 1 - 1 / 1.05]))  # short: rl.returns.lam
    torch.testing.assert_close(gae_lambdas(mask, AdvantageConfig(lam=0.95, lam_alpha=0.05, short_lam=0.0))[1], T(0.0))
    assert gae_lambdas(mask, AdvantageConfig(lam=0.95)).tolist() == pytest.approx([0.95] * 3), "off: one λ"


def test_gae_with_a_lambda_per_sample_equals_the_plain_loop():
    gen = torch.Generator().manual_seed(3)
    rewards, values = torch.randn(6, 10, generator=gen), torch.randn(6, 10, generator=gen)
    mask = torch.zeros(6, 10)
    for i, n in enumerate([1, 4, 5, 7, 8, 10]):
        mask[i, :n] = 1
    mask[5, 3] = 0  # a hole (a tool result) inside the longest response: 9 tokens
    rewards = torch.where(mask.bool(), rewards, torch.full_like(rewards, 1e4))  # padding never reaches a result
    cfg = AdvantageConfig(gamma=0.9, lam=0.3, lam_alpha=0.25, short_lam=0.1, whiten=False)
    lams = [0.1, 0.1, 0.2, 1 - 1 / 1.75, 0.5, 1 - 1 / 2.25]  # l <= 1/α = 4: short_lam; then 1 - 1/(0.25 l)
    adv, returns = gae(rewards, mask, values, cfg)
    expected = T(reference_gae(rewards.tolist(), values.tolist(), mask.tolist(), 0.9, lams))
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(returns, (expected + values) * mask, atol=1e-5, rtol=1e-5), "coupled: same λ"
    # switched off: every row at rl.returns.lam (0.3), which the per-row loop above does not give
    off, _ = gae(rewards, mask, values, AdvantageConfig(gamma=0.9, lam=0.3, whiten=False))
    torch.testing.assert_close(off, T(reference_gae(rewards.tolist(), values.tolist(), mask.tolist(), 0.9, [0.3] * 6)))
    assert not torch.allclose(off, adv, atol=1e-3)


def test_short_responses_get_the_short_lambda():
    # two tokens (< 1/α): the non-adaptive λ by default, here 1: A_0 = 1 - 0.5 = 0.5, A_1 = 1 - 0.4 = 0.6
    rewards, values, mask = T([[0.0, 1.0]]), T([[0.5, 0.4]]), T([[1.0, 1.0]])
    adv, _ = gae(rewards, mask, values, AdvantageConfig(lam=1.0, lam_alpha=0.05, whiten=False))
    torch.testing.assert_close(adv, T([[0.5, 0.6]]))
    # AReaL's and NeMo-RL's clamp, short_lam = 0: TD(0), A_t = r_t + γV_{t+1} - V_t: A_0 = 0.4 - 0.5 = -0.1
    adv, _ = gae(rewards, mask, values, AdvantageConfig(lam=1.0, lam_alpha=0.05, short_lam=0.0, whiten=False))
    torch.testing.assert_close(adv, T([[-0.1, 0.6]]))


# ----------------------------------------------------------------------------------------- decoupled GAE
def test_critic_lambda_one_gives_the_monte_carlo_return_whatever_the_policy_lambda():
    rewards = T([[0.0, 0.0, 1.0], [0.0, 2.0, 1e4]])
    values = T([[0.5, 0.6, 0.7], [1.0, 0.5, 1e4]])
    mask = T([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    cfg = AdvantageConfig(gamma=1.0, lam=0.5, critic_lam=1.0, whiten=False)
    adv, returns = gae(rewards, mask, values, cfg)
    torch.testing.assert_close(returns, T([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]))  # Σ_{s≥t} r_s, values cancel
    torch.testing.assert_close(returns, returns_to_go(rewards, mask, 1.0))
    # the policy's advantages keep their λ = 0.5: row 0: δ = (0.1, 0.1, 0.3), A_2 = .3, A_1 = .1 + .5*.3 = .25,
    # A_0 = .1 + .5*.25 = .225; row 1: δ = (-0.5, 1.5), A_1 = 1.5, A_0 = -.5 + .75 = .25
    torch.testing.assert_close(adv, T([[0.225, 0.25, 0.3], [0.25, 1.5, 0.0]]))
    # switched off (coupled): the critic's targets are A + V at λ = 0.5, biased towards the values
    _, coupled = gae(rewards, mask, values, AdvantageConfig(gamma=1.0, lam=0.5, whiten=False))
    torch.testing.assert_close(coupled, T([[0.725, 0.85, 1.0], [1.25, 2.0, 0.0]]))


def test_monte_carlo_returns_are_discounted_over_valid_tokens():
    rewards, mask = T([[0.5, 0.0, 2.0, 9.0]]), T([[1.0, 0.0, 1.0, 0.0]])  # a hole and a padded position
    torch.testing.assert_close(returns_to_go(rewards, mask, 0.5), T([[1.5, 0.0, 2.0, 0.0]]))  # 0.5 + 0.5 x 2


def test_explained_variance_measures_the_critic_fit():
    returns, mask = T([[1.0, 2.0, 3.0, 4.0]]), T([[1.0, 1.0, 1.0, 1.0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.5), returns, mask) == pytest.approx(0.0)
    # residual (0.5, 0, 0, -0.5): var 1/6 against var(R) = 5/3 -> 0.9
    assert explained_variance(T([[0.5, 2.0, 3.0, 4.5]]), returns, mask) == pytest.approx(0.9)


# ------------------------------------------------------------------------------ positive-example LM loss
def test_positive_lm_loss_touches_only_the_correct_samples():
    logp = T([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5], [-3.0, 0.0, 0.0]], requires_grad=True)
    mask = T([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    correct = T([1.0, 0.0, 1.0])
    loss = positive_lm_loss(logp, mask, correct)
    # correct tokens: (-1, -2) of row 0 and (-3) of row 2: -(-6)/3 = 2
    assert loss.item() == pytest.approx(2.0)
    loss.backward()
    torch.testing.assert_close(logp.grad, T([[-1 / 3, -1 / 3, 0.0], [0.0, 0.0, 0.0], [-1 / 3, 0.0, 0.0]]))
    assert positive_lm_loss(logp, mask, T([0.0, 0.0, 0.0])).item() == 0.0, "no correct sample: no loss"


# ------------------------------------------------------------------------------------- the preset, config
def test_the_preset_turns_every_part_on():
    rl = config.resolve(preset="tiny-demo", algorithm="vapo").rl
    assert rl.critic.pretrain_steps == 50  # value pretraining
    assert rl.returns.critic_lam == 1.0  # decoupled GAE
    assert rl.returns.lam_alpha == 0.05 and rl.returns.lam == 0.95  # length-adaptive GAE (0.95 when off)
    assert (rl.loss.clip_low, rl.loss.clip_high) == (0.2, 0.28)  # clip-higher
    assert rl.loss.agg == "token-mean"  # token-level loss
    assert rl.loss.lm_coef == 0.1  # positive-example LM loss
    assert rl.group_size == 8 and rl.advantage == "gae" and rl.critic.init == "policy"  # group sampling, critic
    assert rl.total_steps == 50 + rl.max_steps
    assert rl.critic_learning_rate == 2 * rl.learning_rate  # the paper's critic lr: 2e-6 for the actor's 1e-6


def test_the_tiny_demo_divides_its_rate_by_the_updates_of_the_algorithm_layered_over_it(tmp_path: Path):
    """tiny-demo's `for_algorithm`: its RL rate, tuned for one update per rollout batch, divided by VAPO's 16 and
    GSPO's 4 when `--algorithm` layers them; the other algorithms keep it, --set wins, a project built on the
    recipe (`defaults: [tiny-demo]`) gets the same, and a malformed block is one paragraph naming its file."""
    from rlctl.errors import UserError

    rate = config.resolve(preset="tiny-demo").rl.learning_rate
    for algorithm, updates in (("vapo", 16), ("gspo", 4), ("grpo", 1), ("ppo", 1), ("dapo", 1)):
        rl = config.resolve(preset="tiny-demo", algorithm=algorithm).rl
        assert rl.ppo_epochs * rl.ppo_mini_batches == updates and rl.learning_rate == rate / updates, algorithm
    assert config.resolve(preset="tiny-demo", algorithm="vapo", sets=["rl.learning_rate=1e-4"]).rl.learning_rate == 1e-4
    project = tmp_path / "rlctl.yaml"
    project.write_text("defaults: [tiny-demo]\nseed: 1\n")
    assert config.resolve(config_file=project, algorithm="vapo").rl.learning_rate == rate / 16
    project.write_text("defaults: [tiny-demo]\nfor_algorithm: {vapo: 0.1}\n")
    with pytest.raises(UserError, match=f"{project}: for_algorithm must map algorithm names to config layers"):
        config.resolve(config_file=project, algorithm="vapo")
    project.write_text("defaults: [tiny-demo]\nfor_algorithm: {vapoo: {rl: {learning_rate: 1.0e-5}}}\n")
    with pytest.raises(UserError, match="for_algorithm names vapoo, not an algorithm preset"):
        config.resolve(config_file=project)


def test_the_critic_learning_rate_is_a_multiple_of_the_policys_unless_set():
    from rlctl.errors import UserError

    ppo = config.resolve(preset="tiny-demo", algorithm="ppo").rl
    assert ppo.critic_learning_rate == ppo.learning_rate == 3e-4  # lr_ratio 1: PPO's critic as before
    vapo = config.resolve(preset="tiny-demo", algorithm="vapo", sets=["rl.learning_rate=1e-4"]).rl
    assert vapo.critic_learning_rate == pytest.approx(2e-4)
    fixed = config.resolve(preset="tiny-demo", algorithm="vapo", sets=["rl.critic.lr=5e-5"]).rl
    assert fixed.critic_learning_rate == 5e-5, "a critic.lr that is set wins over lr_ratio"
    with pytest.raises(UserError, match=r"rl\.critic\.lr_ratio=10"):
        config.resolve(preset="tiny-demo", algorithm="vapo", sets=["rl.learning_rate=0.2", "rl.critic.lr_ratio=10"])


@pytest.mark.parametrize(
    ("sets", "words"),
    [
        (["rl.group_size=1"], "rl.group_size=1"),  # grpo compares within a group
        (["rl.critic.pretrain_steps=5"], "rl.critic.pretrain_steps=5"),  # no critic under grpo
        (["rl.returns.lam_alpha=0.05"], "rl.returns.lam_alpha"),
        (["rl.advantage=gae", "rl.critic.init=policy", "rl.returns.short_lam=0"], "rl.returns.short_lam=0"),
    ],
)
def test_parts_without_what_they_need_are_refused(sets, words):
    from rlctl.errors import UserError

    with pytest.raises(UserError, match=words.replace(".", r"\.")):
        config.resolve(preset="tiny-demo", algorithm="grpo", sets=sets)


def test_group_sampling_off_is_one_sample_per_prompt_at_the_same_batch():
    cfg = config.resolve(preset="tiny-demo", algorithm="vapo", sets=["rl.group_size=1", "rl.prompts_per_step=128"])
    assert cfg.rl.batch_size == 128 == config.resolve(preset="tiny-demo", algorithm="vapo").rl.batch_size


def test_plan_counts_the_critic_and_the_value_pretraining_phase():
    plan = plan_in_fresh_interpreter("--preset", "tiny-demo", "--algorithm", "vapo")["plan"]
    (rl,) = [s for s in plan["stages"] if s["name"] == "rl"]
    assert rl["max_steps"] == 50 + 60, "value pretraining runs before rl.max_steps"
    phases = {p["phase"]: p for p in plan["memory"]["phases"] if p["stage"] == "rl"}
    assert set(phases) >= {"generation", "training", "value pretraining"}
    pre, train = phases["value pretraining"]["components_gib"], phases["training"]["components_gib"]
    assert "critic (weights, grads, optimizer)" in pre and "policy gradients" not in pre
    assert pre["critic (weights, grads, optimizer)"] == train["critic (weights, grads, optimizer)"]
    assert phases["value pretraining"]["peak_gib"] < phases["training"]["peak_gib"]
    off = plan_in_fresh_interpreter(
        "--preset", "tiny-demo", "--algorithm", "vapo", "--set", "rl.critic.pretrain_steps=0"
    )["plan"]
    assert "value pretraining" not in {p["phase"] for p in off["memory"]["phases"]}
    proc = rlctl("plan", "--preset", "tiny-demo", "--algorithm", "vapo")
    assert proc.returncode == 0, proc.stderr
    assert "110 (50 value pretraining + 60)" in proc.stdout and "value pretraining" in proc.stdout


def test_lm_loss_without_a_correctness_reward_is_refused_at_plan_time(tmp_path: Path):
    proc = rlctl(
        "plan", "--preset", "tiny-demo", "--algorithm", "vapo", "--stages", "rl",
        "--set", "rl.rewards=[{name: length_penalty}]", "--run-dir", str(tmp_path / "run"),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "rl.loss.lm_coef=0.1" in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------------------ the loop
SMALL = ["rl.rewards=[{name: exact_match}]", "rl.eval_samples=20"]


def vapo_run(policy: Path, run_dir: Path, *sets: str, preset: str = "tiny-demo") -> dict:
    """`rlctl train --preset PRESET --algorithm vapo --stages rl` from the model folder `policy`, with `sets`."""
    args = ["train", "--preset", preset, "--algorithm", "vapo", "--stages", "rl", "--run-dir", str(run_dir)]
    for key in (f"model.name_or_path={policy}", *sets):
        args += ["--set", key]
    proc = rlctl(*args, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return summary(run_dir)


def crashed_copy(run: Path, dest: Path, last: int) -> None:
    """`run` as a crash after its checkpoint `last` would have left it: later checkpoints, the final folder and the
    rl stage's completion gone."""
    later = [p.name for p in (run / "rl" / "checkpoints").iterdir() if int(p.name.rsplit("-", 1)[1]) > last]
    shutil.copytree(run, dest, ignore=shutil.ignore_patterns(*later, "final", "run.lock"))
    s = summary(dest)
    s["completed"].remove("rl")
    s["stages"].pop("rl")
    (dest / "summary.json").write_text(json.dumps(s))
    (dest / "config.yaml").write_text((dest / "config.yaml").read_text().replace(str(run), str(dest)))


def weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(path)


@pytest.mark.slow
def test_value_pretraining_moves_only_the_critic_and_resume_is_bit_exact_during_and_after_it(demo_run, tmp_path):
    """Two value-pretraining steps, then two VAPO steps, a checkpoint after each: at the end of value pretraining the
    policy is the SFT model bit for bit and the critic has moved; a run killed during value pretraining (after step
    1) and one killed after it (after step 3) resume to exactly the uninterrupted run's weights."""
    sft = demo_run / "sft" / "final"
    straight = tmp_path / "straight"
    sets = [*SMALL, "rl.critic.pretrain_steps=2", "rl.max_steps=2", "rl.save_every=1", "checkpoint.keep_last=4"]
    vapo_run(sft, straight, *sets)
    ckpts = straight / "rl" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == [f"checkpoint-{i}" for i in range(1, 5)]
    start, pretrained = weights(sft / "model.safetensors"), weights(ckpts / "checkpoint-2" / "model.safetensors")
    assert start.keys() == pretrained.keys()
    assert all(torch.equal(start[k], pretrained[k]) for k in start), "the policy is bit-identical after pretraining"
    critic = [weights(ckpts / f"checkpoint-{i}" / "model_1.safetensors") for i in (1, 2)]
    backbone = [k for k in critic[0] if k.startswith("model.")]
    assert backbone and any(not torch.equal(critic[0][k], critic[1][k]) for k in backbone), "the critic trains"
    assert any(not torch.equal(critic[0][k], start[k]) for k in backbone), "the critic moved from its start"
    final = weights(straight / "rl" / "final" / "model.safetensors")
    assert any(not torch.equal(start[k], final[k]) for k in start), "the policy trains after value pretraining"

    steps = [r for r in records(straight) if r.get("stage") == "rl" and "step" in r and "event" not in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and {r["max_steps"] for r in steps} == {4}
    for r in steps[:2]:  # value pretraining: the critic's loss and fit, no policy loss or gradient
        assert r["value_pretrain_step"] == r["step"] and "value_loss" in r and "value_explained_var" in r, r
        assert "loss" not in r and "grad_norm" not in r and "time_value_pretrain" in r, r
    # value pretraining draws its prompts from a stream of its own: the policy's steps start the policy's stream, as
    # a run without value pretraining (or any other algorithm) does at its first steps
    assert [r["prompt_index"] for r in steps] == [0, 16, 0, 16]
    c_opt = torch.load(ckpts / "checkpoint-1" / "optimizer_1.bin", weights_only=False)
    rate = 3e-4 / 16  # tiny-demo's RL rate for VAPO's 16 updates per batch (its for_algorithm)
    assert [g["lr"] for g in c_opt["param_groups"]] == [2 * rate], "the critic learns at 2x the policy's rate"
    for r in steps[2:]:  # VAPO: the per-sample λ (answers under 1/α = 20 tokens: returns.lam) and the LM loss's share
        assert "value_pretrain_step" not in r and "loss" in r and "grad_norm" in r, r
        assert [r["lam_mean"], r["lam_min"], r["lam_max"]] == pytest.approx([0.95] * 3), r
        assert 0 <= r["correct_frac"] <= 1, r
        assert "lm_loss" in r, r

    for last in (1, 3):  # killed during value pretraining, and after it
        resumed = tmp_path / f"resumed-{last}"
        crashed_copy(straight, resumed, last)
        proc = rlctl("resume", str(resumed), env={"OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
        again = weights(resumed / "rl" / "final" / "model.safetensors")
        assert all(torch.equal(final[k], again[k]) for k in final), f"resumed after step {last}: not bit-exact"
        logged = [r["step"] for r in records(resumed) if r.get("stage") == "rl" and "step" in r and "event" not in r]
        assert logged == [1, 2, 3, 4, *range(last + 1, 5)], logged


def rl_steps(run_dir: Path) -> list[dict]:
    return [r for r in records(run_dir) if r.get("stage") == "rl" and "step" in r and "event" not in r]


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["lora", "async"])
def test_vapo_runs_with_lora_and_with_async_rollouts(demo_run, tmp_path, variant):
    """LoRA: the policy and the critic each with adapters. Async: the generator process samples every round, value
    pretraining's from the unchanged policy, one version behind the trainer at most."""
    sets = {"lora": ["model.adapter=lora"], "async": ["rl.async_rollout.enabled=true"]}[variant]
    sets += [*SMALL, "rl.critic.pretrain_steps=2", "rl.max_steps=2"]
    s = vapo_run(demo_run / "sft" / "final", tmp_path / "run", *sets)
    steps = rl_steps(tmp_path / "run")
    assert [r.get("value_pretrain_step") for r in steps] == [1, 2, None, None]
    assert all("lm_loss" in r and "lam_mean" in r for r in steps[2:]), steps[2:]
    live = s["layout"]["rl"]["observed"]
    assert live["critic"] and live["adapter"] == ("lora" if variant == "lora" else "full"), live
    assert s["layout"]["rl"]["mismatches"] == []
    if variant == "async":
        assert all(r["staleness_max"] <= 1 for r in steps), steps


@pytest.mark.slow
def test_vapo_trains_a_vision_language_policy(tmp_path_factory, tmp_path):
    """The tiny VLM demo's SFT model (shared with tests/test_vlm.py) under VAPO: its critic reads the images."""
    from tests.helpers import run_once

    vlm = run_once(tmp_path_factory, "vlm-demo", "--preset", "tiny-vlm-demo")
    sets = ["rl.critic.pretrain_steps=2", "rl.max_steps=2", "rl.eval_samples=20"]
    s = vapo_run(vlm / "sft" / "final", tmp_path / "run", *sets, preset="tiny-vlm-demo")
    assert s["layout"]["rl"]["observed"]["critic"] and s["layout"]["rl"]["mismatches"] == []
    steps = rl_steps(tmp_path / "run")
    assert [r.get("value_pretrain_step") for r in steps] == [1, 2, None, None]
    assert all("lm_loss" in r for r in steps[2:]), steps[2:]
