"""FSDP2 in the stage rlctl owns (its RL loop): torch's `fully_shard` applied by rlctl itself, per decoder layer and
then the root (torchtune's way), so the same code runs on CPU processes (gloo) and on GPUs (NCCL); accelerate
engages FSDP only on GPUs.

This module owns the sharded side of what the loop does with weights:

* `shard`: parameters, gradients and AdamW states split over the processes (DTensor shards; the optimizer built
  on the sharded parameters holds only its shard's moments);
* `full_weights`: the full weights under their Hugging Face names, one parameter (or one LoRA layer, merged on the
  fly without touching the trained weights) gathered at a time: the vLLM weight push and the final save read it,
  so no process ever gathers the whole model for a sync.

A checkpoint's sharded models and optimizers go through DCP, one file per process (`rlctl.trainer.state`).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any

from rlctl.plan import StagePlan


def owns(stage: StagePlan) -> bool:
    """Whether rlctl shards the models of `stage` itself: its RL loop under fsdp2 (TRL stages shard through
    accelerate, on GPUs)."""
    return stage.strategy == "fsdp2" and stage.name == "rl"


@contextlib.contextmanager
def full_loading() -> Iterator[None]:
    """Every process loads full weights from disk. Under an FSDP accelerate config transformers' RAM-efficient
    loading fills the weights of every process but the first with zeros, for accelerate's FSDP preparation to
    broadcast; rlctl shards the models itself, so they must be complete everywhere first."""
    saved = os.environ.get("FSDP_CPU_RAM_EFFICIENT_LOADING")
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "false"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("FSDP_CPU_RAM_EFFICIENT_LOADING")
        else:
            os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = saved


@functools.cache
def _mesh(device_type: str):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (dist.get_world_size(),))


def decoder_layers(model: Any) -> list[Any]:
    """The model's repeated blocks: the classes transformers never splits across devices (`_no_split_modules`)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def shard(model: Any, device_type: str, mixed_precision: str = "no") -> Any:
    """`model` with each decoder layer and then the root sharded over every process (FSDP2, in place). Under bf16
    mixed precision layers compute in bf16 from the fp32 shards and reduce gradients in fp32."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    precision = MixedPrecisionPolicy()
    if mixed_precision == "bf16":
        precision = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    mesh = _mesh(device_type)
    layers = decoder_layers(model)
    if not layers:
        raise RuntimeError(f"{type(model).__name__} names no decoder layer class (_no_split_modules) to shard")
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=precision)
    fully_shard(model, mesh=mesh, mp_policy=precision)
    return model


def _full(tensor: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _hf_name(name: str) -> str:
    """A parameter's name in the plain model: PEFT's wrapper prefix and `base_layer` removed."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def _merged(module: Any) -> Any:
    """A LoRA linear layer's base weight plus its active adapters' B @ A x scaling, gathered (the module's own
    weights are not changed, unlike PEFT's merge)."""
    weight = _full(module.base_layer.weight.detach())
    total = weight.float()
    for adapter in module.active_adapters:
        delta = _full(module.lora_B[adapter].weight.detach()).float() @ _full(module.lora_A[adapter].weight.detach())
        total = total + (delta.T if module.fan_in_fan_out else delta) * module.scaling[adapter]
    return total.to(weight.dtype)


def full_weights(model: Any) -> Iterator[tuple[str, Any]]:
    """(Hugging Face name, full tensor) of every weight of `model`, LoRA adapters merged, one parameter (one LoRA
    layer) gathered at a time; a tied weight once. Every process must iterate it to the end (each gather is a
    collective)."""
    seen: set[int] = set()
    for prefix, module in model.named_modules():
        if hasattr(module, "original_module") and hasattr(module, "modules_to_save"):  # PEFT's trained copy
            on = module.active_adapters and not module.disable_adapters
            used = module.modules_to_save[module.active_adapters[0]] if on else module.original_module
            for name, param in used.named_parameters():
                if id(param) not in seen:  # a tied copy (the output head's) once
                    yield _hf_name(f"{prefix}.{name}"), _full(param.detach())
            seen.update(id(p) for p in module.parameters())
            continue
        lora = hasattr(module, "lora_A") and hasattr(module, "base_layer")
        if lora:
            seen.update(id(p) for p in module.parameters())
            yield _hf_name(f"{prefix}.base_layer.weight"), _merged(module)
            bias = module.base_layer.bias
            if bias is not None:
                yield _hf_name(f"{prefix}.base_layer.bias"), _full(bias.detach())
            continue
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            yield _hf_name(f"{prefix}.{name}" if prefix else name), _full(param.detach())


def gathered_state_dict(model: Any, keep: bool) -> dict[str, Any] | None:
    """The full weights of `model` (LoRA merged) on this process's CPU when `keep` (the process that saves), else
    None; every process takes part in each gather."""
    out = {}
    for name, tensor in full_weights(model):
        if keep:
            out[name] = tensor.cpu()
    return out if keep else None


def base_of(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (itself without one): what saves the merged weights."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model
