"""rlctl's RL-loop transformers generation against TRL's GRPO generation on the same rollouts (CPU).

Both sides sample from one random-init Qwen2-architecture model in the state the trainers hold it in at
generation time (training mode, gradient checkpointing on as GPU plans set it, fp32 on CPU): TRL 1.16's own
`GRPOTrainer._generate_single_turn` (transformers path) and rlctl's `HFGenerator.generate`, the same prompt
token ids, the same number of new tokens (the random model rarely samples EOS, so both generate to the limit).
Rounds alternate A/B so load drift on a shared machine hits both alike. Target: loop / TRL <= 1.1.

Usage: python bench/generation_vs_trl.py [--rounds 5] [--rollouts 64] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report

TARGET = 1.1


def build(vocab_texts: list[str], args: argparse.Namespace):
    """(model, tokenizer): a random-init Qwen2 big enough that generation, not Python, dominates."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlctl.stages.tiny import train_tokenizer

    tok = train_tokenizer(vocab_texts, 512)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 3,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model, tok


def trl_side(model, tok, prompts: list[str], args: argparse.Namespace, out_dir: str):
    """A GRPOTrainer over `model` whose transformers generation we call directly."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    config = GRPOConfig(
        output_dir=out_dir,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        per_device_train_batch_size=args.rollouts,
        num_generations=8,
        max_completion_length=args.new_tokens,
        temperature=1.0,
        top_k=0,
        report_to=[],
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
        args=config,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tok,
    )
    model.train()
    return trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rollouts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()

    import torch

    from rlctl.rollout.generate import HFGenerator

    texts = [f"{a} + {b} = {a + b}" for a in range(60) for b in range(60)]
    model, tok = build(texts, args)
    prompts = [f"{i} + {i * 7 % 50} =" for i in range(args.rollouts)]
    prompt_ids = [tok(p)["input_ids"] for p in prompts]
    with tempfile.TemporaryDirectory() as tmp:
        trainer = trl_side(model, tok, prompts, args, tmp)
        loop = HFGenerator(tok, args.new_tokens, temperature=1.0, batch_size=args.rollouts)
        loop.sync(model)

        def run_trl() -> int:
            ids, _ = trainer._generate_single_turn(prompt_ids, None, {}, 8)
            return sum(map(len, ids))

        def run_loop() -> int:
            return sum(map(len, loop.generate(prompt_ids)))

        sides = {"trl": run_trl, "rlctl loop": run_loop}
        times: dict[str, list[float]] = {k: [] for k in sides}
        tokens: dict[str, int] = {}
        for fn in sides.values():  # warm-up
            torch.manual_seed(0)
            fn()
        for r in range(args.rounds):
            for name in sides if r % 2 == 0 else reversed(list(sides)):
                torch.manual_seed(r)
                start = time.perf_counter()
                tokens[name] = sides[name]()
                times[name].append(time.perf_counter() - start)
                assert model.training and model.is_gradient_checkpointing, f"{name} left the model changed"
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["rlctl loop"] / med["trl"]
    rows = [[k, med[k], min(times[k]), tokens[k], tokens[k] / med[k]] for k in sides]
    rows.append(["ratio loop / TRL", ratio, "", "", f"target <= {TARGET}"])
    report(
        "generation_vs_trl",
        f"transformers generation, {args.rollouts} rollouts x {args.new_tokens} new tokens, CPU",
        ["side", "median s", "best s", "tokens", "tokens/s"],
        rows,
        {"args": vars(args), "seconds": times, "tokens": tokens, "ratio": ratio, "target": TARGET},
    )


if __name__ == "__main__":
    main()
