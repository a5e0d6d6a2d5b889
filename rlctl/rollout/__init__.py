"""Rollouts: generating completions from a policy and scoring them.

Owns: vLLM colocated with training at run time (`vllm`: engine arguments, the weight push, sleep cycle, optimizer
state offload between phases) and generation + scoring for held-out evaluation (`evaluate`: greedy or sampled
completions, rewards, pass@k, reward-model scores).
May import: base, config, data, rewards, plan, algorithms.
"""
