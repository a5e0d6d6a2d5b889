"""Names users type that are not rlctl's keys, answered with rlctl's key: TRL and transformers argument names,
accepted as an alias where the meaning is the same and refused with "did you mean" where it differs, and the rl
keys of earlier releases that moved into a section of rl (`MOVED`), accepted with a notice naming the new key, or
whose choice is gone (`RETIRED`): refused in what a user writes, dropped with a notice from an older run's config.
One table (`ALIASES`) serves the layering (accepted names are rewritten in each layer before layers merge, in
config files, --set and the config.yaml of older run directories) and the unknown-key message (refused names),
and is printed in docs/config.md.

Also here: `epochs` and `max_steps` of a stage replace each other across layers and may not both be set in one."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from rlctl.config.sections import STAGE_ORDER
from rlctl.errors import UserError

STAGE = "STAGE"  # in a row: any stage section (sft, dpo, kto, rm, rl), the same one in `name` and `key`
OFFLINE = ("sft", "dpo", "kto", "rm")


@dataclass(frozen=True)
class Alias:
    """A name as typed under `where` (section names; "" = top level; STAGE = every stage) and the rlctl key it
    means (accepted) or the nearest rlctl key (refused), with the reason; `moved`: an rlctl key of an earlier
    release (not a TRL name) now at `key`."""

    where: tuple[str, ...]
    name: str
    key: str
    accepted: bool
    why: str
    moved: bool = False


# rl keys set rarely, moved into sections of rl (issue 30): the old name under rl -> its key under rl. Each keeps
# its meaning; the name drops the word its section now says (kl_estimator -> kl.estimator).
MOVED: tuple[tuple[str, str], ...] = (
    ("policy_loss", "loss.policy"),
    ("loss_agg", "loss.agg"),
    ("clip_low", "loss.clip_low"),
    ("clip_high", "loss.clip_high"),
    ("cispo_cap", "loss.cispo_cap"),
    ("dual_clip", "loss.dual_clip"),
    ("kl_estimator", "kl.estimator"),
    ("kl_in_reward", "kl.in_reward"),
    ("kl_target", "kl.target"),
    ("kl_horizon", "kl.horizon"),
    ("critic_init", "critic.init"),
    ("critic_lr", "critic.lr"),
    ("critic_warmup_steps", "critic.warmup_steps"),
    ("value_clip", "critic.value_clip"),
    ("gamma", "returns.gamma"),
    ("lam", "returns.lam"),
    ("dynamic_sampling", "filters.dynamic_sampling"),
    ("dynamic_sampling_rounds", "filters.dynamic_sampling_rounds"),
    ("overlong_buffer", "filters.overlong_buffer"),
    ("overlong_penalty", "filters.overlong_penalty"),
    ("mask_truncated", "filters.mask_truncated"),
    ("pf_ppo_mode", "filters.pf_ppo_mode"),
    ("pf_ppo_weight_pow", "filters.pf_ppo_weight_pow"),
    ("rollout_correction", "mismatch.correction"),
    ("rollout_correction_cap", "mismatch.correction_cap"),
    ("sync_tolerance", "mismatch.sync_tolerance"),
    ("max_turns", "agent.max_turns"),
    ("max_tool_output_tokens", "agent.max_tool_output_tokens"),
)

# rl keys of earlier releases whose choice is gone: key under its section -> what replaced it.
RETIRED: dict[tuple[str, str], str] = {
    ("rl", "trainer"): "rlctl's own loop now trains every RL algorithm (grpo, rloo and the rest, with the same "
    "advantage, loss and KL keys), so there is no trainer to choose",
}

# keys added to the schema since runs were first written (SECTION.KEY, as `rlctl.checkpoint.verify.run_config` names
# them): an older run's config.yaml lacks them and reads them at their defaults; any other key missing there means
# the file was cut short.
ADDED: tuple[str, ...] = (
    "model.lora_vision",
    "data.min_pixels",
    "data.max_pixels",
    "model.freeze_vision",
    "model.arch.vision.kind",
    "model.arch.vision.image_size",
    "model.arch.vision.tokens_per_image",
    "hardware.max_restarts",
    "hardware.rendezvous_timeout_s",
)


ALIASES: tuple[Alias, ...] = (
    Alias(
        (STAGE,), "num_train_epochs", "STAGE.epochs", True,
        "passes over the stage's data; the plan turns them into max_steps",
    ),
    Alias((STAGE,), "lr", "STAGE.learning_rate", True, "the peak learning rate"),
    Alias(
        (STAGE,), "lr_scheduler_type", "STAGE.lr_scheduler", True,
        "the schedule (constant, constant_with_warmup, linear, cosine)",
    ),
    Alias((STAGE,), "save_steps", "STAGE.save_every", True, "a checkpoint every N optimizer steps"),
    Alias(OFFLINE, "max_seq_length", "STAGE.max_length", True, "the longest training sequence (TRL's older name)"),
    Alias(("rl",), "num_generations", "rl.group_size", True, "completions sampled per prompt"),
    Alias(("rl",), "max_completion_length", "rl.max_new_tokens", True, "the longest completion in tokens"),
    Alias(
        ("rl",), "max_prompt_length", "data.max_prompt_length", True,
        "the longest prompt in tokens (rlctl drops longer prompts, see data.over_length, rather than cutting "
        "them)",
    ),
    Alias(
        ("rl",), "max_staleness", "rl.async_rollout.max_staleness", True,
        "how many policy versions a batch may lag (TRL's AsyncGRPO name)",
    ),
    Alias(("rl",), "num_iterations", "rl.ppo_epochs", True, "passes over each rollout batch (GRPO's mu)"),
    Alias(("rl",), "epsilon", "rl.loss.clip_low", True, "the ratio's lower clip, 1 - epsilon"),
    Alias(("rl",), "epsilon_high", "rl.loss.clip_high", True, "the ratio's upper clip, 1 + epsilon_high"),
    Alias(("rl",), "kl_coef", "rl.beta", True, "the KL coefficient against the reference policy"),
    Alias(("", "model"), "model_name_or_path", "model.name_or_path", True, "the model to start from"),
    Alias(("",), "lora_r", "model.lora_r", True, "the LoRA rank"),
    Alias(("",), "lora_alpha", "model.lora_alpha", True, "the LoRA alpha"),
    Alias(("",), "lora_dropout", "model.lora_dropout", True, "the LoRA dropout"),
    Alias(("", "logging"), "logging_steps", "logging.every", True, "log every N optimizer steps"),
    Alias(("",), "report_to", "logging.report_to", True, "the experiment trackers"),
    Alias(
        OFFLINE, "per_device_train_batch_size", "STAGE.micro_batch_size", False,
        "TRL's batch is per device and is multiplied by gradient_accumulation_steps and the process count; "
        "rlctl's STAGE.batch_size is that global batch and STAGE.micro_batch_size the per-process forward batch "
        "(accumulation follows from the two)",
    ),
    Alias(
        ("rl",), "per_device_train_batch_size", "rl.micro_batch_size", False,
        "TRL's counts completions per device per forward pass times accumulation; rlctl's rl step is "
        "rl.prompts_per_step x rl.group_size completions, split into rl.micro_batch_size per process "
        "(accumulation follows)",
    ),
    Alias(
        (STAGE,), "gradient_accumulation_steps", "STAGE.batch_size", False,
        "rlctl derives accumulation from the global batch, STAGE.batch_size / (micro_batch_size x processes)",
    ),
    Alias((STAGE,), "warmup_steps", "STAGE.warmup_ratio", False, "rlctl's warmup is a fraction of the stage's steps"),
    Alias((STAGE,), "logging_steps", "logging.every", False, "one logging interval serves every stage"),
    Alias((STAGE,), "save_total_limit", "checkpoint.keep_last", False, "one retention setting serves every stage"),
    Alias((STAGE,), "eval_steps", "STAGE.save_every", False, "rlctl scores held-out data at every checkpoint"),
    Alias(
        (STAGE,), "gradient_checkpointing", "model.gradient_checkpointing", False,
        "set once for the model, for every stage",
    ),
    Alias((STAGE,), "seed", "seed", False, "one seed serves the whole run"),
    Alias(
        (STAGE,), "bf16", "model.dtype", False,
        "the plan picks mixed precision from the hardware; model.dtype sets the weights' dtype",
    ),
    Alias(
        ("", *STAGE_ORDER), "output_dir", "--run-dir", False,
        "the run directory is a flag of plan and train, not a config key",
    ),
    Alias(
        ("dpo", "kto"), "max_prompt_length", "STAGE.max_length", False,
        "rlctl limits the whole prompt+response sequence and drops longer rows rather than cutting the prompt",
    ),
    Alias(
        ("rl",), "loss_type", "rl.loss.agg", False,
        "TRL's loss_type fixes aggregation and normalisation together; rlctl sets them with rl.loss.agg and "
        "rl.advantage (or --algorithm dr-grpo, dapo)",
    ),
    Alias(
        ("", "model"), "use_peft", "model.adapter", False,
        "a boolean in TRL; model.adapter picks full, lora or qlora",
    ),
    Alias(("", "model"), "load_in_4bit", "model.adapter", False, "4-bit loading is model.adapter=qlora"),
    *(Alias(("rl",), old, f"rl.{new}", True, f"moved into rl.{new.split('.')[0]}", moved=True) for old, new in MOVED),
)  # fmt: skip

# TRL names that already are rlctl keys, with the same meaning (listed in docs/config.md).
SAME_NAMES: tuple[str, ...] = (
    "STAGE.learning_rate",
    "STAGE.max_steps",
    "STAGE.warmup_ratio",
    "STAGE.weight_decay",
    "STAGE.max_grad_norm",
    "sft/dpo/kto/rm.max_length",
    "dpo/kto/rl.beta",
    "dpo/kto.loss_type",
    "rl.temperature",
    "rl.use_vllm",
    "seed",
)


def _sections(alias: Alias) -> list[str]:
    return [s for w in alias.where for s in (STAGE_ORDER if w == STAGE else (w,))]


def lookup(section: str, name: str) -> tuple[Alias, str] | None:
    """The row for `name` typed under `section` ("" = top level) and its rlctl key with STAGE filled in."""
    for alias in ALIASES:
        if alias.name == name and section in _sections(alias):
            return alias, alias.key.replace(STAGE, section)
    return None


def typed(section: str, name: str) -> str:
    return f"{section}.{name}" if section else name


def key_for(dotted: str) -> str:
    """The rlctl key a dotted name means: its key when it is an accepted alias, else the name itself."""
    section, _, name = dotted.rpartition(".")
    found = lookup(section, name)
    return found[1] if found and found[0].accepted else dotted


def refusal(loc: tuple[str, ...]) -> str | None:
    """The unknown-key message for a refused TRL name at config location `loc`, or None."""
    if len(loc) > 2:
        return None
    section, name = loc if len(loc) == 2 else ("", loc[0])
    found = lookup(section, name)
    if found is None or found[0].accepted:
        return None
    alias, key = found
    return (
        f"unknown key '{typed(section, name)}' (a TRL name): {alias.why.replace(STAGE, section)}. Did you mean {key}?"
    )


def canonical(layer: dict[str, Any], source: str, notes: list[str] | None = None) -> dict[str, Any]:
    """`layer` with accepted aliases moved to their rlctl keys (`renamed`); a UserError when a layer sets a name and
    its key, a stage's epochs and max_steps together, or a retired key (`RETIRED`)."""
    out = renamed(layer, source, notes)
    for (section, name), why in RETIRED.items():
        if isinstance(out.get(section), dict) and name in out[section]:
            raise UserError(f"Invalid {source}: {section}.{name} is gone: {why}. Remove it.")
    for stage in STAGE_ORDER:
        sc = out.get(stage)
        if isinstance(sc, dict) and "epochs" in sc and "max_steps" in sc:
            raise UserError(
                f"Invalid {source}: {stage}.epochs and {stage}.max_steps are both set; a stage runs for one or the "
                f"other (the plan turns epochs into steps), keep one."
            )
    return out


