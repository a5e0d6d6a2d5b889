"""The length policy: rows are measured in tokens as each stage's trainer sees them, and over-long ones are
dropped and counted or refused (data.over_length); nothing is truncated."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rlctl.config import resolve
from rlctl.errors import UserError
from rlctl.plan import planner as plan_mod
from rlctl.rundir import DataNote
from rlctl.runtime.context import MetricsLog
from rlctl.runtime.rows import length, stage_rows, training_rows
from rlctl.stages import tiny
from rlctl.stages.common import kept_rows
from rlctl.stages.context import StageContext


@pytest.fixture(scope="module")
def tok():
    return tiny.train_tokenizer(["12+3=15", "hello there, how are you"], 300)


def _n(tok, text: str) -> int:
    return len(tok(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize(
    "row",
    [
        {"prompt": "12+3=", "completion": "15"},
        {"text": "12+3=15"},
        {"messages": [{"role": "user", "content": "12+3="}, {"role": "assistant", "content": "15"}]},
        {"prompt": [{"role": "user", "content": "12+3="}], "completion": [{"role": "assistant", "content": "15"}]},
    ],
    ids=["prompt-completion", "text", "messages", "conversational-prompt-completion"],
)
def test_sft_rows_count_the_real_tokens(tok, row):
    if "messages" in row or isinstance(row.get("prompt"), list):
        messages = row.get("messages") or row["prompt"] + row["completion"]
        n = len(tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
    else:
        n = len(tok(row.get("text") or row["prompt"] + row["completion"])["input_ids"]) + 1  # + EOS
    assert n > 5 and length(row, tok, "sft") == n


def test_preference_kto_and_rl_rows(tok):
    pair = {"prompt": "12+3=", "chosen": "15", "rejected": "1515"}
    assert length(pair, tok, "rm") == _n(tok, "12+3=") + _n(tok, "1515") + 1
    assert length(pair, tok, "dpo") == length(pair, tok, "rm")
    kto = {"prompt": "12+3=", "completion": "15", "label": True}
    assert length(kto, tok, "kto") == _n(tok, "12+3=") + _n(tok, "15") + 1
    chat = [{"role": "user", "content": "12+3="}]
    rendered = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert length({"prompt": chat, "answer": "15"}, tok, "rl") == _n(tok, rendered)
    assert length({"prompt": "12+3=", "answer": "15"}, tok, "rl") == _n(tok, "12+3=")


def _context(tmp_path: Path, over_length: str, drop_fraction: float = 0.1) -> StageContext:
    rows = [{"prompt": f"{a}+3=", "answer": str(a + 3)} for a in range(10, 20)]
    rows[4]["prompt"] = "12+3=" * 10
    data = tmp_path / "rl.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sets = ["stages=[rl]", f"data.rl={data}", "data.max_prompt_length=12", f"data.over_length={over_length}"]
    sets.append(f"data.max_drop_fraction={drop_fraction}")
    cfg = resolve(preset="tiny-demo", sets=[*sets, "data.generate=null", "rl.rewards=[{name: exact_match}]"])
    the_plan = plan_mod.build(cfg, tmp_path / "run")
    (tmp_path / "run").mkdir(exist_ok=True)
    paths = plan_mod.data_paths(cfg, tmp_path / "run")
    log = MetricsLog(tmp_path / "run", True)
    return StageContext(cfg, the_plan, the_plan.stages[0], tmp_path / "run", paths, log, True)


def test_over_long_rows_are_dropped_counted_and_logged(tmp_path: Path, tok):
    ctx = _context(tmp_path, "drop")
    kept, note = training_rows(ctx.stage_data(), tok)
    assert len(kept) == 9 and all(len(r["prompt"]) < 10 for r in kept)
    assert note == DataNote(dropped_too_long=1, kept=9, limit=12)
    assert not (tmp_path / "run" / "metrics.jsonl").exists(), "the rows come back with their note: the stage logs it"
    assert kept_rows(ctx, tok) == kept and ctx.notes == note
    event = json.loads((tmp_path / "run" / "metrics.jsonl").read_text())
    assert event["event"] == "data" and event["dropped_too_long"] == 1


def test_dropping_more_than_max_drop_fraction_is_refused_naming_the_length_that_keeps_95(tmp_path: Path, tok):
    ctx = _context(tmp_path, "drop", drop_fraction=0.05)
    keeps = max(
        length(r, tok, "rl") for r in stage_rows(ctx.stage_data())
    )  # 9 of 10 short rows: 95% needs the long one too
    expected = rf"1 of 10 rl rows \(10%\) .* data.max_drop_fraction=0.05. data.max_prompt_length={keeps} keeps 95%"
    with pytest.raises(UserError, match=expected):
        training_rows(ctx.stage_data(), tok)


def test_over_long_rows_refused_naming_the_row(tmp_path: Path, tok):
    ctx = _context(tmp_path, "refuse")
    expected = r"1 of 10 rl rows are longer than data.max_prompt_length=12 tokens \(first: row 5 of "
    with pytest.raises(UserError, match=expected):
        training_rows(ctx.stage_data(), tok)


def test_stages_read_the_run_data_through_its_column_mapping(tmp_path: Path):
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "1+1=", "meta": {"gt": "2"}}) + "\n")
    sets = ["stages=[rl]", f"data.rl={qa}", "data.generate=null", "rl.rewards=[{name: exact_match}]"]
    cfg = resolve(preset="tiny-demo", sets=[*sets, "data.columns={prompt: question, answer: meta.gt}"])
    the_plan = plan_mod.build(cfg, tmp_path / "run")
    paths = plan_mod.data_paths(cfg, tmp_path / "run")
    ctx = StageContext(cfg, the_plan, the_plan.stages[0], tmp_path / "run", paths, MetricsLog(tmp_path, False), True)
    assert stage_rows(ctx.stage_data()) == [{"prompt": "1+1=", "meta": {"gt": "2"}, "answer": "2"}]


def test_nothing_left_after_the_length_policy_is_refused(tmp_path: Path, tok):
    ctx = _context(tmp_path, "drop")
    stage = dataclasses.replace(ctx.stage_data(), limit=1)
    with pytest.raises(UserError, match=r"Every one of the 10 rl rows is longer than data.max_prompt_length=1"):
        training_rows(stage, tok)
