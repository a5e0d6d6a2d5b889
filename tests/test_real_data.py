"""Data as users have it (issue 17): Windows encodings and byte-order marks, mixed conversational rows, BIG-bench
files, per-stage column mapping, GPT-2-style tokenizers without a chat template, models that are not there, and
the pre-flight that finds all of it before launch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlctl import config, data
from rlctl.data import tokens
from rlctl.errors import UserError
from rlctl.launch import preflight
from rlctl.rewards import scoring
from rlctl.stages import tiny
from tests.helpers import rlctl, summary

QWEN2_CONFIG = {"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
QWEN2_CONFIG |= {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 400}


def _out(proc) -> str:
    return " ".join((proc.stdout + proc.stderr).split())


def _refused(proc, *needles: str) -> None:
    out = _out(proc)
    assert proc.returncode == 2, out
    assert "Traceback" not in out, out
    for needle in needles:
        assert needle in out, (needle, out)


# ----------------------------------------------------------------------------------------------- encodings
@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_cp1252_is_refused_naming_line_byte_and_fix_then_read_with_data_encoding(tmp_path: Path, suffix: str):
    text = (
        '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "café 2+2=", "answer": "4"}\n'
        if suffix == ".jsonl"
        else "prompt,answer\n1+1=,2\ncafé 2+2=,4\n"
    )
    path = tmp_path / f"d{suffix}"
    path.write_bytes(text.encode("cp1252"))
    offset = text.encode("cp1252").index("é".encode("cp1252"))
    with pytest.raises(UserError) as e:
        data.check(path, "rl", "answer")
    message = str(e.value)
    for needle in (f"{path}:3" if suffix == ".csv" else f"{path}:2", f"byte {offset}", "cp1252", "data.encoding"):
        assert needle in message, (needle, message)
    assert "iconv -f cp1252 -t utf-8" in message
    rows = data.check(path, "rl", "answer", encoding="cp1252")
    assert rows[1]["prompt"] == "café 2+2="


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".json", ".tsv"])
@pytest.mark.parametrize("codec", ["utf-8-sig", "utf-16"])
def test_byte_order_marks_are_read_everywhere(tmp_path: Path, suffix: str, codec: str):
    rows = [{"prompt": "é 1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
    text = {
        ".jsonl": "".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in rows),
        ".json": json.dumps(rows, ensure_ascii=False),
        ".csv": "prompt,answer\r\n" + "".join(f"{r['prompt']},{r['answer']}\r\n" for r in rows),
        ".tsv": "prompt\tanswer\r\n" + "".join(f"{r['prompt']}\t{r['answer']}\r\n" for r in rows),
    }[suffix]
    path = tmp_path / f"d{suffix}"
    path.write_bytes(text.encode(codec))
    assert data.check(path, "rl", "answer") == rows


def test_plan_refuses_an_undecodable_file_with_exit_2(tmp_path: Path):
    (tmp_path / "rl.csv").write_bytes("prompt,answer\nna\xefve 1+1=,2\n".encode("cp1252"))
    proc = rlctl(
        "plan", "--preset", "tiny-demo", "--stages", "rl", "--set", "data.generate=null",
        "--set", f"data.rl={tmp_path / 'rl.csv'}", "--set", "rl.rewards=[{name: exact_match}]",
        "--run-dir", str(tmp_path / "run"),
    )  # fmt: skip
    _refused(proc, "rl.csv:2", "cp1252", "data.encoding")
    assert proc.stdout.count("error:") + proc.stderr.count("error:") == 1
    bad = rlctl("plan", "--preset", "tiny-demo", "--set", "data.encoding=klingon")
    _refused(bad, "data.encoding", "klingon")


def test_malformed_json_names_its_column_and_context(tmp_path: Path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": 4,}\n')
    with pytest.raises(UserError, match=r"d.jsonl:2, column 32: Expecting property name.*near"):
        data.check(path, "rl", "answer")
    pretty = tmp_path / "pretty.jsonl"  # a JSON array exported with a .jsonl name
    pretty.write_text(json.dumps([{"prompt": "1+1=", "answer": "2"}], indent=2))
    assert data.check(pretty, "rl", "answer") == [{"prompt": "1+1=", "answer": "2"}]


# ------------------------------------------------------------------------------------------------ formats
def test_mixed_conversational_rows_become_one_form_for_sft_and_preference(tmp_path: Path):
    chat = [{"role": "system", "content": "Add."}, {"role": "user", "content": "1+1="}]
    sft = tmp_path / "sft.jsonl"
    sft.write_text(json.dumps({"prompt": chat, "completion": "2"}) + "\n")
    rows = data.check(sft, "sft")
    assert rows == [{"prompt": chat, "completion": [{"role": "assistant", "content": "2"}]}]
    tok = tiny.train_tokenizer(["1+1=2 Add."], 300)
    rendered = tok.apply_chat_template(chat + rows[0]["completion"], tokenize=True, return_dict=True)
    assert tokens.length(rows[0], tok, "sft") == len(rendered["input_ids"])
    pref = tmp_path / "p.jsonl"
    pref.write_text(json.dumps({"prompt": "1+1=", "chosen": [{"role": "assistant", "content": "2"}], "rejected": "3"}))
    (pair,) = data.check(pref, "preference")
    assert pair["prompt"] == [{"role": "user", "content": "1+1="}] and isinstance(pair["rejected"], list)


def test_bigbench_task_json_is_read_for_rl_and_sft(tmp_path: Path):
    task = {
        "name": "arith",
        "keywords": ["math"],
        "metrics": ["exact_str_match"],
        "examples": [{"input": "1+1=", "target": ["2", "two"]}, {"input": "2+2=", "target_scores": {"4": 1, "5": 0}}],
    }
    path = tmp_path / "task.json"
    path.write_text(json.dumps(task))
    rows, info = data.load(path, "rl", "answer")
    assert info.format == "bigbench"
    assert rows == [{"prompt": "1+1=", "answer": ["2", "two"]}, {"prompt": "2+2=", "answer": ["4"]}]
    assert data.check(path, "sft")[0] == {"prompt": "1+1=", "completion": "2"}


# ------------------------------------------------------------------------------------------------- config
def test_config_that_is_not_a_mapping_and_data_stage_keys(tmp_path: Path):
    for text in ("[]\n", "just a string\n"):
        (tmp_path / "c.yaml").write_text(text)
        _refused(rlctl("plan", "--config", str(tmp_path / "c.yaml")), "c.yaml", "mapping")
    proc = rlctl("plan", "--preset", "tiny-demo", "--set", "data.rm=p.jsonl")
    _refused(proc, "data.rm", "data.preference")
    typo = rlctl("plan", "--preset", "tiny-demo", "--set", "rl.lerning_rate=1")
    assert "?." not in _out(typo) and "Did you mean: learning_rate" in _out(typo)


def test_per_stage_columns_override_data_columns(tmp_path: Path):
    gsm = tmp_path / "gsm8k.jsonl"
    gsm.write_text(json.dumps({"question": "1+1=", "answer": "1+1=2 #### 2"}) + "\n")
    sets = ["stages=[sft,rl]", "data.generate=null", f"data.sft={gsm}", f"data.rl={gsm}", "rl.rewards=[{name: gsm8k}]"]
    sets += ["data.columns={prompt: question}", "sft.columns={completion: answer}"]
    cfg = config.resolve("tiny-demo", sets=sets)
    assert data.check(gsm, "sft", columns=data.stage_columns(cfg, "sft")) == [
        {"prompt": "1+1=", "completion": "1+1=2 #### 2"}
    ]
    rl_rows = data.check(gsm, "rl", "answer", columns=data.stage_columns(cfg, "rl"))
    assert rl_rows == [{"prompt": "1+1=", "answer": "1+1=2 #### 2"}]


# ----------------------------------------------------------------------------------------------- pre-flight
@pytest.fixture(scope="module")
def gpt2_style(tmp_path_factory) -> Path:
    """A model folder whose tokenizer has no chat template (as GPT-2's), and a config.json; no weights needed."""
    folder = tmp_path_factory.mktemp("gpt2ish")
    tok = tiny.train_tokenizer(["What is 1+1? It is 2. Hello there, how are you today?"], 300)
    tok.chat_template = None
    tok.save_pretrained(folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    (folder / "config.json").write_text(json.dumps(QWEN2_CONFIG))
    return folder


def _chat_sft(tmp_path: Path, n: int = 20, long_every: int = 0) -> Path:
    path = tmp_path / "chat.jsonl"
    rows = []
    for i in range(n):
        text = "Hello there, how are you today? " * (16 if long_every and i % long_every == 0 else 1)
        rows.append({"messages": [{"role": "user", "content": f"{text}{i}"}, {"role": "assistant", "content": "2"}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _plan(model: Path | str, sft: Path, *extra: str, env: dict | None = None, command: str = "plan"):
    args = [command, "--preset", "tiny-demo", "--stages", "sft", "--set", "data.generate=null"]
    args += ["--set", f"data.sft={sft}", "--set", f"model.name_or_path={model}", "--set", "hardware.spec=cpu", *extra]
    return rlctl(*args, "--run-dir", str(sft.parent / f"run-{command}"), env=env)


def test_tokenizer_without_chat_template_on_chat_rows_needs_data_chat_template(tmp_path: Path, gpt2_style: Path):
    sft = _chat_sft(tmp_path)
    _refused(_plan(gpt2_style, sft), "chat template", "data.chat_template", "chatml")
    ok = _plan(gpt2_style, sft, "--set", "data.chat_template=chatml", "--set", "sft.max_length=100")
    assert ok.returncode == 0, _out(ok)
    assert "0 of 20 rows (0.0%) over sft.max_length=100 tokens" in _out(ok)
    proc = _plan(gpt2_style, sft, command="train")
    _refused(proc, "data.chat_template")
    assert "Starting tiny-demo" not in _out(proc), "refused before anything launches"
    assert not (tmp_path / "run-train").exists()


PICKY_TEMPLATE = (  # ChatML that refuses any message holding BOOM, as real templates refuse role orders
    "{% for m in messages %}{% if 'BOOM' in m['content'] %}{{ raise_exception('no BOOM here') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _chat_rows(path: Path, n: int, boom_line: int, answers: bool = False) -> Path:
    rows = []
    for i in range(1, n + 1):
        text = f"What is {i}+1?" + (" BOOM" if i == boom_line else "")
        row = {"prompt": [{"role": "user", "content": text}], "answer": str(i + 1)}
        rows.append(row if answers else {"messages": [*row["prompt"], {"role": "assistant", "content": row["answer"]}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_row_the_chat_template_refuses_is_named_by_file_and_line(tmp_path: Path, gpt2_style: Path):
    """The pre-flight renders every row (held-out prompts too) and names the one a template refuses."""
    template = tmp_path / "picky.jinja"
    template.write_text(PICKY_TEMPLATE)
    sets = ("--set", f"data.chat_template={template}", "--set", "sft.max_length=100")
    sft = _chat_rows(tmp_path / "chat.jsonl", 12, boom_line=5)
    _refused(_plan(gpt2_style, sft, *sets), f"{sft}:5: The chat template refused a conversation: no BOOM here")
    clean = _chat_rows(tmp_path / "clean.jsonl", 12, boom_line=0)
    held = _chat_rows(tmp_path / "eval.jsonl", 8, boom_line=3, answers=True)
    _refused(_plan(gpt2_style, clean, *sets, "--set", f"data.eval={held}"), f"{held}:3: The chat template refused")
    assert _plan(gpt2_style, clean, *sets).returncode == 0


def test_file_tokenizer_counts_as_transformers_does(gpt2_style: Path):
    from transformers import AutoTokenizer

    real = AutoTokenizer.from_pretrained(gpt2_style)
    real.chat_template = tokens.CHATML
    light = tokens.FileTokenizer.from_folder(gpt2_style, tokens.CHATML)
    chat = [{"role": "user", "content": "What is 1+1?"}, {"role": "assistant", "content": "It is 2."}]
    rows = [
        ("sft", {"messages": chat}),
        ("sft", {"prompt": "What is 1+1?", "completion": " It is 2."}),
        ("rl", {"prompt": chat[:1], "answer": "2"}),
        ("rm", {"prompt": chat[:1], "chosen": chat[1:], "rejected": [{"role": "assistant", "content": "3"}]}),
    ]
    for stage, row in rows:
        assert tokens.length(row, light, stage) == tokens.length(row, real, stage), (stage, row)


def test_over_long_rows_counted_in_the_plan_and_refused_beyond_max_drop_fraction(tmp_path: Path, gpt2_style: Path):
    sft = _chat_sft(tmp_path, n=20, long_every=5)  # 4 of 20 rows are long
    sets = ["--set", "data.chat_template=chatml", "--set", "sft.max_length=100"]
    proc = _plan(gpt2_style, sft, *sets)
    _refused(proc, "4 of 20 sft rows (20%)", "data.max_drop_fraction=0.05", "sft.max_length=")
    ok = _plan(gpt2_style, sft, *sets, "--set", "data.max_drop_fraction=0.25", "--json")
    assert ok.returncode == 0, _out(ok)
    lengths = json.loads(ok.stdout)["preflight"]["lengths"]["sft"]
    assert lengths["over_limit"] == 4 and lengths["share"] == 0.2 and lengths["keeps_95"] > 100


def test_missing_model_folder_and_uncached_hub_id_offline_refused_before_launch(tmp_path: Path):
    sft = tmp_path / "sft.jsonl"
    sft.write_text(json.dumps({"prompt": "1+1=", "completion": "2"}) + "\n")
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "empty-cache")}
    for command in ("plan", "train"):
        proc = _plan(tmp_path / "moved-away", sft, command=command)
        _refused(proc, "moved-away", "no such folder")
        assert "Starting tiny-demo" not in _out(proc)
        proc = _plan("someone/uncached-model", sft, env=env, command=command)
        _refused(proc, "someone/uncached-model", "HF_HUB_OFFLINE", "hf download someone/uncached-model")
        assert "Starting tiny-demo" not in _out(proc)
        assert not (tmp_path / f"run-{command}").exists()


def test_run_dir_under_a_file_is_refused(tmp_path: Path):
    (tmp_path / "afile").write_text("x")
    for command in ("plan", "train"):
        proc = rlctl(command, "--preset", "tiny-demo", "--run-dir", str(tmp_path / "afile" / "run"))
        _refused(proc, "afile", "is a file")
    assert preflight.run_dir_problem(tmp_path / "new" / "deeper") is None


# --------------------------------------------------------------------------------------------- correctness
def test_accuracy_follows_the_correctness_reward_with_its_arguments(tmp_path: Path):
    cfg = config.resolve("tiny-demo", sets=["rl.rewards=[{name: 'gsm8k(strict=False)'}, {name: format}]"])
    assert scoring.accuracy_name(cfg.rl.rewards) == "gsm8k(strict=False)"
    plugin = tmp_path / "judge.py"
    plugin.write_text("def judge(prompts, completions, **_):\n    return [1.0 for _ in completions]\n")
    marked = config.resolve("tiny-demo", sets=[f"rl.rewards=[{{name: exact_match, correctness: false}}, "
                                               f"{{name: '{plugin}:judge', correctness: true}}]"])  # fmt: skip
    assert scoring.accuracy_name(marked.rl.rewards) == f"{plugin}:judge"
    assert scoring.accuracy_name([("format", 1.0)]) == "exact_match"
    assert scoring.accuracy_name([("format", 1.0)], "verl") == "verl"
    loose = scoring.correct("gsm8k(strict=False)", "answer", ["q"], ["so 42"], {"answer": ["#### 42"]})
    strict = scoring.correct("gsm8k", "answer", ["q"], ["so 42"], {"answer": ["#### 42"]})
    assert loose == [True] and strict == [False]


def test_rewards_test_scores_list_ground_truths_as_any_of(tmp_path: Path):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"prompt": "capital of France?", "answer": ["Paris", "paris"]}) + "\n")
    proc = rlctl("rewards", "test", "--data", str(path), "--reward", "exact_match", "--json")
    assert proc.returncode == 0, _out(proc)
    (row,) = json.loads(proc.stdout)["rows"]
    assert row["completion"] == "Paris" and row["exact_match"] == 1.0 and row["correct"] is True


# ------------------------------------------------------------------------------------------------ end to end
@pytest.mark.slow
def test_gsm8k_file_sft_then_grpo_with_conversational_rm_pairs_piped(tmp_path: Path):
    """One GSM8K-shaped file trains SFT (question -> prompt, answer -> completion) and then GRPO (answer the ground
    truth, scored by gsm8k) in one command; the reward model trains on TRL's conversational chosen/rejected lists
    and is scored at its checkpoints; the output, piped, carries progress lines before the stages end."""
    gsm, held, pairs = tmp_path / "gsm8k.jsonl", tmp_path / "test.jsonl", tmp_path / "pairs.jsonl"
    rows = [{"question": f"{a}+{a % 7}=", "answer": f"{a}+{a % 7}={a + a % 7} #### {a + a % 7}"} for a in range(10, 42)]
    gsm.write_text("".join(json.dumps(r) + "\n" for r in rows))
    held.write_text("".join(json.dumps(r) + "\n" for r in rows[:8]))
    pair_rows = [
        {
            "chosen": [{"role": "user", "content": r["question"]}, {"role": "assistant", "content": "right"}],
            "rejected": [{"role": "user", "content": r["question"]}, {"role": "assistant", "content": "no"}],
        }
        for r in rows
    ]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in pair_rows))
    run_dir = tmp_path / "run"
    proc = rlctl(
        "train", "--preset", "tiny-demo", "--run-dir", str(run_dir), "--set", "data.generate=null",
        "--set", f"data.sft={gsm}", "--set", f"data.rl={gsm}", "--set", f"data.eval={held}",
        "--set", f"data.preference={pairs}", "--set", "data.columns={prompt: question}",
        "--set", "sft.columns={completion: answer}", "--set", "rl.rewards=[{name: gsm8k}]",
        "--set", "sft.max_steps=6", "--set", "sft.save_every=3", "--set", "sft.max_length=64",
        "--set", "rm.max_steps=4", "--set", "rm.save_every=2", "--set", "rm.max_length=64",
        "--set", "rl.max_steps=2", "--set", "rl.prompts_per_step=4", "--set", "rl.group_size=2",
        "--set", "rl.eval_samples=8", "--set", "rl.max_new_tokens=8", "--set", "data.max_prompt_length=32",
        "--set", "logging.console_every_s=0.5",
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["completed"] == ["sft", "rm", "rl"]
    assert "eval_accuracy" in summary["stages"]["rl"] and "eval_accuracy" in summary["stages"]["rm"]
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("sft step", "rm step", "rl step"))]
    assert any(line.startswith("sft step") and "/6" in line and "ETA" in line for line in lines), proc.stdout


@pytest.mark.slow
def test_gpt2_style_tokenizer_trains_chat_rows_and_eval_keeps_the_reward_arguments(tmp_path: Path, gpt2_style: Path):
    """A model whose tokenizer has no chat template (GPT-2's case) trains SFT and RL on message-list rows with
    data.chat_template=chatml, and `rlctl eval RUN` scores with the run's correctness reward and its arguments."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = tmp_path / "model"
    shutil.copytree(gpt2_style, model)
    Qwen2ForCausalLM(Qwen2Config(**{k: v for k, v in QWEN2_CONFIG.items() if k != "model_type"})).save_pretrained(model)
    sft = _chat_sft(tmp_path, n=16)
    rl = tmp_path / "rl.jsonl"
    rl.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"{i}+1="}], "answer": str(i + 1)}) + "\n"
                          for i in range(12)))  # fmt: skip
    judge = tmp_path / "judge.py"  # scores `bonus` whatever the completion: 0 unless the argument reaches it
    judge.write_text("def judge(prompts, completions, answer, bonus=0.0, **_):\n    return [bonus] * len(prompts)\n")
    run_dir = tmp_path / "run"
    proc = rlctl(
        "train", "--preset", "tiny-demo", "--stages", "sft,rl", "--algorithm", "reinforce-pp",
        "--run-dir", str(run_dir), "--set", "data.generate=null", "--set", f"model.name_or_path={model}",
        "--set", "data.chat_template=chatml", "--set", f"data.sft={sft}", "--set", f"data.rl={rl}",
        "--set", f"data.eval={rl}", "--set", f"rl.rewards=[{{name: '{judge}:judge(bonus=1.0)', correctness: true}}]",
        "--set", "sft.max_steps=3", "--set", "sft.save_every=3", "--set", "sft.max_length=100",
        "--set", "sft.batch_size=4", "--set", "rl.max_steps=2", "--set", "rl.save_every=2",
        "--set", "rl.prompts_per_step=2", "--set", "rl.group_size=2", "--set", "rl.eval_samples=4",
        "--set", "rl.max_new_tokens=4", "--set", "data.max_prompt_length=48",
    )  # fmt: skip
    assert proc.returncode == 0, _out(proc)
    assert summary(run_dir)["completed"] == ["sft", "rl"]
    assert summary(run_dir)["stages"]["rl"]["eval_accuracy"] == 1.0, "the run's own evaluation used bonus=1.0"
    out = tmp_path / "eval.json"
    proc = rlctl("eval", str(run_dir), "--data", str(rl), "--limit", "4", "--out", str(out))
    assert proc.returncode == 0, _out(proc)
    metrics = json.loads(out.read_text())
    assert metrics["accuracy_reward"] == f"{judge}:judge(bonus=1.0)" and metrics["accuracy"] == 1.0, metrics


@pytest.mark.slow
def test_a_reward_failing_on_a_held_out_row_at_a_checkpoint_names_its_file_and_line(tmp_path: Path, gpt2_style: Path):
    """Scoring at a checkpoint stops on a row a reward cannot score: the message names the file and line."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = tmp_path / "model"
    shutil.copytree(gpt2_style, model)
    Qwen2ForCausalLM(Qwen2Config(**{k: v for k, v in QWEN2_CONFIG.items() if k != "model_type"})).save_pretrained(model)
    run_dir = tmp_path / "run"
    picky = tmp_path / "picky.py"  # fails on row 7's answer, once a checkpoint is being written (not at the base)
    picky.write_text(
        "from pathlib import Path\n"
        f"INCOMING = Path({str(run_dir / 'sft' / 'checkpoints' / '.incoming')!r})\n"
        "def picky(prompts, completions, answer, **_):\n"
        "    if INCOMING.exists() and '8' in answer:\n"
        "        raise ValueError('no 8')\n"
        "    return [0.0] * len(prompts)\n"
    )
    held = tmp_path / "eval.jsonl"
    held.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(1, 9)))
    proc = rlctl(
        "train", "--preset", "tiny-demo", "--stages", "sft", "--run-dir", str(run_dir), "--set", "data.generate=null",
        "--set", f"model.name_or_path={model}", "--set", "data.chat_template=chatml",
        "--set", f"data.sft={_chat_sft(tmp_path, n=16)}", "--set", f"data.eval={held}",
        "--set", f"rl.rewards=[{{name: '{picky}:picky', correctness: true}}]", "--set", "sft.max_steps=2",
        "--set", "sft.save_every=2", "--set", "sft.max_length=100", "--set", "sft.batch_size=4",
        "--set", "rl.max_new_tokens=4",
    )  # fmt: skip
    out = _out(proc)
    assert proc.returncode == 1, out
    assert "raised ValueError: no 8" in out and f"The held-out row is {held}:7." in out, out
    assert f"rlctl resume {run_dir}" in out and "Traceback" not in proc.stderr.split("rlctl:")[-1], out
    assert summary(run_dir)["stages"]["base"]["eval_accuracy"] == 0.0  # the base model was scored before
