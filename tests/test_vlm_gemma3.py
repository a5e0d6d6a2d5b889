"""Gemma 3 vision-language models (issue 41's second family): the tiny Gemma 3 built offline and its processor
(AutoProcessor without torchvision), a Sample's images reaching the forward pass, the critic and generation,
LoRA and model.freeze_vision on its SigLIP tower, and the tiny-gemma3-demo run (SFT then GRPO on coloured shapes)
learning at each stage."""

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
from rlctl.rollout.vision import encode, load_processor, model_inputs, row_images, vision_token_ids
from rlctl.stages import tiny
from rlctl.trainer.models import VisionValueModel, token_values
from tests.helpers import rlctl, run_once, summary

ROOT = Path(__file__).resolve().parents[1]
TOWER = ("vision_tower", "multi_modal_projector")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, list[dict]]:
    """The shapes task and the tiny Gemma 3 built from it (as the launch builds builtin:tiny-gemma3); the rl rows."""
    where = tmp_path_factory.mktemp("gemma3")
    paths = tasks.shapes(where / "data", 42)
    preset = yaml.safe_load((ROOT / "presets/models/tiny-gemma3.yaml").read_text())
    tiny.build(where / "base", ModelArch(**preset["model"]["arch"]), tasks.corpus(paths), 42)
    rows = [json.loads(line) for line in paths["rl"].read_text().splitlines()]
    return where / "base", rows


def _inputs(processor, row: dict, base: Path, suffix: str = ""):
    text = processor.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    return encode(processor, text + suffix, row_images(row, base))


def _samples(processor, rows: list[dict], base: Path, colours: tuple[str, ...]) -> list[Sample]:
    picked = [next(r for r in rows if r["answer"] == c) for c in colours]
    return [
        Sample(0, r, _inputs(processor, r, base)[0], [5, 6, 7], vision=_inputs(processor, r, base)[1]) for r in picked
    ]


def test_processor_round_trip_without_torchvision(built):
    from transformers import AutoProcessor, Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    base, rows = built
    auto = AutoProcessor.from_pretrained(base)
    assert type(auto) is Gemma3Processor and type(auto.image_processor) is Gemma3ImageProcessorPil
    processor = load_processor(str(base))
    assert type(processor) is Gemma3Processor and processor.image_seq_length == 1
    ids, vision = _inputs(processor, rows[0], base.parent / "data")
    soft = processor.tokenizer.convert_tokens_to_ids("<image_soft_token>")
    assert ids.count(soft) == 1  # one image token per 28 x 28 image (mm_tokens_per_image)
    assert vision.pixel_values.shape == (1, 3, 28, 28) and vision.image_grid_thw is None
    text = processor.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>user\n\n\n<start_of_image><image_soft_token><end_of_image>\n\nWhat colour")
    assert text.endswith("<|im_start|>assistant\n")
    assert processor.tokenizer.eos_token == "<|im_end|>"


