"""Loading models and tokenizers for the stages, with the plan's dtype, quantization and LoRA config and the user's
trust setting."""

from __future__ import annotations

from rlctl import vision
from rlctl.data import tokens
from rlctl.runtime.context import StageContext
from rlctl.vision.family import Family


def template(ctx: StageContext) -> str:
    """The user's chat template (data.chat_template; a built-in renders images as the model family does)."""
    return tokens.template_text(ctx.cfg.data.chat_template, vision.placeholder(ctx.cfg.model.arch))


def tokenizer(ctx: StageContext, path: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=ctx.cfg.model.trust_remote_code)
    if ctx.cfg.data.chat_template:  # the user's template (saved with every stage's model)
        tok.chat_template = template(ctx)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _quantization(ctx: StageContext) -> dict:
    if ctx.plan.adapter != "qlora":
        return {}
    import torch
    from transformers import BitsAndBytesConfig

    return {
        "quantization_config": BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            # the plan's precision: bf16 under bf16 mixed precision, fp32 otherwise (CPU, GPUs without bf16)
            bnb_4bit_compute_dtype=torch.bfloat16 if ctx.plan.mixed_precision == "bf16" else torch.float32,
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


def is_vision(ctx: StageContext, path: str) -> bool:
    """Whether the model at `path` is a vision-language model (its config has a vision tower)."""
    from transformers import AutoConfig

    from rlctl.rollout import vision as runtime

    config = AutoConfig.from_pretrained(path, trust_remote_code=ctx.cfg.model.trust_remote_code)
    return runtime.is_vision_model(config)


def family(ctx: StageContext, path: str) -> Family:
    """The family of the vision-language model at `path` (`rlctl.vision`; one rlctl does not train is refused)."""
    from transformers import AutoConfig

    from rlctl.rollout import vision as runtime

    config = AutoConfig.from_pretrained(path, trust_remote_code=ctx.cfg.model.trust_remote_code)
    return runtime.family_of(config, path)


def processor(ctx: StageContext, path: str):
    """The processor of the vision-language model at `path` (its images and text into model inputs), None for a
    text-only model; the user's chat template (data.chat_template) replaces its own."""
    from rlctl.rollout import vision as runtime

    proc = runtime.processor_of(path, ctx.cfg.model.trust_remote_code)
    if proc is None:
        return None
    if ctx.cfg.data.chat_template:
        proc.chat_template = proc.tokenizer.chat_template = template(ctx)
    if proc.tokenizer.pad_token is None:
        proc.tokenizer.pad_token = proc.tokenizer.eos_token
    return proc


def causal_lm(ctx: StageContext, path: str, trainable: bool = True):
    """The policy's model class: a causal LM, or a vision-language model (image-text-to-text) for one."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    vlm = is_vision(ctx, path)
    auto = AutoModelForImageTextToText if vlm else AutoModelForCausalLM
    model = auto.from_pretrained(
        path, dtype=torch_dtype(ctx, trainable), trust_remote_code=ctx.cfg.model.trust_remote_code, **_quantization(ctx)
    )
    if vlm:
        model = in_step(ctx, model)
    return _keep_trainable(frozen_vision(ctx, model) if trainable else model, trainable)


def in_step(ctx: StageContext, model):
    """A vision-language model sharded by FSDP2 runs its vision tower in step on every process
    (`rlctl.rollout.vision.keep_tower_in_step`); as it is otherwise."""
    if ctx.stage.strategy != "fsdp2":
        return model
    from rlctl.rollout import vision as runtime

    return runtime.keep_tower_in_step(model)


def frozen_vision(ctx: StageContext, model):
    """`model` with its vision tower (its family's `tower_modules`: the tower and its merger or projector) taking no
    gradients under model.freeze_vision in full fine-tuning (LoRA freezes every base weight anyway)."""
    from rlctl.rollout import vision as runtime

    if ctx.cfg.model.freeze_vision and ctx.plan.adapter == "full" and runtime.is_vision_model(model.config):
        tower = set(runtime.family(model).tower_modules)
        for name, param in model.named_parameters():
            if tower & set(name.split(".")):
                param.requires_grad_(False)
    return model


def reward_model(ctx: StageContext, path: str, pad_token_id: int, trainable: bool = True):
    """A sequence classifier with one output (the reward), its head freshly initialised when `path` is an LM."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(
        path,
        num_labels=1,
        dtype=torch_dtype(ctx, trainable),
        trust_remote_code=ctx.cfg.model.trust_remote_code,
        pad_token_id=pad_token_id,
        **_quantization(ctx),
    )
    return _keep_trainable(model, trainable)


def torch_dtype(ctx: StageContext, trainable: bool = True):
    """The dtype to load a model in. Under bf16 mixed precision, weights that train in full keep an fp32 master
    copy (autocast runs the math in bf16; AdamW updates below half a bf16 step would otherwise round away);
    frozen models and LoRA/QLoRA bases load in bf16."""
    import torch

    if ctx.cfg.model.dtype != "auto":
        return getattr(torch, ctx.cfg.model.dtype)
    if ctx.plan.mixed_precision != "bf16":
        return torch.float32
    return torch.float32 if trainable and ctx.plan.adapter == "full" else torch.bfloat16


def lora_config(ctx: StageContext, task_type: str | None = "CAUSAL_LM"):
    """The PEFT LoRA config when the plan trains adapters, else None. `task_type` None: a model rlctl composes
    itself (PEFT's plain wrapper), whose value head `score` trains whole (a vision-language policy's critic,
    `rlctl.trainer.models.VisionValueModel`)."""
    if ctx.plan.adapter not in ("lora", "qlora"):
        return None
    from peft import LoraConfig

    m = ctx.cfg.model
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
