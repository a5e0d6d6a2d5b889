"""Evaluation that fits real models: completions end at the end-of-turn token, `rlctl eval` picks a length that
fits the answers and shows progress off a terminal, held-out scoring at checkpoints scores a bounded subset, and
a long step's progress line is printed once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlctl.config import ModelArch
from rlctl.launch import progress
from rlctl.monitors import heldout
from tests.helpers import rlctl

ARCH = ModelArch(layers=2, hidden=64, heads=4, kv_heads=2, vocab=320, intermediate=128, max_position=64)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    from rlctl.stages import tiny

    texts = [f"What is {a} + {b}? {a + b}" for a in range(10, 60) for b in range(10, 20)]
    return tiny.build(tmp_path_factory.mktemp("tiny") / "model", ARCH, texts, seed=0)


def test_completions_end_at_the_end_of_turn_token(tiny_folder: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlctl.evaluation import evaluate

    tok = AutoTokenizer.from_pretrained(tiny_folder)
    model = AutoModelForCausalLM.from_pretrained(tiny_folder)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.eos_token_id = [tok.eos_token_id, 7]
    assert evaluate.end_ids(model, tok) == [tok.eos_token_id, 7, im_end]
    # 2 * 3 tokens + 32 for a three-token answer; a list of accepted answers counts its first
    longest = len(tok("123", add_special_tokens=False)["input_ids"])
    assert evaluate.fitting_max_new_tokens(tok, ["1", ["123", "x"]]) == 2 * longest + 32
    assert evaluate.fitting_max_new_tokens(tok, [None]) == 256


def test_generation_pads_on_the_left_and_gives_the_tokenizer_its_side_back(tiny_folder: Path):
    """Greedy and sampled generation pad prompts on the left; the tokenizer's own side comes back afterwards, also
    when a row fails."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlctl.evaluation import evaluate

    tok = AutoTokenizer.from_pretrained(tiny_folder)
    model = AutoModelForCausalLM.from_pretrained(tiny_folder)
    tok.padding_side = "right"
    prompts = ["What is 10 + 11?", "What is 12345 + 10?"]  # lengths differ: padding shows
    greedy = evaluate.generate(model, tok, prompts, max_new_tokens=3)
    texts, _ = evaluate.sample(model, tok, prompts, max_new_tokens=3)
    assert [t[0] for t in texts] == greedy  # the same left-padded greedy completions
    alone = [evaluate.generate(model, tok, [p], max_new_tokens=3)[0] for p in prompts]  # no padding at all
    assert greedy == alone and tok.padding_side == "right"

    def interrupted(rows: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        evaluate.sample(model, tok, prompts, max_new_tokens=3, on_batch=interrupted)
    assert tok.padding_side == "right"


def test_eval_without_a_length_fits_the_answers_and_prints_progress_off_a_terminal(tiny_folder: Path, tmp_path):
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + 3?"}], "answer": str(a + 3)} for a in range(20)]
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.json"
    proc = rlctl("eval", str(tiny_folder), "--data", str(data), "--batch-size", "8", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    chosen = json.loads(out.read_text())["max_new_tokens"]
    assert f"max new tokens: {chosen} (twice the longest" in proc.stdout and chosen < 256
    assert re.search(r"^generate 20/20 rows  ETA 0s$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^generate 8/20 rows  ETA ", proc.stdout, re.M), "the first batch gets its line"


def test_checkpoints_score_a_bounded_subset():
    assert heldout.checkpoint_rows(save_every=10, batch_size=128, eval_samples=200) == 128
    assert heldout.checkpoint_rows(save_every=100, batch_size=64, eval_samples=200) == 200
    assert heldout.checkpoint_rows(save_every=5, batch_size=8, eval_samples=200) == heldout.CHECKPOINT_MIN_ROWS


def test_a_long_step_is_printed_once_and_scoring_shows_rows_and_eta():
    stage = progress.StageProgress("rl", plain=True)
    stage.update({"stage": "rl", "event": "scoring", "scope": "base", "done": 0, "rows": 100, "time": 0.0}, now=0.0)
    stage.update({"stage": "rl", "event": "scoring", "scope": "base", "done": 40, "rows": 100, "time": 20.0}, now=20)
    assert stage.plain_lines(30, now=31.0) == ["rl scoring base 40/100 rows  ETA 30s"]
    stage.update({"stage": "rl", "event": "scoring", "scope": "base", "done": 60, "rows": 100, "time": 40.0}, now=40)
    assert stage.plain_lines(30, now=45.0) == [], "scoring progress: at most one line every console_every_s"
    stage.update({"stage": "rl", "event": "scoring", "scope": "base", "done": 100, "rows": 100, "time": 50.0}, now=50)
    stage.update({"stage": "rl", "event": "start", "max_steps": 3}, now=51.0)
    stage.update({"stage": "rl", "step": 1, "loss": 0.5}, now=170.0)  # a step of two minutes
    assert stage.plain_lines(30, now=171.0) == ["rl step 1/3  loss 0.5  ETA -"]
    assert not any(stage.plain_lines(30, now=t) for t in (201.0, 231.0, 261.0)), "nothing new: not printed again"
    stage.update({"stage": "rl", "event": "scoring", "scope": "checkpoint", "done": 0, "rows": 16, "time": 270})
    stage.update({"stage": "rl", "event": "scoring", "scope": "checkpoint", "done": 8, "rows": 16, "time": 280})
    assert stage.plain_lines(30, now=281.0) == ["rl scoring checkpoint 8/16 rows  ETA 10s"]
    stage.update({"stage": "rl", "event": "scoring", "scope": "checkpoint", "done": 16, "rows": 16, "time": 290})
    stage.update({"stage": "rl", "step": 1, "event": "checkpoint", "eval_accuracy": 0.25, "eval_rows": 16}, now=290)
    assert stage.plain_lines(30, now=321.0) == [], "no step, no scoring under way: nothing to print"
    stage.update({"stage": "rl", "step": 2, "loss": 0.4}, now=330.0)
    [line] = stage.plain_lines(30, now=331.0)
    assert line.startswith("rl step 2/3  loss 0.4  eval_accuracy 0.250  ETA ") and "eval_rows" not in line


def test_each_logged_step_gets_its_line_in_step_order():
    """Off a terminal every logged step prints one line (with its own metrics and ETA, timed by the records),
    also when several arrive in one poll; a record of a step already printed adds none."""
    stage = progress.StageProgress("sft", plain=True)
    stage.update({"stage": "sft", "event": "start", "max_steps": 8, "time": 0.0}, now=5.0)
    for step in (2, 4, 6):  # logging.every=2, read in one poll
        stage.update({"stage": "sft", "step": step, "loss": 1.0 / step, "time": 10.0 * step}, now=5.0)
        stage.update({"stage": "sft", "step": step, "event": "memory", "time": 10.0 * step}, now=5.0)
    stage.update({"stage": "sft", "step": 4, "loss": 9.0}, now=5.0)  # an earlier step again: no line
    assert stage.plain_lines(30, now=6.0) == [
        "sft step 2/8  loss 0.5  ETA -",
        "sft step 4/8  loss 0.25  ETA 40s",
        "sft step 6/8  loss 0.1667  ETA 20s",
    ]
    assert stage.plain_lines(0.001, now=7.0) == [], "printed once"
    assert progress.StageProgress("sft").plain_lines(30) == [], "on a terminal the bars show it"


def test_chat_sums_holds_out_its_eval_prompts_and_scores_the_replys_last_number(tmp_path: Path):
    from rlctl.data import tasks
    from rlctl.rewards import resolve

    paths = tasks.chat_sums(tmp_path, seed=0)
    rows = {role: [json.loads(line) for line in path.read_text().splitlines()] for role, path in paths.items()}
    asked = {json.dumps(r["prompt"]) for r in rows["rl"]}
    assert len(rows["eval"]) == tasks.CHAT_SUMS_EVAL and not asked & {json.dumps(r["prompt"]) for r in rows["eval"]}
    first = rows["eval"][0]
    a, b = map(int, re.findall(r"\d+", first["prompt"][0]["content"]))
    assert first["answer"] == str(a + b) and first["prompt"][0]["role"] == "user"
    fn = resolve("gsm8k(strict=False)", "answer")
    said = [f"{a} + {b} = {a + b}", str(a + b + 1), "To solve this, we add."]
    assert fn(prompts=[first["prompt"]] * 3, completions=said, answer=[first["answer"]] * 3) == [1.0, 0.0, 0.0]


def test_eval_of_damaged_weights_is_one_paragraph(tiny_folder: Path, tmp_path: Path):
    import shutil

    folder = tmp_path / "damaged"
    shutil.copytree(tiny_folder, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    data = tmp_path / "eval.jsonl"
    data.write_text('{"prompt": "What is 1 + 3?", "answer": "4"}\n')
    proc = rlctl("eval", str(folder), "--data", str(data), "--out", str(tmp_path / "out.json"))
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2 and "Traceback" not in said, said
    assert f"Cannot load a model from '{folder}': its weights are damaged" in said and "rlctl verify" in said, said
    assert not (tmp_path / "out.json").exists()
