"""Rewards: the built-ins on hand-checked cases, arguments in call form, file plugins and entry points, the
shipped plugin examples, the dry run that stops a bad plugin before training, and `rlctl rewards test`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rlctl import rewards
from rlctl.errors import UserError
from tests.helpers import rlctl

REPO = Path(__file__).resolve().parent.parent
PLUGINS = REPO / "plugins"


def score(name: str, completions: list, answers: list | None = None, **columns) -> list[float]:
    fn = rewards.resolve(name)
    kwargs = {"answer": answers} if answers is not None else {}
    return fn([""] * len(completions), completions, **kwargs, **columns)


# ------------------------------------------------------------------------------------------ built-ins
def test_exact_match_strips_and_accepts_any_listed_answer():
    assert score("exact_match", [" 42\n", "41", "b"], ["42", "42", ["a", "b"]]) == [1.0, 0.0, 1.0]
    chat = [[{"role": "assistant", "content": "42"}]]
    assert score("exact_match", chat, ["42"]) == [1.0], "conversational completions are read as text"


def test_gsm8k_final_answer():
    completions = ["so she has 72. #### 72", "#### 1,234", "The answer is 72", "#### $5", "#### 71", "no answer"]
    truths = ["72", "1234", "72", "5", "Natalia sold 48/2 = 24 clips ... #### 72", "3"]
    assert score("gsm8k", completions, truths) == [1.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    assert score("gsm8k(strict=False)", ["The answer is 72", "it is 3.50"], ["72", "3.5"]) == [1.0, 1.0]


@pytest.mark.parametrize(
    ("completion", "truth", "ok"),
    [
        (r"so \boxed{\frac{1}{2}}", "0.5", True),
        (r"\boxed{0.5}", r"\frac12", True),
        (r"\boxed{\dfrac{3}{4}}", "3/4", True),
        (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", True),
        (r"\boxed{\pi/2}", r"\frac{\pi}{2}", True),
        (r"\boxed{x^2+2x}", "x(x+2)", True),
        (r"\boxed{x = 5}", "5", True),
        (r"\boxed{(1,2)}", "(1, 2)", True),
        (r"\boxed{90^\circ}", "90", True),
        (r"\boxed{\text{(B)}}", "B", True),
        (r"first \boxed{3} then \boxed{4}", "4", True),
        (r"\boxed{\frac{1}{3}}", "0.33", False),
        (r"\boxed{3}", "4", False),
        ("4", "4", False),  # no box, no credit
        (r"\boxed{3^{1000}}", "3", False),
    ],
)
def test_boxed_math_equivalence(completion, truth, ok):
    assert score("boxed", [completion], [truth]) == [float(ok)]


def test_boxed_never_evaluates_untrusted_code():
    """More in tests/test_math_answers.py (no output, no debugger, no command, timeouts)."""
    for evil in ("().__class__.__base__.__subclasses__()", "9^9^9^9", "__import__(os)", "x" * 500):
        assert not rewards.math_equal(evil, "1")


def test_verl_dispatches_on_data_source():
    values = rewards.verl(
        ["", "", ""],
        ["#### 3", r"\boxed{3}", "3"],
        answer=["3", "3", "3"],
        data_source=["openai/gsm8k", "lighteval/MATH", "x"],
    )
    assert values == [1.0, 1.0, 1.0]
    assert rewards.verl([""], [r"\boxed{3}"], answer=["3"], data_source=["openai/gsm8k"]) == [0.0]


def test_format_and_length_penalty():
    assert score("format", ["<think>hmm</think> 42", "42", "<think>x</think>"]) == [1.0, 0.0, 0.0]
    assert score(r"format(pattern=r'\d+')", ["42", "4 2"]) == [1.0, 0.0]
    values = score("length_penalty(max_length=10, buffer=4)", ["a" * 6, "a" * 8, "a" * 10, "a" * 30])
    assert values == [0.0, -0.5, -1.0, -1.0]
    ids = [[0] * 3, [0] * 12]
    assert score("length_penalty(max_length=10, buffer=2, unit='tokens')", ["x", "y"], completion_ids=ids) == [
        0.0,
        -1.0,
    ]


def test_answer_field_is_read_under_the_name_answer():
    fn = rewards.resolve("exact_match", answer_field="solution")
    assert fn(["p"], ["7"], solution=["7"]) == [1.0]


# ---------------------------------------------------------------------------------- names, arguments
def test_call_syntax_and_its_errors():
    assert rewards.split_call("length_penalty(max_length=5, unit='words')") == (
        "length_penalty",
        {"max_length": 5, "unit": "words"},
    )
    assert rewards.split_call("a/b.py:fn(x=[1, 2])") == ("a/b.py:fn", {"x": [1, 2]})
    with pytest.raises(UserError, match=r"has no argument 'max_len'. Did you mean: max_length"):
        rewards.resolve("length_penalty(max_len=5)")
    with pytest.raises(UserError, match="must be keywords"):
        rewards.resolve("length_penalty(5)")
    with pytest.raises(UserError, match="must be a literal"):
        rewards.resolve("length_penalty(max_length=os.sep)")
    with pytest.raises(UserError, match=r"Unknown reward 'gsmk8'. Did you mean: gsm8k"):
        rewards.resolve("gsmk8")


def test_file_plugins_with_arguments(tmp_path):
    plugin = tmp_path / "mine.py"
    plugin.write_text("def bonus(prompts, completions, scale=1.0, **columns):\n    return [scale] * len(completions)\n")
    assert rewards.resolve(f"{plugin}:bonus(scale=0.5)")(["p"], ["c"]) == [0.5]
    with pytest.raises(UserError, match=r"has no function 'bonsu'. Did you mean: bonus"):
        rewards.resolve(f"{plugin}:bonsu")


def test_shipped_plugin_examples():
    fn = rewards.resolve(f"{PLUGINS / 'math_rewards.py'}:boxed_or_last_number")
    assert fn(["", "", ""], [r"\boxed{\frac{1}{2}}", "it is 12", "nothing"], answer=["0.5", "12", "1"]) == [
        1.0,
        1.0,
        0.0,
    ]
    steps = rewards.resolve(f"{PLUGINS / 'math_rewards.py'}:step_count(target=2)")
    assert steps([""], ["a\n\nb\nc"]) == [1.0]
    code = rewards.resolve(f"{PLUGINS / 'code_rewards.py'}:unit_tests")
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    bad = "```python\ndef add(a, b):\n    return a - b\n```"
    assert code(["", ""], [good, bad], tests=["assert add(1, 2) == 3"] * 2) == [1.0, 0.0]


def _install_entry_points(root: Path) -> Path:
    """A dist-info that registers the example package's entry points, as `pip install` would."""
    site = root / "site"
    dist = site / "rlctl_rewards_example-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rlctl-rewards-example\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(
        "[rlctl.rewards]\npoliteness = rlctl_rewards_example:politeness\n"
        "no_repetition = rlctl_rewards_example:no_repetition\n"
    )
    return site


