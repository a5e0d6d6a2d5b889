"""Built-in synthetic tasks, generated deterministically from the seed (no downloads).

`arithmetic`: add a two-digit and a one-digit number ("47+5=" -> "52"). Each training problem is shown
by several annotators who each forget the carry 60% of the time when one is needed: SFT faithfully learns
that habit (greedy decoding then drops the carry), while the RL stage, rewarded by exact match, has to learn
to carry. Preference pairs prefer the correct sum to a wrong one. 20% of the problems are held out.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from rlctl.rundir import data_file

CARRY_DROP_RATE = 0.6
ANNOTATORS = 4
EVAL_FRACTION = 0.2


def _problems(seed: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    pairs = [(a, b) for a in range(10, 100) for b in range(10)]
    random.Random(seed).shuffle(pairs)
    n_eval = int(len(pairs) * EVAL_FRACTION)
    return pairs[n_eval:], pairs[:n_eval]


def _dropped_carry(a: int, b: int) -> int:
    """The sum with the carry from the ones into the tens forgotten: 47+5 -> 42."""
    return (a // 10) * 10 + (a % 10 + b) % 10


def _empty_rows() -> dict[str, list[dict]]:
    """A generated task's rows by role, none yet."""
    return {"sft": [], "preference": [], "rl": [], "eval": []}


def _write(out_dir: Path, rows: dict[str, list[dict]]) -> dict[str, Path]:
    """Write each role's rows to out_dir/ROLE.jsonl; returns the paths by role."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for role, items in rows.items():
        paths[role] = data_file(out_dir, role)
        paths[role].write_text("".join(json.dumps(r) + "\n" for r in items))
    return paths


def arithmetic(out_dir: Path, seed: int) -> dict[str, Path]:
    """Write sft/preference/rl/eval jsonl files for the arithmetic task; returns their paths by role."""
    rng = random.Random(seed + 1)
    train, held_out = _problems(seed)
    rows = _empty_rows()
    for a, b in train:
        prompt, answer = f"{a}+{b}=", a + b
        carries = a % 10 + b >= 10
        for _ in range(ANNOTATORS):
            shown = _dropped_carry(a, b) if carries and rng.random() < CARRY_DROP_RATE else answer
            rows["sft"].append({"prompt": prompt, "completion": str(shown)})
        wrong = _dropped_carry(a, b) if carries else answer + rng.choice([-10, -1, 1, 10])
        rows["preference"].append({"prompt": prompt, "chosen": str(answer), "rejected": str(wrong)})
        rows["rl"].append({"prompt": prompt, "answer": str(answer)})
    for a, b in held_out:
        rows["eval"].append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    return _write(out_dir, rows)


# `products` (tiny-agent-demo): multiply a three-digit number by a one-digit one ("347*6=" -> "2082"), which the
# tiny model cannot learn to do itself, with a calculator tool it may call. The SFT demonstrations call the tool
# in TOOL_RATE of the problems and answer directly (correctly) in the rest, so SFT learns to guess as often as to
# call; RL, rewarded by exact match on the final answer, learns to call. RL rows carry the prompt only: the
# trajectory (call, result, answer) is the policy's own, rendered by the built-in chatml-compact template.
TOOL_RATE = 0.3
CALCULATOR = {"type": "function", "function": {"name": "calculator"}}  # all chatml-compact shows of the tool


def _tool_call(expression: str) -> str:
    return "<tool_call>" + json.dumps({"name": "calculator", "arguments": {"expression": expression}}) + "</tool_call>"


def agent_demonstration(prompt: str, expression: str, answer: str, use_tool: bool) -> dict[str, str]:
    """One SFT row in prompt/completion form, rendered exactly as the RL rollout renders the conversation."""
    from rlctl.data.tokens import CHATML_COMPACT, render

    head = [{"role": "user", "content": prompt}]
    turns = [{"role": "assistant", "content": answer}]
    if use_tool:
        turns = [{"role": "assistant", "content": _tool_call(expression)}, {"role": "tool", "content": answer}, *turns]
    start = render(CHATML_COMPACT, head, add_generation_prompt=True, tools=[CALCULATOR])
    full = render(CHATML_COMPACT, head + turns, tools=[CALCULATOR])
    return {"prompt": start, "completion": full[len(start) :].removesuffix("\n")}


def products(out_dir: Path, seed: int) -> dict[str, Path]:
    """Write sft/preference/rl/eval jsonl files for the products task; returns their paths by role."""
    rng = random.Random(seed + 2)
    pairs = [(a, b) for a in range(100, 1000) for b in range(2, 10)]
    random.Random(seed).shuffle(pairs)
    n_eval = 200
    rows = _empty_rows()
    for a, b in pairs[n_eval:]:
        prompt, expression, answer = f"{a}*{b}=", f"{a}*{b}", str(a * b)
        shown = agent_demonstration(prompt, expression, answer, rng.random() < TOOL_RATE)
        rows["sft"].append(shown)
        wrong = agent_demonstration(prompt, expression, str(a * b + rng.choice([-10, -1, 1, 10])), False)
        rows["preference"].append({"prompt": shown["prompt"], "chosen": shown["completion"],
                                   "rejected": wrong["completion"]})  # fmt: skip
        rows["rl"].append({"prompt": prompt, "answer": answer})
    rows["eval"] = [{"prompt": f"{a}*{b}=", "answer": str(a * b)} for a, b in pairs[:n_eval]]
    return _write(out_dir, rows)


# `chat-sums` (an instruct model's task): "What is 47 + 38? Reply with only the number." as a chat message, two
# two-digit numbers, answer the sum. Scored by the last number of the reply (gsm8k with strict=False), so a model
# that answers "47 + 38 = 85" is right and the reward measures the arithmetic, not the format.
CHAT_SUMS_EVAL = 200


def _chat(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def chat_sums(out_dir: Path, seed: int) -> dict[str, Path]:
    """Write sft/preference/rl/eval jsonl files for the chat-sums task; returns their paths by role."""
    rng = random.Random(seed + 3)
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    random.Random(seed).shuffle(pairs)
    rows = _empty_rows()
    for i, (a, b) in enumerate(pairs):
        prompt, answer = _chat(f"What is {a} + {b}? Reply with only the number."), str(a + b)
        if i < CHAT_SUMS_EVAL:
            rows["eval"].append({"prompt": prompt, "answer": answer})
            continue
        wrong = str(a + b + rng.choice([-10, -1, 1, 10]))
        rows["sft"].append({"prompt": prompt, "completion": [{"role": "assistant", "content": answer}]})
        rows["preference"].append({"prompt": prompt, "chosen": [{"role": "assistant", "content": answer}],
                                   "rejected": [{"role": "assistant", "content": wrong}]})  # fmt: skip
        rows["rl"].append({"prompt": prompt, "answer": answer})
    return _write(out_dir, rows)


def corpus(paths: dict[str, Path]) -> list[str]:
    """Every text of a run's datasets (generated or any format rlctl reads), to train the tiny tokenizer on."""
    from rlctl import data

    texts = []
    for path in paths.values():
        texts.extend(data.texts(data.read(path).rows))
    return texts


