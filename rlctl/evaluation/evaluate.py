"""Held-out evaluation: greedy or sampled generation scored by rewards (accuracy, mean reward, pass@k), and
pairwise reward-model accuracy. `rlctl eval` and the runner's per-stage evaluation both come through here."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from rlctl import rewards as rewards_mod
from rlctl.data import each_row
from rlctl.data.tokens import prompt_text
from rlctl.errors import RewardError, RowFailure, UserError
from rlctl.rewards import RewardFn
from rlctl.rollout import multiturn, vision
from rlctl.rollout.samples import Sample
from rlctl.rundir import RunDir, read_summary


def end_ids(model: Any, tokenizer: Any) -> list[int]:
    """The tokens that end a completion: the tokenizer's EOS, the generation config's EOS ids, and the chat
    template's end-of-turn token (ChatML's <|im_end|>) - a chat model stops at the end of its turn."""
    ids = [tokenizer.eos_token_id]
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    ids += eos if isinstance(eos, list) else [eos]
    if getattr(tokenizer, "chat_template", None):
        ids += multiturn.stop_ids(tokenizer)
    return list(dict.fromkeys(i for i in ids if i is not None))


def fitting_max_new_tokens(tokenizer: Any, answers: list[Any]) -> int:
    """A completion length that fits held-out answers: twice the longest ground truth in tokens plus 32 (room
    for a short preamble), at most 256; 256 when the rows carry no answers."""
    from rlctl.rewards import scoring

    texts = [str(scoring.first_truth(a)) for a in answers if a is not None]
    if not texts:
        return 256
    longest = max(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    return min(256, 2 * longest + 32)


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: list[Any],
    max_new_tokens: int,
    batch_size: int = 64,
    synced: bool = False,
    on_batch: Callable[[int], None] | None = None,
    processor: Any = None,
    images: list[list[Any]] | None = None,
) -> list[str]:
    """Greedy completions of `prompts` (left-padded batches) ending at the end-of-turn token (`end_ids`), special
    tokens stripped; `synced` keeps ranks that hold shards of one model (FSDP) stepping together until every
    rank's batch is done; `on_batch(rows)` after each batch. A vision-language model's `processor` turns each
    prompt and its `images` (Pillow images, one list per prompt) into the model's inputs."""
    model.eval()
    ends = end_ids(model, tokenizer)
    out: list[str] = []
    with _left_padded(tokenizer, processor):
        for i in range(0, len(prompts), batch_size):
            texts = each_row(lambda p: prompt_text(p, tokenizer), prompts[i : i + batch_size], start=i)
            pictures = (images or [])[i : i + batch_size]  # one list per prompt
            enc = vision.encode_batch(processor, tokenizer, texts, pictures).to(model.device)
            ids = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=ends,
                synced_gpus=synced,
            )
            out += tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            if on_batch:
                on_batch(len(texts))
    return out


@contextlib.contextmanager
def _left_padded(tokenizer: Any, processor: Any = None) -> Iterator[None]:
    """Generation pads on the left (the prompts end where the completions start); the tokenizer's (and a
    vision-language processor's) own side comes back afterwards, also when generation raised."""
    tokenizers = [tokenizer] + ([processor.tokenizer] if processor is not None else [])
    sides = [t.padding_side for t in tokenizers]
    for t in tokenizers:
        t.padding_side = "left"
    try:
        yield
    finally:
        for t, side in zip(tokenizers, sides, strict=True):
            t.padding_side = side


def score_policy(
    model,
    tokenizer,
    rows: list[dict[str, Any]],
    rewards: list[tuple[RewardFn, float]],
    answer_field: str,
    max_new_tokens: int,
    synced: bool = False,
    accuracy: str = "exact_match",
    agent: multiturn.Agent | None = None,
    on_batch: Callable[[int], None] | None = None,
    processor: Any = None,
) -> dict[str, float]:
    """eval_accuracy (the correctness reward `accuracy`, with its arguments, above 0.5) and eval_reward (the
    weighted reward sum). With an `agent` (rl.tools) each prompt is a greedy multi-turn rollout: the final answer
    is scored, the trajectory is a column, and the turns and tool use are reported (eval_turns, ...). A
    vision-language model's `processor` reads each row's images (absolute paths, bytes or images) with its prompt;
    the rewards see the text answer."""
    from rlctl.rewards import scoring

    prompts = [r["prompt"] for r in rows]
    columns = {k: [r.get(k) for r in rows] for k in rows[0] if k != "prompt"}
    extra: dict[str, float] = {}
    if agent is None:
        images = [vision.row_images(r, None) for r in rows] if processor is not None else None
        completions = generate(
            model, tokenizer, prompts, max_new_tokens, synced=synced, on_batch=on_batch, processor=processor,
            images=images,
        )  # fmt: skip
    else:
        samples = agent_rollouts(model, agent, rows, synced=synced, processor=processor)
        completions = [multiturn.final_answer(s) for s in samples]
        columns["trajectory"] = [s.messages for s in samples]
        extra = {f"eval_{k}": v for k, v in multiturn.metrics(samples).items()}
        if on_batch:
            on_batch(len(rows))
    total = [0.0] * len(rows)
    for fn, weight in rewards:  # guarded: a reward failing on one row names it (before correctness, unguarded)
        try:
            values = fn(prompts=prompts, completions=completions, **columns)
        except RewardError as e:
            if e.index is None:
                raise
            raise RowFailure(e.index, e) from e
        for i, value in enumerate(values):
            total[i] += weight * float(value if value is not None else 0.0)
    correct = scoring.correct(accuracy, answer_field, prompts, completions, columns)
    n = len(rows)
    return {"eval_accuracy": sum(correct) / n, "eval_reward": sum(total) / n, **extra}


