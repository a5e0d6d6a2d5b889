"""What reward functions get as `trainer_state`: the two fields of transformers' `TrainerState` that the RL loop
fills, under TRL's names (`global_step`, `max_steps`).

Not transformers' class itself: importing it loads transformers' trainer modules (and peft, bitsandbytes through
them), 2.5-6 s of CPU in the trainer and again in every reward worker that unpickles one, for two integers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainerState:
    """The policy's optimizer steps before this step's update (`global_step`) and the stage's total (`max_steps`)."""

    global_step: int
    max_steps: int
