"""Datasets: every source type, every recognised format, column mapping, Hub names, errors that name the place,
and a verl-format parquet written independently (as verl's preprocessing writes it) training with no conversion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl import data
from rlctl.errors import UserError
from tests.helpers import rlctl

RL_ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+3=", "answer": "5"}, {"prompt": "9+9=", "answer": "18"}]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def verl_rows(n: int, split: str = "train") -> list[dict]:
    """Rows shaped exactly like verl's examples/data_preprocess/gsm8k.py output."""
    rows = []
    for i in range(n):
        a, b = 10 + (7 * i) % 90, i % 10
        question = f"{a}+{b}="
        rows.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": question}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {
                    "split": split,
                    "index": i,
                    "answer": f"{a}+{b}={a + b} #### {a + b}",
                    "question": question,
                },
            }
        )
    return rows


# ------------------------------------------------------------------------------------------- sources
def test_every_local_source_type_reads_the_same_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_jsonl(tmp_path / "d.jsonl", RL_ROWS)
    (tmp_path / "d.json").write_text(json.dumps(RL_ROWS))
    (tmp_path / "wrapped.json").write_text(json.dumps({"data": RL_ROWS}))
    (tmp_path / "d.csv").write_text("prompt,answer\n" + "".join(f'"{r["prompt"]}",{r["answer"]}\n' for r in RL_ROWS))
    (tmp_path / "d.tsv").write_text("prompt\tanswer\n" + "".join(f"{r['prompt']}\t{r['answer']}\n" for r in RL_ROWS))
    pq.write_table(pa.Table.from_pylist(RL_ROWS), tmp_path / "d.parquet")
    shards = tmp_path / "shards"
    shards.mkdir()
    write_jsonl(shards / "part-0.jsonl", RL_ROWS[:2])
    write_jsonl(shards / "part-1.jsonl", RL_ROWS[2:])
    for name in ("d.jsonl", "d.json", "wrapped.json", "d.csv", "d.tsv", "d.parquet", "shards"):
        rows, info = data.load(tmp_path / name, "rl", "answer")
        assert rows == RL_ROWS, name
        assert info.format == "prompt_answer" and info.rows == 3, name


def test_save_to_disk_dataset_and_dataset_dict(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(RL_ROWS)
    ds.save_to_disk(str(tmp_path / "ds"))
    datasets.DatasetDict({"train": ds, "test": ds.select([2])}).save_to_disk(str(tmp_path / "dd"))
    assert data.check(tmp_path / "ds", "rl", "answer") == RL_ROWS
    assert data.check(tmp_path / "dd", "rl", "answer") == RL_ROWS, "train split by default"
    assert data.check(tmp_path / "dd", "eval", "answer") == RL_ROWS[2:], "eval data takes the test split"
    assert data.check(f"{tmp_path / 'dd'}@test", "rl", "answer") == RL_ROWS[2:]
    with pytest.raises(UserError, match=r"no split 'dev'.*train, test"):
        data.check(f"{tmp_path / 'dd'}@dev", "rl", "answer")
    assert data.absolute(f"{tmp_path / 'dd'}@test") == f"{(tmp_path / 'dd').resolve()}@test"


def test_hub_names_parse_and_load_through_datasets(monkeypatch):
    datasets = pytest.importorskip("datasets")
    assert data.parse_source("openai/gsm8k:main@test") == data.Source(
        "hub", name="openai/gsm8k", config="main", split="test"
    )
    assert data.parse_source("hf://trl-lib/tldr") == data.Source("hub", name="trl-lib/tldr")
    assert data.is_hub("hf:/x/y"), "an hf:// name that went through pathlib"
    assert not data.is_hub("data/rl.jsonl") and not data.is_hub("./a/b")
    assert data.absolute("openai/gsm8k:main") == "openai/gsm8k:main"

    calls = []

    def fake_load(name, config=None, split=None):
        calls.append((name, config, split))
        table = datasets.Dataset.from_list(RL_ROWS)
        return table if split else datasets.DatasetDict({"train": table, "test": table.select([0])})

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    assert data.check("openai/gsm8k:main@train", "rl", "answer") == RL_ROWS
    assert data.check("openai/gsm8k:main", "eval", "answer") == RL_ROWS[:1], "eval picks the test split"
    assert calls == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", "main", None)]

    def offline(*args, **kwargs):
        raise ConnectionError("cannot reach huggingface.co")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(UserError, match=r"Cannot load Hub dataset 'openai/gsm8k'.*cannot reach"):
        data.check("openai/gsm8k", "rl", "answer")


# ------------------------------------------------------------------------------------------- formats
@pytest.mark.parametrize(
    ("role", "row", "fmt"),
    [
        ("sft", {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}, "messages"),
        ("sft", {"prompt": "1+1=", "completion": "2"}, "prompt_completion"),
        ("sft", {"text": "some text"}, "text"),
        ("preference", {"prompt": "p", "chosen": "a", "rejected": "b"}, "preference"),
        ("preference", {"chosen": "p a", "rejected": "p b"}, "preference_implicit"),
        ("kto", {"prompt": "p", "completion": "a", "label": True}, "kto"),
        ("rl", {"prompt": "1+1=", "answer": "2"}, "prompt_answer"),
        ("rl", verl_rows(1)[0], "verl"),
        ("eval", verl_rows(1)[0], "verl"),
    ],
)
def test_formats_are_recognised(tmp_path, role, row, fmt):
    _, info = data.load(write_jsonl(tmp_path / "d.jsonl", [row]), role, "answer")
    assert info.format == fmt
    assert fmt in data.FORMATS and role in data.FORMATS[fmt][1]


def test_verl_ground_truth_becomes_the_answer_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(verl_rows(4)), tmp_path / "train.parquet")
    rows = data.check(tmp_path / "train.parquet", "rl", "answer")
    assert [r["answer"] for r in rows] == [r["reward_model"]["ground_truth"] for r in verl_rows(4)]
    assert rows[0]["prompt"] == [{"role": "user", "content": "10+0="}], "the message-list prompt is kept as is"
    assert rows[0]["data_source"] == "openai/gsm8k" and rows[0]["extra_info"]["index"] == 0
    rows = data.check(tmp_path / "train.parquet", "rl", "solution")
    assert rows[1]["solution"] == "18", "mapped to whatever data.answer_field names"


