"""Held-out evaluation: a policy's completions scored by rewards (accuracy, mean reward, pass@k) and a reward
model's pairwise accuracy, the same code for `rlctl eval` and for the scores a stage's model gets during training.

Owns: `evaluate` (greedy or sampled generation, multi-turn rollouts with tools, reward and reward-model scores,
pass@k, and loading a policy or reward model from a run directory, a folder or a Hub id). Imported by the RL
stage's reward sources (`rlctl.runtime.rewarding`: the reward model's scores), the held-out monitor
(`rlctl.monitors.heldout`) and the CLI (`rlctl eval`, the web page); these modules import torch.
May import: base, vision, config, sandbox, rundir, data, rewards, plan, algorithms, checkpoint, rollout.
"""
