"""Worker of tests/test_generation.py::test_sharded_generation_keeps_every_process_in_step (torchrun, 2 processes):
a policy sharded by rlctl.trainer.sharding generates greedily while the processes have different numbers of
prompts (rank 0: six, two calls of four; rank 1: none, then one), as multi-turn rollouts do once some have
answered. Writes OUT/rank<rank>.json: [first call, second call]."""

import json
import sys
from pathlib import Path

import torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlctl.rollout.generate import HFGenerator
from rlctl.trainer import sharding

model_dir, out = sys.argv[1], Path(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
tok = AutoTokenizer.from_pretrained(model_dir)
policy = AutoModelForCausalLM.from_pretrained(model_dir).eval()
sharding.shard(policy, "cpu")
gen = HFGenerator(tok, max_new_tokens=12, temperature=1.0, batch_size=4, synced=True)
gen.sync(policy)
prompts = [tok(f"{i} + 7 =")["input_ids"] for i in range(6)]
first = gen.generate(prompts if rank == 0 else [], greedy=True)
second = gen.generate([] if rank == 0 else prompts[:1], greedy=True)
(out / f"rank{rank}.json").write_text(json.dumps([first, second]))
dist.barrier()  # neither process tears gloo down while the other still talks to it
dist.destroy_process_group()
