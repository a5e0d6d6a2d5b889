"""rlctl's own RL trainer: the loop that runs the algorithms TRL 1.16 does not run faithfully (ppo, dapo,
reinforce-pp, reinforce-pp-baseline, remax, pf-ppo), entered by the rl stage (`rlctl.stages.rl`) as
`loop.train(ctx)`.

Owns: the loop and the phases of a step (`loop`: rollout, prepare with the weight-sync check, advantages, update,
log), what every step works with (`state`: the `Loop`, its setup and restore, the phase clock), the policy,
reference and critic and their forward passes (`models`), FSDP2 applied by rlctl and the full weights gathered
one at a time (`sharding`), the optimizer-state offload between phases (`offload`, TRL's trainers use it too),
the loop's checkpoints (`checkpoint`: accelerate state, DCP shards, loop state) and the asynchronous rollouts
(`async_rollout`: rounds sampled by the generator process, weights pushed after each step).
May import: base, config, sandbox, data, rewards, plan, algorithms, checkpoint, rollout, runtime, monitors.
"""