def renamed(data: dict[str, Any], source: str, notes: list[str] | None = None) -> dict[str, Any]:
    """`data` (a layer, or a whole saved config) with accepted aliases moved to their rlctl keys, one line in
    `notes` naming the new keys of moved rl keys; a UserError when it sets a name and its key together."""
    out = copy.deepcopy(data)
    moved = []
    for section in ("", *{s for a in ALIASES if a.accepted for s in _sections(a)}):
        holder = out if section == "" else out.get(section)
        if not isinstance(holder, dict):
            continue
        for name in list(holder):
            found = lookup(section, str(name))
            if found is None or not found[0].accepted:
                continue
            alias, key = found
            *parents, last = key.split(".")
            target = out
            for part in parents:
                target = target.setdefault(part, {})
            if not isinstance(target, dict):
                continue  # the section is not a mapping: validation says so
            was = f"moved to {key}" if alias.moved else f"TRL's name for {key}"
            if last in target:
                raise UserError(f"Invalid {source}: {typed(section, name)} ({was}) and {key} are both set; keep {key}.")
            target[last] = holder.pop(name)
            if alias.moved:
                moved.append(f"{typed(section, name)} is now {key}")
    if moved and notes is not None:
        notes.append(f"{source}: {'; '.join(moved)}.")
    return out


