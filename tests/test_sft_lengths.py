"""SFT drops rows longer than sft.max_length (counted and reported), for every row layout."""

from __future__ import annotations

import pytest

from rlctl import tiny
from rlctl.stages.sft import _fits


@pytest.fixture(scope="module")
def tok():
    return tiny.train_tokenizer(["12+3=15", "hello there, how are you"], 300)


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
def test_length_filter_counts_the_real_tokens(tok, row):
    if "messages" in row or isinstance(row.get("prompt"), list):
        messages = row.get("messages") or row["prompt"] + row["completion"]
        n = len(tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
    else:
        n = len(tok(row.get("text") or row["prompt"] + row["completion"])["input_ids"]) + 1  # + EOS
    assert n > 5, "the row is longer than the small limits below"
    assert _fits(row, tok, n)
    assert not _fits(row, tok, n - 1)
