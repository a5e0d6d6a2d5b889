"""Run-wide monitors: what watches every stage's training, whichever trainer runs it, and reports through its
metrics log.

Owns: the alarms for runs that learn nothing (`alarms`: fed by every metrics record, torch-free), the measured
memory per stage and phase beside the plan's (`memory_probe`), the layout each stage runs read from the live
objects against its plan (`layout`: a contradiction stops the stage at its first step) and the held-out scores of a
stage's model at each checkpoint and at its end (`heldout`: the best checkpoint's metric).
May import: base, vision, config, sandbox, rundir, data, rewards, plan, algorithms, checkpoint, rollout, evaluation,
runtime.
"""