def without_retired(data: dict[str, Any], source: str, notes: list[str] | None = None) -> dict[str, Any]:
    """A saved config (an older run's config.yaml) without the keys whose choice is gone, one line in `notes`
    naming each."""
    out = copy.deepcopy(data)
    for (section, name), why in RETIRED.items():
        holder = out.get(section)
        if isinstance(holder, dict) and name in holder:
            del holder[name]
            if notes is not None:
                notes.append(f"{source}: {section}.{name} is no longer read: {why}.")
    return out


def replaced(base: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    """`base` without the stage lengths that `layer` replaces: a layer's epochs replaces an earlier max_steps of
    the same stage and its max_steps an earlier epochs."""
    out = dict(base)
    for stage in STAGE_ORDER:
        sc, old = layer.get(stage), out.get(stage)
        if not (isinstance(sc, dict) and isinstance(old, dict)):
            continue
        for new, gone in (("epochs", "max_steps"), ("max_steps", "epochs")):
            if new in sc and gone not in sc and gone in old:
                out[stage] = {k: v for k, v in old.items() if k != gone}
    return out


def markdown() -> list[str]:
    """The alias tables for docs/config.md: TRL names, then the moved rl keys."""
    lines = [
        "## TRL names",
        "",
        "TRL and transformers argument names are answered with rlctl's key, in `--set` and in config files. Accepted",
        "names mean the same and are rewritten to the rlctl key (a layer that sets both is refused); refused names",
        f"mean something else and stop the run with the nearest rlctl key. `STAGE` is any of {', '.join(STAGE_ORDER)}.",
        "",
        "| you type | rlctl key | | why |",
        "|---|---|---|---|",
    ]
    for a in ALIASES:
        if a.moved:
            continue
        sections = "/".join(w for w in a.where if w)
        typed_as = ", ".join([f"`{a.name}`"] * ("" in a.where) + [f"`{sections}.{a.name}`"] * bool(sections))
        lines.append(f"| {typed_as} | `{a.key}` | {'alias' if a.accepted else 'refused'} | {a.why} |")
    lines += ["", "Already rlctl keys with TRL's meaning: " + ", ".join(f"`{n}`" for n in SAME_NAMES) + "."]
    lines += [
        "",
        "## Moved keys",
        "",
        "The rl keys set rarely moved into sections of rl; each kept its meaning. The old names still work in",
        "`--set`, config files and the `config.yaml` of older run directories: they are read at the new place with",
        "a one-line notice (a layer that sets both is refused).",
        "",
        "| old key | new key |",
        "|---|---|",
        *(f"| `rl.{old}` | `rl.{new}` |" for old, new in MOVED),
    ]
    return lines