def test_entry_point_rewards(tmp_path, monkeypatch):
    site = _install_entry_points(tmp_path)
    monkeypatch.syspath_prepend(str(PLUGINS / "rlctl_rewards_example"))
    monkeypatch.syspath_prepend(str(site))
    assert {"politeness", "no_repetition"} <= set(rewards.entry_points())
    assert rewards.resolve("politeness(bonus=2.0)")(["p", "p"], ["Thank you!", "no"]) == [2.0, 0.0]
    assert rewards.resolve("no_repetition(n=1)")(["p"], ["a a b b"]) == [0.5]


# ------------------------------------------------------------------------------------------- dry run
def test_dry_run_stops_bad_plugins(tmp_path):
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
    plugin = tmp_path / "bad.py"
    plugin.write_text(
        "def boom(prompts, completions, **c):\n    raise KeyError('score')\n"
        "def short(prompts, completions, **c):\n    return [1.0]\n"
        "def needs(prompts, completions, difficulty, **c):\n    return [1.0] * len(completions)\n"
        "def fine(prompts, completions, answer, completion_ids, **c):\n"
        "    return [float(len(completion_ids[0]) > 0)] * 2\n"
    )
    with pytest.raises(UserError, match=r"Reward '.*bad.py:boom' raised KeyError"):
        rewards.dry_run([f"{plugin}:boom"], rows)
    with pytest.raises(UserError, match=r"one finite number or None per completion \(2\); it returned 1 values"):
        rewards.dry_run([f"{plugin}:short"], rows)
    with pytest.raises(UserError, match=r"cannot be called with the dataset's columns \(answer\).*difficulty"):
        rewards.dry_run([f"{plugin}:needs"], rows)
    rewards.dry_run(["exact_match", f"{plugin}:fine", "length_penalty(unit='tokens')"], rows)


