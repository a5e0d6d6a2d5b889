"""What a training stage runs with, whichever trainer runs it (TRL's or rlctl's own): its context and inputs.

Owns: the stage's context (`context`: config, plan, run directory, the metrics log, the stop flag, the ways a stage
stops and the checkpoint it resumes from), its models and tokenizers as the plan loads them (`models`: dtype,
4-bit quantization, the LoRA config), its training rows under the length policy (`rows`, with the held-out tenth
of the preference data) and the RL stage's reward sources (`rewarding`: rl.rewards and the reward model, DAPO's
overlong buffer, the `Scorer` of rlctl's loop). Imported by the monitors, the trainer and the stages; these modules
import torch.
May import: base, vision, config, sandbox, rundir, data, rewards, plan, algorithms, checkpoint, rollout, evaluation.
"""
