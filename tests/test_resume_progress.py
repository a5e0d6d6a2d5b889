"""Resume and advice agree (the keys a resume may change, checked; finished runs), progress where users look
(metrics kept across checkpoint events, an ETA from the measured step time, plain lines off a terminal), and
faults at a checkpoint named for what they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl import checkpoint, config
from rlctl.checkpoint import faults
from rlctl.errors import RewardError, UserError
from rlctl.launch import progress, resume_check
from rlctl.plan import planner
from rlctl.rundir import RunDir, write_record
from tests.helpers import rlctl

QWEN2 = {"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
QWEN2 |= {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 400}


def _run_dir(tmp_path: Path, sets: list[str], completed: list[str]) -> tuple[Path, config.RunConfig]:
    cfg = config.resolve("tiny-demo", sets=sets)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(config.dump(cfg))
    (run / "summary.json").write_text(json.dumps({"stages": {}, "completed": completed}))
    for stage in completed:  # a finished stage has its final folder
        (run / stage / "final").mkdir(parents=True)
    return run, cfg


def test_resume_of_a_finished_run_says_so_and_exits_0_without_launching(tmp_path: Path):
    run, _ = _run_dir(tmp_path, ["stages=[sft]"], ["sft"])
    proc = rlctl("resume", str(run))
    assert proc.returncode == 0 and "finished" in proc.stdout, proc.stdout + proc.stderr
    assert "accelerate launch" not in proc.stdout + proc.stderr, "no accelerate launch"
    assert not (run / "logs").exists()


def test_resume_overrides_are_checked_against_the_run(tmp_path: Path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN2))
    sets = ["stages=[rl]", f"model.name_or_path={model}", "rl.rewards=[{name: exact_match}, {name: format}]"]
    run, cfg = _run_dir(tmp_path, sets, [])
    ckpt = checkpoint.incoming(run / "rl" / "checkpoints") / "checkpoint-8"
    ckpt.mkdir(parents=True)
    checkpoint.publish(run / "rl" / "checkpoints", 8, None, 2, False)

    def resume(*items: str) -> config.RunConfig:
        new = config.with_resume_overrides(cfg, list(items))
        resume_check.check(cfg, new, run)
        return new

    zero = resume("rl.rewards=[{name: exact_match, on_error: zero}, {name: format}]")
    assert zero.rl.rewards[0].on_error == "zero"
    assert resume("rl.max_steps=20", "rl.save_every=5", "logging.console_every_s=5").rl.max_steps == 20
    with pytest.raises(UserError, match=r"rl.max_steps=4 is below the 8 steps"):
        resume("rl.max_steps=4")
    with pytest.raises(UserError, match="may change only each reward's on_error"):
        resume("rl.rewards=[{name: exact_match, weight: 2}, {name: format}]")
    moved = tmp_path / "moved"
    model.rename(moved)  # the folder was moved: the same weights elsewhere
    assert resume(f"model.name_or_path={moved}").model.name_or_path == str(moved)
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**QWEN2, "num_hidden_layers": 8}))
    # the run's plan.json, as `rlctl train` wrote it, records the model's shape: the moved folder's
    planned = config.resolve("tiny-demo", sets=[sets[0], f"model.name_or_path={moved}", sets[2]])
    write_record(RunDir(run).plan, planner.build(planned, run))
    with pytest.raises(UserError, match="another model than the run's"):
        resume(f"model.name_or_path={other}")


def test_every_resume_advice_names_a_change_resume_accepts(tmp_path: Path):
    """The reward fault's `rlctl resume ... --set` is accepted by resume (and checked) as printed."""
    cfg = config.resolve("tiny-demo", sets=["stages=[sft,rm,rl]"])
    plan = planner.build(cfg, tmp_path)
    message = faults.explain(RewardError("Reward 'exact_match' raised."), plan, "rl", tmp_path / "ck", True)
    command = message.split("`rlctl resume ")[1].split("`")[0]
    item = command.split("--set ", 1)[1].strip('"')
    new = config.with_resume_overrides(cfg, [item])
    resume_check.check(cfg, new, tmp_path)
    assert all(r.on_error == "zero" for r in new.rl.rewards)
    assert "checkpoint.keep_last" in config.RESUMABLE  # the full-disk advice's change


def test_a_failure_at_a_checkpoint_is_not_reported_as_a_full_disk(tmp_path: Path):
    ckpts = tmp_path / "ck"
    (checkpoint.incoming(ckpts) / "checkpoint-4").mkdir(parents=True)
    plan = planner.build(config.resolve("tiny-demo"), tmp_path)
    try:
        _ = "prefix" + [{"role": "assistant"}]  # the concatenation a conversational pair once hit
    except TypeError as e:
        message = faults.explain(e, plan, "rm", ckpts, True)
    assert "TypeError" in message and "not a full disk" in message and "Free disk space" not in message
    assert "test_resume_progress.py" in message, "the place it was raised"


def test_progress_keeps_metrics_across_checkpoints_and_measures_the_eta():
    stage = progress.StageProgress("rl")
    stage.update({"stage": "rl", "event": "start", "max_steps": 10}, now=0.0)
    stage.update({"stage": "rl", "step": 1, "loss": 0.5, "reward": 0.25}, now=100.0)
    assert stage.eta() is None, "one step measures nothing yet"
    stage.update({"stage": "rl", "step": 3, "loss": 0.4, "reward": 0.5}, now=200.0)  # 50 s a step
    stage.update({"stage": "rl", "step": 3, "event": "checkpoint", "eval_accuracy": 0.75}, now=210.0)
    assert stage.info() == "loss 0.4  reward 0.5  eval_accuracy 0.750"
    assert stage.eta() == 350.0 and stage.eta_text() == "ETA 5m50s"
    assert stage.line() == "rl step 3/10  loss 0.4  reward 0.5  eval_accuracy 0.750  ETA 5m50s"