def test_dry_run_samples_one_of_a_list_of_accepted_answers(tmp_path):
    """A ground truth listing several accepted answers: the dry run's sample completion is one of them, never the
    list's string form."""
    rows = [{"prompt": "Capital of France?", "answer": ["Paris", "paris"]}]
    plugin = tmp_path / "strict.py"
    plugin.write_text(
        "def one_of(prompts, completions, answer, **c):\n"
        "    assert all(c in a for c, a in zip(completions, answer)), (completions, answer)\n"
        "    return [1.0] * len(completions)\n"
    )
    rewards.dry_run([f"{plugin}:one_of", "exact_match"], rows)


def test_train_refuses_a_raising_plugin_before_starting(tmp_path):
    (tmp_path / "rl.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    (tmp_path / "r.py").write_text("def score(prompts, completions, **c):\n    return 1 / 0\n")
    proc = rlctl(
        "train", "--preset", "qwen0.5b-grpo", "--run-dir", str(tmp_path / "run"),
        "--set", "data.rl=rl.jsonl", "--set", "rl.rewards=[{name: r.py:score}]",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "r.py:score' raised ZeroDivisionError" in proc.stderr.replace("\n", " ")
    assert not (tmp_path / "run" / "config.yaml").exists()


# ------------------------------------------------------------------------------------- rlctl rewards
def test_rewards_test_prints_each_reward_and_the_weighted_total(tmp_path):
    rows = [
        {"prompt": "1+1=", "completion": "2", "answer": "2"},
        {"prompt": "2+2=", "completion": "#### 4", "answer": "4"},
        {"prompt": "3+3=", "completion": "7", "answer": "6"},
    ]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "rlctl.yaml").write_text(
        "defaults: [qwen0.5b-grpo]\nrl:\n  rewards:\n    - {name: exact_match, weight: 1.0}\n"
        "    - {name: 'gsm8k(strict=False)', weight: 0.5}\n"
    )
    proc = rlctl("rewards", "test", "--data", "s.jsonl", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["scored"] == "completion"
    assert [r["exact_match"] for r in out["rows"]] == [1.0, 0.0, 0.0]
    assert [r["gsm8k(strict=False)"] for r in out["rows"]] == [1.0, 1.0, 0.0]
    assert [r["total"] for r in out["rows"]] == [1.5, 0.5, 0.0]
    table = rlctl("rewards", "test", "--data", "s.jsonl", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    for text in ("exact_match x1", "gsm8k(strict=False) x0.5", "mean", "0.6667"):
        assert text in table.stdout, table.stdout


def test_rewards_test_with_entry_points_and_reference_answers(tmp_path):
    site = _install_entry_points(tmp_path)
    (tmp_path / "s.jsonl").write_text('{"prompt": "hi", "answer": "Thank you, glad to help"}\n')
    env = {"PYTHONPATH": f"{site}:{PLUGINS / 'rlctl_rewards_example'}"}
    proc = rlctl(
        "rewards", "test", "--data", "s.jsonl", "-r", "politeness", "-r", "exact_match", "--json", cwd=tmp_path, env=env
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["scored"].startswith("answer"), "without completions the ground truth is scored"
    assert out["rows"][0]["politeness"] == 1.0 and out["rows"][0]["exact_match"] == 1.0
    listing = rlctl("rewards", "list", env=env)
    assert listing.returncode == 0 and "politeness" in listing.stdout and "length_penalty" in listing.stdout
    missing = rlctl("rewards", "test", "--data", "s.jsonl", "-r", "politness", cwd=tmp_path, env=env)
    assert missing.returncode == 2 and "Did you mean: politeness" in missing.stderr.replace("\n", " ")


def test_reward_names_are_python_identifiers():
    assert all(name.isidentifier() for name in rewards.BUILTINS)
    assert sys.modules["rlctl.rewards"] is rewards
