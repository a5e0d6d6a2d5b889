"""Reward functions: built-in rule-based rewards, user plugins and installed entry points.

Every reward has TRL's signature: `fn(prompts, completions, **columns) -> list[float]`, where `columns`
holds the dataset's other columns (the ground truth among them, as `answer`). A reward is named in
`rl.rewards` by:

- a built-in: `exact_match`, `gsm8k`, `boxed`, `verl`, `format`, `length_penalty`, `code_tests` (see BUILTINS);
- `reward_model`: the reward model trained in the rm stage, wired in by the RL stage (it needs the weights);
- a plugin file: `path/to/file.py:function`;
- an installed entry point of group `rlctl.rewards` (`[project.entry-points."rlctl.rewards"]` in a package's
  pyproject.toml): its name.

Arguments are given in call form, with Python literals: `length_penalty(max_length=512, buffer=128)`,
`format(pattern=r"^<think>.+</think>.+$")`, `my_rewards.py:score(strict=False)`. Several rewards are summed
with their weights.

Package `rlctl.rewards`: `answers` (answer extraction and math equality), `builtin` (the built-in rewards),
`resolve` (names to functions), `guard` (checked calls, on_error, deadlines, the pre-launch dry run), `worker` (the
worker process a reward runs in, so that its deadline can stop it) and the sandbox that runs model-written code
(`sandbox`); this module re-exports what callers use.
May import: base, vision, config, sandbox, rundir, data.
"""

from rlctl.rewards.answers import completion_text, gsm8k_answer, last_boxed, math_equal, parse_answer
from rlctl.rewards.builtin import (
    BUILTINS,
    COLUMN_PARAMS,
    CORRECTNESS,
    NEEDS_ANSWER,
    THINK_FORMAT,
    TRAINER_KWARGS,
    RewardFn,
    boxed,
    code_tests,
    describe_builtins,
    exact_match,
    format_reward,
    gsm8k,
    length_penalty,
    verl,
)
from rlctl.rewards.guard import (
    DEADLINE_S,
    JUDGE_BATCH,
    BadOutput,
    NanSteps,
    as_scores,
    call,
    checked,
    columns_of,
    dry_run,
    guarded,
    judged,
    score,
    stage_rewards,
)
from rlctl.rewards.resolve import (
    ENTRY_POINT_GROUP,
    MODEL_REWARDS,
    entry_points,
    known_names,
    load_plugin,
    resolve,
    split_call,
)

__all__ = [
    "BUILTINS",
    "COLUMN_PARAMS",
    "CORRECTNESS",
    "DEADLINE_S",
    "ENTRY_POINT_GROUP",
    "JUDGE_BATCH",
    "MODEL_REWARDS",
    "NEEDS_ANSWER",
    "THINK_FORMAT",
    "TRAINER_KWARGS",
    "BadOutput",
    "NanSteps",
    "RewardFn",
    "as_scores",
    "boxed",
    "call",
    "checked",
    "code_tests",
    "columns_of",
    "completion_text",
    "describe_builtins",
    "dry_run",
    "entry_points",
    "exact_match",
    "format_reward",
    "gsm8k",
    "gsm8k_answer",
    "guarded",
    "judged",
    "known_names",
    "last_boxed",
    "length_penalty",
    "load_plugin",
    "math_equal",
    "parse_answer",
    "resolve",
    "score",
    "split_call",
    "stage_rewards",
    "verl",
]
