"""`rlctl doctor`: is this machine ready to train? Python, torch and its CUDA, the GPUs, the library versions
against the supported matrix (with the exact command that fixes each mismatch), free disk, and the Hugging
Face Hub login (the token itself is never shown)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"


@dataclass(frozen=True)
class Supported:
    """One row of the supported matrix."""

    package: str
    spec: str
    optional: bool = False
    purpose: str = ""

    def install(self) -> str:
        """The pip requirement that installs a supported version."""
        return f"{self.package}{self.spec}"


# The supported matrix. tests/test_doctor.py checks it against pyproject.toml; docs/troubleshooting.md and
# docs/getting-started.md show it (generated).
MATRIX: tuple[Supported, ...] = (
    Supported("torch", "==2.13.*", purpose="training and generation"),
    Supported("transformers", ">=4.56,<5.18", purpose="models and tokenizers"),
    Supported("trl", "==1.16.*", purpose="SFT, reward model, DPO, KTO and GRPO trainers"),
    Supported("peft", ">=0.15", purpose="LoRA and QLoRA adapters"),
    Supported("accelerate", ">=1.4", purpose="launching, DDP and FSDP"),
    Supported("datasets", ">=3", purpose="dataset loading"),
    Supported("huggingface_hub", ">=0.34", purpose="Hub downloads and rlctl export --push"),
    Supported(
        "vllm", "==0.31.*", optional=True, purpose="fast colocated generation on GPUs (pip install 'rlctl[vllm]')"
    ),
    Supported("bitsandbytes", ">=0.46.1", optional=True, purpose="4-bit QLoRA (pip install 'rlctl[qlora]')"),
)
MIN_PYTHON = (3, 10)
DISK_WARN_GIB = 20.0
DISK_FAIL_GIB = 2.0


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


def pip(requirement: str, extra: str = "") -> str:
    """The exact pip command for this interpreter."""
    return f"{sys.executable} -m pip install {extra}'{requirement}'".replace("  ", " ")


def installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_package(req: Supported, version: str | None) -> Check:
    """A package's installed version against its supported range, with the fix command."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion

    if version is None:
        if req.optional:
            return Check(req.package, INFO, f"not installed (optional: {req.purpose})")
        return Check(req.package, FAIL, f"not installed; needed for {req.purpose}", pip(req.install()))
    try:
        ok = SpecifierSet(req.spec).contains(version, prereleases=True)
    except InvalidVersion:
        ok = False
    if ok:
        return Check(req.package, OK, f"{version} (supported: {req.spec})")
    extra = "--force-reinstall " if req.package == "torch" else ""
    return Check(req.package, FAIL, f"{version} is outside the supported {req.spec}", pip(req.install(), extra))


def check_python() -> Check:
    version = platform.python_version()
    if sys.version_info[:2] < MIN_PYTHON:
        need = ".".join(map(str, MIN_PYTHON))
        return Check(
            "python",
            FAIL,
            f"{version} ({sys.executable}); rlctl needs >= {need}",
            f"create a new environment with Python >= {need}: python3.11 -m venv .venv",
        )
    return Check("python", OK, f"{version} ({sys.executable})")