def test_kto_rows_per_role(tmp_path):
    path = write_jsonl(
        tmp_path / "kto.jsonl",
        [
            {"prompt": "p", "completion": "good", "label": True},
            {"prompt": "p", "completion": "bad", "label": "false"},
            {"prompt": "q", "completion": "fine", "label": 1},
        ],
    )
    assert data.check(path, "preference") == [{"prompt": "p", "chosen": "good", "rejected": "bad"}]
    assert data.check(path, "sft") == [{"prompt": "p", "completion": "good"}, {"prompt": "q", "completion": "fine"}]
    assert [r["label"] for r in data.check(path, "kto")] == [True, False, True]
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "p", "chosen": "a", "rejected": "b"}])
    assert data.check(pairs, "kto") == [
        {"prompt": "p", "completion": "a", "label": True},
        {"prompt": "p", "completion": "b", "label": False},
    ]
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "p", "completion": "a", "label": "maybe"}])
    with pytest.raises(UserError, match=r"bad.jsonl:1: column label must be true or false"):
        data.check(bad, "kto")


def test_column_mapping_renames_and_reaches_nested_fields(tmp_path):
    path = write_jsonl(
        tmp_path / "qa.jsonl", [{"question": "1+1=", "meta": {"gt": "2"}}, {"question": "2+2=", "meta": {"gt": "4"}}]
    )
    with pytest.raises(UserError, match=r"qa.jsonl:1 has columns \['meta', 'question'\].*data.columns"):
        data.check(path, "rl", "answer")
    rows = data.check(path, "rl", "answer", columns={"prompt": "question", "answer": "meta.gt"})
    assert rows == [
        {"prompt": "1+1=", "meta": {"gt": "2"}, "answer": "2"},
        {"prompt": "2+2=", "meta": {"gt": "4"}, "answer": "4"},
    ]


# -------------------------------------------------------------------------------------------- errors
def test_errors_name_the_file_and_line_or_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad_csv = tmp_path / "d.csv"
    bad_csv.write_text('prompt,answer\n"1+1=",2\n"2+2=",\n')
    with pytest.raises(UserError, match=r"d.csv:3: column\(s\) answer must be non-empty"):
        data.check(bad_csv, "rl", "answer")
    pq.write_table(
        pa.Table.from_pylist([{"prompt": "a", "answer": "1"}, {"prompt": "", "answer": "2"}]), tmp_path / "p.parquet"
    )
    with pytest.raises(UserError, match=r"p.parquet row 2: column\(s\) prompt must be non-empty text"):
        data.check(tmp_path / "p.parquet", "rl", "answer")
    verl = verl_rows(2)
    del verl[1]["reward_model"]["ground_truth"]
    pq.write_table(pa.Table.from_pylist(verl), tmp_path / "v.parquet")
    with pytest.raises(UserError, match=r"v.parquet row 2 lacks column\(s\) reward_model.ground_truth"):
        data.check(tmp_path / "v.parquet", "rl", "answer")
    (tmp_path / "d.txt").write_text("hello")
    with pytest.raises(UserError, match=r"Unsupported dataset file type '.txt'"):
        data.check(tmp_path / "d.txt", "sft")
    (tmp_path / "arr.json").write_text('[{"prompt": "a"},\n 3]')
    with pytest.raises(UserError, match=r"arr.json row 2 must be a JSON object"):
        data.check(tmp_path / "arr.json", "rl")
    with pytest.raises(UserError, match="Dataset file not found"):
        data.check(tmp_path / "missing.parquet", "rl")


