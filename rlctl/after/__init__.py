"""After training: what a user does with a finished run directory.

Owns: `export` (a Hugging Face folder with a model card, optional Hub push), `report` (plots and report.md),
`doctor` (is this machine ready), `finals` (a finished stage's final folder re-created on resume).
May import: base, vision, config, sandbox, rundir, data, rewards, plan, algorithms, checkpoint, rollout, evaluation,
runtime, monitors, trainer, stages, launch.
"""