def nvidia_smi() -> list[str]:
    """GPUs the driver reports (name, memory, driver version), whatever torch thinks; [] without a driver."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=15,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def check_torch() -> list[Check]:
    """torch's CUDA build, whether it sees the GPUs, and what each GPU supports."""
    if installed_version("torch") is None:
        return []
    try:
        import torch
    except Exception as e:  # a broken install is exactly what doctor is for
        return [Check("torch import", FAIL, f"{type(e).__name__}: {e}", pip("torch==2.13.*", "--force-reinstall "))]
    driver_gpus = nvidia_smi()
    cuda_build = torch.version.cuda
    checks = []
    if not cuda_build:
        if driver_gpus:
            checks.append(
                Check(
                    "CUDA",
                    FAIL,
                    f"torch {torch.__version__} is a CPU-only build, but the driver reports {len(driver_gpus)} GPU(s)",
                    pip("torch==2.13.*", "--force-reinstall "),  # PyPI's Linux wheel is the CUDA build
                )
            )
        else:
            checks.append(Check("CUDA", INFO, f"CPU-only torch {torch.__version__}; no NVIDIA driver found: CPU runs"))
        return checks
    if not torch.cuda.is_available():
        detail = f"torch built for CUDA {cuda_build} but no GPU is usable"
        if driver_gpus:
            detail += (
                f" although the driver lists {len(driver_gpus)}: the driver is likely older than CUDA {cuda_build}"
            )
            fix = (
                f"update the NVIDIA driver to one that supports CUDA {cuda_build} (nvidia-smi shows the driver's CUDA)"
            )
            checks.append(Check("CUDA", FAIL, detail, fix))
        else:
            checks.append(Check("CUDA", INFO, detail + " (no NVIDIA driver): CPU runs"))
        return checks
    count = torch.cuda.device_count()
    checks.append(Check("CUDA", OK, f"CUDA {cuda_build}, {count} GPU(s) visible"))
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        cap = f"{props.major}.{props.minor}"
        mem = props.total_memory / 2**30
        bf16 = props.major >= 8
        note = "bf16" if bf16 else "no bf16 (fp16 mixed precision instead; flash attention unavailable)"
        checks.append(Check(f"GPU {i}", OK if bf16 else WARN, f"{props.name}, {mem:.0f} GiB, compute {cap}, {note}"))
    return checks


def check_disk(paths: dict[str, Path]) -> list[Check]:
    checks = []
    for label, path in paths.items():
        probe = path
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free = shutil.disk_usage(probe).free / 2**30
        status = FAIL if free < DISK_FAIL_GIB else WARN if free < DISK_WARN_GIB else OK
        fix = "" if status == OK else f"free space on {probe} (checkpoints of a 7B model take ~15 GiB each)"
        checks.append(Check(f"disk ({label})", status, f"{free:.1f} GiB free at {path}", fix))
    return checks


def hub_paths() -> dict[str, Path]:
    from huggingface_hub import constants

    return {"runs": Path.cwd(), "Hugging Face cache": Path(constants.HF_HOME)}


def _whoami(token: str, timeout: float) -> tuple[str | None, str | None]:
    """(user name, error) from the Hub's whoami, within `timeout` seconds."""
    result: dict[str, object] = {}

    def call() -> None:
        from huggingface_hub import HfApi

        try:
            result["info"] = HfApi().whoami(token=token)
        except Exception as e:
            result["error"] = e

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout)
    if "info" in result:
        info = result["info"]
        return (info.get("name") if isinstance(info, dict) else None) or "?", None
    if "error" in result:
        e = result["error"]
        status = getattr(getattr(e, "response", None), "status_code", None)
        return None, "the Hub rejected the token" if status in (401, 403) else f"Hub unreachable ({type(e).__name__})"
    return None, f"Hub unreachable (no answer in {timeout:g} s)"


def check_hub(online: bool = True, timeout: float = 8.0) -> Check:
    """Whether a Hub token is set, where from, and (online) whose it is. The token is never printed."""
    from huggingface_hub import constants, get_token

    token = get_token()
    login = "hf auth login"
    if not token:
        return Check(
            "Hub login", INFO, "no token (public models and datasets work; gated ones and --push need one)", login
        )
    source = "HF_TOKEN environment variable" if os.environ.get("HF_TOKEN") else f"token file {constants.HF_TOKEN_PATH}"
    if not online or constants.HF_HUB_OFFLINE:
        return Check("Hub login", OK, f"token set ({source}); not verified (offline)")
    name, error = _whoami(token, timeout)
    if name:
        return Check("Hub login", OK, f"logged in as {name} ({source}, {constants.ENDPOINT})")
    status = FAIL if error == "the Hub rejected the token" else WARN
    return Check("Hub login", status, f"token set ({source}); {error}", login if status == FAIL else "")


def run(online: bool = True) -> list[Check]:
    """Every check, in the order shown."""
    from rlctl import __version__

    checks = [Check("rlctl", INFO, f"{__version__} on {platform.platform()}, {os.cpu_count()} CPU core(s)")]
    checks.append(check_python())
    checks += [check_package(req, installed_version(req.package)) for req in MATRIX]
    checks += check_torch()
    checks += check_disk(hub_paths())
    checks.append(check_hub(online))
    return checks


def as_json(checks: list[Check]) -> list[dict]:
    return [asdict(c) for c in checks]
