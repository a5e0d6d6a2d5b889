"""Rollouts: generating completions from a policy, in one turn or in several with tools.

Owns: the generation engines of RL (`generate`: transformers, and the plan's choice; `vllm`: vLLM colocated with
training, its arguments, the weight push and sleep cycle; `async_engine`: the generator engines of asynchronous
RL as the trainer drives them, `async_generator`: one engine's process, `weight_push`: the gloo broadcast of
every push to every engine, on any node), a rollout batch's pieces (`samples`: samples, the prompt stream, padded
batches and their log-probs), and multi-turn rollouts with tools (`multiturn`: turns batched across rollouts,
tool results masked out of the loss; `tools`: the built-in and user tools and their schemas; `toolcalls`: the
tool-call format and the tool turns of the chat template). The optimizer-state offload between phases is the
trainer's (`rlctl.trainer.offload`); held-out evaluation is `rlctl.evaluation`'s.
May import: base, vision, config, sandbox, rundir, data, rewards, plan, algorithms.
"""
