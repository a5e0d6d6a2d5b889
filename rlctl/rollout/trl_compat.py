"""Every use of TRL's internals in one place: the private methods and classes outside its public trainer API that
rlctl reaches into, written for TRL 1.16 (`rlctl.plan.packages.TRL_SERIES`). Each checks the installed TRL first
and refuses another series with the install command, rather than failing deep inside a run.

- `VLLMGeneration` (trl.generation.vllm_generation): the colocated engine of rlctl's loop.
- `VLLMGeneration._iter_named_params` / `sync_weights`: the weight push, replaced for a sharded policy and for
  vLLM's CPU build.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from typing import Any

from rlctl.errors import UserError


def check() -> None:
    """Refuse (UserError) a TRL other than the series these internals were written for."""
    from rlctl.plan import packages

    problem = packages.trl_problem()
    if problem is not None:
        raise UserError(
            f"rlctl's TRL adapters were written for TRL {packages.TRL_SERIES}, but {problem}; {packages.TRL_FIX}."
        )


def vllm_generation(**kwargs: Any) -> Any:
    """TRL's colocated vLLM engine (`VLLMGeneration(**kwargs)`)."""
    check()
    from trl.generation.vllm_generation import VLLMGeneration

    return VLLMGeneration(**kwargs)


def push_weights_from(generation: Any, weights: Callable[[], Iterator[tuple[str, Any]]]) -> None:
    """Make the engine's weight push read (name, full tensor) pairs from `weights()` instead of TRL's iteration."""
    generation._iter_named_params = weights


def pushed_weights(generation: Any) -> Iterator[tuple[str, Any]]:
    """The (name, tensor) pairs the engine's weight push reads (LoRA merged while it is iterated)."""
    return generation._iter_named_params()


def replace_push(generation: Any, push: Callable[[Any], None]) -> None:
    """Replace the engine's weight push (`sync_weights`) with `push(generation)`."""
    generation.sync_weights = types.MethodType(push, generation)
