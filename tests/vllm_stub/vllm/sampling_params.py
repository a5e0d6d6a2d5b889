"""vllm.sampling_params as TRL imports it."""

from dataclasses import dataclass


@dataclass
class StructuredOutputsParams:
    regex: str | None = None
