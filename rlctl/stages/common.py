"""What every stage shares beside its context (`rlctl.stages.context`): the rows it keeps after the length policy
(`kept_rows`: the dropped ones logged and noted for summary.json) and the final save (`save_final`: LoRA merged,
sharded weights gathered, written whole). The TRL stages' own shared parts live in `rlctl.stages.trl_common`."""

from __future__ import annotations

from typing import Any

from rlctl import rundir
from rlctl.runtime import models
from rlctl.runtime.context import Trained
from rlctl.runtime.rows import training_rows
from rlctl.stages.context import StageContext
from rlctl.trainer import sharding


def kept_rows(ctx: StageContext, tok: Any) -> list[dict[str, Any]]:
    """The stage's rows that fit its limit (`rlctl.runtime.rows.training_rows`); those dropped as too long are
    logged (a metrics.jsonl `data` event) and kept in the context's `notes` for summary.json."""
    data = ctx.stage_data()
    rows, note = training_rows(data, tok)
    if note is not None:
        ctx.notes = note
        dropped = {"dropped_too_long": note.dropped_too_long, "kept": note.kept, "limit": note.limit}
        ctx.log.write(stage=ctx.stage.name, event="data", **dropped)
    return rows


def save_final(ctx: StageContext, trained: Trained) -> None:
    """Save the trained model (LoRA merged into full weights) and tokenizer to the stage's final folder.

    A stage that ended early (a signal, a NaN, an alarm, a broken weight sync) does not get a final folder: the
    reason is raised instead."""
    import shutil

    if trained.stopped is not None:
        raise trained.stopped
    acc, source = trained.accelerator, ctx.source()
    acc.wait_for_everyone()
    model = acc.unwrap_model(trained.model)
    if sharding.owns(ctx.stage):  # sharded by rlctl itself (its RL loop): gathered one weight at a time, LoRA merged
        state_dict, model = sharding.gathered_state_dict(model, keep=ctx.is_main), sharding.base_of(model)
    else:
        state_dict = acc.get_state_dict(trained.model)  # gathered from every shard under accelerate's FSDP
        if hasattr(model, "merge_and_unload"):
            model, state_dict = _merged(source, model), None
    if ctx.is_main:
        tmp = rundir.final_staging(ctx.final)
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, state_dict=state_dict)
        trained.tokenizer.save_pretrained(tmp)
        processor = models.processor(source)  # a vision-language model's goes with it
        if processor is not None:
            processor.save_pretrained(tmp)
        shutil.rmtree(ctx.final, ignore_errors=True)
        tmp.rename(ctx.final)
    acc.wait_for_everyone()


def _merged(source: models.ModelSource, peft_model):
    """LoRA adapters merged into plain weights. Under QLoRA they are merged into the base (`source`, the stage's
    starting model) reloaded unquantized (the frozen weights' dtype): merging into 4-bit layers would round the sum
    to NF4, and transformers cannot save a 4-bit model it quantized on load."""
    if source.adapter != "qlora":
        return peft_model.merge_and_unload()
    import copy
    import tempfile

    from peft import PeftModel

    quantized = peft_model.get_base_model()
    config = copy.deepcopy(quantized.config)
    del config.quantization_config
    with tempfile.TemporaryDirectory() as adapters:
        peft_model.save_pretrained(adapters)  # LoRA weights and modules_to_save (a reward model's head)
        base = type(quantized).from_pretrained(
            source.name,
            config=config,
            dtype=models.torch_dtype(source, trainable=False),
            trust_remote_code=source.model.trust_remote_code,
        )
        return PeftModel.from_pretrained(base, adapters).merge_and_unload()
