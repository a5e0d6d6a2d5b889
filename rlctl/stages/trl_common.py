"""What the TRL stages (sft, rm, dpo, kto) share: the TRL config built from the plan (`training_args`, their
argument builder), the callback that streams a trainer's logs to metrics.jsonl, publishes complete checkpoints and
stops safely (`StreamMetrics`), training from the last complete checkpoint (`train`), a causal LM trained and saved
(`train_causal_lm`) and the held-out pairs scored through TRL's evaluate() (`score_held_out_pairs`). Only the TRL
stages import it: transformers' callback module pulls in its trainer utilities (peft, bitsandbytes: seconds at
import), which a run of the rl stage alone never needs."""

from __future__ import annotations

import math
from typing import Any

from transformers import TrainerCallback

from rlctl import checkpoint
from rlctl.monitors import trl_callbacks
from rlctl.runtime import models
from rlctl.runtime.context import Trained, alarm_stop, resume_point, signalled, stop_signal
from rlctl.runtime.models import lora_config
from rlctl.stages.common import save_final
from rlctl.stages.context import StageContext

# Trainer log keys worth streaming, renamed to rlctl's metric names.
_LOG_KEYS = {
    "loss": "loss",
    "learning_rate": "lr",
    "grad_norm": "grad_norm",
    "reward": "reward",
    "kl": "kl",
    "entropy": "entropy",
    "accuracy": "accuracy",
    "margin": "margin",
    "mean_token_accuracy": "token_accuracy",
    "completions/mean_length": "response_length",
    "clip_ratio/region_mean": "clip_ratio",
    "rewards/accuracies": "accuracy",
    "rewards/margins": "margin",
    "frac_reward_zero_std": "frac_reward_zero_std",
    "completions/clipped_ratio": "truncated_ratio",
}


class StreamMetrics(TrainerCallback):
    """Streams trainer logs to metrics.jsonl, publishes checkpoints once fully written, stops safely on a
    signal (checkpoint at the step boundary) and on a NaN/inf loss or reward (no checkpoint of that state)."""

    def __init__(self, ctx: StageContext):
        self.ctx, self.monitors = ctx, ctx.monitors()
        self.non_finite: tuple[str, float, int] | None = None  # (key, value, step) of the first NaN/inf
        self.stopped_by_alarm = False  # an alarm asked to stop (logging.alarms: stop)
        self.begin = 0  # the step this attempt started from (a resume's checkpoint)

    def on_train_begin(self, args, state, control, **kwargs):
        self.begin = state.global_step

    def on_train_end(self, args, state, control, **kwargs):
        """The alarm for a resume that trained 0 steps reads this record."""
        resumed = self.begin if self.begin else None
        steps = state.global_step - self.begin
        self.ctx.log.write(
            stage=self.ctx.stage.name, event="trained", resumed_from=resumed, steps=steps, max_steps=state.max_steps
        )
        self.stopped_by_alarm = self.stopped_by_alarm or alarm_stop(self.ctx.log)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == state.max_steps:  # the last step is logged whatever logging.every says
            control.should_log = True
        if stop_signal(self.ctx.stop):
            control.should_save = True
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "train_runtime" in logs:
            return
        values = {}
        for key, name in _LOG_KEYS.items():
            value = logs.get(key)
            if isinstance(value, int | float):
                if not math.isfinite(value) and key in ("loss", "reward", "grad_norm"):
                    self.non_finite = (key, value, state.global_step)
                    control.should_save = False
                    control.should_training_stop = True
                elif math.isfinite(value):
                    values[name] = float(value)
        self.ctx.log.write(stage=self.ctx.stage.name, step=state.global_step, max_steps=state.max_steps, **values)
        if alarm_stop(self.ctx.log):
            self.stopped_by_alarm = True
            control.should_save = False
            control.should_training_stop = True

    def on_save(self, args, state, control, model=None, processing_class=None, **kwargs):
        tokenizer = getattr(processing_class, "tokenizer", processing_class)  # a vision-language model's processor
        self.monitors.publish(state.global_step, model, tokenizer)