def test_plan_reports_recognised_formats(tmp_path):
    write_jsonl(tmp_path / "sft.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    write_jsonl(tmp_path / "rl.jsonl", [{"q": "1+1=", "gt": "2"}])
    proc = rlctl(
        "plan", "--preset", "tiny-demo", "--stages", "sft,rl", "--json",
        "--set", "data.generate=null", "--set", "data.sft=sft.jsonl", "--set", "data.rl=rl.jsonl",
        "--set", "data.eval=openai/gsm8k:main@test", "--set", "data.columns={prompt: q, answer: gt}",
        "--set", "rl.rewards=[{name: exact_match}]",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["data"]
    assert report["sft"]["format"] == "messages" and report["sft"]["rows"] == 1
    assert report["rl"]["format"] == "prompt_answer"
    assert report["eval"]["format"] == "hub" and report["eval"]["source"] == "hf://openai/gsm8k:main@test"


@pytest.mark.slow
def test_verl_parquet_trains_without_conversion(tmp_path):
    """A verl parquet written the way verl's preprocessing writes it (datasets' to_parquet), passed as is."""
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(verl_rows(32)).to_parquet(str(tmp_path / "train.parquet"))
    datasets.Dataset.from_list(verl_rows(8, "test")).to_parquet(str(tmp_path / "test.parquet"))
    run_dir = tmp_path / "run"
    proc = rlctl(
        "train", "--preset", "tiny-demo", "--stages", "rl", "--run-dir", str(run_dir),
        "--set", "data.generate=null", "--set", "data.rl=train.parquet", "--set", "data.eval=test.parquet",
        "--set", "rl.rewards=[{name: verl}]", "--set", "rl.max_steps=2", "--set", "rl.prompts_per_step=4",
        "--set", "rl.group_size=2", "--set", "rl.eval_samples=8", "--set", "data.max_prompt_length=56",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rl: " in proc.stdout and "verl" in proc.stdout, "the recognised format is reported"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["completed"] == ["rl"] and "eval_reward" in summary["stages"]["rl"]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("stage") == "rl" and r.get("step") == 2 and "reward" in r for r in records)
    assert (run_dir / "rl" / "final" / "model.safetensors").is_file()


def test_plan_samples_large_files(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setattr(data, "PEEK_ABOVE_BYTES", 1)
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(500)]
    write_jsonl(tmp_path / "big.jsonl", [*rows, {"prompt": "late", "answer": ""}])
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "big.parquet")
    (tmp_path / "big.csv").write_text("prompt,answer\n" + "".join(f"{r['prompt']},{r['answer']}\n" for r in rows))
    for name, total in (("big.jsonl", 501), ("big.parquet", 500), ("big.csv", 500)):
        info = data.describe(tmp_path / name, "rl", "answer")
        assert info.rows == total and info.format == "prompt_answer", name
        assert "first 50 rows checked" in info.notes[-1]
    with pytest.raises(UserError, match=r"big.jsonl:501: column\(s\) answer must be non-empty"):
        data.check(tmp_path / "big.jsonl", "rl", "answer")  # training still checks every row


# ------------------------------------------------------------------------------ one kind per column
def test_answers_become_text_as_the_rewards_read_them_and_build_a_dataset(tmp_path):
    from datasets import Dataset

    rows = [{"prompt": "a", "answer": 12}, {"prompt": "b", "answer": 12.0}, {"prompt": "c", "answer": "12"}]
    rows.append({"prompt": "d", "answer": [3, "3.0"]})  # several acceptable answers
    path = write_jsonl(tmp_path / "rl.jsonl", rows[:3])
    got = data.check(path, "rl", "answer")
    assert [r["answer"] for r in got] == ["12", "12.0", "12"], "str() of what the file holds, as exact_match reads it"
    Dataset.from_list(got)  # what the stages build: it failed with ArrowInvalid on the raw rows
    with pytest.raises(Exception, match="convert"):
        Dataset.from_list(rows[:3])
    listed = data.check(write_jsonl(tmp_path / "l.jsonl", rows[3:]), "rl", "answer")
    assert listed[0]["answer"] == ["3", "3.0"]


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        (
            [{"prompt": "1+1=", "answer": "2"}, {"prompt": [{"role": "user", "content": "2+2="}], "answer": "4"}],
            r"rl.jsonl:2: prompt is a list of messages here but text in .*rl.jsonl:1",
        ),
        (
            [
                {"prompt": [{"role": "user", "content": "x"}], "answer": "2"},
                {"prompt": [{"role": "user"}], "answer": "4"},
            ],
            r"rl.jsonl:2: column prompt has a user message with no content",
        ),
        ([{"prompt": [{"role": "user", "content": ""}], "answer": "2"}], r"rl.jsonl:1: .*user message with empty"),
        ([{"prompt": [{"role": "user", "content": None}], "answer": "2"}], r"rl.jsonl:1: .*with null content"),
        ([{"prompt": ["hi"], "answer": "2"}], r"rl.jsonl:1: column prompt holds text where a message"),
        (
            [{"prompt": "a", "answer": "2", "meta": {"k": 1}}, {"prompt": "b", "answer": "3", "meta": {"k": "x"}}],
            r"rl.jsonl:2: meta.k is text here but a number in .*rl.jsonl:1",
        ),
    ],
)
def test_rows_of_another_kind_are_refused_by_file_and_line(tmp_path, rows, match):
    with pytest.raises(UserError, match=match):
        data.check(write_jsonl(tmp_path / "rl.jsonl", rows), "rl", "answer")


