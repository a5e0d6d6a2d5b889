"""Rollouts: generating completions from a policy and scoring them.

Owns: the generation engines of RL (`generate`: transformers, and the plan's choice; `vllm`: vLLM colocated with
training, its arguments, the weight push and sleep cycle; `async_engine`: the generator process of asynchronous
RL), a rollout batch's pieces (`samples`: samples, the prompt stream, padded batches and their log-probs), and
generation + scoring for held-out evaluation (`evaluate`: greedy or sampled completions, rewards, pass@k,
reward-model scores); multi-turn rollouts with tools (`multiturn`: turns batched across rollouts, tool results
masked out of the loss; `tools`: the built-in and user tools and their schemas; `toolcalls`: the tool-call format
and the tool turns of the chat template). The optimizer-state offload between phases is the trainer's
(`rlctl.trainer.offload`).
May import: base, vision, config, sandbox, rundir, data, rewards, plan, algorithms.
"""
