"""rlctl's own RL trainer: the loop that trains every RL algorithm (grpo and its family, rloo, ppo, vapo, dapo,
reinforce-pp, remax, pf-ppo), entered by the rl stage (`rlctl.stages.rl`) as `loop.train(parts, settings, hooks)`:
ready-built models, optimizers, scorer and engine, the rl section with the plan fields the loop reads, and the
stage's hooks (never its context).

Owns: the loop and the phases of a step (`loop`: rollout, prepare with the weight-sync check, advantages, update,
log), the loop's state (`state`: what the stage hands it, the `Loop` every step works with, its setup, its
checkpoints with the DCP shards and its restore on resume, the phase clock), the policy, reference and critic's
optimizers and forward passes (`models`), FSDP2 applied by rlctl and the full weights gathered one at a time
(`sharding`), the optimizer-state offload between phases (`offload`) and the asynchronous rollouts (`async_rollout`:
rounds sampled by the generator engines, each its share, weights pushed to all of them after each step).
May import: base, vision, config, sandbox, rundir, data, rewards, plan, algorithms, checkpoint, rollout, evaluation,
runtime, monitors.
"""