def test_messages_may_be_empty_only_where_chat_data_has_them(tmp_path):
    messages = [
        {"role": "system", "content": ""},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "calc", "arguments": "{}"}}]},
        {"role": "tool", "content": "4"},
        {"role": "assistant", "content": "4"},
    ]
    assert data.check(write_jsonl(tmp_path / "sft.jsonl", [{"messages": messages}]), "sft")[0]["messages"] == messages


def test_far_over_rows_are_bounded_not_encoded():
    from rlctl.data import tokens

    tok = tokens.FileTokenizer.builtin(["hello world", "1+1=2"], 300, None)
    per_token = tokens.max_token_bytes(tok)
    row = {"prompt": "hello " * 20_000}
    bound = tokens.far_over(row, "rl", 16, per_token)
    assert bound is not None and 16 < bound <= tokens.length(row, tok, "rl")
    assert tokens.bounded_length(row, tok, "rl", 16, per_token) == bound
    short = {"prompt": "hello world"}
    assert tokens.bounded_length(short, tok, "rl", 16, per_token) == tokens.length(short, tok, "rl")


def test_builtin_tokenizer_counts_as_the_one_training_builds():
    from rlctl.data import tokens
    from rlctl.stages import tiny

    texts = ["12+3=15", "What's the answer?", "hello there, how are you", "日本語 café"]
    light, real = tokens.FileTokenizer.builtin(texts, 300, None), tiny.train_tokenizer(texts, 300)
    messages = [{"role": "user", "content": "12+3="}, {"role": "assistant", "content": "15"}]
    for stage, row in [("rl", {"prompt": "What's 12+3?"}), ("sft", {"messages": messages}), ("sft", {"text": "café"})]:
        assert tokens.length(row, light, stage) == tokens.length(row, real, stage)


def test_a_tiny_tokenizer_of_sums_has_merges_and_keeps_the_sums_in_bytes():
    """Sums give no pair to merge (Qwen2's regex splits digits one by one): the tiny tokenizer then also learns
    ChatML's role names, so that it has merges (a GGUF file cannot hold a BPE without), and the sums keep their
    one token per character."""
    from rlctl.data import tokens

    texts = [f"{a}+{b}=" for a in range(60) for b in range(10)] + [str(n) for n in range(70)]
    tok = tokens.train_bpe(texts, 320)
    assert json.loads(tok.to_str())["model"]["merges"]
    assert all(len(tok.encode(text).ids) == len(text) for text in texts)
    assert len(tok.encode("assistant").ids) < len("assistant")


# ------------------------------------------------------------------------------------ explicit data
def test_user_files_beat_the_presets_generated_task_and_the_plan_says_who_reads_what(tmp_path):
    write_jsonl(tmp_path / "sft.jsonl", [{"prompt": "1+1=", "completion": "2"}])
    write_jsonl(tmp_path / "rl.jsonl", RL_ROWS)
    (tmp_path / "c.yaml").write_text(
        "defaults: [tiny-demo]\nstages: [sft, rl]\nrl: {rewards: [{name: exact_match}]}\n"
        "data: {sft: sft.jsonl, rl: rl.jsonl, eval: rl.jsonl}\n"
    )
    proc = rlctl("plan", "--config", "c.yaml", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["data"]
    assert {role: (r["source"], r["stages"]) for role, r in report.items()} == {
        "sft": ("sft.jsonl", ["sft"]),
        "rl": ("rl.jsonl", ["rl"]),
        "eval": ("rl.jsonl", ["eval"]),
    }
    console = rlctl("plan", "--config", "c.yaml", cwd=tmp_path)
    assert "held-out eval" in console.stdout and "generated" not in console.stdout
