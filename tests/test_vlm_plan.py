"""The planner on vision-language models (issue 41): the vision tower counted as transformers builds it, Qwen2-VL /
Qwen2.5-VL config.json read, image tokens as the model's own processor makes them, and the plan of
qwen2.5-vl-3b-grpo on one 80 GB GPU showing the tower and the image-token budget."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from rlctl import config
from rlctl.data import images
from rlctl.plan import arch as model_arch
from rlctl.plan import data_lengths, planner
from rlctl.plan.memory import model as mm
from rlctl.plan.memory.arch import Arch
from rlctl.plan.memory.search import environment, workloads
from rlctl.rundir import RunDir
from rlctl.vision import qwen2_vl
from tests.helpers import plan_in_fresh_interpreter, rlctl

# config.json of Qwen/Qwen2.5-VL-3B-Instruct (the numbers the planner reads)
QWEN25_VL_3B = {
    "model_type": "qwen2_5_vl",
    "hidden_size": 2048,
    "intermediate_size": 11008,
    "max_position_embeddings": 128000,
    "num_attention_heads": 16,
    "num_hidden_layers": 36,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
    "vocab_size": 151936,
    "vision_config": {
        "depth": 32,
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "in_chans": 3,
        "out_hidden_size": 2048,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}


def test_the_preset_holds_the_numbers_of_the_models_config_json():
    preset = config.resolve("qwen2.5-vl-3b-grpo", None, None, "1xH100-80GB", []).model.arch
    assert model_arch.arch_from_config(QWEN25_VL_3B, "config.json") == preset
    nested = {  # transformers 5 writes the text numbers under text_config
        "model_type": "qwen2_5_vl",
        "tie_word_embeddings": True,
        "text_config": {k: v for k, v in QWEN25_VL_3B.items() if k != "vision_config"} | {"model_type": "x_text"},
        "vision_config": QWEN25_VL_3B["vision_config"],
    }
    assert model_arch.arch_from_config(nested, "config.json") == preset


def test_qwen2_vl_reads_embed_dim_and_its_two_matrix_mlp():
    """Qwen2-VL's vision width is embed_dim (its vision hidden_size is the LM's) and its MLP two matrices of
    mlp_ratio x width: read as 2/3 of that in the planner's three-matrix MLP."""
    qwen2_vl = {
        **{k: v for k, v in QWEN25_VL_3B.items() if k != "vision_config"},
        "model_type": "qwen2_vl",
        "vision_config": {"depth": 32, "embed_dim": 1280, "hidden_size": 2048, "mlp_ratio": 4, "num_heads": 16},
    }
    vision = model_arch.arch_from_config(qwen2_vl, "config.json").vision
    assert (vision.layers, vision.hidden, vision.intermediate, vision.patch, vision.merge) == (32, 1280, 3413, 14, 2)


def _meta_model(kind: str):
    import torch
    import transformers

    text = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 1000,
        "tie_word_embeddings": True,
    }
    if kind == "qwen2_5_vl":
        vision = {"depth": 3, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "out_hidden_size": 64}
        cfg = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True)
        cls = transformers.Qwen2_5_VLForConditionalGeneration
    else:
        vision = {"depth": 3, "embed_dim": 48, "hidden_size": 64, "mlp_ratio": 4, "num_heads": 2}
        cfg = transformers.Qwen2VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True)
        cls = transformers.Qwen2VLForConditionalGeneration
    with torch.device("meta"):
        model = cls(cfg)
    weights = {n: p.numel() for n, p in model.named_parameters() if not n.endswith("bias")}  # the planner's count
    return cfg.to_dict(), weights


