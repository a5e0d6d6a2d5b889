"""The bad-input corpus: every case exits 2 before anything starts, without a traceback, and the message
names the key, file or row at fault."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

from tests.helpers import rlctl

GOOD_RL = '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": "4"}\n'

# (id, files to write {name: text}, argv after `rlctl`, substrings the message must contain)
CASES = [
    ("top-level-typo", {}, ["plan", "--preset", "tiny-demo", "--set", "modle.dtype=float32"], ["modle", "model"]),
    (
        "nested-typo",
        {},
        ["plan", "--preset", "tiny-demo", "--set", "rl.lerning_rate=1e-5"],
        ["rl.lerning_rate", "learning_rate"],
    ),
    ("sft-typo", {}, ["plan", "--preset", "tiny-demo", "--set", "sft.max_step=3"], ["sft.max_step", "max_steps"]),
    ("wrong-type", {}, ["plan", "--preset", "tiny-demo", "--set", "rl.max_steps=abc"], ["rl.max_steps"]),
    ("negative-lr", {}, ["plan", "--preset", "tiny-demo", "--set", "sft.learning_rate=-1"], ["sft.learning_rate"]),
    ("huge-lr", {}, ["plan", "--preset", "tiny-demo", "--set", "rl.learning_rate=5"], ["rl.learning_rate"]),
    ("group-of-one", {}, ["plan", "--preset", "tiny-demo", "--set", "rl.group_size=1"], ["rl.group_size"]),
    ("clip-out-of-range", {}, ["plan", "--preset", "tiny-demo", "--set", "rl.loss.clip_low=1.5"], ["rl.loss.clip_low"]),
    ("zero-temperature", {}, ["plan", "--preset", "tiny-demo", "--set", "rl.temperature=0"], ["rl.temperature"]),
    ("no-stages", {}, ["plan", "--preset", "tiny-demo", "--set", "stages=[]"], ["stages"]),
    ("stage-twice", {}, ["plan", "--preset", "tiny-demo", "--set", "stages=[sft,sft]"], ["stages", "twice"]),
    ("unknown-stage", {}, ["plan", "--preset", "tiny-demo", "--set", "stages=[sft,ppo]"], ["stages"]),
    (
        "kv-heads-not-dividing",
        {},
        ["plan", "--preset", "tiny-demo", "--set", "model.arch.kv_heads=3"],
        ["kv_heads (3)"],
    ),
    ("bad-dtype", {}, ["plan", "--preset", "tiny-demo", "--set", "model.dtype=fp8"], ["model.dtype"]),
    ("bad-adapter", {}, ["plan", "--preset", "tiny-demo", "--set", "model.adapter=qlora2"], ["model.adapter"]),
    ("bad-hw-key", {}, ["plan", "--preset", "tiny-demo", "--set", "hardware.spec=banana"], ["banana"]),
    (
        "zero-processes",
        {},
        ["plan", "--preset", "tiny-demo", "--set", "hardware.num_processes=0"],
        ["hardware.num_processes"],
    ),
    ("unknown-algorithm-key", {}, ["plan", "--preset", "tiny-demo", "--set", "rl.algorithm=gpro"], ["gpro", "grpo"]),
    ("unknown-algorithm-flag", {}, ["plan", "--preset", "tiny-demo", "--algorithm", "gpro"], ["gpro", "grpo"]),
    ("unknown-preset", {}, ["plan", "--preset", "qwen7b-grop"], ["qwen7b-grop", "qwen7b-grpo"]),
    ("preset-as-a-path", {}, ["plan", "--preset", "./tiny-demo"], ["preset './tiny-demo'", "Did you mean: tiny-demo"]),
    ("preset-under-a-folder", {}, ["plan", "--preset", "tiny-demo/x"], ["Unknown preset 'tiny-demo/x'"]),
    ("preset-as-a-yaml-path", {}, ["plan", "--preset", "../c/run.yaml"], ["preset '../c/run.yaml'", "--config"]),
    ("key-in-the-section-above", {}, ["plan", "--preset", "tiny-demo", "--set", "rl.kl.beta=0.1"], ["rl.beta?"]),
    ("bad-hardware-flag", {}, ["plan", "--preset", "tiny-demo", "--hardware", "1xH100"], ["1xH100"]),
    ("missing-config-file", {}, ["plan", "--config", "{tmp}/nope.yaml"], ["nope.yaml"]),
    ("malformed-config", {"c.yaml": "rl:\n  beta: [1, 2\n"}, ["plan", "--config", "{tmp}/c.yaml"], ["c.yaml:"]),
    ("config-not-text", {"c.yaml": b"\xff\xfeseed: 1\n"}, ["plan", "--config", "{tmp}/c.yaml"], ["c.yaml", "UTF-8"]),
    ("config-is-a-folder", {"c.yaml/x": ""}, ["plan", "--config", "{tmp}/c.yaml"], ["c.yaml", "folder"]),
    ("config-not-mapping", {"c.yaml": "- a\n- b\n"}, ["plan", "--config", "{tmp}/c.yaml"], ["c.yaml", "mapping"]),
    (
        "config-is-a-dataset",
        {"c.yaml": GOOD_RL * 40_000},
        ["plan", "--config", "{tmp}/c.yaml"],
        ["c.yaml is too large for a config file (2.6 MiB", "data.rl=FILE"],
    ),
    ("config-is-endless", {}, ["plan", "--config", "/dev/zero"], ["/dev/zero is too large for a config file (over"]),
    (
        "config-bad-default",
        {"c.yaml": "defaults: [tiny-dem]\n"},
        ["plan", "--config", "{tmp}/c.yaml"],
        ["tiny-dem", "tiny-demo"],
    ),
    (
        "config-typo",
        {"c.yaml": "defaults: [tiny-demo]\nrl:\n  grup_size: 4\n"},
        ["plan", "--config", "{tmp}/c.yaml"],
        ["rl.grup_size", "group_size"],
    ),
    (
        "config-hydra-defaults",
        {"c.yaml": "defaults: [tiny-demo, {rl: grpo}]\n"},
        ["plan", "--config", "{tmp}/c.yaml"],
        ["c.yaml", "defaults: [tiny-demo, grpo]", "--algorithm grpo"],
    ),
    ("config-defaults-number", {"c.yaml": "defaults: 5\n"}, ["plan", "--config", "{tmp}/c.yaml"], ["defaults"]),
    (
        "config-defaults-null-entry",
        {"c.yaml": "defaults: [tiny-demo, null]\n"},
        ["plan", "--config", "{tmp}/c.yaml"],
        ["c.yaml", "null"],
    ),
    (
        "reward-weight-nan",
        {"c.yaml": "defaults: [tiny-demo]\nrl:\n  rewards: [{name: exact_match, weight: .nan}]\n"},
        ["plan", "--config", "{tmp}/c.yaml"],
        ["rl.rewards.0.weight", "finite"],
    ),
    ("temperature-inf", {}, ["plan", "--preset", "tiny-demo", "--set", "rl.temperature=.inf"], ["rl.temperature"]),
    ("negative-seed", {}, ["plan", "--preset", "tiny-demo", "--set", "seed=-1"], ["seed", "greater than or equal"]),
    ("seed-over-32-bits", {}, ["plan", "--preset", "tiny-demo", "--set", "seed=4294967296"], ["seed", "4294967295"]),
    ("max-steps-true", {}, ["plan", "--preset", "tiny-demo", "--set", "sft.max_steps=true"], ["sft.max_steps"]),
    (
        "generate-and-files-in-one-layer",
        {"c.yaml": "defaults: [tiny-demo]\ndata: {generate: arithmetic, rl: rl.jsonl}\n", "rl.jsonl": GOOD_RL},
        ["train", "--config", "{tmp}/c.yaml"],
        ["--set data.generate=null"],
    ),
    ("set-without-equals", {}, ["plan", "--preset", "tiny-demo", "--set", "rl.beta"], ["key=value"]),
    ("set-empty-key", {}, ["plan", "--preset", "tiny-demo", "--set", "=3"], ["empty key"]),
    ("rm-reward-without-rm", {}, ["plan", "--preset", "tiny-demo", "--stages", "sft,rl"], ["reward_model"]),
    (
        "batch-not-divisible",
        {},
        ["plan", "--preset", "tiny-demo", "--set", "hardware.num_processes=3"],
        ["divide", "3"],
    ),
    (
        "micro-not-dividing",
        {},
        ["plan", "--preset", "tiny-demo", "--set", "sft.micro_batch_size=5"],
        ["sft.micro_batch_size"],
    ),
    ("bad-tracker", {}, ["plan", "--preset", "tiny-demo", "--set", "logging.report_to=[foo]"], ["logging.report_to"]),
    ("keep-zero", {}, ["plan", "--preset", "tiny-demo", "--set", "checkpoint.keep_last=0"], ["checkpoint.keep_last"]),
    ("vllm-on-cpu", {}, ["plan", "--preset", "tiny-demo", "--set", "rl.use_vllm=true"], ["rl.use_vllm"]),
    (
        "unknown-reward",
        {"rl.jsonl": GOOD_RL},
        [
            "train",
            "--preset",
            "qwen0.5b-grpo",
            "--set",
            "data.rl={tmp}/rl.jsonl",
            "--set",
            "rl.rewards=[{name: exact_mach}]",
        ],
        ["exact_mach", "exact_match"],
    ),
    (
        "plugin-file-missing",
        {"rl.jsonl": GOOD_RL},
        [
            "train",
            "--preset",
            "qwen0.5b-grpo",
            "--set",
            "data.rl={tmp}/rl.jsonl",
            "--set",
            "rl.rewards=[{name: '{tmp}/r.py:f'}]",
        ],
        ["r.py"],
    ),
    (
        "tool-typo",
        {},
        ["plan", "--preset", "tiny-demo", "--algorithm", "dapo", "--set", "rl.tools=[calculater]"],
        ["calculater", "Did you mean: calculator"],
    ),
    (
        "tool-plugin-import-error",
        {"t.py": "import does_not_exist_anywhere\n"},
        ["plan", "--preset", "tiny-demo", "--algorithm", "dapo", "--set", "rl.tools=['{tmp}/t.py:f']"],
        ["t.py", "does_not_exist_anywhere"],
    ),
    (
        "tool-without-docstring",
        {"t.py": "def f(x: int) -> int:\n    return x\n"},
        ["train", "--preset", "tiny-demo", "--algorithm", "dapo", "--set", "rl.tools=['{tmp}/t.py:f']"],
        ["rl.tools", "t.py:f", "no docstring"],
    ),
    (
        "row-offers-an-unknown-tool",
        {"rl.jsonl": '{"prompt": "1+1=", "answer": "2", "tools": [{"function": {"name": "serch"}}]}\n'},
        ["plan", "--preset", "qwen1.5b-tool-grpo", "--set", "data.rl={tmp}/rl.jsonl"],
        ["row 1", "serch", "rl.tools: calculator, python"],
    ),
    (
        "row-binds-an-argument-its-tool-lacks",
        {
            "rl.jsonl": '{"prompt": "1+1=", "answer": "2", "extra_info": {"tools_kwargs": '
            '{"calculator": {"create_kwargs": {"expresion": "1+1"}}}}}\n'
        },
        ["plan", "--preset", "qwen1.5b-tool-grpo", "--set", "data.rl={tmp}/rl.jsonl"],
        ["row 1", "tools_kwargs", "expresion", "Did you mean: expression"],
    ),
    (
        "plugin-function-missing",
        {"rl.jsonl": GOOD_RL, "r.py": "def score(prompts, completions, **kw):\n    return [0.0]\n"},
        [
            "train",
            "--preset",
            "qwen0.5b-grpo",
            "--set",
            "data.rl={tmp}/rl.jsonl",
            "--set",
            "rl.rewards=[{name: '{tmp}/r.py:scor'}]",
        ],
        ["scor", "score"],
    ),
    (
        "plugin-import-error",
        {"rl.jsonl": GOOD_RL, "r.py": "import does_not_exist_anywhere\n"},
        [
            "train",
            "--preset",
            "qwen0.5b-grpo",
            "--set",
            "data.rl={tmp}/rl.jsonl",
            "--set",
            "rl.rewards=[{name: '{tmp}/r.py:f'}]",
        ],
        ["r.py", "does_not_exist_anywhere"],
    ),
    (
        "missing-rl-file",
        {},
        ["train", "--preset", "qwen0.5b-grpo", "--set", "data.rl={tmp}/missing.jsonl"],
        ["missing.jsonl"],
    ),
    (
        "malformed-jsonl",
        {"rl.jsonl": GOOD_RL + '{"prompt": "3+3=", oops}\n'},
        ["train", "--preset", "qwen0.5b-grpo", "--set", "data.rl={tmp}/rl.jsonl"],
        ["rl.jsonl:3"],
    ),
    (
        "empty-file",
        {"rl.jsonl": ""},
        ["train", "--preset", "qwen0.5b-grpo", "--set", "data.rl={tmp}/rl.jsonl"],
        ["rl.jsonl", "empty"],
    ),
    (
        "row-not-object",
        {"rl.jsonl": GOOD_RL + "[1, 2]\n"},
        ["train", "--preset", "qwen0.5b-grpo", "--set", "data.rl={tmp}/rl.jsonl"],
        ["rl.jsonl:3"],
    ),
    (
        "missing-answer",
        {"rl.jsonl": '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="}\n'},
        ["train", "--preset", "qwen0.5b-grpo", "--set", "data.rl={tmp}/rl.jsonl"],
        ["rl.jsonl:2", "answer"],
    ),
    (
        "missing-prompt",
        {"rl.jsonl": '{"question": "1+1=", "answer": "2"}\n'},
        ["train", "--preset", "qwen0.5b-grpo", "--set", "data.rl={tmp}/rl.jsonl"],
        ["rl.jsonl", "prompt"],
    ),
    (
        "empty-prompt",
        {"rl.jsonl": '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "", "answer": "2"}\n'},
        ["train", "--preset", "qwen0.5b-grpo", "--set", "data.rl={tmp}/rl.jsonl"],
        ["rl.jsonl:2", "prompt"],
    ),
    (
        "sft-wrong-columns",
        {"sft.jsonl": '{"question": "a", "reply": "b"}\n'},
        ["train", "--preset", "qwen7b-sft", "--set", "data.sft={tmp}/sft.jsonl"],
        ["sft.jsonl", "completion"],
    ),
    (
        "preference-no-rejected",
        {"p.jsonl": '{"prompt": "a", "chosen": "b"}\n'},
        ["train", "--preset", "qwen7b-dpo", "--set", "data.preference={tmp}/p.jsonl"],
        ["p.jsonl", "rejected"],
    ),
    (
        "rl-prompts-text-and-messages",
        {"rl.jsonl": GOOD_RL + '{"prompt": [{"role": "user", "content": "3+3="}], "answer": "6"}\n'},
        ["train", "--preset", "qwen0.5b-grpo", "--set", "data.rl={tmp}/rl.jsonl"],
        ["rl.jsonl:3", "prompt", "list of messages"],
    ),
    (
        "preference-text-then-message-replies",
        {
            "p.jsonl": '{"prompt": "a", "chosen": "b", "rejected": "c"}\n'
            '{"prompt": "a", "chosen": [{"role": "assistant", "content": "b"}], "rejected": "c"}\n'
        },
        ["train", "--preset", "qwen7b-dpo", "--set", "data.preference={tmp}/p.jsonl"],
        ["p.jsonl:2", "A text prompt whose completion, chosen or rejected is a message list counts as a message list"],
    ),
    (
        "sft-assistant-message-without-content",
        {"sft.jsonl": '{"messages": [{"role": "user", "content": "1+2="}, {"role": "assistant"}]}\n'},
        ["train", "--preset", "qwen7b-sft", "--set", "data.sft={tmp}/sft.jsonl"],
        ["sft.jsonl:1", "has an assistant message with no content (message 2)"],
    ),
    *[
        (
            f"code-tests-that-{what}",
            {
                "rl.jsonl": '{"prompt": "add", "tests": "assert add(1, 1) == 2"}\n{"prompt": "sub", "tests": '
                + tests
                + "}\n"
            },
            [
                "plan",
                "--preset",
                "tiny-demo",
                "--stages",
                "rl",
                "--set",
                "data.generate=null",
                "--set",
                "data.rl={tmp}/rl.jsonl",
                "--set",
                "data.answer_field=tests",
                "--set",
                "rl.rewards=[{name: code_tests}]",
            ],
            ["data.rl row 2: its tests (for the code_tests reward)", said],
        )
        for what, tests, said in [
            ("assert-nothing", '"x = 1"', "every completion, even an empty one, would pass"),
            ("are-a-number", "5", "assert nothing"),
            ("do-not-parse", '"assert sub(1, 1) =="', "are not Python"),
        ]
    ],
    (
        "answers-text-and-list",
        {"rl.jsonl": '{"prompt": "a", "answer": 12}\n{"prompt": "b", "answer": [12]}\n'},
        ["train", "--preset", "qwen0.5b-grpo", "--set", "data.rl={tmp}/rl.jsonl"],
        ["rl.jsonl:2", "every answer text, or every answer a list"],
    ),
    (
        "rl-message-without-content",
        {"rl.jsonl": '{"prompt": [{"role": "user"}], "answer": "6"}\n'},
        ["train", "--preset", "qwen0.5b-grpo", "--set", "data.rl={tmp}/rl.jsonl"],
        ["rl.jsonl:1", "no content"],
    ),
    (
        "prompt-over-length-refused-on-builtin-tiny",
        {"rl.jsonl": GOOD_RL + '{"prompt": "' + "one two three " * 300 + '", "answer": "6"}\n'},
        [
            "train",
            "--preset",
            "tiny-demo",
            "--stages",
            "rl",
            "--set",
            "data.generate=null",
            "--set",
            "data.rl={tmp}/rl.jsonl",
            "--set",
            "rl.rewards=[{name: exact_match}]",
            "--set",
            "data.over_length=refuse",
        ],
        ["rl.jsonl:3", "data.max_prompt_length=16", "over_length=refuse"],
    ),
    (
        "sft-rows-over-max-length-at-plan",
        {"sft.jsonl": '{"prompt": "' + "one two three " * 30 + '", "completion": "x"}\n'},
        [
            "plan",
            "--preset",
            "tiny-demo",
            "--stages",
            "sft",
            "--set",
            "data.generate=null",
            "--set",
            "data.sft={tmp}/sft.jsonl",
        ],
        ["sft.max_length=16", "nothing would be left"],
    ),
    ("no-data-for-stage", {}, ["train", "--preset", "qwen7b-grpo"], ["data.rl"]),
    (
        "parquet-not-parquet",
        {"rl.parquet": b"PAR1 not really \x00\x01"},
        ["plan", "--preset", "qwen0.5b-grpo", "--set", "data.rl={tmp}/rl.parquet"],
        ["Cannot read parquet file", "rl.parquet"],
    ),
    (
        "save-to-disk-folder-damaged",
        {"ds/state.json": '{"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}', "ds/dataset_info.json": "{}"},
        ["plan", "--preset", "qwen0.5b-grpo", "--set", "data.rl={tmp}/ds"],
        ["ds looks like a datasets save_to_disk folder but cannot be read", "FileNotFoundError"],
    ),
    (
        "json-not-array",
        {"rl.json": '"just a string"'},
        ["train", "--preset", "qwen0.5b-grpo", "--set", "data.rl={tmp}/rl.json"],
        ["rl.json", "array"],
    ),
]


# cases that are bad input only on some installs
MARKS = {"vllm-on-cpu": pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")}


@pytest.mark.parametrize(
    ("files", "argv", "needles"), [pytest.param(*c[1:], id=c[0], marks=MARKS.get(c[0], ())) for c in CASES]
)
def test_bad_input_exits_2_with_a_clear_message(tmp_path: Path, files, argv, needles):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    run_dir = tmp_path / "run"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if argv[0] == "train":
        argv += ["--run-dir", str(run_dir)]
    proc = rlctl(*argv, cwd=tmp_path)
    out = (proc.stdout + proc.stderr).replace("\n", " ")
    assert proc.returncode == 2, out
    assert "Traceback" not in out, out
    assert out.count("error:") == 1, "one paragraph"
    for needle in needles:
        assert needle.replace("{tmp}", str(tmp_path)) in out, (needle, out)
    assert not run_dir.exists(), "nothing was written"


def test_corpus_is_large_enough():
    assert len(CASES) >= 40


def test_huge_rows_are_judged_at_once(tmp_path: Path):
    """A 5 MB record is refused before it is parsed, naming its line; a 3 MB word under that bound is counted
    without training the builtin tokenizer on all of it (quadratic in a word's length: hours). The timeout is only
    a safety net; unbounded, each would run for far longer."""
    letters = random.Random(0).choices("abcdefgh", k=3 << 20)
    word = '{"prompt": "' + "".join(letters) + '", "answer": "2"}\n'
    record = '{"prompt": "' + "x" * (5 << 20) + '", "answer": "2"}\n'
    for name, text, said in [
        ("word.jsonl", GOOD_RL + word, "1 of 3 rl rows (33%) are longer than data.max_prompt_length"),
        ("record.jsonl", GOOD_RL + record, "record.jsonl:3 is a row of 5.0 M characters"),
    ]:
        (tmp_path / name).write_text(text)
        sets = ["--set", "data.generate=null", "--set", f"data.rl={tmp_path / name}"]
        proc = rlctl("plan", "--preset", "tiny-demo", *sets, cwd=tmp_path, timeout=120)
        out = " ".join((proc.stdout + proc.stderr).split())
        assert proc.returncode == 2 and "Traceback" not in out and said in out, out
