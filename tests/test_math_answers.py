"""Math answers: `boxed` agrees with math-verify's own verdict on common MATH-style answers and with the documented
examples, model text is parsed and never run, and math-verify's timeouts hold where rewards run."""

from __future__ import annotations

import itertools
import json
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rlctl import rewards
from rlctl.rewards import answers, builtin
from tests.helpers import rlctl

REPO = Path(__file__).resolve().parent.parent

# (boxed answer of the completion, ground truth, right?)
CASES = [
    (r"\frac{1}{2}", "0.5", True),
    (r"\dfrac{3}{4}", "3/4", True),
    (r"\frac12", r"\tfrac{1}{2}", True),
    (r"-\frac{1}{2}", "-0.5", True),
    (r"\frac{1}{3}", "0.33", False),
    (r"2\sqrt{2}", r"\sqrt{8}", True),
    (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}", True),
    (r"\sqrt{3}", "3", False),
    (r"\pi/2", r"\frac{\pi}{2}", True),
    (r"2\pi", "6.28", False),
    ("[0,1)", "[0,1]", False),
    ("(0,1]", r"(0,1]", True),
    (r"(-\infty, 3)", r"(-\infty,3)", True),
    (r"\{1,2,3\}", r"\{3,2,1\}", True),
    (r"\{1,2\}", r"\{1,2,3\}", False),
    ("(1,2)", "(1, 2)", True),
    (r"\left( 3, -1 \right)", "(3,-1)", True),
    ("(1,2,3)", "(1,3,2)", False),
    (r"50\%", "0.5", True),
    (r"25\%", "50", False),
    (r"12\text{ cm}", "12", True),
    (r"90^\circ", "90", True),
    (r"45^{\circ}", "45", True),
    (r"\$12", "12", True),
    ("-7", "-7", True),
    ("-7", "7", False),
    ("10^{3}", "1000", True),
    (r"1.5\times10^{3}", "1500", True),
    (r"3\cdot 10^{-2}", "0.03", True),
    (r"\binom{5}{2}", "10", True),
    (r"\log_2 8", "3", True),
    ("3^{1000}", "3", False),
    ("1,234", "1234", True),
    ("3.50", "3.5", True),
    ("x = 5", "5", True),
    ("x^2+2x", "x(x+2)", True),
    ("x^2+2x", "x(x+1)", False),
    (r"\text{(B)}", "B", True),
    (r"\text{B}", "C", False),
    (r"\text{Monday}", "Monday", True),
    (r"\frac{1}{0}", "1", False),
]


def math_verify_verdict(prediction: str, truth: str) -> bool:
    """math-verify on the two boxed answers with all its defaults, as its README calls it."""
    from math_verify import parse, verify

    return verify(parse(rf"\boxed{{{truth}}}"), parse(rf"\boxed{{{prediction}}}"))


@pytest.mark.parametrize(("prediction", "truth", "right"), CASES)
def test_boxed_agrees_with_math_verify(prediction, truth, right):
    assert math_verify_verdict(prediction, truth) is right, "the table's verdict is math-verify's"
    assert rewards.boxed([""], [rf"so the answer is \boxed{{{prediction}}}."], answer=[truth]) == [float(right)]


def test_integers_parse_as_math_verify_parses_them():
    """parse_answer reads plain integers without the LaTeX grammar (its cost); the numbers are the same."""
    from math_verify import parse

    for text in ("72", "-7", "1,234", "007", "0", " 12 ", "9" * 90):
        assert answers.parse_answer(text)[0] == parse(rf"\boxed{{{text}}}")[0], text


def _documented_pairs() -> list[tuple[str, str]]:
    """Every `A` = `B` (= `C` ...) of docs/rewards.md's math details and of the math rewards' docstrings."""
    docs = (REPO / "docs" / "rewards.md").read_text()
    math_part = docs[docs.index("- **gsm8k**") : docs.index("- **format**")]
    texts = [math_part, answers.math_equal.__doc__, answers.parse_answer.__doc__, builtin.boxed.__doc__]
    pairs = []
    for text in texts:
        for chain in re.findall(r"`[^`]+`(?:\s*=\s*`[^`]+`)+", " ".join(text.split())):
            items = re.findall(r"`([^`]+)`", chain)
            pairs += list(itertools.pairwise(items))
    return pairs


def test_the_documented_examples_hold():
    pairs = _documented_pairs()
    assert len(pairs) >= 6, pairs
    for a, b in pairs:
        assert rewards.math_equal(a, b), (a, b)
        assert math_verify_verdict(a, b), (a, b)


def test_model_text_is_parsed_never_run(capfd, monkeypatch):
    """The issue's attacks: nothing printed, stdout still open, no debugger, no command run; each scores 0."""
    called = []
    monkeypatch.setattr(sys, "breakpointhook", lambda *a, **k: called.append("breakpoint"))
    marker = f"/tmp/rlctl-math-{os.getpid()}"
    evil = [
        r"\boxed{print(12345)}",
        r"\boxed{open(1)}",
        r"\boxed{breakpoint()}",
        rf"\boxed{{__import__('os').system('touch {marker}')}}",
        r"\boxed{().__class__.__base__.__subclasses__()}",
        r"\boxed{exec('print(54321)')}",
    ]
    assert rewards.boxed([""] * len(evil), evil, answer=["12345", "1", "0", "0", "0", "0"]) == [0.0] * len(evil)
    os.fstat(1)  # fd 1 still open
    out, err = capfd.readouterr()
    assert "12345" not in out + err and "54321" not in out + err
    assert not called and not os.path.exists(marker)