def test_the_vision_tower_counts_what_transformers_builds():
    """Every weight (biases aside, as the planner counts) of a Qwen2.5-VL built by transformers on the meta device:
    the tower exactly, the whole model exactly; Qwen2-VL's two-matrix MLP read as 2/3 within 0.2%."""
    cfg, weights = _meta_model("qwen2_5_vl")
    arch = Arch.of(model_arch.arch_from_config(cfg, "qwen2_5_vl"))
    assert arch.vision_params == sum(n for name, n in weights.items() if "visual" in name)
    assert arch.params() == sum(weights.values())
    cfg, weights = _meta_model("qwen2_vl")
    arch = Arch.of(model_arch.arch_from_config(cfg, "qwen2_vl"))
    assert arch.vision_params == pytest.approx(sum(n for name, n in weights.items() if "visual" in name), rel=2e-3)


@pytest.mark.parametrize(
    "size, bounds",
    [
        ((300, 200), (3136, 1003520)),
        ((20, 20), (3136, 1003520)),  # scaled up to min_pixels
        ((4000, 3000), (3136, 1003520)),  # scaled down to max_pixels
        ((1000, 30), (3136, 200704)),
        ((57, 1111), (65536, 401408)),
    ],
)
def test_image_tokens_match_the_qwen2_vl_processor(size, bounds):
    """The tokens rlctl plans per image equal the image processor's own grid (t x h x w patches / merge^2), on a
    real image through transformers' pixel pipeline."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    processor = Qwen2VLImageProcessorPil(min_pixels=bounds[0], max_pixels=bounds[1])
    t, h, w = processor(images=[Image.new("RGB", size)])["image_grid_thw"][0]
    assert t == 1
    assert qwen2_vl.tokens_per_image(*size, 14, 2, *bounds) == h * w // 4


def test_lora_leaves_the_tower_frozen_unless_lora_vision():
    """LoRA's trainable parameters: the language model's adapters, plus the tower's with model.lora_vision (r x
    (in + out) per linear: qkv, proj, gate, up, down per block, the merger's two layers)."""
    arch = Arch.of(config.resolve("qwen2.5-vl-3b-grpo", None, None, "1xH100-80GB", []).model.arch)
    h, i, merged, out = 1280, 3420, 1280 * 4, 2048
    tower = 32 * 16 * ((h + 3 * h) + 2 * h + 3 * (h + i)) + 16 * (2 * merged + merged + out)
    assert arch.adapter_params(16, vision=True) - arch.adapter_params(16) == tower
    assert arch.vision_params == 1_505_280 + 32 * (4 * h * h + 3 * h * i + 2 * h) + h + merged * merged + merged * out


def test_image_tokens_lengthen_sequences_and_the_tower_activations_follow_them():
    cfg = config.resolve("qwen2.5-vl-3b-grpo", None, None, "1xH100-80GB", [])
    arch = Arch.of(cfg.model.arch)
    env = environment(cfg, planner.facts(cfg, "/tmp/x").hardware, 1, "vllm", "bf16")
    plain, seen = workloads(cfg, 1), workloads(cfg, 1, {"rl": 500})
    assert seen[0].prompt_tokens - plain[0].prompt_tokens == 500 and seen[0].tokens - plain[0].tokens == 500
    frozen, full = mm.Setup("single", "lora"), mm.Setup("single", "full")
    assert mm.vision_activations(arch, env, full, plain[0], 4) == 0  # no images, no tower activations
    per_block = 4 * 500 * 4 * 2 * (12 * 1280 + 4 * 3420)  # 4 rows x 500 tokens x 2x2 patches, bf16
    assert mm.vision_activations(arch, env, frozen, seen[0], 4) == per_block  # frozen: one block at a time
    assert mm.vision_activations(arch, env._replace(lora_vision=True), frozen, seen[0], 4) == 32 * per_block


