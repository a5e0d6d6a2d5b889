"""Loading models and tokenizers for the stages, as their `ModelSource` says: the plan's dtype, quantization and
LoRA config, the user's chat template and trust setting."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from rlctl import vision
from rlctl.config.sections import ModelConfig
from rlctl.data import tokens
from rlctl.plan import Plan, StagePlan
from rlctl.vision.family import Family


@dataclass(frozen=True)
class ModelSource:
    """A model to load and how a stage loads it: its folder or Hub id (`name`), the model settings (`model`: dtype,
    trust_remote_code, LoRA, the vision tower's), the user's chat template (data.chat_template; None: the model's
    own), the plan's mixed precision ("bf16" or "no") and adapter ("full", "lora" or "qlora": 4-bit base weights),
    and whether the stage shards its models with FSDP2."""

    name: str
    model: ModelConfig
    chat_template: str | None
    mixed_precision: str
    adapter: str
    fsdp2: bool = False

    @classmethod
    def of(cls, plan: Plan, stage: StagePlan) -> ModelSource:
        """The starting model of `stage` (its init_from), loaded as `plan` says."""
        cfg = plan.config
        fsdp2 = stage.strategy == "fsdp2"
        return cls(stage.init_from, cfg.model, cfg.data.chat_template, plan.mixed_precision, plan.adapter, fsdp2)

    def at(self, name: str | Path) -> ModelSource:
        """The model at `name` (another stage's output, a checkpoint), loaded the same way."""
        return replace(self, name=str(name))


def template(source: ModelSource) -> str:
    """The user's chat template (data.chat_template; a built-in renders images as the model family does)."""
    return tokens.template_text(source.chat_template, vision.placeholder(source.model.arch))


def tokenizer(source: ModelSource):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(source.name, trust_remote_code=source.model.trust_remote_code)
    if source.chat_template:  # the user's template (saved with every stage's model)
        tok.chat_template = template(source)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _quantization(source: ModelSource) -> dict:
    if source.adapter != "qlora":
        return {}
    import torch
    from transformers import BitsAndBytesConfig

    return {
        "quantization_config": BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            # the plan's precision: bf16 under bf16 mixed precision, fp32 otherwise (CPU, GPUs without bf16)
            bnb_4bit_compute_dtype=torch.bfloat16 if source.mixed_precision == "bf16" else torch.float32,
            bnb_4bit_use_double_quant=True,
        )
    }


def _keep_trainable(model, trainable: bool):
    """A 4-bit model that trains keeps its layers' trainable layout: bitsandbytes (0.50) repacks a `Linear4bit`
    into an inference-only CPU layout the first time it runs in eval mode without gradients on a CPU with
    AVX512-BF16 (held-out scoring at a checkpoint, rollouts), and the next training forward on it fails."""
    if trainable:
        for module in model.modules():
            if hasattr(module, "support_avx512bf16_for_cpu"):
                module.support_avx512bf16_for_cpu = False
    return model


def is_vision(source: ModelSource) -> bool:
    """Whether the model is a vision-language model (its config has a vision tower)."""
    from transformers import AutoConfig

    from rlctl.rollout import vision as runtime

    config = AutoConfig.from_pretrained(source.name, trust_remote_code=source.model.trust_remote_code)
    return runtime.is_vision_model(config)


def family(source: ModelSource) -> Family:
    """The family of the vision-language model (`rlctl.vision`; one rlctl does not train is refused)."""
    from transformers import AutoConfig

    from rlctl.rollout import vision as runtime

    config = AutoConfig.from_pretrained(source.name, trust_remote_code=source.model.trust_remote_code)
    return runtime.family_of(config, source.name)


def processor(source: ModelSource):
    """The processor of a vision-language model (its images and text into model inputs), None for a text-only
    model; the user's chat template (data.chat_template) replaces its own."""
    from rlctl.rollout import vision as runtime

    proc = runtime.processor_of(source.name, source.model.trust_remote_code)
    if proc is None:
        return None
    if source.chat_template:
        proc.chat_template = proc.tokenizer.chat_template = template(source)
    if proc.tokenizer.pad_token is None:
        proc.tokenizer.pad_token = proc.tokenizer.eos_token
    return proc


def causal_lm(source: ModelSource, trainable: bool = True):
    """The policy's model class: a causal LM, or a vision-language model (image-text-to-text) for one."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    vlm = is_vision(source)
    auto = AutoModelForImageTextToText if vlm else AutoModelForCausalLM
    model = auto.from_pretrained(
        source.name,
        dtype=torch_dtype(source, trainable),
        trust_remote_code=source.model.trust_remote_code,
        **_quantization(source),
    )
    if vlm:
        model = in_step(source, model)
    return _keep_trainable(frozen_vision(source, model) if trainable else model, trainable)


def in_step(source: ModelSource, model):
    """A vision-language model sharded by FSDP2 runs its vision tower in step on every process
    (`rlctl.rollout.vision.keep_tower_in_step`); as it is otherwise."""
    if not source.fsdp2:
        return model
    from rlctl.rollout import vision as runtime

    return runtime.keep_tower_in_step(model)


def frozen_vision(source: ModelSource, model):
    """`model` with its vision tower (its family's `tower_modules`: the tower and its merger or projector) taking no
    gradients under model.freeze_vision in full fine-tuning (LoRA freezes every base weight anyway)."""
    from rlctl.rollout import vision as runtime

    if source.model.freeze_vision and source.adapter == "full" and runtime.is_vision_model(model.config):
        tower = set(runtime.family(model).tower_modules)
        for name, param in model.named_parameters():
            if tower & set(name.split(".")):
                param.requires_grad_(False)
    return model


def reward_model(source: ModelSource, pad_token_id: int, trainable: bool = True):
    """A sequence classifier with one output (the reward), its head freshly initialised when the model is an LM."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(
        source.name,
        num_labels=1,
        dtype=torch_dtype(source, trainable),
        trust_remote_code=source.model.trust_remote_code,
        pad_token_id=pad_token_id,
        **_quantization(source),
    )
    return _keep_trainable(model, trainable)


def torch_dtype(source: ModelSource, trainable: bool = True):
    """The dtype to load a model in. Under bf16 mixed precision, weights that train in full keep an fp32 master
    copy (autocast runs the math in bf16; AdamW updates below half a bf16 step would otherwise round away);
    frozen models and LoRA/QLoRA bases load in bf16."""
    import torch

    if source.model.dtype != "auto":
        return getattr(torch, source.model.dtype)
    if source.mixed_precision != "bf16":
        return torch.float32
    return torch.float32 if trainable and source.adapter == "full" else torch.bfloat16


def lora_config(source: ModelSource, task_type: str | None = "CAUSAL_LM"):
    """The PEFT LoRA config when the plan trains adapters, else None. `task_type` None: a model rlctl composes
    itself (PEFT's plain wrapper), whose value head `score` trains whole (a vision-language policy's critic,
    `rlctl.trainer.models.VisionValueModel`)."""
    if source.adapter not in ("lora", "qlora"):
        return None
    from peft import LoraConfig

    m = source.model
    # a vision-language model: adapters on the language model, and on the vision tower with model.lora_vision
    # (the tower's modules: its family's tower_modules); the tower trains no adapters otherwise
    heads: dict[str | None, list[str]] = {"TOKEN_CLS": ["score", "classifier"], None: ["score"]}
    exclude: str | list[str] | None = heads.get(task_type)
    family = vision.of_arch(m.arch)
    if family is not None and not m.lora_vision:  # PEFT: a string is a regex
        tower = "|".join(family.tower_modules)
        exclude = rf".*\b(?:{tower})\b.*" + "".join(rf"|(.*\.)?{name}" for name in exclude or [])
    # model.train_embeddings: the embeddings train whole beside the adapters, and a causal LM's output head with
    # them (kept tied to them when the model ties the two)
    embeddings = (["embed_tokens"] + (["lm_head"] if task_type == "CAUSAL_LM" else [])) if m.train_embeddings else None
    return LoraConfig(
        r=m.lora_r,
        lora_alpha=m.lora_alpha,
        lora_dropout=m.lora_dropout,
        target_modules="all-linear",
        # a value head (the critic's) trains whole: PEFT leaves it out of all-linear for SEQ_CLS only, and a head
        # with LoRA in it cannot also be one of the task's modules_to_save (which a plain model names itself)
        exclude_modules=exclude,
        modules_to_save=(embeddings or []) + (["score"] if task_type is None else []) or None,
        ensure_weight_tying=bool(embeddings),
        task_type=task_type,
    )
