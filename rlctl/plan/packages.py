"""Optional packages a plan's layout needs, checked when the plan is made (without importing them).

A plan whose layout needs a package this machine lacks is refused (exit 2, with the install command) when the
run is to happen here - a CPU plan, or a GPU plan made on a machine with GPUs - and carries a warning when it is
made for another machine."""

from __future__ import annotations

import importlib.metadata

from rlctl.errors import UserError

# transformers 5.17 refuses 4-bit loading below this bitsandbytes ("requires bitsandbytes>=0.46.1");
# 0.50 is the first with CPU 4-bit kernels. pyproject's qlora extra and doctor's matrix use the same floor.
BITSANDBYTES_MIN = "0.46.1"


def installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def qlora_problem() -> str | None:
    """Why 4-bit QLoRA cannot load here, or None."""
    from packaging.version import Version

    version = installed_version("bitsandbytes")
    if version is None:
        return "bitsandbytes is not installed"
    if Version(version) < Version(BITSANDBYTES_MIN):
        return f"bitsandbytes {version} is installed, transformers needs >= {BITSANDBYTES_MIN}"
    return None


def check_layout(adapter: str, here: bool, warnings: list[str]) -> None:
    """Refuse (here) or warn (elsewhere) when the layout's packages are missing."""
    if adapter != "qlora":
        return
    problem = qlora_problem()
    if problem is None:
        return
    fix = f"pip install 'rlctl[qlora]' (bitsandbytes>={BITSANDBYTES_MIN})"
    if here:
        raise UserError(
            f"Invalid setup: the plan trains QLoRA (4-bit base + LoRA) but {problem}; {fix}, or choose another "
            "adapter with --set model.adapter=lora."
        )
    warnings.append(f"QLoRA needs bitsandbytes on the machine that trains ({problem} here): {fix}")