def test_the_plan_of_qwen25_vl_3b_grpo_on_one_h100_shows_the_tower_and_image_tokens():
    """Hub data: the worst case of data.max_pixels (1,280 tokens per image), one image per row; the plan fits, the
    tower is in every phase's weights and its activations in training and in generation (transformers: rlctl has no
    vLLM engine for a VLM yet), and planning imported no torch."""
    run = plan_in_fresh_interpreter("--preset", "qwen2.5-vl-3b-grpo", "--hardware", "1xH100-80GB")
    plan = run["plan"]
    assert not run["torch"] and plan["memory"]["fits"]
    assert plan["model"]["vision_params"] == 668_253_440 and plan["model"]["params_billions"] == 3.75
    budget = plan["images"]["rl"]
    assert (budget["tokens_per_row"], budget["tokens_per_image"], budget["measured"]) == (1280, 1280, False)
    assert plan["generation"]["engine"] == "transformers" and plan["vllm"] is None
    assert "a vision-language model: RL generation uses transformers (docs/vlm.md)" in plan["warnings"]
    for phase in ("training", "generation"):
        found = next(p for p in plan["memory"]["phases"] if p["phase"] == phase)
        assert found["components_gib"]["vision tower activations"] > 0, phase
    assert any(d["setting"] == "vision tower" for d in plan["decisions"])
    proc = rlctl("plan", "--preset", "qwen2.5-vl-3b-grpo", "--hardware", "1xH100-80GB")
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 0, proc.stderr
    assert "Vision tower 668.3M parameters (32 blocks of 1280, 14 px patches merged 2x2)" in out
    assert "Image tokens rl: up to 1,280 image tokens per row (1 image(s), up to 1,280 tokens each); pixels " in out
    assert "3,136..1,003,520; worst case" in out


def test_local_images_are_planned_from_their_sizes(tmp_path):
    """Local data: the image tokens come from the images' sizes (two 280 x 280 images: 200 tokens per row), and
    the run directory's record makes a later plan (a resume) the same."""
    Image.new("RGB", (280, 280)).save(tmp_path / "a.png")
    rows = [{"prompt": "<image><image>Same?", "answer": "yes", "images": ["a.png", "a.png"]}]
    (tmp_path / "rl.jsonl").write_text(json.dumps(rows[0]) + "\n")
    sets = ["--set", f"data.rl={tmp_path / 'rl.jsonl'}", "--set", "data.eval=null"]
    plan = plan_in_fresh_interpreter("--preset", "qwen2.5-vl-3b-grpo", "--hardware", "1xH100-80GB", *sets)["plan"]
    budget = images.ImageBudget.from_json(plan["images"]["rl"])
    assert budget == images.ImageBudget(200, 100, 2, 3136, 1003520, read=2, seen=2)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    data_lengths.record(run_dir, {}, {"rl": budget})
    cfg = config.resolve("qwen2.5-vl-3b-grpo", None, None, "1xH100-80GB", [f"data.rl={tmp_path / 'rl.jsonl'}"])
    assert planner.build(cfg, run_dir).images == {"rl": budget}


def test_builtin_tiny_vlm_is_planned_from_its_preset_on_cpu():
    vision = "model.arch.vision={layers: 2, hidden: 32, heads: 2, intermediate: 64, patch: 14, merge: 2}"
    cfg = config.resolve("tiny-demo", None, None, "cpu", ["model.name_or_path=builtin:tiny-vlm", vision])
    plan = planner.build(cfg, "/tmp/rlctl-tiny-vlm-plan")
    assert plan.model.arch_source == "the preset (builtin:tiny-vlm)" and plan.model.vision_params
    assert plan.config.model.train_embeddings is True
    assert not any("real models train very slowly" in w for w in plan.warnings)
    assert plan.stages[0].init_from == "/tmp/rlctl-tiny-vlm-plan/base"


def test_an_async_generator_holds_the_image_tokens_too(tmp_path):
    cfg = config.resolve("qwen2.5-vl-3b-grpo", None, None, "8xH100-80GB", ["rl.async_rollout.enabled=true"])
    plan = planner.build(cfg, tmp_path / "run")
    assert plan.async_split.generator_engine == "transformers"
    assert plan.async_split.max_model_length == 1024 + 1280 + 2048


def test_vllm_generation_is_refused_for_a_vision_language_model():
    """rl.use_vllm=true: exit 2 before anything is written (rlctl's vLLM engines get no images yet)."""
    proc = rlctl("plan", "--preset", "tiny-vlm-demo", "--set", "rl.use_vllm=true")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "is a vision-language model" in proc.stderr and "rl.use_vllm=false or auto" in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr


def test_a_damaged_image_record_is_named(tmp_path):
    from rlctl import strictjson

    RunDir(tmp_path).data_lengths.write_text('{"images": {"rl": {"tokens_per_row": 5}}}')
    cfg = config.resolve("qwen2.5-vl-3b-grpo", None, None, "1xH100-80GB", [])
    with pytest.raises(strictjson.DamagedFile, match=r"data_lengths\.json is damaged.*one image per row"):
        data_lengths.image_budgets(cfg, tmp_path, None)


def test_text_only_stages_are_refused_for_a_vision_language_model(tmp_path):
    run_dir = tmp_path / "run"
    proc = rlctl("train", "--preset", "tiny-vlm-demo", "--set", "stages=[sft,rm,rl]", "--run-dir", str(run_dir))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = " ".join((proc.stdout + proc.stderr).split())
    assert "vision-language model" in said and "the rm stage cannot train it" in said and "stages=[sft, rl]" in said
    assert not run_dir.exists(), "refused before anything is written"


@pytest.mark.parametrize(
    ("preprocessor", "bounds"),
    [
        ({"min_pixels": 3136, "max_pixels": 12845056}, (3136, 12845056)),  # Qwen2.5-VL-Instruct's own file
        ({"size": {"shortest_edge": 784, "longest_edge": 200704}}, (784, 200704)),  # as transformers 5 saves it
        ({"image_processor_type": "Qwen2VLImageProcessor"}, (None, None)),  # none given: the processor's defaults
    ],
)
def test_a_local_model_is_planned_within_its_own_processors_pixel_bounds(tmp_path, preprocessor, bounds):
    """data.min_pixels / max_pixels unset: the bounds of the model folder's preprocessor_config.json, which its
    processor resizes within at run time, bound the planned image tokens; set, they win."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_VL_3B))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    sets = [f"model.name_or_path={tmp_path}", "data.min_pixels=null", "data.max_pixels=null"]
    cfg = config.resolve("qwen2.5-vl-3b-grpo", None, None, "1xH100-80GB", sets)
    plan = planner.build(cfg, tmp_path / "run")
    assert (plan.config.data.min_pixels, plan.config.data.max_pixels) == bounds
    budget = plan.images["rl"]
    expected = bounds[1] or qwen2_vl.MAX_PIXELS
    assert budget.max_pixels == expected and budget.tokens_per_image == expected // 28**2
    mine = planner.build(cfg.model_copy(update={"data": cfg.data.model_copy(update={"max_pixels": 401408})}), tmp_path)
    assert mine.images["rl"].max_pixels == 401408 and mine.config.data.max_pixels == 401408


def test_a_frozen_tower_takes_no_gradients_or_optimizer_states():
    """model.freeze_vision in full fine-tuning: the tower's fp32 weights stay, its gradients (4 B) and AdamW states
    (8 B) per parameter go, and its activations are one block's at a time."""
    cfg = config.resolve("qwen2.5-vl-3b-grpo", None, None, "1xH100-80GB", [])
    arch = Arch.of(cfg.model.arch)
    env = environment(cfg, planner.facts(cfg, "/tmp/x").hardware, 1, "transformers", "bf16")
    frozen_env, full = env._replace(freeze_vision=True), mm.Setup("single", "full")
    trains, frozen = mm.model_state(arch, env, full), mm.model_state(arch, frozen_env, full)
    assert trains["weights"] == frozen["weights"]
    assert trains["grads"] - frozen["grads"] == 4 * arch.vision_params
    assert trains["optim"] - frozen["optim"] == 8 * arch.vision_params
    seen = workloads(cfg, 1, {"rl": 500})[0]  # no checkpointing: a tower that trains keeps all 32 blocks' tensors
    one_block = mm.vision_activations(arch, frozen_env, full, seen, 4)
    assert one_block > 0 and mm.vision_activations(arch, env, full, seen, 4) == 32 * one_block