# `shapes` (tiny-vlm-demo): "What colour is the shape?" about a small drawn image (one filled square or circle of
# one of SHAPE_COLOURS on a grey background, its size and place varying). The SFT annotators call yellow shapes
# green YELLOW_AS_GREEN of the time: SFT learns that habit (greedy decoding answers green), while the RL stage,
# rewarded by exact match, learns yellow. Images are PNG files in images/ beside the jsonl files; rows name them
# relative to their folder and carry the prompt as a chat message of an image part and a text part (TRL's layout).
SHAPE_COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 70, 220), "yellow": (230, 210, 40)}
YELLOW_AS_GREEN = 0.6
SHAPES_IMAGES = 400
SHAPES_EVAL = 80
SHAPES_SIDE = 28  # pixels: one 2x2 square of 14-pixel patches, one image token after the merge
SHAPES_QUESTION = "What colour is the shape?"


def _shape_image(colour: str, rng: random.Random):
    """A SHAPES_SIDE-pixel image of one filled square or circle of `colour` on grey, size and place random."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (SHAPES_SIDE, SHAPES_SIDE), (128, 128, 128))
    size = rng.randint(10, 20)
    x, y = rng.randint(0, SHAPES_SIDE - size), rng.randint(0, SHAPES_SIDE - size)
    box = (x, y, x + size - 1, y + size - 1)
    draw = ImageDraw.Draw(image)
    (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=SHAPE_COLOURS[colour])
    return image


def _image_prompt(text: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]


def shapes(out_dir: Path, seed: int) -> dict[str, Path]:
    """Write sft/preference/rl/eval jsonl files and their images for the shapes task; returns the paths by role."""
    rng = random.Random(seed + 4)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    colours = list(SHAPE_COLOURS)
    rows = _empty_rows()
    for i in range(SHAPES_IMAGES):
        colour = colours[i % len(colours)]
        name = f"images/{i:04d}.png"
        _shape_image(colour, rng).save(out_dir / name)
        base = {"images": [name], "prompt": _image_prompt(SHAPES_QUESTION)}
        if i < SHAPES_EVAL:
            rows["eval"].append({**base, "answer": colour})
            continue
        for _ in range(ANNOTATORS):
            shown = "green" if colour == "yellow" and rng.random() < YELLOW_AS_GREEN else colour
            rows["sft"].append({**base, "completion": [{"role": "assistant", "content": shown}]})
        wrong = rng.choice([c for c in colours if c != colour])
        rows["preference"].append({**base, "chosen": [{"role": "assistant", "content": colour}],
                                   "rejected": [{"role": "assistant", "content": wrong}]})  # fmt: skip
        rows["rl"].append({**base, "answer": colour})
    return _write(out_dir, rows)


GENERATORS = {"arithmetic": arithmetic, "products": products, "chat-sums": chat_sums, "shapes": shapes}