@pytest.mark.parametrize(
    "hedge",
    [
        "1, 2, 3, 4, 5",
        r"\{1,2,3,4,5\}",
        r"3 \text{ or } 4",
        r"\pm 3",
        r"(-\infty, \infty)",
        r"\mathbb{R}",
        r"x \in \mathbb{R}",
        "x",
        r"x \geq 3",
        "3 > 2",
        r"\text{anything}",
        "",
    ],
)
def test_answer_level_hacks_score_zero(hedge):
    """Every candidate at once, a variable, the whole real line, a true relation: none is the answer 3."""
    assert rewards.boxed([""], [rf"\boxed{{{hedge}}}"], answer=["3"]) == [0.0]


def test_boxed_in_its_reward_worker(capfd):
    """Where training runs rewards (the main thread of a worker process): the attack prints nothing there either."""
    from rlctl.rewards import worker

    workers = worker.Workers()
    fn = workers.remote("boxed", "answer", timeout_s=120)
    try:
        got = fn(["", ""], [r"\boxed{print(12345)}", r"\boxed{\binom{5}{2}}"], answer=["12345", "10"])
    finally:
        workers.stop_all()
    assert got == [0.0, 1.0]
    out, err = capfd.readouterr()
    assert "12345" not in out + err


def test_math_equal_in_other_threads():
    """Away from the main thread math-verify's signal-based timeouts cannot be set; equality still works there."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        verdicts = list(pool.map(rewards.math_equal, [r"\frac{1}{2}", "10^{3}", "3"], ["0.5", "1000", "4"]))
    assert verdicts == [True, True, False]


def test_an_answer_past_the_timeout_scores_zero(monkeypatch):
    """A power tower sympy would compute for ever: math-verify's timeout (main thread) stops it, scoring 0."""
    monkeypatch.setattr(answers, "VERIFY_TIMEOUT_S", 1)
    assert rewards.boxed([""], [r"\boxed{9^{9^{9^{9}}}}"], answer=["1"]) == [0.0]


def test_a_timeout_never_echoes_the_model_text(monkeypatch, caplog):
    """math-verify warns with the text it gave up on: model output (escape sequences too) would reach the terminal
    and the logs from inside the reward. The timeout is a 0, said nowhere."""
    import logging

    monkeypatch.setattr(answers, "VERIFY_TIMEOUT_S", 1)
    caplog.set_level(logging.WARNING)
    assert rewards.boxed([""], ["\x1b[2J" + r"\boxed{9^{9^{9^{9}}}}"], answer=["1"]) == [0.0]
    assert [r.getMessage() for r in caplog.records if r.name.startswith("math_verify")] == []


def test_gsm8k_compares_through_math_verify():
    assert rewards.gsm8k([""] * 3, ["#### 1,234", "#### 0.50", "#### 3"], answer=["1234", r"\frac{1}{2}", "4"]) == [
        1.0,
        1.0,
        0.0,
    ]


def test_rewards_test_on_hostile_completions(tmp_path):
    """`rlctl rewards test` scores the issue's attacks 0, with no traceback and its table printed."""
    rows = [
        {"prompt": "p", "completion": r"\boxed{print(12345)}", "answer": "12345"},
        {"prompt": "p", "completion": r"\boxed{open(1)}", "answer": "1"},
        {"prompt": "p", "completion": r"\boxed{breakpoint()}", "answer": "0"},
        {"prompt": "p", "completion": r"\boxed{[0,1)}", "answer": "[0,1]"},
        {"prompt": "p", "completion": r"\boxed{\binom{5}{2}}", "answer": "10"},
    ]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = rlctl("rewards", "test", "--data", "s.jsonl", "-r", "boxed", "--json", cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    out = json.loads(proc.stdout)
    assert [r["boxed"] for r in out["rows"]] == [0.0, 0.0, 0.0, 0.0, 1.0]


def test_runs_of_commas_and_spaces_are_judged_at_once(tmp_path):
    """gsm8k's number patterns read a run of commas or spaces once (they were quadratic: 40k commas not judged
    after 25 s, so 200k would take many minutes); `rlctl rewards test` judges 200k of them."""
    run = 200_000
    rows = [
        {"prompt": "p", "completion": "1" + "," * run + "x", "answer": "1"},
        {"prompt": "p", "completion": "#### " + " " * run + "x 3", "answer": "3"},
        {"prompt": "p", "completion": "####" + "\t" * run + "7", "answer": "7"},
        {"prompt": "p", "completion": "2" + ",,2" * run, "answer": "5"},
    ]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = rlctl(
        "rewards", "test", "--data", "s.jsonl", "-r", "gsm8k(strict=False)", "--json", cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert [r["gsm8k(strict=False)"] for r in json.loads(proc.stdout)["rows"]] == [1.0, 1.0, 1.0, 0.0]
    assert answers.gsm8k_answer("x 1,234.5 y", strict=False) == "1234.5"
    assert answers.gsm8k_answer("#### $ 1,000") == "1000" and answers.gsm8k_answer("5, then 1,000,", False) == "1000"
