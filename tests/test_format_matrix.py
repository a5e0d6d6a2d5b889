"""Every dataset format of the ecosystem trains in every stage that accepts it: TRL's matrix (standard and
conversational x language modelling, prompt-completion, prompt-only, preference with an explicit and an implicit
prompt, unpaired preference), chats with a system turn, mixed rows (message-list prompt, text completion), verl's
and BIG-bench's layouts, and RL rows that carry their own tools. One cell, one short run of the stage on the tiny
model: it must recognise the format, train two steps with a finite loss, and finish."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.helpers import rlctl, strict_records, summary

PAIRS = [(a, b) for a in range(1, 7) for b in range(1, 4)]  # 18 sums


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _bot(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def _rows(cell: str) -> list[dict]:
    """The rows of `cell`: each a small sum, right and wrong answers where the format has both (unpaired rows:
    the right one desirable, the wrong one not)."""
    out = []
    for i, (a, b) in enumerate(PAIRS):
        p, good, bad = f"{a}+{b}=", str(a + b), str(a + b + 1)
        if cell in ("kto", "kto_conv"):
            prompt, wrap = (p, str) if cell == "kto" else (_user(p), _bot)
            out += [{"prompt": prompt, "completion": wrap(c), "label": c == good} for c in (good, bad)]
            continue
        out.append(
            {
                "text": {"text": p + good},
                "messages": {"messages": _user(p) + _bot(good)},
                "messages_system": {"messages": [{"role": "system", "content": "Add."}, *_user(p), *_bot(good)]},
                "prompt_completion": {"prompt": p, "completion": good},
                "prompt_completion_conv": {"prompt": _user(p), "completion": _bot(good)},
                "mixed": {"prompt": _user(p), "completion": good},
                "preference": {"prompt": p, "chosen": good, "rejected": bad},
                "preference_conv": {"prompt": _user(p), "chosen": _bot(good), "rejected": _bot(bad)},
                "implicit": {"chosen": p + good, "rejected": p + bad},
                "implicit_conv": {"chosen": _user(p) + _bot(good), "rejected": _user(p) + _bot(bad)},
                "prompt_only": {"prompt": p, "answer": good},
                "prompt_only_conv": {"prompt": _user(p), "answer": good},
                "verl": {
                    "prompt": _user(p),
                    "data_source": "sums",
                    "reward_model": {"style": "rule", "ground_truth": good},
                    "extra_info": {"index": i},
                },
                "tools": {
                    "prompt": _user(p),
                    "answer": good,
                    "tools": [
                        {
                            "type": "function",
                            "function": {
                                "name": "calculator",
                                "description": "Exact arithmetic on an expression.",
                                "parameters": {
                                    "type": "object",
                                    "properties": {"expression": {"type": "string"}},
                                    "required": ["expression"],
                                },
                            },
                        }
                    ],
                },
            }[cell]
        )
    return out


# (cell, stage, the format the data layer must recognise)
CELLS = [
    ("text", "sft", "text"),
    ("messages", "sft", "messages"),
    ("messages_system", "sft", "messages"),
    ("prompt_completion", "sft", "prompt_completion"),
    ("prompt_completion_conv", "sft", "prompt_completion"),
    ("mixed", "sft", "prompt_completion"),
    ("kto", "sft", "kto"),
    ("preference", "rm", "preference"),
    ("preference_conv", "rm", "preference"),
    ("implicit", "rm", "preference_implicit"),
    ("implicit_conv", "rm", "preference_implicit"),
    ("kto", "rm", "kto"),
    ("preference", "dpo", "preference"),
    ("preference_conv", "dpo", "preference"),
    ("implicit", "dpo", "preference_implicit"),
    ("implicit_conv", "dpo", "preference_implicit"),
    ("kto", "kto", "kto"),
    ("kto_conv", "kto", "kto"),
    ("preference", "kto", "preference"),
    ("implicit", "kto", "preference_implicit"),
    ("implicit_conv", "kto", "preference_implicit"),
    ("prompt_only", "rl", "prompt_answer"),
    ("prompt_only_conv", "rl", "prompt_answer"),
    ("verl", "rl", "verl"),
    ("tools", "rl", "prompt_answer"),
]
ROLE = {"sft": "sft", "rm": "preference", "dpo": "preference", "kto": "preference", "rl": "rl"}
SHOWN = {"kto": "kto"}  # the role a stage reads its data as, where it differs from its data.* key


# CI trains the conversational cell of each pair (its template is the harder path) and every cell without one; the
# standard cells whose conversational sibling runs there are `make test-long`'s
SIBLING_IN_CI = {"prompt_completion", "preference", "implicit", "prompt_only"}


def _marked(cell: str, stage: str, fmt: str):
    marks = (
        [pytest.mark.long] if cell in SIBLING_IN_CI and (f"{cell}_conv", stage) in {(c, t) for c, t, _ in CELLS} else []
    )
    return pytest.param(cell, stage, fmt, marks=marks, id=f"{stage}-{cell}")


@pytest.mark.slow
@pytest.mark.parametrize(("cell", "stage", "fmt"), [_marked(*c) for c in CELLS])
def test_format_trains_in_stage(tmp_path: Path, cell: str, stage: str, fmt: str):
    data = tmp_path / f"{cell}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows(cell)))
    role = ROLE[stage]
    sets = {
        "data.generate": "null",
        f"data.{role}": str(data),
        "data.max_prompt_length": 32,
        f"{stage}.max_steps": 2,
        f"{stage}.save_every": 2,
    }
    if stage == "rl":
        sets |= {"rl.prompts_per_step": 2, "rl.group_size": 2, "rl.max_new_tokens": 8, "rl.eval_samples": 2}
        sets["rl.rewards"] = "[{name: exact_match}]"
        if cell == "tools":  # the tool's description in the prompt: the agent demo's compact template and context
            sets |= {"rl.tools": "[calculator]", "rl.agent.max_turns": 2, "data.chat_template": "chatml-compact"}
            sets |= {"model.arch.max_position": 128, "data.max_prompt_length": 40, "rl.max_new_tokens": 24}
    else:
        sets |= {f"{stage}.batch_size": 4, f"{stage}.max_length": 48}
    algorithm = {"dpo": "dpo", "kto": "kto", "rl": "reinforce-pp-baseline"}.get(stage, "grpo")
    args = ["train", "--preset", "tiny-demo", "--stages", stage, "--algorithm", algorithm]
    args += [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    run_dir = tmp_path / "run"
    proc = rlctl(*args, "--run-dir", str(run_dir))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    shown = f"Data {SHOWN.get(stage, role)}: {data}: "
    assert shown in out and f", {fmt} (" in out.split(shown)[1], out
    assert summary(run_dir)["completed"] == [stage]
    losses = [r["loss"] for r in strict_records(run_dir) if r.get("stage") == stage and "loss" in r]
    assert losses and all(math.isfinite(v) for v in losses), losses
