"""The pre-flight's checks of what the RL stage runs beside the model: the tools of rl.tools load and can be described
to the model, rows offer only those tools with their own arguments, the code_tests reward's tests assert something,
model-written code (the code_tests reward, the python tool) can run in the kernel sandbox, unless
rl.allow_unconfined_code opts out, and VAPO's positive-example loss has a correctness reward to read."""

from __future__ import annotations

from typing import Any

from rlctl.config import RunConfig
from rlctl.data import tokens
from rlctl.errors import UserError, did_you_mean
from rlctl.launch.preflight.report import Preflight, Report


def check_tools(cfg: RunConfig, report: Report) -> None:
    """rl.tools resolved as the RL stage will: plugin files imported, entry points loaded, schemas built."""
    from rlctl.rollout import tools

    try:
        found = tools.resolve_all(cfg.rl.tools)
    except UserError as e:
        report.errors.append(str(e))
        return
    report.checks["tools"] = f"{', '.join(found)} (up to {cfg.rl.agent.max_turns} turns per rollout)"


def check_row_tools(cfg: RunConfig, rows: list[dict[str, Any]], report: Report) -> None:
    """RL rows' own `tools` (or verl's `extra_info.tools_kwargs`) must name tools of rl.tools (those are the ones
    rlctl can run), and the arguments a row binds must be parameters of its tool."""
    import inspect

    from rlctl.rollout import tools

    try:
        known = tools.resolve_all(cfg.rl.tools)
    except UserError:  # reported by check_tools already
        return
    for i, row in enumerate(rows):
        try:
            names = tools.tool_names(tokens.row_tools(row) or [])
            bound = tokens.row_tool_kwargs(row) or {}
        except (ValueError, AttributeError, TypeError) as e:
            report.errors.append(
                f"data.rl row {i + 1}: its tools column is not a list of OpenAI tool schemas, or its "
                f"extra_info.tools_kwargs not verl's {{tool: {{create_kwargs: {{...}}}}}} ({e})."
            )
            return
        names += [n for n in bound if n not in names]
        for name, kwargs in bound.items():
            params = inspect.signature(known[name].fn).parameters if name in known else {}
            extra = [k for k in kwargs if k not in params]
            if params and extra and all(p.kind != p.VAR_KEYWORD for p in params.values()):
                hint = did_you_mean(extra[0], list(params))
                report.errors.append(
                    f"data.rl row {i + 1}: extra_info.tools_kwargs gives the tool '{name}' the argument '{extra[0]}', "
                    f"which it does not take (its parameters: {', '.join(params)}).{hint}"
                )
                return
        unknown = [n for n in names if n not in known]
        if unknown:
            report.errors.append(
                f"data.rl row {i + 1} offers the tool '{unknown[0]}', which rl.tools does not provide "
                f"(rl.tools: {', '.join(known) or 'none'}).{did_you_mean(str(unknown[0]), known)} A row's tools "
                "choose among rl.tools; add the tool there (a plugin path.py:function or an entry point)."
            )
            return


def runs_model_code(cfg: RunConfig) -> bool:
    """The RL stage executes code the policy writes: the code_tests reward or the python tool."""
    rewards = [r.name.split("(")[0].strip() for r in cfg.rl.rewards]
    return "rl" in cfg.stages and ("code_tests" in rewards or "python" in cfg.rl.tools)


def check_code_tests(cfg: RunConfig, rows: list[dict[str, Any]], report: Report) -> None:
    """With the code_tests reward, every RL row's `tests` must be Python that asserts something: tests that assert
    nothing would pay every completion 1.0."""
    from rlctl.rewards.builtin import code_tests_problem

    if not any(r.name.split("(")[0].strip() == "code_tests" for r in cfg.rl.rewards):
        return
    for i, row in enumerate(rows):
        problem = code_tests_problem(row["tests"]) if "tests" in row else None  # a missing column: the dry run
        if problem:
            report.errors.append(f"data.rl row {i + 1}: its tests (for the code_tests reward) {problem}.")
            return


def check_code_sandbox(cfg: RunConfig, report: Report) -> None:
    """Model-written code runs only in the bubblewrap sandbox: refused here when that cannot start, unless the
    user opted out with rl.allow_unconfined_code."""
    from rlctl import sandbox

    why = sandbox.problem()
    if why is None:
        report.checks["code sandbox"] = "bubblewrap: model-written code runs confined"
    elif cfg.rl.allow_unconfined_code:
        report.checks["code sandbox"] = "UNCONFINED (rl.allow_unconfined_code=true): no kernel sandbox here"
    else:
        report.errors.append(why)


def check_rl_tools(p: Preflight) -> None:
    """rl.tools load (`check_tools`), when the RL stage has any."""
    if "rl" in p.cfg.stages and p.cfg.rl.tools:
        check_tools(p.cfg, p.report)


def check_positive_examples(p: Preflight) -> None:
    """VAPO's positive-example LM loss (rl.loss.lm_coef) trains on the completions a correctness reward of rl.rewards
    scores correct: without one it would train on nothing."""
    from rlctl.rewards import scoring

    rl = p.cfg.rl
    if "rl" in p.cfg.stages and rl.loss.lm_coef > 0 and scoring.correctness_index(rl.rewards) is None:
        names = ", ".join(r.name for r in rl.rewards)
        p.report.errors.append(
            f"rl.loss.lm_coef={rl.loss.lm_coef:g} trains the policy on the completions a correctness reward scores "
            f"correct, but rl.rewards ({names}) has none; add one (exact_match, gsm8k, boxed, verl, code_tests, or a "
            "reward marked `correctness: true`), or set rl.loss.lm_coef=0."
        )


def check_sandbox(p: Preflight) -> None:
    """Model-written code can run confined (`check_code_sandbox`), when the RL stage runs any."""
    if runs_model_code(p.cfg):
        check_code_sandbox(p.cfg, p.report)


def check_rl_rows(p: Preflight) -> None:
    """The RL rows' tools and code tests (`check_row_tools`, `check_code_tests`)."""
    if "rl" in p.cfg.stages:
        rows = p.rows.get("rl") or []
        check_row_tools(p.cfg, rows, p.report)
        check_code_tests(p.cfg, rows, p.report)
