"""Training stages, run inside `accelerate launch` by rlctl.launch.runner. These modules import torch.

Owns: each stage's training (sft, rm, dpo, kto on TRL's trainers; rl on TRL's GRPO/RLOO or rlctl's own loop,
`rl_loop` with its models `rl_models` and `weight_sync` check), what they share (`common`) and the offline tiny
model (`tiny`); what they run with is `rlctl.runtime`, what watches them `rlctl.monitors`.
May import: base, config, sandbox, data, rewards, plan, algorithms, checkpoint, rollout, runtime, monitors.
"""
