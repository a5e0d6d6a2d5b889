"""Vision-language models (issue 41): the tiny Qwen2.5-VL built offline, its processor, a Sample's images reaching
the forward pass and generation, and the tiny-vlm-demo run (SFT then GRPO on coloured shapes) learning at each
stage, exported with its processor and answering as `rlctl eval` does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from rlctl.config import ModelArch
from rlctl.data import tasks
from rlctl.rollout.generate import HFGenerator
from rlctl.rollout.samples import Sample, collate, token_logprobs
from rlctl.rollout.vision import encode, encode_batch, load_processor, row_images
from rlctl.stages import tiny
from rlctl.trainer.models import VisionValueModel, token_values
from tests.helpers import rlctl, run_once, summary

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, list[dict]]:
    """The shapes task and the tiny VLM built from it (as the launch builds builtin:tiny-vlm); the rl rows."""
    where = tmp_path_factory.mktemp("vlm")
    paths = tasks.shapes(where / "data", 42)
    preset = yaml.safe_load((ROOT / "presets/models/tiny-vlm.yaml").read_text())
    arch = ModelArch(**preset["model"]["arch"])
    pixels = (preset["data"]["min_pixels"], preset["data"]["max_pixels"])
    tiny.build(where / "base", arch, tasks.corpus(paths), 42, pixels)
    rows = [json.loads(line) for line in paths["rl"].read_text().splitlines()]
    return where / "base", rows


def _inputs(processor, row: dict, base: Path):
    text = processor.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    return encode(processor, text, row_images(row, base))


def test_processor_round_trip(built):
    base, rows = built
    for row in rows:  # the row contract: image paths relative to the jsonl's folder, one image part per image
        assert len(row["images"]) == 1 and (base.parent / "data" / row["images"][0]).is_file()
        assert row["prompt"][0]["content"][0] == {"type": "image"}
    assert {r["answer"] for r in rows} == set(tasks.SHAPE_COLOURS)
    processor = load_processor(str(base))
    saved = json.loads((base / "processor_config.json").read_text())
    assert saved["processor_class"] == "Qwen2_5_VLProcessor"  # what AutoProcessor builds where torchvision is
    assert (base / "preprocessor_config.json").is_file()
    ids, vision = _inputs(processor, rows[0], base.parent / "data")
    image_token = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    tokens = int(vision.image_grid_thw.prod()) // processor.image_processor.merge_size**2
    assert ids.count(image_token) == tokens == 1  # a 28 x 28 image: one 2 x 2 square of patches, one token
    assert vision.pixel_values.shape[0] == int(vision.image_grid_thw.prod())
    text = processor.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What colour is the shape?")
    assert text.endswith("<|im_start|>assistant\n")
    assert processor.tokenizer.eos_token == "<|im_end|>"  # a reply ends at the end of its turn


def test_one_encoder_serves_training_and_evaluation(built):
    """Training's prompt encoding (`encode`, one prompt) is evaluation's batch encoding (`encode_batch`) of the same
    prompt: the same ids (left-padded in the batch) and pixel values; a batch without images goes through the
    tokenizer alone."""
    base, rows = built
    processor = load_processor(str(base))
    tok = processor.tokenizer
    tok.padding_side = "left"
    data = base.parent / "data"
    texts = [processor.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows[:2]]
    texts[1] += " Answer in one word."  # a longer prompt: the first is padded
    pictures = [row_images(r, data) for r in rows[:2]]
    batch = encode_batch(processor, tok, texts, pictures)
    at = 0
    for i, (text, picture) in enumerate(zip(texts, pictures, strict=True)):
        ids, vision = encode(processor, text, picture)
        assert batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist() == ids
        n = vision.pixel_values.shape[0]
        torch.testing.assert_close(batch["pixel_values"][at : at + n], vision.pixel_values)
        at += n
    plain = encode_batch(processor, tok, ["hello", "hello there"], [[], []])
    assert (
        "pixel_values" not in plain
        and plain["input_ids"].tolist()
        == tok(["hello", "hello there"], return_tensors="pt", padding=True, add_special_tokens=False)[
            "input_ids"
        ].tolist()
    )


def test_pixel_values_reach_the_forward_pass_and_generation(built):
    from transformers import AutoModelForImageTextToText

    base, rows = built
    processor = load_processor(str(base))
    model = AutoModelForImageTextToText.from_pretrained(base).eval()
    data = base.parent / "data"
    red, yellow = (next(r for r in rows if r["answer"] == c) for c in ("red", "yellow"))
    samples = []
    for row in (red, yellow, red):
        ids, vision = _inputs(processor, row, data)
        samples.append(Sample(0, row, ids, completion_ids=[5, 6, 7], vision=vision))
    batch = collate(samples, processor.tokenizer.pad_token_id, "cpu")
    with torch.no_grad():
        logp = token_logprobs(model, batch, 1.0)
        # the same prompt ids with another image: other log-probs; the same image: the same ones
        assert not torch.allclose(logp[0], logp[1])
        torch.testing.assert_close(logp[0], logp[2])
        # a slice of the batch keeps each row's own images
        torch.testing.assert_close(token_logprobs(model, batch[1:2], 1.0)[0], logp[1])
        torch.testing.assert_close(token_logprobs(model, batch[torch.tensor([2, 1])], 1.0), logp[[2, 1]])
    engine = HFGenerator(processor.tokenizer, max_new_tokens=3, temperature=1.0)
    engine.sync(model)
    out = engine.generate([s.prompt_ids for s in samples], greedy=True, vision=[s.vision for s in samples])
    assert len(out) == 3 and all(1 <= len(ids) <= 3 for ids in out)
    assert out[0] == out[2]


def test_vision_critic_values_read_the_image_and_train_its_head_whole_under_lora(built):
    from peft import get_peft_model
    from transformers import AutoModel, AutoModelForImageTextToText

    from rlctl import config
    from rlctl.runtime.models import ModelSource, lora_config

    base, rows = built
    processor = load_processor(str(base))
    policy = AutoModelForImageTextToText.from_pretrained(base).eval()
    critic = VisionValueModel(AutoModel.from_pretrained(base)).eval()
    # the policy's own backbone, vision tower included, and a fresh one-output head as a token classifier's
    own = dict(critic.model.named_parameters())
    assert any(name.startswith("visual.") for name in own)
    for name, p in policy.model.named_parameters():
        torch.testing.assert_close(own[name], p)
    assert critic.score.weight.shape == (1, critic.config.text_config.hidden_size)
    assert critic.score.weight.std() > 0 and not critic.score.bias.any()
    red, yellow = (next(r for r in rows if r["answer"] == c) for c in ("red", "yellow"))
    samples = []
    for row in (red, yellow, red):
        ids, vision = _inputs(processor, row, base.parent / "data")
        samples.append(Sample(0, row, ids, completion_ids=[5, 6, 7], vision=vision))
    batch = collate(samples, processor.tokenizer.pad_token_id, "cpu")
    with torch.no_grad():
        values = token_values(critic, batch)
        logp = token_logprobs(policy, batch, 1.0)
    assert values.shape == logp.shape == (3, 3)  # one value per completion token, as the text critic's
    assert not torch.allclose(values[0], values[1])  # the same text with another image: other values
    torch.testing.assert_close(values[0], values[2])

    cfg = config.resolve(preset="tiny-vlm-demo", hardware="cpu", sets=["model.adapter=lora"])
    lora = lora_config(ModelSource(str(base), cfg.model, None, "no", "lora"), task_type=None)
    adapted = get_peft_model(critic, lora)
    trained = {name for name, p in adapted.named_parameters() if p.requires_grad}
    assert any(".language_model." in name and "lora_A" in name for name in trained)
    assert not any(".visual." in name or ("score" in name and "lora" in name) for name in trained)
    assert {name for name in trained if "score" in name} == {
        f"base_model.model.score.modules_to_save.default.{w}" for w in ("weight", "bias")
    }
    token_values(adapted, batch).sum().backward()
    assert all(adapted.get_parameter(name).grad is not None for name in trained)


class Scripted:
    """An engine that writes the given turns and records the images each call was given (the code under test is
    the multi-turn rollout and the trainer's scoring of it, not the sampling)."""

    logprobs = None

    def __init__(self, tok, turns: list[list[str]]):
        self.tok, self.turns, self.images = tok, turns, []

    def awake(self):
        import contextlib

        return contextlib.nullcontext()

    def generate(self, prompts, greedy=False, vision=None):
        self.images.append(vision)
        end = self.tok.convert_tokens_to_ids("<|im_end|>")
        texts = [self.turns[i][len(self.images) - 1] for i in range(len(prompts))]
        return [self.tok(text, add_special_tokens=False)["input_ids"] + [end] for text in texts]


def test_a_tool_rollout_keeps_its_images_on_every_turn_and_scores_as_the_whole_conversation(built):
    """A multi-turn rollout with a tool, prompts with images: the prompt lists the tools and holds the image's
    tokens, every turn's call gets the prompt's images, and the trainer's log-probs of the trajectory (model turns
    and tool result) equal those of the whole conversation rendered by the template and read by the processor."""
    from transformers import AutoModelForImageTextToText

    from rlctl.data import tokens
    from rlctl.rollout import multiturn, tools

    base, rows = built
    processor = load_processor(str(base))
    tok = processor.tokenizer
    tok.chat_template = processor.chat_template = tokens.CHATML_COMPACT
    agent = multiturn.Agent(tok, tools.resolve_all(["calculator"]), 3, 200, 16, multiturn.stop_ids(tok))
    data = base.parent / "data"
    red, yellow = (next(r for r in rows if r["answer"] == c) for c in ("red", "yellow"))
    samples = []
    for i, row in enumerate((red, yellow)):
        ids, vision = agent.prompt_inputs(row, processor, data)
        samples.append(Sample(i, row, ids, vision=vision))
    image_token = tok.convert_tokens_to_ids("<|image_pad|>")
    assert tok.decode(samples[0].prompt_ids).startswith("<|im_start|>system\ntools: calculator<|im_end|>\n")
    assert samples[0].prompt_ids.count(image_token) == 1 and samples[0].vision is not None
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
    engine = Scripted(tok, [[call, "red"], [call, "yellow"]])
    multiturn.rollout(agent, engine, samples)
    assert len(engine.images) == 2, "two model turns"
    for seen in engine.images:
        assert [v is s.vision for v, s in zip(seen, samples, strict=True)] == [True, True]
    assert [s.tool_calls for s in samples] == [1, 1] and samples[0].messages[2]["content"] == "5"

    model = AutoModelForImageTextToText.from_pretrained(base).eval()
    batch = collate(samples, tok.pad_token_id, "cpu")
    with torch.no_grad():
        logp = token_logprobs(model, batch, 1.0)
        for i, s in enumerate(samples):
            text = tok.apply_chat_template(s.messages, tokenize=False, tools=agent.schemas(s.row))
            enc = processor(text=[text], images=row_images(s.row, data), return_tensors="pt")
            whole = s.prompt_ids + s.completion_ids
            assert enc["input_ids"][0, : len(whole)].tolist() == whole
            logits = model(**enc).logits[0, len(s.prompt_ids) - 1 : len(whole) - 1]
            own = logits.log_softmax(-1).gather(-1, torch.tensor(s.completion_ids)[:, None])[:, 0]
            torch.testing.assert_close(logp[i, : len(s.completion_ids)], own, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("lora_vision", [False, True])
def test_lora_targets_the_language_model_and_the_vision_tower_on_request(built, lora_vision):
    from peft import get_peft_model
    from transformers import AutoModelForImageTextToText

    from rlctl import config
    from rlctl.runtime.models import ModelSource, lora_config

    base, _ = built
    sets = ["model.adapter=lora", f"model.lora_vision={str(lora_vision).lower()}"]
    cfg = config.resolve(preset="tiny-vlm-demo", hardware="cpu", sets=sets)
    lora = lora_config(ModelSource(str(base), cfg.model, None, "no", "lora"))
    model = get_peft_model(AutoModelForImageTextToText.from_pretrained(base), lora)
    adapted = {name for name, _ in model.named_parameters() if "lora_A" in name}
    assert any(".language_model." in name for name in adapted)
    assert any(".visual." in name for name in adapted) == lora_vision


# ------------------------------------------------------------------------------------------- the demo, end to end
@pytest.fixture(scope="module")
def vlm_run(tmp_path_factory) -> Path:
    return run_once(tmp_path_factory, "vlm-demo", "--preset", "tiny-vlm-demo")


@pytest.mark.slow
def test_vlm_demo_learns_at_each_stage(vlm_run: Path):
    s = summary(vlm_run)
    assert s["completed"] == ["sft", "rl"]
    acc = {stage: s["stages"][stage]["eval_accuracy"] for stage in ("base", "sft", "rl")}
    assert acc["base"] < 0.1, acc
    assert acc["sft"] > acc["base"] + 0.4, acc  # red, green, blue learnt; yellow called green
    assert acc["rl"] > acc["sft"] + 0.1, acc  # exact match teaches yellow
    for name in ("base/processor_config.json", "sft/final/processor_config.json", "rl/final/processor_config.json"):
        assert (vlm_run / name).is_file(), name


def _rl_from_the_demos_sft(vlm_run: Path, run: Path, *sets: str):
    """`rlctl train --preset tiny-vlm-demo --stages rl` from the demo's SFT model, with `sets`."""
    args = ["--preset", "tiny-vlm-demo", "--stages", "rl", "--run-dir", str(run)]
    for key in (f"model.name_or_path={vlm_run / 'sft' / 'final'}", *sets):
        args += ["--set", key]
    proc = rlctl("train", *args, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return summary(run)


@pytest.mark.slow
@pytest.mark.long
def test_vlm_async_rollouts_learn_as_the_synchronous_run(vlm_run: Path, tmp_path: Path):
    """GRPO with rl.async_rollout from the demo's SFT model: the generator process samples each round with its
    images, one policy version behind the trainer, and held-out accuracy rises past the SFT model's as in the
    synchronous demo."""
    from tests.helpers import records

    s = _rl_from_the_demos_sft(vlm_run, tmp_path / "async", "rl.async_rollout.enabled=true")
    sft = summary(vlm_run)["stages"]["sft"]["eval_accuracy"]
    assert s["stages"]["base"]["eval_accuracy"] == sft  # the starting model, scored again
    assert s["stages"]["rl"]["eval_accuracy"] > sft + 0.1, s["stages"]
    logged = [r for r in records(tmp_path / "async") if r.get("stage") == "rl" and "staleness_max" in r]
    assert len(logged) == 12 and max(r["staleness_max"] for r in logged) == 1, "generation overlapped training"


@pytest.mark.slow
def test_vlm_tool_run_trains_and_evaluates_with_its_images(vlm_run: Path, tmp_path: Path):
    """rl.tools on the demo's SFT model (ChatML with the tools listed by name): each rollout is multi-turn with
    the prompt's image, trained and scored held out as a tool run; `rlctl eval` of the run rolls out the same way."""
    run = tmp_path / "tools"
    sets = ("rl.tools=[calculator]", "data.chat_template=chatml-compact", "data.max_prompt_length=64")
    s = _rl_from_the_demos_sft(vlm_run, run, *sets, "rl.max_steps=2", "rl.max_new_tokens=8", "rl.eval_samples=16")
    assert s["completed"] == ["rl"] and s["stages"]["rl"]["eval_turns"] >= 1, s["stages"]
    report = tmp_path / "eval.json"
    proc = rlctl("eval", str(run), "--out", str(report), "--limit", "8", env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    result = json.loads(report.read_text())
    assert result["prompts"] == 8 and result["turns"] >= 1 and "tool_call_rate" in result


@pytest.mark.slow
def test_freeze_vision_trains_the_language_model_around_a_fixed_tower(tmp_path: Path):
    """model.freeze_vision in full fine-tuning: after SFT and RL the vision tower (merger included) is bit for bit
    the base model's, every language-model tensor has moved, and the plan counts no gradients for the tower."""
    from safetensors.torch import load_file

    run = tmp_path / "frozen"
    args = ["--preset", "tiny-vlm-demo", "--run-dir", str(run)]
    for key in ("model.freeze_vision=true", "sft.max_steps=10", "sft.save_every=10", "rl.max_steps=2"):
        args += ["--set", key]
    proc = rlctl("train", *args, "--set", "rl.eval_samples=16", env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    plan = json.loads((run / "plan.json").read_text())
    assert plan["adapter"] == "full"
    assert any(d["setting"] == "vision tower" and "model.freeze_vision" in d["why"] for d in plan["decisions"])
    base, sft, rl = (load_file(run / part / "model.safetensors") for part in ("base", "sft/final", "rl/final"))
    tower = [k for k in base if "visual" in k.split(".")]
    assert tower and len(tower) < len(base)
    for k in base:
        if k in tower:
            assert torch.equal(base[k], sft[k]) and torch.equal(base[k], rl[k]), k
        else:
            assert not torch.equal(base[k], sft[k]) and not torch.equal(sft[k], rl[k]), k


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp2", pytest.param("ddp", marks=pytest.mark.long)])
def test_two_processes_with_text_rows_beside_image_rows(tmp_path: Path, strategy: str):
    """PPO (policy, reference and critic) over 2 processes on data whose rows are half text-only, where a
    process's batch may hold no image while the other's does. FSDP2: that process runs the vision tower on a blank
    image, so their collectives match (without it gloo fails on a size mismatch; NCCL would hang). DDP: the tower's
    parameters unused there are found (without it the second step hangs)."""
    from tests.helpers import records

    paths = tasks.shapes(tmp_path / "data", 42)
    rows = [json.loads(line) for line in paths["rl"].read_text().splitlines()][:64]
    text = {"prompt": [{"role": "user", "content": [{"type": "text", "text": "What colour is grass?"}]}]}
    mixed = [row if i % 2 else {**text, "answer": "green", "images": []} for i, row in enumerate(rows)]
    data = paths["rl"].with_name("mixed.jsonl")
    data.write_text("".join(json.dumps(row) + "\n" for row in mixed))
    run = tmp_path / "run"
    args = ["--preset", "tiny-vlm-demo", "--stages", "rl", "--algorithm", "ppo", "--run-dir", str(run)]
    sets = [f"data.rl={data}", "hardware.num_processes=2", f"hardware.strategy={strategy}", "rl.max_steps=3"]
    sets += ["rl.prompts_per_step=2", "rl.group_size=4"]  # one prompt per process: with this seed a step gives
    # one process a text prompt and the other an image one
    sets_ = [a for key in sets for a in ("--set", key)]
    proc = rlctl("train", *args, *sets_, env={"OMP_NUM_THREADS": "1"}, timeout=300)  # a hang fails, not stalls
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    layout = summary(run)["layout"]["rl"]
    assert layout["observed"]["strategy"] == strategy and layout["mismatches"] == [], layout
    steps = [r["step"] for r in records(run) if r.get("stage") == "rl" and "value_loss" in r]
    assert steps == [1, 2, 3]


def test_freeze_vision_and_lora_vision_contradict():
    from rlctl import config
    from rlctl.errors import UserError

    with pytest.raises(UserError, match=r"model\.freeze_vision and model\.lora_vision contradict"):
        config.resolve(
            preset="tiny-vlm-demo", hardware="cpu", sets=["model.freeze_vision=true", "model.lora_vision=true"]
        )


@pytest.mark.slow
def test_vlm_export_loads_with_its_processor_and_answers_as_rlctl_eval(vlm_run: Path, tmp_path: Path):
    from transformers import AutoModelForImageTextToText

    out = tmp_path / "model"
    proc = rlctl("export", str(vlm_run), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "AutoModelForImageTextToText.from_pretrained" in (out / "README.md").read_text()
    for name in ("model.safetensors", "processor_config.json", "preprocessor_config.json", "chat_template.jinja"):
        assert (out / name).is_file(), name
    eval_file = vlm_run / "data" / "eval.jsonl"
    report = tmp_path / "eval.json"
    proc = rlctl("eval", str(out), "--data", str(eval_file), "--out", str(report))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    samples = report.with_suffix(".samples.jsonl").read_text().splitlines()
    by_eval = [json.loads(line)["completions"][0] for line in samples]

    model = AutoModelForImageTextToText.from_pretrained(out).eval()
    processor = load_processor(str(out))
    rows = [json.loads(line) for line in eval_file.read_text().splitlines()]
    texts = [processor.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    images = [im for r in rows for im in row_images(r, eval_file.parent)]
    processor.tokenizer.padding_side = "left"
    enc = processor(text=texts, images=images, return_tensors="pt", padding=True)
    ids = model.generate(**enc, max_new_tokens=3, do_sample=False)
    answers = processor.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert answers == by_eval
    correct = sum(a.strip() == r["answer"] for a, r in zip(answers, rows, strict=True))
    assert correct == round(summary(vlm_run)["stages"]["rl"]["eval_accuracy"] * len(rows))


@pytest.mark.slow
def test_vlm_ppo_trains_its_critic_and_resumes_exactly(tmp_path: Path):
    """PPO on the demo (a short SFT, 4 RL steps): the critic reads the images and learns (value_loss logged every
    step); interrupted after checkpoint-2 and resumed, the run ends with exactly the uninterrupted run's weights
    (the critic's weights and optimizer restored: its values set every advantage)."""
    import shutil

    from safetensors.torch import load_file

    from tests.helpers import records

    straight = tmp_path / "straight"
    args = ["--preset", "tiny-vlm-demo", "--algorithm", "ppo", "--run-dir", str(straight)]
    for key in ("sft.max_steps=30", "sft.save_every=30", "rl.max_steps=4", "rl.save_every=2", "rl.eval_samples=20"):
        args += ["--set", key]
    one_thread = {"OMP_NUM_THREADS": "1"}
    proc = rlctl("train", *args, env=one_thread)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    s = summary(straight)
    assert s["completed"] == ["sft", "rl"] and s["layout"]["rl"]["mismatches"] == [], s["layout"]["rl"]
    assert s["layout"]["rl"]["observed"]["critic"] is True
    logged = [r for r in records(straight) if r.get("stage") == "rl" and "step" in r and "event" not in r]
    assert [r["step"] for r in logged] == [1, 2, 3, 4]
    assert all(r["value_loss"] >= 0 for r in logged), logged

    resumed = tmp_path / "resumed"  # a crash after checkpoint-2: the run directory without what came after it
    shutil.copytree(straight, resumed, ignore=shutil.ignore_patterns("checkpoint-4", "final", "run.lock"))
    s["completed"].remove("rl")
    s["stages"].pop("rl")
    (resumed / "summary.json").write_text(json.dumps(s))
    config_text = (resumed / "config.yaml").read_text().replace(str(straight), str(resumed))
    (resumed / "config.yaml").write_text(config_text)
    proc = rlctl("resume", str(resumed), env=one_thread)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    steps = [r["step"] for r in records(resumed) if r.get("stage") == "rl" and "step" in r and "event" not in r]
    assert steps == [1, 2, 3, 4, 3, 4], "the resumed run continues from step 3"
    a = load_file(straight / "rl" / "final" / "model.safetensors")
    b = load_file(resumed / "rl" / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize(
    ("sets", "engine", "generator", "named"),
    [
        ([], "vllm", None, "vLLM generation"),
        ([], "transformers", "vllm", "vLLM generation"),  # the async generator's own engine
        (
            ["stages=[sft,rm,rl]", "rl.advantage=gae", "rl.critic.init=reward_model"],
            "transformers",
            None,
            "rl.critic.init=reward_model",
        ),
    ],
)
def test_rl_refuses_what_a_vision_language_policy_cannot_train_with(sets, engine, generator, named):
    from rlctl import config, vision
    from rlctl.errors import UserError
    from rlctl.stages.rl import refuse_for_images

    cfg = config.resolve(preset="tiny-vlm-demo", hardware="cpu", sets=sets)
    plain = config.resolve(preset="tiny-vlm-demo", hardware="cpu").rl
    for family in vision.FAMILIES:  # none of them has either yet
        with pytest.raises(UserError, match=named):
            refuse_for_images(cfg.rl, family, engine, generator, "run/sft/final")
        refuse_for_images(plain, family, "transformers", None, "run/sft/final")
