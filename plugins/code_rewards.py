"""A code-execution reward plugin: the completion's Python code must pass the row's unit tests. rlctl ships the
same idea as the built-in `code_tests`; this file shows how such a reward is written as a plugin.

    data.rl rows:  {"prompt": "Write add(a, b) ...", "tests": "assert add(1, 2) == 3"}
    rl:
      rewards:
        - {name: "plugins/code_rewards.py:unit_tests(wall_s=5)", weight: 1.0}

The code runs in rlctl's kernel sandbox (`rlctl.sandbox`: bubblewrap, no network, no view of the host, CPU,
memory, wall-time and output limits; the tests in a second sandboxed process that decides the verdict); any
failure, timeout or refused operation scores 0.0.
"""

from __future__ import annotations

import re

from rlctl.rewards import completion_text
from rlctl.sandbox import Limits, run

_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The last fenced code block of `text`, or the whole text when it has none."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def unit_tests(prompts: list, completions: list, tests: list, wall_s: float = 5.0, **columns) -> list[float]:
    """1.0 when the completion's code passes every assert in the row's `tests` column, else 0.0."""
    limits = Limits(wall_s=wall_s, cpu_s=max(1, int(wall_s)))
    return [
        float(run(extract_code(completion_text(c)), t, limits).passed) for c, t in zip(completions, tests, strict=True)
    ]
