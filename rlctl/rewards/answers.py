"""Answer checking shared by the built-in rewards and plugins: completion text, GSM8K final answers, `\\boxed{}`
contents, and math equality, which is math-verify's (HuggingFace's checker, the one TRL's accuracy reward and
open-r1 use).

Completions and ground truths are untrusted text: math-verify parses them with its LaTeX grammar (an ANTLR parser
building sympy objects) and compares the results; no text is ever evaluated as Python here (a test inspects rlctl
for eval/exec/sympify/parse_expr). A parse or comparison that overruns math-verify's timeout (signal.alarm, so in a
main thread, which is where rlctl's reward workers call rewards) counts as not equal; in any other thread the
timeouts are off and the reward's `timeout_s` deadline is the bound."""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

# math-verify's own defaults: seconds one parse / one comparison may take before it counts as no answer / unequal.
PARSE_TIMEOUT_S = 5
VERIFY_TIMEOUT_S = 5


def completion_text(completion: Any) -> str:
    """The text of a completion, plain or conversational (a list of messages)."""
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


def _truths(answer: Any) -> list[str]:
    """A ground truth as the list of acceptable answers (verl data may hold a list)."""
    if isinstance(answer, list | tuple):
        return [str(a) for a in answer]
    return [str(answer)]


# A number (digits with thousands commas, a decimal part) and the `#### N` final answer. Possessive quantifiers: a
# run of commas or spaces is read once, never re-split, so matching is linear in the text (model output).
_DIGITS = r"-?(?:\d++(?:,++\d++)*+(?:\.\d++)?+|\.\d++)"
_NUMBER = re.compile(_DIGITS + r"(?:[eE][-+]?\d++)?+")
_FINAL = re.compile(r"####\s*+(?:\$\s*+)?+(" + _DIGITS + ")")


def gsm8k_answer(text: str, strict: bool = True) -> str | None:
    """The final answer of a GSM8K-style solution: the number after `####` (strict), or else the last number
    in the text (flexible)."""
    match = _FINAL.findall(text)
    if match:
        return match[-1].replace(",", "")
    if strict:
        return None
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced; None if absent."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        rest = text[start + len("\\boxed") :].strip()  # \boxed 5
        return rest.split("$")[0].strip() or None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def _quiet_math_verify() -> None:
    """math-verify warns on every timeout with the text it was parsing: model output (escape sequences and all)
    would reach the terminal and the logs from inside a reward. A timeout is a 0, said nowhere."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)


def _in_main_thread(seconds: int) -> int | None:
    """`seconds` in the main thread, where math-verify's signal.alarm timeouts work; None (no timeout) in any
    other thread, where setting the alarm would fail and math-verify would score every answer 0."""
    return seconds if threading.current_thread() is threading.main_thread() else None


def _balanced(text: str) -> bool:
    """Whether the braces of `text` pair up (escaped ones too: `\\{1, 2\\}`)."""
    depth = 0
    for ch in text:
        depth += (ch == "{") - (ch == "}")
        if depth < 0:
            return False
    return depth == 0


_INTEGER = re.compile(r"\s*-?(?:\d{1,3}(?:,\d{3}){1,30}|\d{1,90})\s*")  # within int()'s digit limit


def parse_answer(text: str) -> list:
    """The answer `text` (LaTeX or plain: `\\frac{1}{2}`, `\\frac12`, `12 cm`, `[0,1)`, `\\text{B}`) as
    math-verify parses a boxed answer with its default LaTeX normalisation (units dropped, malformed operators
    fixed): [sympy object, string], or [] when it is not an answer (unbalanced braces) or does not parse within
    PARSE_TIMEOUT_S. Only the LaTeX grammar is used (math-verify's plain-expression path goes through sympy's
    parse_expr)."""
    from math_verify import LatexExtractionConfig, parse
    from sympy import Integer

    _quiet_math_verify()

    if _INTEGER.fullmatch(text):  # the number the grammar makes of it, without its ~20 ms parse (most answers)
        return [Integer(int(text.replace(",", ""))), text.strip()]
    if not _balanced(text):  # `a}b{c` would box only `a`
        return []
    config = LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)
    return parse("\\boxed{" + text + "}", [config], "first_match", parsing_timeout=_in_main_thread(PARSE_TIMEOUT_S))


def math_equal(prediction: str, truth: str) -> bool:
    """math-verify's verdict on whether the answer `prediction` equals `truth` (both as `parse_answer` reads
    them): numbers (`\\frac{1}{2}` = `0.5` = `50\\%`), expressions (`2\\sqrt{2}` = `\\sqrt{8}`), intervals,
    sets and tuples, equations (`x = 5` = `5`), text (`\\text{(B)}` = `B`). False when either does not parse or
    the comparison overruns VERIFY_TIMEOUT_S."""
    from math_verify import verify

    gold = parse_answer(truth)
    if not gold:
        return False
    pred = parse_answer(prediction)
    return bool(pred) and verify(gold, pred, timeout_seconds=_in_main_thread(VERIFY_TIMEOUT_S))