def training_args(ctx: StageContext, config_cls, **extra: Any):
    """A TRL config (SFTConfig, RewardConfig, GRPOConfig) filled from the plan and the stage settings."""
    sc, plan = ctx.settings, ctx.plan
    return config_cls(
        output_dir=str(checkpoint.incoming(ctx.checkpoints)),  # renamed into ctx.checkpoints once complete
        max_steps=sc.max_steps,
        per_device_train_batch_size=ctx.stage.micro_batch_size,
        gradient_accumulation_steps=ctx.stage.grad_accum,
        learning_rate=sc.learning_rate,
        lr_scheduler_type=sc.lr_scheduler,
        warmup_steps=sc.warmup_ratio,
        weight_decay=sc.weight_decay,
        max_grad_norm=sc.max_grad_norm,
        logging_steps=ctx.cfg.logging.every,
        logging_first_step=True,
        save_strategy="steps",
        save_steps=sc.save_every,
        seed=ctx.cfg.seed,
        data_seed=ctx.cfg.seed,
        bf16=plan.mixed_precision == "bf16",
        use_cpu=plan.hardware.is_cpu,
        report_to="none",  # rlctl sends its metrics.jsonl records to logging.report_to (rlctl.launch.trackers)
        disable_tqdm=True,
        gradient_checkpointing=plan.gradient_checkpointing,
        dataloader_num_workers=0,
        **extra,
    )


def train(ctx: StageContext, trainer, tokenizer) -> Trained:
    """Train a TRL trainer from the stage's last complete checkpoint; what it trained, and why it ended early if
    it did (a non-finite value, an alarm, a signal)."""
    trainer.train(resume_from_checkpoint=resume_point(ctx.checkpoints, ctx.is_main))
    guard = next((cb for cb in trainer.callback_handler.callbacks if isinstance(cb, StreamMetrics)), None)
    stopped: Exception | None
    if guard is not None and guard.non_finite:
        stopped = ctx.stops.non_finite_stopped(*guard.non_finite)
    elif guard is not None and guard.stopped_by_alarm:
        stopped = ctx.stops.alarm_stopped(trainer.state.global_step)
    else:
        stopped = signalled(ctx.stop)
    return Trained(trainer.accelerator, trainer.model, tokenizer, stopped)


def train_causal_lm(ctx: StageContext, trainer_cls, args, rows: list[dict], tok):
    """SFT, DPO and KTO: TRL's `trainer_cls` on `rows` from the stage's starting model (LoRA/QLoRA as planned),
    checked against the plan, resumed from the last complete checkpoint, and saved; returns the trainer."""
    from datasets import Dataset

    source = ctx.source()
    trainer = trainer_cls(
        model=models.causal_lm(source),
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        peft_config=lora_config(source),
        callbacks=[StreamMetrics(ctx)],
    )
    trl_callbacks.follow(ctx.monitors(), trainer)
    save_final(ctx, train(ctx, trainer, tok))
    return trainer


class _LastLog(TrainerCallback):
    """Keeps the last log a trainer sends (its evaluate() metrics)."""

    def __init__(self):
        self.logs: dict[str, float] = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs = dict(logs or {})


def score_held_out_pairs(ctx: StageContext, trainer, rows: list[dict], accuracy: str | None) -> None:
    """DPO and KTO: the trained policy's implicit-reward accuracy (`accuracy`, TRL's eval metric, None for KTO whose
    unpaired rows have none) and mean chosen-minus-rejected margin on the held-out tenth of data.preference,
    through TRL's own evaluate(), logged as one `heldout` record that `rlctl report` charts."""
    from datasets import Dataset

    if not rows:
        return
    trainer.remove_callback(StreamMetrics)  # an eval log is not a training step
    last = _LastLog()
    trainer.add_callback(last)
    trainer.evaluate(eval_dataset=Dataset.from_list(rows))
    scores = {"preference_margin": last.logs.get("eval_rewards/margins")}
    if accuracy is not None:
        scores["preference_accuracy"] = last.logs.get(accuracy)
    found = {k: float(v) for k, v in scores.items() if isinstance(v, int | float) and math.isfinite(v)}
    if ctx.is_main and found:
        ctx.log.write(stage=ctx.stage.name, event="heldout", pairs=len(rows), **found)
