"""TRL names answered with rlctl's key (accepted aliases, refusals with did-you-mean), the rl keys that moved into
sections read at their new places (--set, config files, an old run's config.yaml), and STAGE.epochs counted into
max_steps by the plan: all at plan level, no training."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from rlctl import config
from rlctl.config import aliases, presets
from rlctl.data import tasks
from rlctl.errors import UserError
from rlctl.plan import planner
from tests.helpers import rlctl

ALL_STAGES = "stages=[sft,dpo,kto,rm,rl]"
# A value per rlctl key (its last part) that differs from tiny-demo's, so an alias that went nowhere shows.
VALUES = {
    "epochs": "2",
    "learning_rate": "0.0002",
    "lr_scheduler": "linear",
    "save_every": "7",
    "max_length": "200",
    "group_size": "4",
    "max_new_tokens": "12",
    "max_prompt_length": "40",
    "ppo_epochs": "2",
    "clip_low": "0.15",
    "clip_high": "0.25",
    "beta": "0.05",
    "name_or_path": "builtin:tiny",
    "lora_r": "4",
    "lora_alpha": "8",
    "lora_dropout": "0.1",
    "every": "3",
    "report_to": "[tensorboard]",
    "max_staleness": "2",
}


def _rows(kind: str) -> list[tuple[str, str, str]]:
    """(section, typed name, rlctl key) of every accepted (`alias`) or refused (`refused`) TRL row, per section."""
    out = []
    for a in aliases.ALIASES:
        if a.accepted == (kind == "alias") and not a.moved:
            for where in a.where:
                for section in config.STAGE_ORDER if where == aliases.STAGE else (where,):
                    out.append((section, a.name, a.key.replace(aliases.STAGE, section)))
    return out


def _plan_json(sets: list[str], run_dir: Path) -> dict:
    """What `rlctl plan --json` reports for tiny-demo with every stage and `sets` (less the data checks)."""
    cfg = config.resolve("tiny-demo", sets=[ALL_STAGES, *sets])
    return planner.build(cfg, run_dir).to_json()


def test_every_accepted_alias_plans_as_its_rlctl_key(tmp_path):
    """All accepted names at once give the plan the rlctl keys give (one name per key: two names for one key in a
    layer are refused, tested below; report_to needs its tracker installed to plan, and has its config test)."""
    typed, keys, seen = [], [], {"logging.report_to"}
    for section, name, key in _rows("alias"):
        if key in seen:
            continue
        seen.add(key)
        value = VALUES[key.rsplit(".", 1)[1]]
        typed.append(f"{section + '.' if section else ''}{name}={value}")
        keys.append(f"{key}={value}")
    by_alias, by_key = _plan_json(typed, tmp_path), _plan_json(keys, tmp_path)
    assert by_alias == by_key
    base = _plan_json([], tmp_path)
    for item in keys:  # every value reached the config (the test would pass on a no-op otherwise)
        key, value = item.split("=")
        if key not in ("model.name_or_path",):
            new, old = by_key["config"], base["config"]
            for part in key.split("."):
                new, old = new[part], old[part]
            assert new != old, key


@pytest.mark.parametrize(("section", "name", "key"), _rows("alias"))
def test_alias_typed_anywhere_it_applies(section, name, key):
    """Each accepted name under each section it applies to sets its rlctl key."""
    value = VALUES[key.rsplit(".", 1)[1]]
    typed = f"{section + '.' if section else ''}{name}={value}"
    got = config.resolve("tiny-demo", sets=[ALL_STAGES, typed]).model_dump(mode="json")
    want = config.resolve("tiny-demo", sets=[ALL_STAGES, f"{key}={value}"]).model_dump(mode="json")
    assert got == want


@pytest.mark.parametrize(("section", "name", "key"), _rows("refused"))
def test_refused_name_suggests_the_rlctl_key(section, name, key):
    typed = f"{section + '.' if section else ''}{name}"
    with pytest.raises(UserError) as err:
        config.resolve("tiny-demo", sets=[ALL_STAGES, f"{typed}=4"])
    assert f"unknown key '{typed}' (a TRL name)" in str(err.value)
    assert f"Did you mean {key}?" in str(err.value)


def test_refusal_on_the_command_line_exits_2(tmp_path):
    proc = rlctl("plan", "--preset", "tiny-demo", "--set", "sft.per_device_train_batch_size=8", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Did you mean sft.micro_batch_size?" in proc.stderr and "Traceback" not in proc.stderr
    assert "global batch" in proc.stderr  # the difference, not just the name
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "sets",
    [
        ["rl.num_generations=4", "rl.group_size=8"],  # a name and its alias in one layer
        ["sft.epochs=1", "sft.max_steps=5"],
        ["sft.num_train_epochs=1", "sft.max_steps=5"],
    ],
)
def test_contradicting_set_items_are_refused(sets):
    with pytest.raises(UserError, match="both set"):
        config.resolve("tiny-demo", sets=sets)


def test_config_file_aliases_and_epochs(tmp_path):
    """A config file speaks TRL too; its epochs replace the max_steps of its defaults and of the preset below it."""
    path = tmp_path / "rlctl.yaml"
    path.write_text("defaults: [tiny-demo]\nrl: {num_generations: 4, lr: 0.0002}\nsft: {num_train_epochs: 1}\n")
    cfg = config.resolve(config_file=path)
    assert (cfg.rl.group_size, cfg.rl.learning_rate, cfg.sft.epochs) == (4, 0.0002, 1.0)
    assert "max_steps" not in cfg.sft.model_fields_set
    later = config.resolve(config_file=path, sets=["sft.max_steps=9"])  # a later layer's max_steps wins back
    assert (later.sft.epochs, later.sft.max_steps) == (None, 9)
    path.write_text("sft: {epochs: 1, max_steps: 9}\n")
    with pytest.raises(UserError, match=r"sft\.epochs and sft\.max_steps are both set"):
        config.resolve("tiny-demo", config_file=path)
    path.write_text("rl: {per_device_train_batch_size: 4}\n")
    with pytest.raises(UserError, match=r"Did you mean rl.micro_batch_size\?"):
        config.resolve("tiny-demo", config_file=path)


def test_resume_takes_aliases_and_max_steps_replaces_epochs():
    cfg = config.resolve("tiny-demo", sets=["sft.epochs=1"])
    cfg.sft.max_steps = 45  # as the plan leaves it
    resumed = config.with_resume_overrides(cfg, ["sft.save_steps=9", "sft.max_steps=60"])
    assert (resumed.sft.save_every, resumed.sft.max_steps, resumed.sft.epochs) == (9, 60, None)


def test_epochs_in_plan_json(tmp_path):
    """`rlctl plan --json`: sft and rl given in epochs train the steps one pass over the generated rows takes."""
    proc = rlctl(
        "plan", "--preset", "tiny-demo", "--json", "--run-dir", str(tmp_path / "run"),
        "--set", "sft.epochs=1", "--set", "rl.num_train_epochs=2", "--set", "rl.prompts_per_step=32",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    stages = {s["name"]: s for s in json.loads(proc.stdout)["stages"]}
    files = tasks.arithmetic(tmp_path / "data", 42)
    rows = {role: len(files[role].read_text().splitlines()) for role in ("sft", "rl")}
    sft, rl = stages["sft"], stages["rl"]
    assert (sft["epochs"], sft["max_steps"]) == (1.0, math.ceil(rows["sft"] / 64))  # tiny-demo: sft.batch_size 64
    assert (rl["epochs"], rl["max_steps"]) == (2.0, math.ceil(2 * rows["rl"] / 32))
    assert stages["rm"]["epochs"] is None


def test_preference_epochs_leave_out_the_held_out_tenth(tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}?", "chosen": "a", "rejected": "b"}) + "\n" for i in range(100)))
    plan = _plan_json(["data.generate=null", f"data.preference={data}", "rm.epochs=1",
                       "dpo.epochs=3", "kto.epochs=1", "rm.batch_size=10", "dpo.batch_size=10", "kto.batch_size=10",
                       "stages=[dpo,kto,rm]"], tmp_path)  # fmt: skip
    steps = {s["name"]: s["max_steps"] for s in plan["stages"]}
    assert steps == {"rm": 9, "dpo": 27, "kto": 18}  # 90 training pairs; kto: 180 unpaired rows


def test_epochs_need_countable_data(tmp_path):
    cfg = config.resolve(
        "tiny-demo", sets=["data.generate=null", "stages=[rl]", "rl.epochs=1", "rl.rewards=[{name: exact_match}]"]
    )
    with pytest.raises(UserError, match=r"rl\.epochs counts the rows of data\.rl"):
        planner.build(cfg, tmp_path)


# ------------------------------------------------------------------------------------------ moved rl keys
# A value per moved rl key that differs from tiny-demo --algorithm ppo's (which runs in rlctl's loop, so no TRL
# limit applies), so a move that went nowhere shows.
MOVED_VALUES = {
    "loss.policy": "gspo",
    "loss.agg": "seq-mean-token-sum",
    "loss.clip_low": "0.15",
    "loss.clip_high": "0.25",
    "loss.cispo_cap": "4.0",
    "loss.dual_clip": "2.5",
    "kl.estimator": "k2",
    "kl.in_reward": "false",
    "kl.target": "0.1",
    "kl.horizon": "500",
    "critic.init": "reward_model",
    "critic.lr": "0.001",
    "critic.warmup_steps": "2",
    "critic.value_clip": "0.3",
    "returns.gamma": "0.9",
    "returns.lam": "0.95",
    "filters.dynamic_sampling": "true",
    "filters.dynamic_sampling_rounds": "3",
    "filters.overlong_buffer": "0.25",
    "filters.overlong_penalty": "0.5",
    "filters.mask_truncated": "true",
    "filters.pf_ppo_mode": "max_min",
    "filters.pf_ppo_weight_pow": "3.0",
    "mismatch.correction": "sequence_mask",
    "mismatch.correction_cap": "3.0",
    "mismatch.sync_tolerance": "0.2",
    "agent.max_turns": "2",
    "agent.max_tool_output_tokens": "16",
}
# The moved keys as the config.yaml of a run made before the sections holds them (tiny-demo --algorithm ppo).
OLD_FLAT_RL = """
policy_loss: ppo
loss_agg: token-mean
clip_low: 0.2
clip_high: 0.2
cispo_cap: 5.0
dual_clip: 3.0
kl_estimator: k1
kl_in_reward: true
kl_target: null
kl_horizon: 10000
gamma: 1.0
lam: 1.0
critic_init: policy
critic_lr: null
critic_warmup_steps: 0
value_clip: 0.5
dynamic_sampling: false
dynamic_sampling_rounds: 10
overlong_buffer: 0.0
overlong_penalty: 1.0
mask_truncated: false
pf_ppo_mode: null
pf_ppo_weight_pow: 2.0
max_turns: 4
max_tool_output_tokens: 256
sync_tolerance: 0.1
rollout_correction: token_truncate
rollout_correction_cap: 2.0
"""


def _ppo(sets: list[str], notes: list[str] | None = None) -> dict:
    return config.resolve("tiny-demo", algorithm="ppo", sets=sets, notes=notes).model_dump(mode="json")


def test_every_moved_key_is_listed_and_every_section_key_was_one():
    assert {f"rl.{new}" for _, new in aliases.MOVED} == {f"rl.{k}" for k in MOVED_VALUES}
    assert {old for old, _ in aliases.MOVED} == set(yaml.safe_load(OLD_FLAT_RL))
    sections = {k.split(".")[0] for k in MOVED_VALUES}
    fields = {f"{s}.{k}" for s in sections for k in type(getattr(config.RLConfig(), s)).model_fields}
    born_in_a_section = {"loss.lm_coef", "critic.pretrain_steps", "returns.critic_lam", "returns.lam_alpha"}
    born_in_a_section |= {"returns.short_lam", "critic.lr_ratio"}  # VAPO's keys (issue 48): never flat, not in MOVED
    assert fields - born_in_a_section == set(MOVED_VALUES), "a section key that was never flat needs no entry in MOVED"


def test_old_flat_keys_on_the_command_line_land_at_their_new_places_with_a_notice():
    """All old names at once give the config the new keys give; one notice line names every new key."""
    old_sets = [f"rl.{old}={MOVED_VALUES[new]}" for old, new in aliases.MOVED]
    new_sets = [f"rl.{new}={MOVED_VALUES[new]}" for _, new in aliases.MOVED]
    notes: list[str] = []
    by_old, by_new, base = _ppo(old_sets, notes), _ppo(new_sets), _ppo([])
    assert by_old == by_new
    for _, new in aliases.MOVED:  # every value reached its place (the test would pass on a no-op otherwise)
        section, key = new.split(".")
        assert by_new["rl"][section][key] != base["rl"][section][key], new
    assert len(notes) == 1 and notes[0].startswith("--set: ")
    for old, new in aliases.MOVED:
        assert f"rl.{old} is now rl.{new}" in notes[0]


def test_old_flat_keys_in_a_config_file(tmp_path):
    path = tmp_path / "rlctl.yaml"
    path.write_text("defaults: [tiny-demo]\nrl: {kl_estimator: k1, clip_high: 0.28}\n")
    notes: list[str] = []
    cfg = config.resolve(config_file=path, notes=notes)
    assert (cfg.rl.kl.estimator, cfg.rl.loss.clip_high) == ("k1", 0.28)
    assert notes == [f"{path}: rl.kl_estimator is now rl.kl.estimator; rl.clip_high is now rl.loss.clip_high."]


def test_an_old_runs_config_yaml_loads_as_resume_reads_it(tmp_path):
    """A run directory written before the sections (its config.yaml has the flat rl keys) is read by the function
    `rlctl resume` uses, moved keys at their new places, complete (no key reported missing)."""
    from rlctl.checkpoint import verify

    cfg = config.resolve("tiny-demo", algorithm="ppo")
    data = yaml.safe_load(config.dump(cfg))
    for section in {new.split(".")[0] for _, new in aliases.MOVED}:
        del data["rl"][section]
    data["rl"].update(yaml.safe_load(OLD_FLAT_RL))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    notes: list[str] = []
    assert verify.run_config(tmp_path, notes=notes) == cfg
    assert len(notes) == 1 and "rl.rollout_correction_cap is now rl.mismatch.correction_cap" in notes[0]
    assert config.load_run_config(tmp_path / "config.yaml") == cfg
    assert verify.run_file_problems(tmp_path)[0] == ("config.yaml", [])
    resumed = config.with_resume_overrides(cfg, ["rl.sync_tolerance=0.3"], notes)  # resume --set, old name
    assert resumed.rl.mismatch.sync_tolerance == 0.3 and "rl.mismatch.sync_tolerance" in notes[-1]


def test_a_run_that_chose_its_rl_trainer_still_loads_and_a_new_config_naming_it_is_refused(tmp_path):
    """rl.trainer (TRL's GRPO/RLOO trainers or rlctl's loop) is gone: an older run's config.yaml that holds it
    resumes with a notice; a config file or --set naming it exits 2 saying what replaced it."""
    from rlctl.checkpoint import verify

    cfg = config.resolve("tiny-demo")
    data = yaml.safe_load(config.dump(cfg))
    data["rl"]["trainer"] = "auto"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    notes: list[str] = []
    assert verify.run_config(tmp_path, notes=notes) == cfg
    assert any("rl.trainer is no longer read" in n for n in notes), notes
    assert config.load_run_config(tmp_path / "config.yaml") == cfg
    for args in (["--set", "rl.trainer=rlctl"], ["--config", str(tmp_path / "config.yaml")]):
        proc = rlctl("plan", "--preset", "tiny-demo", *args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "rl.trainer is gone: rlctl's own loop now trains every RL algorithm" in " ".join(proc.stderr.split())


@pytest.mark.parametrize(
    "sets",
    [
        ["rl.clip_high=0.28", "rl.loss.clip_high=0.3"],
        ["rl.kl_estimator=k1", "rl.kl={estimator: k2}"],
        ["rl.epsilon_high=0.28", "rl.clip_high=0.3"],  # TRL's name and the old name: one key
    ],
)
def test_an_old_and_a_new_name_together_are_refused(sets):
    with pytest.raises(UserError, match=r"are both set; keep rl\.(loss\.clip_high|kl\.estimator)\."):
        config.resolve("tiny-demo", sets=sets)


def test_old_and_new_name_in_a_config_file_exit_2(tmp_path):
    path = tmp_path / "rlctl.yaml"
    path.write_text("defaults: [tiny-demo]\nrl:\n  sync_tolerance: 0.2\n  mismatch: {sync_tolerance: 0.3}\n")
    proc = rlctl("plan", "--config", str(path), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "rl.sync_tolerance (moved to rl.mismatch.sync_tolerance) and rl.mismatch.sync_tolerance are both set" in (
        " ".join(proc.stderr.split())
    )


def test_cli_notice_on_stderr_and_the_plan_of_the_new_key(tmp_path):
    run = str(tmp_path / "run")
    old = rlctl("plan", "--preset", "tiny-demo", "--json", "--run-dir", run, "--set", "rl.clip_high=0.28")
    new = rlctl("plan", "--preset", "tiny-demo", "--json", "--run-dir", run, "--set", "rl.loss.clip_high=0.28")
    assert old.returncode == 0 and new.returncode == 0, old.stderr + new.stderr
    assert "note: --set: rl.clip_high is now rl.loss.clip_high." in old.stderr and "note" not in new.stderr
    plans = [json.loads(p.stdout) for p in (old, new)]
    for p in plans:
        p["memory"]["disk"].pop("free_gib", None)  # free disk space may change between the two runs
    assert plans[0] == plans[1] and plans[0]["config"]["rl"]["loss"]["clip_high"] == 0.28


@pytest.mark.parametrize(
    ("typed", "suggested"),
    [
        ("rl.loss.clip_hihg", "Did you mean: clip_high"),  # a misspelt key inside a section
        ("rl.clip_hihg", "Did you mean: loss.clip_high"),  # a misspelt old name: its new place
        ("rl.kl_estimater", "Did you mean: kl.estimator"),
        ("rl.estimator", "Did you mean: kl.estimator"),  # a section's key typed under rl
        ("rl.mismatch.sync_tolerence", "Did you mean: sync_tolerance"),
    ],
)
def test_misspelt_keys_get_their_nested_names_suggested(typed, suggested):
    with pytest.raises(UserError, match=f"unknown key '{typed}'.") as err:
        config.resolve("tiny-demo", sets=[f"{typed}=1"])
    assert suggested in str(err.value)


def test_shipped_presets_use_the_new_names():
    for preset in presets.all_presets().values():
        notes: list[str] = []
        aliases.canonical(presets.read_yaml(preset.path), preset.name, notes)
        assert notes == [], notes
