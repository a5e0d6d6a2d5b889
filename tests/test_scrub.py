"""rlctl.scrub: the credentials a third party's error may quote are replaced by *** before rlctl logs or shows it;
the rest of the text is kept as it was."""

from __future__ import annotations

import pytest

from rlctl.scrub import scrub


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (
            "API request to http://alice:s3cret@127.0.0.1:9/api failed",
            "API request to http://alice:***@127.0.0.1:9/api failed",
        ),
        ("postgresql://u:p%40ss@db:5432/x", "postgresql://u:***@db:5432/x"),
        ("password=hunter2 and token: abc123, next", "password=*** and token: ***, next"),
        ('{"api_key": "xyz"}', '{"api_key": "***"}'),
        ("Authorization: Bearer abcdefghijk", "Authorization: Bearer ***"),
        ("token hf_abcdefghijklmnopqrstuvwxyz refused", "token *** refused"),
        ("HF_TOKEN=abc WANDB_API_KEY: 0123abcd", "HF_TOKEN=*** WANDB_API_KEY: ***"),
    ],
)
def test_credentials_are_hidden(text: str, want: str):
    assert scrub(text) == want


@pytest.mark.parametrize(
    "text",
    [
        "https://user@host/x",
        "max_new_tokens=32 at http://host:8080/a",
        "loss 3.0 at step 4 (rl.kl.beta=0.1)",
        "pad_token: <pad>, eos_token='</s>'",
    ],
)
def test_text_without_credentials_is_kept(text: str):
    assert scrub(text) == text
