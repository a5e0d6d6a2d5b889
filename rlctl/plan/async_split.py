"""Where asynchronous RL runs (rl.async_rollout): the generator process beside the trainer processes.

On CPU the cores are split between the two processes (torch threads each). On GPUs the generator takes GPUs the
trainers do not use; a machine that cannot split (one GPU) is refused with the reason, since overlapping there
would need the engine and the trainer to time-share one card (sleep mode), which is what the synchronous loop
already does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from rlctl.errors import UserError
from rlctl.plan import hardware as hw


@dataclass(frozen=True)
class AsyncSplit:
    """The split of an async RL run: the generator's devices and threads, the trainers' share."""

    generator_engine: str  # transformers (a copy of the policy in the generator process) or vllm
    generator_gpus: int  # GPUs of the generator process (0 on CPU)
    trainer_gpus: int  # GPUs left to the trainer processes (0 on CPU)
    generator_threads: int  # torch CPU threads of the generator process
    trainer_threads: int  # torch CPU threads of each trainer process
    why: str  # one line for the plan's decisions

    def to_dict(self) -> dict:
        return asdict(self)


def split(hardware: hw.Hardware, procs: int, engine: str) -> AsyncSplit:
    """The split for `procs` trainer processes planned on `hardware`; a UserError where it cannot split."""
    if hardware.is_cpu:
        cores = max(hardware.cpu_cores, 2)
        gen = max(1, cores // (procs + 1))
        train = max(1, (cores - gen) // procs)
        why = f"{cores} CPU cores: {gen} for the generator process, {train} for each of {procs} trainer process(es)"
        return AsyncSplit("transformers", 0, 0, gen, train, why)
    gpus = hardware.gpus_per_node
    if gpus < 2:
        raise UserError(
            f"rl.async_rollout needs the generator on devices the trainer does not use, but {hardware.spec} has one "
            "GPU per node: overlapping there would time-share the card (the engine sleeping while the trainer "
            "steps), which is what the synchronous loop does already. Turn it off (rl.async_rollout.enabled=false) "
            "or plan for 2 or more GPUs (--hardware 2xH100-80GB)."
        )
    gen = max(1, gpus // 4)  # the engine side: a quarter of the node (at least one GPU), the rest trains
    why = f"{gpus} GPUs per node: {gen} for the generator ({engine}), {gpus - gen} for the trainer processes"
    return AsyncSplit(engine, gen, gpus - gen, 1, max(1, hardware.cpu_cores // gpus), why)
