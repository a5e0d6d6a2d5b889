"""Hardware: parse `--hardware` specs and detect the local machine without initialising CUDA."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from rlctl.errors import UserError

_SPEC = re.compile(r"^(?:(?P<nodes>\d+)x)?(?P<gpus>\d+)x(?P<name>[A-Za-z0-9]+?)-(?P<mem>\d+(?:\.\d+)?)GB$")


@dataclass(frozen=True)
class Hardware:
    """What a run is planned for: `gpus_per_node` GPUs of `gpu_memory_gib` each on `nodes` nodes."""

    spec: str
    nodes: int = 1
    gpus_per_node: int = 0
    gpu_name: str = ""
    gpu_memory_gib: float = 0.0
    cpu_cores: int = 0
    ram_gib: float = 0.0

    @property
    def is_cpu(self) -> bool:
        return self.gpus_per_node == 0

    @property
    def world_size(self) -> int:
        return self.nodes * max(self.gpus_per_node, 1)

    def to_dict(self) -> dict:
        return asdict(self)


def parse_spec(spec: str) -> Hardware:
    """`cpu`, `1xH100-80GB` or `2x8xH100-80GB` as a Hardware."""
    if spec == "cpu":
        return Hardware(spec="cpu", cpu_cores=os.cpu_count() or 1, ram_gib=_ram_gib())
    m = _SPEC.match(spec)
    if not m:
        raise UserError(
            f"Unknown hardware spec '{spec}'. Use `cpu`, `auto`, NxGPU-MEMGB (e.g. 1xH100-80GB) "
            "or MxNxGPU-MEMGB for M nodes (e.g. 2x8xH100-80GB)."
        )
    gpus = int(m["gpus"])
    if gpus < 1:
        raise UserError(f"Hardware spec '{spec}' has no GPUs; use `cpu` to plan for CPU only.")
    return Hardware(
        spec=spec,
        nodes=int(m["nodes"] or 1),
        gpus_per_node=gpus,
        gpu_name=m["name"],
        gpu_memory_gib=float(m["mem"]),
    )


def _ram_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return 0.0


def detect() -> Hardware:
    """The local machine: GPUs from `nvidia-smi` (CUDA is never initialised here), else the CPU."""
    cores, ram = os.cpu_count() or 1, _ram_gib()
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        rows = [r.split(",") for r in out.strip().splitlines() if r.strip()]
        if rows:
            name = rows[0][0].strip().replace("NVIDIA ", "").split()[0]
            mem = round(float(rows[0][1]) / 1024, 1)
            return Hardware(
                spec=f"{len(rows)}x{name}-{round(mem)}GB",
                gpus_per_node=len(rows),
                gpu_name=name,
                gpu_memory_gib=mem,
                cpu_cores=cores,
                ram_gib=ram,
            )
    return Hardware(spec="cpu", cpu_cores=cores, ram_gib=ram)


def resolve(spec: str) -> Hardware:
    """`auto` detects the local machine; anything else is parsed."""
    return detect() if spec == "auto" else parse_spec(spec)


def free_disk_gib(path: Path) -> float:
    """Free disk space where `path` (or its nearest existing parent) lives."""
    path = path.resolve()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free / 2**30