def test_pixel_values_reach_the_forward_pass_and_generation(built):
    from transformers import AutoModelForImageTextToText

    base, rows = built
    processor = load_processor(str(base))
    model = AutoModelForImageTextToText.from_pretrained(base).eval()
    data = base.parent / "data"
    samples = _samples(processor, rows, data, ("red", "yellow", "red"))
    # a longer prompt left-pads the others: their positions and masks must not move their log-probs
    longer = next(r for r in rows if r["answer"] == "blue")
    ids, vision = _inputs(processor, longer, data, "blue or")
    samples.append(Sample(0, longer, ids, [5, 6, 7], vision=vision))
    batch = collate(samples, processor.tokenizer.pad_token_id, "cpu")
    inputs = model_inputs(model, batch.input_ids, batch.vision, batch.position_ids)
    assert set(inputs) == {"pixel_values", "token_type_ids", "position_ids"}
    assert inputs["pixel_values"].shape == (4, 3, 28, 28) and int(inputs["token_type_ids"].sum()) == 4
    with torch.no_grad():
        logp = token_logprobs(model, batch, 1.0)
        assert not torch.allclose(logp[0], logp[1])  # the same prompt ids with another image: other log-probs
        torch.testing.assert_close(logp[0], logp[2])
        torch.testing.assert_close(token_logprobs(model, batch[1:2], 1.0)[0], logp[1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(token_logprobs(model, batch[torch.tensor([2, 1])], 1.0), logp[[2, 1]])
    config = model.config
    assert vision_token_ids(model) == [config.image_token_id, config.boi_token_id, config.eoi_token_id]
    engine = HFGenerator(processor.tokenizer, max_new_tokens=3, temperature=1.0)
    engine.sync(model)
    out = engine.generate([s.prompt_ids for s in samples], greedy=True, vision=[s.vision for s in samples])
    assert len(out) == 4 and all(1 <= len(ids) <= 3 for ids in out)
    assert out[0] == out[2] and not set(vision_token_ids(model)) & {t for ids in out for t in ids}


def test_vision_critic_reads_the_image(built):
    from transformers import AutoModel

    base, rows = built
    processor = load_processor(str(base))
    critic = VisionValueModel(AutoModel.from_pretrained(base)).eval()
    assert type(critic.model).__name__ == "Gemma3Model"
    assert critic.score.weight.shape == (1, critic.config.text_config.hidden_size)
    batch = collate(_samples(processor, rows, base.parent / "data", ("red", "yellow", "red")), 0, "cpu")
    with torch.no_grad():
        values = token_values(critic, batch)
    assert values.shape == (3, 3) and not torch.allclose(values[0], values[1])
    torch.testing.assert_close(values[0], values[2])


@pytest.mark.parametrize("lora_vision", [False, True])
def test_lora_leaves_the_siglip_tower_alone_unless_asked(built, lora_vision):
    from peft import get_peft_model
    from transformers import AutoModelForImageTextToText

    from rlctl import config
    from rlctl.runtime.models import ModelSource, lora_config

    base, _ = built
    sets = ["model.adapter=lora", f"model.lora_vision={str(lora_vision).lower()}"]
    cfg = config.resolve(preset="tiny-gemma3-demo", hardware="cpu", sets=sets)
    lora = lora_config(ModelSource(str(base), cfg.model, None, "no", "lora"))
    model = get_peft_model(AutoModelForImageTextToText.from_pretrained(base), lora)
    adapted = {name for name, _ in model.named_parameters() if "lora_A" in name}
    assert any(".language_model." in name for name in adapted)
    assert any(".vision_tower." in name for name in adapted) == lora_vision


def test_freeze_vision_keeps_the_tower_and_projector_bit_identical(built):
    from transformers import AutoModelForImageTextToText

    from rlctl import config
    from rlctl.runtime.models import ModelSource, frozen_vision

    base, rows = built
    cfg = config.resolve(preset="tiny-gemma3-demo", hardware="cpu", sets=["model.freeze_vision=true"])
    model = AutoModelForImageTextToText.from_pretrained(base)
    frozen_vision(ModelSource(str(base), cfg.model, None, "no", "full"), model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    tower = {n for n in before if set(TOWER) & set(n.split("."))}
    assert any("vision_tower" in n for n in tower) and any("multi_modal_projector" in n for n in tower)
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    processor = load_processor(str(base))
    batch = collate(_samples(processor, rows, base.parent / "data", ("red", "yellow")), 0, "cpu")
    token_logprobs(model, batch, 1.0).sum().backward()
    optim.step()
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]) == (name in tower), name


def test_builtin_chat_templates_render_gemma3_image_parts_for_a_siglip_tower():
    from rlctl import config, vision
    from rlctl.data import tokens

    gemma3 = config.resolve(preset="tiny-gemma3-demo", hardware="cpu").model.arch
    qwen = config.resolve(preset="tiny-vlm-demo", hardware="cpu").model.arch
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour?"}]}]
    for name in ("chatml", "chatml-compact"):
        text = tokens.render(tokens.template_text(name, vision.placeholder(gemma3)), messages)
        assert text == "<|im_start|>user\n<start_of_image>What colour?<|im_end|>\n"
        assert tokens.template_text(name, vision.placeholder(qwen)) == tokens.BUILTIN_TEMPLATES[name]
    assert vision.placeholder(None) == vision.qwen2_vl.FAMILY.placeholder  # a text model: no image part to render


# ------------------------------------------------------------------------------------------- the demo, end to end
@pytest.fixture(scope="module")
def gemma3_run(tmp_path_factory) -> Path:
    return run_once(tmp_path_factory, "gemma3-demo", "--preset", "tiny-gemma3-demo")


@pytest.mark.slow
def test_gemma3_demo_learns_at_each_stage(gemma3_run: Path):
    s = summary(gemma3_run)
    assert s["completed"] == ["sft", "rl"]
    acc = {stage: s["stages"][stage]["eval_accuracy"] for stage in ("base", "sft", "rl")}
    assert acc["base"] < 0.1, acc
    assert acc["sft"] > acc["base"] + 0.4, acc  # red, green, blue learnt; yellow called green
    assert acc["rl"] > acc["sft"] + 0.1, acc  # exact match teaches yellow
    for name in ("base/processor_config.json", "sft/final/processor_config.json", "rl/final/processor_config.json"):
        assert (gemma3_run / name).is_file(), name


@pytest.mark.slow
def test_gemma3_tool_run_trains_and_evaluates_with_its_images(gemma3_run: Path, tmp_path: Path):
    """rl.tools on the demo's SFT model with the built-in chatml-compact (its image parts as Gemma 3's
    placeholder): each rollout is multi-turn with the prompt's image; `rlctl eval` of the run rolls out the same
    way."""
    run = tmp_path / "tools"
    args = ["--preset", "tiny-gemma3-demo", "--stages", "rl", "--run-dir", str(run)]
    sets = [f"model.name_or_path={gemma3_run / 'sft' / 'final'}", "rl.tools=[calculator]"]
    sets += ["data.chat_template=chatml-compact", "data.max_prompt_length=64", "rl.max_steps=2"]
    for key in (*sets, "rl.max_new_tokens=8", "rl.eval_samples=16"):
        args += ["--set", key]
    proc = rlctl("train", *args, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    s = summary(run)
    assert s["completed"] == ["rl"] and s["stages"]["rl"]["eval_turns"] >= 1, s["stages"]
    assert "<start_of_image>" in (run / "rl" / "final" / "chat_template.jinja").read_text()
    report = tmp_path / "eval.json"
    proc = rlctl("eval", str(run), "--out", str(report), "--limit", "8", env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    result = json.loads(report.read_text())
    assert result["prompts"] == 8 and result["turns"] >= 1


# ------------------------------------------------------------------------------------------------ the planner
# config.json of google/gemma-3-4b-it as published: the numbers it leaves out are transformers' defaults
GEMMA3_4B = {
    "model_type": "gemma3",
    "architectures": ["Gemma3ForConditionalGeneration"],
    "mm_tokens_per_image": 256,
    "text_config": {
        "model_type": "gemma3_text",
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_hidden_layers": 34,
        "sliding_window": 1024,
    },
    "vision_config": {
        "model_type": "siglip_vision_model",
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}


def test_gemma3_config_is_read_with_its_siglip_tower_counted_as_transformers_builds_it():
    """google/gemma-3-4b-it's config.json: the SigLIP tower and projector counted exactly as transformers builds
    them on the meta device, the whole model within 0.1% (Gemma's extra norms are not in the planner's layer)."""
    import transformers

    from rlctl.plan import arch as model_arch
    from rlctl.plan.memory.arch import Arch

    arch = model_arch.arch_from_config(GEMMA3_4B, "config.json")
    v = arch.vision
    assert (v.kind, v.layers, v.hidden, v.heads, v.patch, v.image_size, v.tokens_per_image) == (
        "siglip", 27, 1152, 16, 14, 896, 256
    )  # fmt: skip
    assert (arch.layers, arch.hidden, arch.heads, arch.kv_heads, arch.vocab, arch.head_dim) == (
        34, 2560, 8, 4, 262_208, 256
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.Gemma3ForConditionalGeneration(transformers.Gemma3Config(**GEMMA3_4B))
    weights = {n: p.numel() for n, p in model.named_parameters()}
    tower = sum(n for name, n in weights.items() if set(TOWER) & set(name.split(".")))
    planned = Arch.of(arch)
    assert planned.vision_params == tower
    assert planned.params() == pytest.approx(sum(weights.values()), rel=1e-3)


def test_gemma3_image_tokens_and_tower_activations_are_planned_per_image():
    """Every image costs mm_tokens_per_image tokens whatever its size, and the tower encodes (image_size / patch)^2
    patches of it: the plan's image budget and the vision tower's activations say so."""
    from rlctl import config
    from rlctl.data import images
    from rlctl.plan import planner
    from rlctl.plan.memory import model as mm
    from rlctl.plan.memory.arch import Arch
    from rlctl.plan.memory.search import environment, workloads

    cfg = config.resolve(preset="tiny-gemma3-demo", hardware="cpu")
    vision = cfg.model.arch.vision
    b = images.budget([[(28, 28)], [(300, 20), (4000, 3000)]], vision, 3136, 1003520, 3)
    assert (b.tokens_per_row, b.tokens_per_image, b.images_per_row, b.fixed_size) == (2, 1, 2, 28)
    assert "every image resized to 28 x 28 px" in b.describe() and "pixels" not in b.describe()
    assert images.worst_case(vision, 3136, 1003520).tokens_per_row == 1
    arch = Arch.of(cfg.model.arch)
    assert arch.vision.patches_per_image == 4 and arch.vision.patches_per_token == 4
    wl = next(w for w in workloads(cfg, 1, {"sft": 2}) if w.stage == "sft")
    env = environment(cfg, planner.facts(cfg, "/tmp/x").hardware, 1, "transformers", "fp32")
    per = arch.vision.act_bytes_per_patch_layer(env.wb)  # 3 rows x 2 images x 4 patches each, every block kept
    assert mm.vision_activations(arch, env, mm.Setup("single", "full"), wl, 3) == 3 * 2 * 4 * arch.vision.layers * per


def test_tiny_gemma3_demo_plans_its_tower_and_one_token_per_image():
    proc = rlctl("plan", "--preset", "tiny-gemma3-demo", "--hardware", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["images"]["rl"]["tokens_per_row"] == 1 and plan["images"]["rl"]["fixed_size"] == 28
    tower = next(d for d in plan["decisions"] if d["setting"] == "vision tower")
    assert "SigLIP" in tower["why"] and "pooled into 1 token" in tower["why"]


def test_gemma3_is_never_sharded_with_fsdp2_over_several_processes(tmp_path):
    """google/gemma-3-4b-it on 8 GPUs: the planner picks no FSDP2 (its processes' collectives can diverge, see
    docs/vlm.md), and hardware.strategy=fsdp2 is refused, exit 2 with nothing written."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(GEMMA3_4B))
    sets = ["--set", f"model.name_or_path={tmp_path / 'model'}", "--set", "data.chat_template=chatml"]
    proc = rlctl("plan", "--preset", "tiny-gemma3-demo", "--hardware", "8xH100-80GB", *sets, "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["strategy"] != "fsdp2" and all(s["strategy"] != "fsdp2" for s in plan["stages"])
    run = tmp_path / "run"
    proc = rlctl("plan", "--preset", "tiny-gemma3-demo", "--hardware", "8xH100-80GB", *sets,
                 "--set", "hardware.strategy=fsdp2", "--run-dir", str(run))  # fmt: skip
    assert proc.returncode == 2 and "SigLIP vision tower (Gemma 3)" in proc.stderr, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and not run.exists()
