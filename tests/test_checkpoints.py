"""Crash-safe checkpoint publishing and retention (keep-last-N plus the best), reward failures handled per
`on_error`, and the out-of-memory report: the pieces, checked directly (the end-to-end runs are in
test_faults.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlctl import checkpoint
from rlctl.checkpoint import faults
from rlctl.config import resolve
from rlctl.errors import RewardError
from rlctl.plan import memory
from rlctl.plan import planner as plan_mod
from rlctl.rewards import guarded


def _write(folder: Path, step: int, value: float | None) -> Path:
    ckpt = checkpoint.incoming(folder) / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"x" * 10)
    return checkpoint.publish(folder, step, value, keep_last=2, keep_best=True)


def test_publish_renames_complete_checkpoints_and_keeps_last_two_plus_best(tmp_path: Path):
    for step, value in [(10, 0.2), (20, 0.9), (30, 0.5), (40, 0.4), (50, 0.3)]:
        dst = _write(tmp_path, step, value)
        assert dst == tmp_path / f"checkpoint-{step}" and (dst / "model.safetensors").exists()
        assert checkpoint.being_written(tmp_path) == []
    names = [p.name for p in checkpoint.complete_checkpoints(tmp_path)]
    assert names == ["checkpoint-20", "checkpoint-40", "checkpoint-50"], "the best (20) outlives the rotation"
    assert checkpoint.best(tmp_path).name == "checkpoint-20"
    mark = checkpoint.mark(tmp_path / "checkpoint-20")
    assert (mark.step, mark.metric, mark.value) == (20, "eval_accuracy", 0.9)
    assert checkpoint.last_complete(tmp_path).name == "checkpoint-50"


def test_best_prefers_the_later_checkpoint_on_a_tie_and_keep_best_off_rotates_plainly(tmp_path: Path):
    for step in (1, 2, 3):
        _write(tmp_path, step, 0.5)
    assert checkpoint.best(tmp_path).name == "checkpoint-3"
    plain = tmp_path / "plain"
    for step, value in [(1, 0.9), (2, 0.1), (3, 0.1)]:
        ckpt = checkpoint.incoming(plain) / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        checkpoint.publish(plain, step, value, keep_last=2, keep_best=False)
    assert [p.name for p in checkpoint.complete_checkpoints(plain)] == ["checkpoint-2", "checkpoint-3"]


def test_unscored_checkpoints_have_no_best_and_partial_writes_are_dropped(tmp_path: Path):
    _write(tmp_path, 5, None)
    assert checkpoint.best(tmp_path) is None
    half = checkpoint.incoming(tmp_path) / "checkpoint-10"
    half.mkdir(parents=True)
    (half / "optimizer.pt").write_bytes(b"half")
    legacy = tmp_path / "checkpoint-7"  # unmarked, in place: also never trusted
    legacy.mkdir()
    assert checkpoint.being_written(tmp_path) == [half]
    assert sorted(p.name for p in checkpoint.drop_partial(tmp_path)) == ["checkpoint-10", "checkpoint-7"]
    assert checkpoint.last_complete(tmp_path).name == "checkpoint-5" and not half.exists() and not legacy.exists()


def test_republishing_a_step_replaces_it(tmp_path: Path):
    _write(tmp_path, 4, 0.1)
    _write(tmp_path, 4, 0.7)
    assert json.loads((tmp_path / "checkpoint-4" / checkpoint.COMPLETE).read_text())["value"] == 0.7


def _picky(prompts, completions, answer, **_):
    """Fails on completions containing 'boom'; 1.0 when the completion is the answer."""
    if any("boom" in c for c in completions):
        raise ValueError("cannot parse")
    return [float(c == a) for c, a in zip(completions, answer, strict=True)]


def test_reward_on_error_zero_scores_only_the_failing_completions_and_counts_them():
    errors: dict[str, int] = {}
    fn = guarded(_picky, "picky.py:score", "zero", errors)
    values = fn(prompts=["1+1=", "2+2=", "3+3="], completions=["2", "boom", "6"], answer=["2", "4", "6"])
    assert values == [1.0, 0.0, 1.0] and errors == {"picky.py:score": 1}
    assert fn.__name__ == "_picky", "TRL logs rewards by function name"
    assert fn(prompts=["1+1="], completions=["2"], answer=["2"]) == [1.0] and errors["picky.py:score"] == 1


def test_reward_on_error_raise_names_the_reward_and_the_sample():
    fn = guarded(_picky, "picky.py:score", "raise", {})
    with pytest.raises(RewardError) as info:
        fn(prompts=["1+1=", "2+2="], completions=["2", "boom!"], answer=["2", "4"])
    text = str(info.value)
    assert "picky.py:score" in text and "ValueError: cannot parse" in text and "'boom!'" in text
    assert "'2+2='" in text and "on_error: zero" in text


def test_out_of_memory_always_propagates_from_rewards():
    def hungry(prompts, completions, **_):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(torch.OutOfMemoryError):
        guarded(hungry, "hungry", "zero", {})(prompts=["a"], completions=["b"])


def test_out_of_memory_report_has_the_plan_numbers_and_safer_settings(tmp_path: Path):
    cfg = resolve(preset="qwen7b-grpo", hardware="1xH100-80GB")
    the_plan = plan_mod.build(cfg, tmp_path / "run")
    rl = next(s for s in the_plan.stages if s.name == "rl")
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total capacity")
    text = faults.explain(error, the_plan, "rl", tmp_path / "run" / "rl" / "checkpoints", True)
    mem = the_plan.memory
    assert text.startswith("Out of memory in stage rl (CUDA out of memory. Tried to allocate 3.50 GiB.")
    assert f"micro-batch {rl.micro_batch_size} x {rl.grad_accum} accumulation" in text
    assert f"a peak of {mem.peak_gib} GiB per GPU ({mem.peak_phase})" in text
    assert f"budget of {mem.budget_gib} GiB" in text
    options = memory.safer(the_plan, "rl")
    assert options and f"Nearest safer plans: rlctl resume {the_plan.run_dir} {options[0]}" in text
    if rl.micro_batch_size > 1:
        assert options[0].startswith(f"--set rl.micro_batch_size={rl.micro_batch_size // 2} (planned rl/training peak")
    for option in options:  # each one needs less memory than the plan that ran out
        for change in option.split("(planned ")[1].rstrip(")").split(", "):
            old, new = change.split(" peak ")[1].removesuffix(" GiB").split(" -> ")
            assert float(new) < float(old)


def test_resume_may_change_only_what_the_checkpoints_do_not_hold(tmp_path: Path):
    from rlctl.config import dump, with_resume_overrides
    from tests.helpers import rlctl

    cfg = resolve(preset="tiny-demo")
    changed = with_resume_overrides(cfg, ["rl.micro_batch_size=4", "model.gradient_checkpointing=true"])
    assert changed.rl.micro_batch_size == 4 and changed.model.gradient_checkpointing is True
    assert changed.rl.learning_rate == cfg.rl.learning_rate
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dump(cfg))
    proc = rlctl("resume", str(run), "--set", "model.adapter=lora")
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "--set model.adapter cannot change on resume" in text, text
    assert "rl.micro_batch_size" in text and (run / "config.yaml").read_text() == dump(cfg)


def test_rlctl_names_checkpoint_folders_as_transformers_trainer_does():
    """TRL's stages write their checkpoints through transformers' Trainer, rlctl's RL loop through
    `rlctl.rundir.checkpoint`: one name for both, so resume, retention and keep-best find either."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    from rlctl import rundir

    assert rundir.checkpoint(Path("c"), 7).name == f"{PREFIX_CHECKPOINT_DIR}-7"
    assert rundir.checkpoint_step(Path(f"{PREFIX_CHECKPOINT_DIR}-12")) == 12
    assert rundir.checkpoint_step(Path("checkpoint-12.damaged")) is None