def agent_rollouts(
    model,
    agent: multiturn.Agent,
    rows: list[dict[str, Any]],
    n: int = 1,
    temperature: float | None = None,
    top_p: float = 1.0,
    synced: bool = False,
    processor: Any = None,
    image_base: Path | None = None,
) -> list[Sample]:
    """n multi-turn rollouts per row with the agent's tools (transformers generation; greedy when temperature is
    None), row after row. `synced`: a sharded policy, every process generating in step. A vision-language model's
    `processor` reads each row's images (relative paths from `image_base`) into its prompt."""
    from rlctl.rollout.generate import HFGenerator

    tok, stops = agent.tokenizer, agent.stop_ids
    engine = HFGenerator(tok, agent.max_new_tokens, temperature or 1.0, synced=synced, stop_ids=stops, top_p=top_p)
    engine.sync(model)
    samples = []
    for i, row in enumerate(rows):
        ids, images = agent.prompt_inputs(row, processor, image_base)
        samples += [Sample(i, row, list(ids), vision=images) for _ in range(n)]
    multiturn.rollout(agent, engine, samples, greedy=temperature is None)
    return samples


@torch.no_grad()
def reward_scores(model, tokenizer, texts: list[str], batch_size: int = 64) -> list[float]:
    """Scalar reward-model scores of full texts (scored as the RL stage scores completions)."""
    model.eval()
    scores: list[float] = []
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(
            texts[i : i + batch_size], return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False
        ).to(model.device)
        scores += model(**enc).logits[:, 0].float().tolist()
    return scores


def pair_text(prompt: Any, reply: Any, tokenizer) -> str:
    """A prompt and one reply as the reward model reads them: text joined, or a conversation (message lists, as
    TRL's chosen/rejected may be) through the chat template."""
    if isinstance(reply, list):
        head = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}] if prompt else []
        return tokenizer.apply_chat_template(head + reply, tokenize=False)
    return prompt_text(prompt, tokenizer) + reply


def score_reward_model(model, tokenizer, pairs: list[dict[str, Any]]) -> dict[str, float]:
    """eval_accuracy: the fraction of held-out pairs where chosen outscores rejected."""
    chosen = reward_scores(
        model, tokenizer, each_row(lambda p: pair_text(p.get("prompt", ""), p["chosen"], tokenizer), pairs)
    )
    rejected = reward_scores(
        model, tokenizer, each_row(lambda p: pair_text(p.get("prompt", ""), p["rejected"], tokenizer), pairs)
    )
    wins = [c > r for c, r in zip(chosen, rejected, strict=True)]
    margin = sum(c - r for c, r in zip(chosen, rejected, strict=True)) / len(pairs)
    return {"eval_accuracy": sum(wins) / len(pairs), "eval_margin": margin}


# ------------------------------------------------------------------------------------------ rlctl eval
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): the chance that at least one of k samples drawn without replacement
    from n samples, c of them correct, is correct."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def ks_for(n: int) -> list[int]:
    """The k reported for n samples per prompt: 1, 2, 4, ... up to n, and n itself."""
    ks = [1]
    while ks[-1] * 2 <= n:
        ks.append(ks[-1] * 2)
    return ks if ks[-1] == n else [*ks, n]


