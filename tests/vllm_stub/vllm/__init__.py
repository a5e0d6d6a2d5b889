"""A CPU stand-in for the part of vLLM 0.31's public API that rlctl's engine (rlctl/rollout/vllm.py) calls: `LLM(...)`,
`sleep` / `wake_up`, `collective_rpc` (on a worker whose model has `load_weights`, as on a GPU),
`reset_prefix_cache`, `generate` on token-id prompts, and `SamplingParams`. It lets rlctl's vLLM path run end to end
where vLLM cannot be installed (no GPU, no 320 MB wheel).

The engine keeps its own copy of the weights, filled only by `load_weights`; a level-2 sleep discards them (NaN),
as vLLM frees them, so generating from weights that were not pushed again produces garbage, and pushing or
generating while asleep raises, as the real engine crashes. Generation is transformers' `generate` on that copy,
one prompt at a time, stopping as vLLM's V1 scheduler does (EOS unless `ignore_eos`, then `stop_token_ids`,
the stop token kept); asked for log-probs (`logprobs=0, flat_logprobs=True`), it returns the sampled tokens'
after temperature (`processed_logprobs`) in the flat form. Every call is appended to `CALLS`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace

__version__ = "0.31.0"

CALLS: list[tuple[str, dict]] = []  # (method, details), every engine of the process, in order

# The keyword arguments of vllm.LLM this stand-in accepts (those rlctl's colocated engine passes).
LLM_ARGS = {
    "dtype",
    "enforce_eager",
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "enable_sleep_mode",
    "model_impl",
    "distributed_executor_backend",
    "seed",
    "max_num_batched_tokens",
    "logprobs_mode",
    "quantization",
    "trust_remote_code",
}


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16
    logprobs: int | None = None
    flat_logprobs: bool = False
    detokenize: bool = True
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    structured_outputs: object = None


@dataclass
class FlatLogprobs:
    logprobs: list[float]


@dataclass
class CompletionOutput:
    token_ids: list[int]
    logprobs: FlatLogprobs | None = None


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)


class _Model:
    """The worker's model (`worker.model_runner.model`, reached through `collective_rpc`): `load_weights`."""

    def __init__(self, llm: LLM):
        self.llm = llm

    def load_weights(self, weights) -> None:
        import torch

        weights = list(weights)
        if "weights" in self.llm.asleep:
            raise RuntimeError("load_weights while the weights are asleep (vLLM writes to unmapped memory)")
        params = dict(self.llm.model.named_parameters())
        for name, tensor in weights:
            if name not in params:
                raise KeyError(f"vLLM has no weight named {name!r}")
            with torch.no_grad():
                params[name].copy_(tensor.detach().to(params[name].dtype))
            self.llm.pushed.add(name)
        CALLS.append(("load_weights", {"names": [n for n, _ in weights]}))


class LLM:
    def __init__(self, model: str, **kwargs):
        from transformers import AutoModelForCausalLM

        unknown = set(kwargs) - LLM_ARGS
        if unknown:
            raise TypeError(f"LLM() got unexpected keyword arguments {sorted(unknown)}")
        self.kwargs = {"model": model, **kwargs}
        dtype = kwargs.get("dtype", "auto")  # "auto": the checkpoint's own, as transformers reads it
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).eval()
        self.asleep: set[str] = set()
        self.pushed: set[str] = set()
        runner = SimpleNamespace(model=_Model(self))
        self.worker = SimpleNamespace(device=SimpleNamespace(type="cuda"), model_runner=runner)  # as on a GPU
        CALLS.append(("init", dict(self.kwargs)))

    def collective_rpc(self, method, timeout=None, args: tuple = (), kwargs: dict | None = None) -> list:
        return [method(self.worker, *args, **(kwargs or {}))]

    def sleep(self, level: int = 1) -> None:
        import torch

        if not self.kwargs.get("enable_sleep_mode"):
            raise RuntimeError("sleep() needs enable_sleep_mode=True")
        self.asleep = {"weights", "kv_cache"}
        if level == 2:  # weights discarded, not offloaded
            with torch.no_grad():
                for p in self.model.parameters():
                    p.fill_(math.nan)
            self.pushed.clear()
        CALLS.append(("sleep", {"level": level}))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.asleep -= set(tags or ["weights", "kv_cache"])
        CALLS.append(("wake_up", {"tags": tags}))

    def reset_prefix_cache(self) -> bool:
        CALLS.append(("reset_prefix_cache", {}))
        return True

    def generate(self, prompts, sampling_params: SamplingParams | None = None, use_tqdm: bool = True):
        import torch

        if self.asleep:
            raise RuntimeError(f"generate while asleep: {sorted(self.asleep)}")
        sp = sampling_params or SamplingParams()
        eos = self.model.generation_config.eos_token_id
        stops = [] if sp.ignore_eos else ([eos] if isinstance(eos, int) else list(eos or []))
        stops += list(sp.stop_token_ids or [])
        sampling = {"do_sample": False} if sp.temperature < 1e-5 else {"do_sample": True, "temperature": sp.temperature}
        outputs = []
        for prompt in prompts:
            ids = list(prompt["prompt_token_ids"])
            with torch.no_grad():
                gen = self.model.generate(
                    input_ids=torch.tensor([ids]),
                    attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                    max_new_tokens=sp.max_tokens,
                    top_k=sp.top_k if sp.top_k > 0 else None,
                    top_p=sp.top_p,
                    eos_token_id=stops or None,
                    pad_token_id=stops[0] if stops else 0,
                    output_scores=True,
                    return_dict_in_generate=True,
                    **sampling,
                )
            out = gen.sequences[0, len(ids) :].tolist()
            cut = next((i for i, t in enumerate(out) if t in stops), None)
            out = out if cut is None else out[: cut + 1]
            logprobs = None
            if sp.logprobs is not None:  # the scores after temperature, as processed_logprobs
                picked = [torch.log_softmax(s[0].float(), -1)[t] for s, t in zip(gen.scores, out, strict=False)]
                logprobs = FlatLogprobs([float(x) for x in picked])
            outputs.append(RequestOutput(ids, [CompletionOutput(out, logprobs)]))
        CALLS.append(("generate", {"prompts": len(prompts), "temperature": sp.temperature, "params": sp}))
        return outputs
