"""Worker of tests/test_vllm_cpu.py::test_sharded_policy_syncs_into_each_process_engine (torchrun, 2 processes): a
policy sharded by rlctl.trainer.sharding (full, or LoRA with nonzero B) pushes its gathered weights, one at a time,
into each process's colocated vLLM engine; greedy completions of vLLM and of the gathered model in transformers,
before and after an update of the shards. Prints RESULT<rank> {round: [vllm, transformers]}."""

import json
import sys

import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlctl import config
from rlctl.plan import planner as plan
from rlctl.rollout import vllm
from rlctl.rollout.generate import HFGenerator
from rlctl.trainer import sharding

model_dir, run_dir, adapter = sys.argv[1:4]
torch.manual_seed(0)  # one change every run: an unseeded one could leave every greedy completion as it was
sets = [f"model.name_or_path={model_dir}", "rl.use_vllm=true", "hardware.num_processes=2", "hardware.strategy=fsdp2"]
cfg = config.resolve("tiny-demo", None, "reinforce-pp", None, sets)
the_plan = plan.build(cfg, run_dir)
acc = Accelerator(cpu=True)
tok = AutoTokenizer.from_pretrained(model_dir)
policy = AutoModelForCausalLM.from_pretrained(model_dir)
if adapter == "lora":  # B nonzero: the adapters change every merged weight
    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(policy, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(0.01 * torch.randn_like(p))
sharding.shard(policy, "cpu")
vllm_gen = vllm.colocated(the_plan, policy, acc, tok, sharding.full_weights)
hf_gen = HFGenerator(tok, cfg.rl.max_new_tokens, cfg.rl.temperature)
pairs = list(zip(range(10, 40), range(40, 10, -1), strict=True))[acc.process_index :: 2]  # each process its own prompts
prompts = [tok(f"{a} + {b} =", add_special_tokens=False)["input_ids"] for a, b in pairs]
# the LoRA step is larger: moving A and B by 0.01 moves the merged weights far less than 0.01
step = 0.1 if adapter == "lora" else 0.01
out = {}
for round_ in ("start", "after a change"):
    vllm_gen.sync(policy)
    gathered = AutoModelForCausalLM.from_pretrained(model_dir)
    gathered.load_state_dict(sharding.gathered_state_dict(policy, keep=True), strict=False)  # tied head: once
    hf_gen.sync(gathered)
    out[round_] = (vllm_gen.generate(prompts, greedy=True), hf_gen.generate(prompts, greedy=True))
    with torch.no_grad():  # an update the engine must follow, on this process's shards
        for p in policy.parameters():
            if p.requires_grad:
                p.to_local().add_(step * torch.randn_like(p.to_local()))
print(f"RESULT{acc.process_index} " + json.dumps(out))