def _quiet_transformers() -> None:
    """No weight-loading progress bars or advisory warnings in rlctl's own output."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    from huggingface_hub.utils import logging as hub_logging

    hub_logging.set_verbosity_error()


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class Policy:
    """A causal LM to evaluate, with where it came from (and a vision-language model's processor)."""

    model: Any
    tokenizer: Any
    source: str
    stage: str | None = None
    run_dir: Path | None = None
    processor: Any = None


def load_causal_lm(path: str | Path, device: str, trust_remote_code: bool = False):
    """(model, tokenizer) from a folder or Hub id (a vision-language model as one: image-text-to-text); LoRA adapter
    folders are merged onto their base."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    _quiet_transformers()
    dtype = torch.bfloat16 if device == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    try:
        if (Path(path) / "adapter_config.json").is_file():
            from peft import AutoPeftModelForCausalLM

            model = AutoPeftModelForCausalLM.from_pretrained(
                path, dtype=dtype, trust_remote_code=trust_remote_code
            ).merge_and_unload()
        else:
            config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
            auto = AutoModelForImageTextToText if vision.is_vision_model(config) else AutoModelForCausalLM
            model = auto.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, SafetensorError) as e:
        first = str(e).strip().splitlines()[0].rstrip(".") if str(e).strip() else type(e).__name__
        if isinstance(e, SafetensorError):  # weights cut short or overwritten: named, never a traceback
            raise UserError(
                f"Cannot load a model from '{path}': its weights are damaged ({first}). `rlctl verify` on the run "
                "or folder names every damaged file; `rlctl export RUN` writes a run's newest intact checkpoint, "
                "which eval reads."
            ) from None
        raise UserError(
            f"Cannot load a model from '{path}': {first}. Give a run directory, an exported folder, or a Hub model id "
            "(online, or already in the Hugging Face cache)."
        ) from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device), tokenizer


def load_policy(target: Path, stage: str | None = None, device: str | None = None) -> Policy:
    """The policy of a run directory (its last finished policy stage, or `stage`), or a model folder / Hub id."""
    from rlctl.config import load_run_config
    from rlctl.plan import final_policy
    from rlctl.plan.planner import final_gone

    device = device or default_device()
    if RunDir(target).is_run():
        cfg = load_run_config(RunDir(target).config)
        works = f"Evaluate a stage's final folder instead (rlctl eval {target}/STAGE/final ...), or an export."
        completed = read_summary(target, works).completed
        if stage:
            folder = RunDir(target).final(stage)
            if stage in completed and not folder.is_dir():
                raise final_gone(target, stage)
            if stage not in completed:
                done = ", ".join(completed) or "none"
                raise UserError(f"{target} has no finished stage '{stage}' to evaluate (finished: {done}).")
        else:
            stage, folder = final_policy(target, cfg, completed)
        model, tok = load_causal_lm(folder, device, cfg.model.trust_remote_code)
        return Policy(model, tok, str(folder), stage, target, vision.processor_of(folder, cfg.model.trust_remote_code))
    if stage:
        raise UserError(f"--stage needs a run directory; {target} is not one (no config.yaml).")
    model, tok = load_causal_lm(str(target), device)
    return Policy(model, tok, str(target), processor=vision.processor_of(str(target)))


@torch.no_grad()
def sample(
    model,
    tokenizer,
    prompts: list[Any],
    max_new_tokens: int,
    n: int = 1,
    temperature: float | None = None,
    top_p: float = 1.0,
    batch_size: int = 16,
    on_batch: Callable[[int], None] | None = None,
    processor: Any = None,
    images: list[list[Any]] | None = None,
) -> tuple[list[list[str]], list[list[int]]]:
    """n completions per prompt (greedy when temperature is None) and their lengths in tokens; a vision-language
    model's `processor` reads each prompt's `images` with it."""
    model.eval()
    texts: list[list[str]] = []
    lengths: list[list[int]] = []
    greedy = temperature is None
    sampling = {} if greedy else {"temperature": temperature, "top_p": top_p}
    ends = end_ids(model, tokenizer)
    with _left_padded(tokenizer, processor):
        for i in range(0, len(prompts), batch_size):
            batch = [prompt_text(p, tokenizer) for p in prompts[i : i + batch_size]]
            pictures = (images or [])[i : i + batch_size]  # one list per prompt
            enc = vision.encode_batch(processor, tokenizer, batch, pictures).to(model.device)
            ids = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=not greedy,
                num_return_sequences=n,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=ends,
                **sampling,
            )
            new = ids[:, enc["input_ids"].shape[1] :]
            decoded = tokenizer.batch_decode(new, skip_special_tokens=True)
            stop = {tokenizer.pad_token_id, *ends} - {None}
            for j in range(len(batch)):
                texts.append(decoded[j * n : (j + 1) * n])
                lengths.append([_length(row, stop) for row in new[j * n : (j + 1) * n].tolist()])
            if on_batch:
                on_batch(len(batch))
    return texts, lengths


def _length(ids: list[int], stop: set[int]) -> int:
    """Generated tokens up to and including the first end token."""
    for i, t in enumerate(ids):
        if t in stop:
            return i + 1
    return len(ids)


@dataclass
class EvalResult:
    metrics: dict[str, Any]
    samples: list[dict[str, Any]] = field(default_factory=list)


def evaluate_rows(
    policy: Policy,
    rows: list[dict[str, Any]],
    reward_specs: Sequence[tuple[str, float]],
    accuracy: str,
    answer_field: str,
    max_new_tokens: int,
    n: int = 1,
    temperature: float | None = None,
    top_p: float = 1.0,
    batch_size: int = 16,
    reward_model: Callable[[list[str]], list[float]] | None = None,
    on_batch: Callable[[int], None] | None = None,
    agent: multiturn.Agent | None = None,
    image_base: Path | None = None,
) -> EvalResult:
    """Accuracy (the `accuracy` reward above 0.5, over every sample), mean weighted reward, each reward's mean,
    pass@k for n samples per prompt, and mean response length; plus every sample with its scores. With an `agent`
    (a run with rl.tools) each sample is a multi-turn rollout: its final answer is scored, its trajectory is a
    reward column, and turns and tool use are reported. A vision-language policy reads each row's images (relative
    paths from `image_base`, the data file's folder)."""
    prompts = [r["prompt"] for r in rows]
    columns = {k: [v for v in vs for _ in range(n)] for k, vs in rewards_mod.columns_of(rows).items()}
    tool_use: dict[str, float] = {}
    if agent is None:
        images = [vision.row_images(r, image_base) for r in rows] if policy.processor is not None else None
        completions, lengths = sample(
            policy.model, policy.tokenizer, prompts, max_new_tokens, n, temperature, top_p, batch_size, on_batch,
            policy.processor, images,
        )  # fmt: skip
    else:
        runs = agent_rollouts(policy.model, agent, rows, n, temperature, top_p, False, policy.processor, image_base)
        completions = [[multiturn.final_answer(s) for s in runs[i * n : (i + 1) * n]] for i in range(len(rows))]
        lengths = [[len(s.completion_ids) for s in runs[i * n : (i + 1) * n]] for i in range(len(rows))]
        columns["trajectory"] = [s.messages for s in runs]
        tool_use = multiturn.metrics(runs)
        if on_batch:
            on_batch(len(rows))
    flat_prompts = [p for p in prompts for _ in range(n)]
    flat = [c for cs in completions for c in cs]
    model_scores = {}
    if reward_model is not None and any(name in rewards_mod.MODEL_REWARDS for name, _ in reward_specs):
        texts = [prompt_text(p, policy.tokenizer) + c for p, c in zip(flat_prompts, flat, strict=True)]
        model_scores["reward_model"] = reward_model(texts)
    per, total = rewards_mod.score(reward_specs, flat_prompts, flat, columns, answer_field, model_scores)
    from rlctl.rewards import scoring

    correct = scoring.correct(accuracy, answer_field, flat_prompts, flat, columns)
    n_rows = len(rows)
    metrics: dict[str, Any] = {
        "prompts": n_rows,
        "samples_per_prompt": n,
        "decoding": "greedy" if temperature is None else f"sampled (temperature {temperature:g}, top_p {top_p:g})",
        "accuracy_reward": accuracy,
        "accuracy": sum(correct) / len(correct),
        "mean_reward": sum(total) / len(total),
    }
    for name, values in per.items():
        if values is not None:
            finite = [v for v in values if not math.isnan(v)]
            metrics[f"reward/{name}"] = sum(finite) / len(finite) if finite else float("nan")
    if n > 1:
        for k in ks_for(n):
            metrics[f"pass@{k}"] = (
                sum(pass_at_k(n, sum(correct[i * n : (i + 1) * n]), k) for i in range(n_rows)) / n_rows
            )
    metrics["mean_response_tokens"] = sum(sum(ls) for ls in lengths) / (n_rows * n)
    metrics.update(tool_use)
    samples = []
    for i, row in enumerate(rows):
        sl = slice(i * n, (i + 1) * n)
        samples.append(
            {
                "prompt": row["prompt"],
                "answer": row.get(answer_field),
                "completions": completions[i],
                "correct": correct[sl],
                "reward": total[sl],
                **{f"reward/{k}": v[sl] for k, v in per.items() if v is not None},
            }
        )
    return EvalResult(metrics, samples)


def reward_model_scorer(rm_dir: Path, device: str | None = None) -> Callable[[list[str]], list[float]]:
    """Scores of full texts by the reward model saved in `rm_dir` (a run's rm/final)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    _quiet_transformers()
    device = device or default_device()
    tok = AutoTokenizer.from_pretrained(rm_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForSequenceClassification.from_pretrained(rm_dir, num_labels=1).to(device)
    return lambda texts: reward_scores(model, tok, texts)
