"""Credentials out of text rlctl logs or shows: the one place a third party's error message (a tracker, a hub, a
library's exception) is cleaned before it reaches a log, the console, a report or a card."""

from __future__ import annotations

import re

HIDDEN = "***"
# scheme://user:PASSWORD@host -> scheme://user:***@host
_URI_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:)[^\s/@]+@")
# password=..., WANDB_API_KEY: ..., "token": "..." (the value up to a space, quote, comma, semicolon or &); a
# tokenizer's pad_token or eos_token is no secret
_KEY = (
    r"(?:[\w-]*[_-])?(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?key|secret[_-]?key|private[_-]?key)"
    r"|(?:(?:auth|access|api|hf|refresh|session|github|wandb)[_-]?)?token"
)
_NAMED = re.compile(rf"""(?i)(\b(?:{_KEY})["']?\s*[=:]\s*["']?)[^\s"',;&]+""")
_BEARER = re.compile(r"(?i)(\b(?:bearer|basic)\s+)[A-Za-z0-9._~+/=-]{8,}")
_TOKENS = re.compile(r"\b(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,})\b")


def scrub(text: str) -> str:
    """`text` with every credential it quotes replaced by ***: a URI's password, a `password=`/`token:`-style
    value, a Bearer/Basic authorization, and Hugging Face, OpenAI and GitHub tokens."""
    text = _URI_PASSWORD.sub(rf"\g<1>{HIDDEN}@", text)
    text = _NAMED.sub(rf"\g<1>{HIDDEN}", text)
    text = _BEARER.sub(rf"\g<1>{HIDDEN}", text)
    return _TOKENS.sub(HIDDEN, text)
