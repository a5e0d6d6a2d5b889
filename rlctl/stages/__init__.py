"""Training stages, run inside `accelerate launch` by rlctl.launch.runner: one entry point per stage, `run(ctx)`.
These modules import torch.

Owns: sft, rm, dpo and kto on TRL's trainers, and rl on rlctl's own trainer (`rlctl.trainer`);
what the stages share (`common`: the TRL arguments from the plan, the callback that streams metrics and publishes
checkpoints, the final save); the offline tiny model (`tiny`) and the GGUF import (`gguf_import`) the run starts
from. What a stage runs with is `rlctl.runtime`, what watches it `rlctl.monitors`.
May import: base, vision, config, sandbox, rundir, data, rewards, plan, algorithms, checkpoint, rollout, evaluation,
runtime, monitors, trainer.
"""
