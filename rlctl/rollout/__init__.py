"""Rollouts: generating completions from a policy and scoring them.

Owns: vLLM colocated with training at run time (`vllm`: engine arguments, the weight push, sleep cycle, optimizer
state offload between phases) and generation + scoring for held-out evaluation (`evaluate`: greedy or sampled
completions, rewards, pass@k, reward-model scores); multi-turn rollouts with tools (`multiturn`: turns batched
across rollouts, tool results masked out of the loss; `tools`: the built-in and user tools and their schemas;
`toolcalls`: the tool-call format and the tool turns of the chat template).
May import: base, config, sandbox, data, rewards, plan, algorithms.
"""
