"""Alarms for runs that learn nothing, fed metric records as both RL paths write them; and `rlctl report` listing
them. The end-to-end alarm (a constant reward on the TRL GRPO path) is in test_silent_failures.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.after import report
from rlctl.monitors.alarms import Watch


def _feed(watch: Watch, records: list[dict]) -> list[dict]:
    fired = []
    for step, rec in enumerate(records, start=1):
        fired += watch.feed({"stage": "rl", "step": step, **rec})
    return fired


@pytest.mark.parametrize(
    "record, name",
    [
        ({"grad_norm": 0.0, "loss": 0.3}, "zero_gradient"),
        ({"loss": 0.0}, "zero_gradient"),
        ({"frac_reward_zero_std": 1.0, "grad_norm": 0.1}, "identical_rewards"),
        ({"truncated_ratio": 1.0}, "all_truncated"),
        ({"clip_ratio": 1.0}, "clip_stuck"),
        ({"clip_frac": 1.0}, "clip_stuck"),
        ({"reward": 0.0}, "reward_at_minimum"),
    ],
)
def test_each_condition_fires_once_after_n_steps(record: dict, name: str):
    fired = _feed(Watch(3), [record] * 6)
    assert [(a["alarm"], a["step"]) for a in fired] == [(name, 3)]
    assert "Likely cause:" in fired[0]["message"] and "Fix:" in fired[0]["message"]


def test_conditions_must_hold_in_a_row_and_fire_again_after_clearing():
    healthy = {"grad_norm": 0.5, "frac_reward_zero_std": 0.25, "loss": 0.0, "reward": 0.4}
    stuck = {**healthy, "frac_reward_zero_std": 1.0}
    assert _feed(Watch(3), [stuck, stuck, healthy, stuck, stuck, healthy]) == [], "GRPO's loss 0 is no alarm"
    fired = _feed(Watch(2), [stuck, stuck, stuck, healthy, stuck, stuck])
    assert [a["step"] for a in fired] == [2, 6]


def test_a_reward_flat_at_its_top_or_still_moving_is_no_alarm():
    assert _feed(Watch(3), [{"reward": 1.0}] * 5) == []
    assert _feed(Watch(3), [{"reward": v} for v in (0.0, 0.1, 0.0, 0.2, 0.0)]) == []
    fired = _feed(Watch(3), [{"reward": v} for v in (0.5, 0.2, 0.2, 0.2)])
    assert [(a["alarm"], a["step"]) for a in fired] == [("reward_at_minimum", 4)]


def test_a_resume_that_trains_nothing_and_stop_mode():
    watch = Watch(5, "stop")
    assert watch.feed({"stage": "rl", "event": "trained", "resumed_from": 8, "steps": 0, "max_steps": 8}) == []
    assert watch.feed({"stage": "rl", "event": "trained", "resumed_from": None, "steps": 0, "max_steps": 8}) == []
    assert watch.stop is None
    (alarm,) = watch.feed({"stage": "rl", "event": "trained", "resumed_from": 12, "steps": 0, "max_steps": 8})
    assert alarm["alarm"] == "resume_trained_nothing" and alarm["step"] == 12
    assert "The resume from step 12 trained 0 steps" in alarm["message"] and watch.stop == alarm["message"]


def _run_config() -> str:
    """config.yaml as a run directory holds it: every section and key written out."""
    from rlctl import config

    return config.dump(config.validate({"name": "t", "stages": ["rl"]}))


def test_report_lists_the_alarms(tmp_path: Path):
    (tmp_path / "config.yaml").write_text(_run_config())
    watch, records = Watch(2), []
    for step in (1, 2, 3):
        rec = {"stage": "rl", "step": step, "reward": 0.5, "frac_reward_zero_std": 1.0}
        records += [rec, *watch.feed(rec)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    text = report.build(tmp_path).markdown.read_text()
    assert "## Alarms" in text and "- **identical_rewards** (rl, step 2): Every group of completions" in text


def test_report_shows_null_metrics_as_their_reason(tmp_path: Path):
    (tmp_path / "config.yaml").write_text(_run_config())
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"stage": "rl", "step": 1, "reward": 0.5}) + "\n")
    summary = {"stages": {"rl": {"eval_accuracy": 0.5, "eval_reward": None, "null_reasons": {"eval_reward": "nan"}}}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    text = report.build(tmp_path).markdown.read_text()
    assert "| rl | 0.5 | nan |" in text and "null_reasons" not in text
