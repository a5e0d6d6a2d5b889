"""The vision-language families (issue 50): each family one module of `rlctl.vision` that every rule reads (the
config's tower kinds, the planner, the pre-flight, the engine choice, the stages, the runtime); a vision-language
model of another family is refused by name, before anything is written, never taken for Qwen2-VL; vLLM's generator
takes the `Generator` protocol's images and refuses them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import get_args

import pytest

from rlctl import config, vision
from rlctl.config.sections import VisionArch
from rlctl.errors import UserError
from rlctl.plan import arch as model_arch
from rlctl.vision.family import Family
from tests.helpers import rlctl

# config.json of llava-hf/llava-1.5-7b-hf (the keys the planner reads): a vision-language family rlctl does not train
LLAVA = {
    "model_type": "llava",
    "image_token_index": 32000,
    "text_config": {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32064,
    },
    "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "image_size": 336, "patch_size": 14},
}


def test_every_family_is_one_whole_description():
    """Model types and tower kinds name one family each; the config admits exactly the families' tower kinds; a
    family is sharded by FSDP2 over several processes only with its own blank-tower pass; the built-in tokenizer
    gets every token the placeholder is made of."""
    model_types = [t for f in vision.FAMILIES for t in f.model_types]
    assert len(model_types) == len(set(model_types))
    assert len(vision.KINDS) == len(set(vision.KINDS))
    assert get_args(VisionArch.model_fields["kind"].annotation) == vision.KINDS
    for family in vision.FAMILIES:
        assert isinstance(family, Family) and vision.find(family.model_types[0]) is family
        has_pass = type(family).blank_tower is not Family.blank_tower
        assert family.fsdp2 == has_pass, family.name
        assert all(t in family.tokenizer_tokens for t in family.named_tokens.values())
        assert set(re.findall(r"<[^<>]+>", family.placeholder)) <= set(family.tokenizer_tokens)
        assert set(family.stages) <= {"sft", "dpo", "kto", "rm", "rl"}


def test_the_presets_towers_are_read_by_their_families():
    for preset, name in (("tiny-vlm-demo", "Qwen2-VL / Qwen2.5-VL"), ("tiny-gemma3-demo", "Gemma 3")):
        arch = config.resolve(preset, None, None, "cpu", []).model.arch
        assert vision.of_arch(arch).name == name
    assert vision.of_arch(config.resolve("tiny-demo", None, None, "cpu", []).model.arch) is None


def test_an_unknown_family_is_refused_by_name_by_the_planner():
    """A LLaVA config.json is not planned as its language model (as before issue 50) nor as Qwen2-VL: refused,
    naming its model_type and the families rlctl trains."""
    with pytest.raises(vision.UnknownFamily, match="model_type 'llava'") as e:
        model_arch.arch_from_config(LLAVA, "llava/config.json")
    assert "Qwen2-VL / Qwen2.5-VL (model_type qwen2_vl, qwen2_5_vl)" in str(e.value) and "Gemma 3" in str(e.value)
    assert isinstance(e.value, UserError)  # exit 2
    text = LLAVA["text_config"]  # its language model alone still plans as a text model
    assert model_arch.arch_from_config(text, "config.json").vision is None


def test_an_unknown_family_is_refused_before_anything_is_written(tmp_path: Path):
    (tmp_path / "llava").mkdir()
    (tmp_path / "llava" / "config.json").write_text(json.dumps(LLAVA))
    run = tmp_path / "run"
    sets = ["--set", f"model.name_or_path={tmp_path / 'llava'}", "--run-dir", str(run)]
    for command in ("plan", "train"):
        proc = rlctl(command, "--preset", "tiny-vlm-demo", "--hardware", "cpu", *sets, timeout=300)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 2, out
        assert "model_type 'llava', a family rlctl does not train" in " ".join(out.split()), out
        assert "Traceback" not in out and not run.exists()


def test_the_runtime_takes_no_unknown_family_for_qwen2_vl(tmp_path: Path):
    """What loads a model at run time (the processor, the family's token types, positions and special tokens)
    refuses a vision-language model of another family by name, where it fell back to Qwen2-VL's."""
    from transformers import LlavaConfig

    from rlctl.rollout import vision as runtime

    with pytest.raises(vision.UnknownFamily, match="model_type 'llava'"):
        runtime.family_of(LlavaConfig(), "llava-hf/llava-1.5-7b-hf")
    LlavaConfig().save_pretrained(tmp_path)
    with pytest.raises(vision.UnknownFamily, match="model_type 'llava'"):
        runtime.processor_of(tmp_path)


def test_vllm_generator_takes_the_protocols_images_and_refuses_them():
    """`VLLMGenerator.generate` has the `Generator` protocol's `vision` parameter; images are refused before the
    engine is asked (the engine itself is not needed to say so), prompts without any pass."""
    import inspect

    import torch

    from rlctl.rollout.generate import Generator
    from rlctl.rollout.vision import VisionInputs
    from rlctl.rollout.vllm import VLLMGenerator

    mine, protocol = inspect.signature(VLLMGenerator.generate), inspect.signature(Generator.generate)
    assert list(mine.parameters) == list(protocol.parameters)
    engine = object.__new__(VLLMGenerator)  # no vllm.LLM built: the refusal comes first
    with pytest.raises(UserError, match="cannot read images"):
        engine.generate([[1, 2]], vision=[VisionInputs(torch.zeros(4, 8))])
