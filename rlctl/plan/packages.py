"""Optional packages a plan needs, checked when the plan is made and again before a run starts here (without
importing them).

What a plan can need beyond the core install: bitsandbytes for QLoRA, vLLM when it generates the RL rollouts,
and the experiment trackers of `logging.report_to`. A plan whose needs are missing is refused (exit 2, with the
exact install command) when the run is to happen here - a CPU plan, or a GPU plan made on a machine with GPUs -
and carries a warning when it is made for another machine; `require` refuses at `rlctl train` / `resume` time
whatever is missing where the processes are about to start.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlctl.errors import UserError

# transformers 5.17 refuses 4-bit loading below this bitsandbytes ("requires bitsandbytes>=0.46.1");
# pyproject's qlora extra and doctor's matrix use the same floor.
BITSANDBYTES_MIN = "0.46.1"
# 4-bit layers on CPU: bitsandbytes' CPU kernels; rlctl's CPU QLoRA path is tested from this release (0.50.2)
BITSANDBYTES_CPU_MIN = "0.50"

# The TRL series rlctl's SFT, reward model, DPO and KTO stages were written for.
TRL_SERIES = "1.16"
TRL_FIX = f"pip install 'trl=={TRL_SERIES}.*' (the version rlctl pins)"

# logging.report_to -> (the modules its adapter imports, all needed; the install command). TensorBoard needs none:
# rlctl writes its event files itself (rlctl.launch.tbevents). MLflow's SQLite store needs SQLAlchemy and alembic,
# which mlflow-skinny leaves out.
TRACKERS: dict[str, tuple[tuple[str, ...], str]] = {
    "tensorboard": ((), ""),
    "wandb": (("wandb",), "pip install wandb"),
    "mlflow": (("mlflow", "sqlalchemy", "alembic"), "pip install mlflow-skinny sqlalchemy alembic"),
    "trackio": (("trackio",), "pip install trackio"),
}


@dataclass(frozen=True)
class Need:
    """A package the plan needs: what for, why it is unusable here, the install command and the way around it."""

    what: str
    problem: str
    fix: str
    instead: str

    def message(self) -> str:
        return f"the plan uses {self.what}, but {self.problem} here; {self.fix}, or {self.instead}"

    def warning(self) -> str:
        return f"the plan uses {self.what}: the machine that trains needs it ({self.problem} here): {self.fix}"


def installed_version(package: str, module: str | None = None) -> str | None:
    """The installed version of distribution `package`, or None when its module cannot be imported here."""
    if importlib.util.find_spec(module or package) is None:
        return None
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def qlora_problem(cpu: bool) -> str | None:
    """Why 4-bit QLoRA cannot load here (on CPU when `cpu`), or None."""
    from packaging.version import Version

    version = installed_version("bitsandbytes")
    if version is None:
        return "bitsandbytes is not installed"
    if Version(version) < Version(BITSANDBYTES_MIN):
        return f"bitsandbytes {version} is installed, transformers needs >= {BITSANDBYTES_MIN}"
    if cpu and Version(version) < Version(BITSANDBYTES_CPU_MIN):
        return f"bitsandbytes {version} is installed, 4-bit layers on CPU need >= {BITSANDBYTES_CPU_MIN}"
    return None


def trl_problem() -> str | None:
    """Why the installed TRL is not the series rlctl was written for, or None."""
    version = installed_version("trl")
    if version is None:
        return "trl is not installed"
    if version.split(".")[:2] != TRL_SERIES.split("."):
        return f"trl {version} is installed"
    return None


def missing(adapter: str, vllm: bool, cpu: bool, trackers: Sequence[str]) -> list[Need]:
    """The packages a layout needs that cannot be used here."""
    from rlctl.plan import engine

    out = []
    trl = trl_problem()
    if trl is not None:
        out.append(Need(f"TRL's trainers (rlctl is written for TRL {TRL_SERIES})", trl, TRL_FIX, "reinstall rlctl"))
    problem = qlora_problem(cpu) if adapter == "qlora" else None
    if problem is not None:
        fix = f"pip install 'rlctl[qlora]' (bitsandbytes>={BITSANDBYTES_CPU_MIN if cpu else BITSANDBYTES_MIN})"
        out.append(Need("QLoRA (4-bit base + LoRA)", problem, fix, "--set model.adapter=lora"))
    if vllm and not engine.installed():
        fix = engine.install_hint(cpu)
        out.append(Need("vLLM for the RL rollouts", "vllm is not installed", fix, "--set rl.use_vllm=false"))
    for tracker in trackers:
        modules, fix = TRACKERS[tracker]
        absent = [m for m in modules if importlib.util.find_spec(m) is None]
        if absent:
            what = f"{tracker} (logging.report_to)"
            problem = f"{' and '.join(absent)} {'is' if len(absent) == 1 else 'are'} not installed"
            out.append(Need(what, problem, f"{fix} (or 'rlctl[trackers]')", f"drop {tracker} from logging.report_to"))
    return out


def check_layout(
    adapter: str, vllm: bool, cpu: bool, trackers: Sequence[str], here: bool, said: Sequence[str]
) -> tuple[str, ...]:
    """At plan time: refuse (here) or warn (a plan for another machine) when the layout's packages are missing; the
    warnings to add to those the plan `said` already (a fix it names already is not repeated).
    `vllm`: the user asked for it (rl.use_vllm=true); vLLM assumed on rl.use_vllm=auto for named GPU hardware
    is `rlctl.plan.engine.choose`'s warning here and `require`'s refusal where the run starts."""
    needs = missing(adapter, vllm, cpu, trackers)
    if here and needs:
        raise UserError(f"Invalid setup: {needs[0].message()}.")
    out: list[str] = []
    for need in needs:
        if need.fix not in " ".join([*said, *out]):
            out.append(need.warning())
    return tuple(out)


def require(plan: Any) -> None:
    """Before processes start here (train, resume, a joining node): every package `plan` (a planner.Plan, which
    imports this module) needs, or exit 2."""
    cfg = plan.config
    vllm = plan.generation_engine == "vllm"
    needs = missing(plan.adapter, vllm, plan.hardware.is_cpu, list(cfg.logging.report_to))
    if needs:
        raise UserError(f"Cannot start the run here: {needs[0].message()}.")
