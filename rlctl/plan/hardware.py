"""Hardware: parse `--hardware` specs and detect the local machine without initialising CUDA.

A spec (`1xH100-80GB`, `2x8xH100-80GB`) names the nominal memory; the planner budgets against what
nvidia-smi reports as the card's total (`gpu_usable_gib`, from a table of known cards) and knows each card's
compute capability (bf16 needs 8.0+). Host RAM of a spec is not known: it is assumed (`ram_assumed`).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from rlctl.errors import UserError

_SPEC = re.compile(r"^(?:(?P<nodes>\d+)x)?(?P<gpus>\d+)x(?P<name>[A-Za-z0-9]+?)-(?P<mem>\d+(?:\.\d+)?)GB$")

# memory.total (MiB) as nvidia-smi reports it, for the nominal sizes of common cards
KNOWN_TOTAL_MIB = {
    ("A10G", 24): 23028,
    ("L4", 24): 23034,
    ("A100", 40): 40960,
    ("A100", 80): 81920,
    ("H100", 80): 81559,
    ("H200", 141): 143771,
}
# compute capability by card name (bf16 needs 8.0 or newer)
COMPUTE_CAPABILITY = {
    "V100": "7.0",
    "T4": "7.5",
    "A100": "8.0",
    "A10G": "8.6",
    "A10": "8.6",
    "A40": "8.6",
    "A6000": "8.6",
    "RTX3090": "8.6",
    "L4": "8.9",
    "L40": "8.9",
    "L40S": "8.9",
    "RTX4090": "8.9",
    "H100": "9.0",
    "H200": "9.0",
    "GH200": "9.0",
    "B200": "10.0",
}
HOST_RAM_PER_GPU = 2.0  # a spec does not say its host RAM: assume 2 x GPU memory per GPU (typical cloud nodes)


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
    compute_capability: str = ""
    gpu_usable_gib: float = 0.0
    ram_assumed: bool = False

    @property
    def is_cpu(self) -> bool:
        return self.gpus_per_node == 0

    @property
    def bf16(self) -> bool:
        """bf16 kernels need compute capability 8.0+ (unknown cards are assumed recent)."""
        cc = self.compute_capability
        return not self.is_cpu and (not cc or float(cc) >= 8.0)

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
    name, mem = m["name"], float(m["mem"])
    known = KNOWN_TOTAL_MIB.get((name.upper(), int(mem))) if mem.is_integer() else None
    return Hardware(
        spec=spec,
        nodes=int(m["nodes"] or 1),
        gpus_per_node=gpus,
        gpu_name=name,
        gpu_memory_gib=mem,
        compute_capability=COMPUTE_CAPABILITY.get(name.upper(), ""),
        gpu_usable_gib=round(known / 1024, 2) if known else mem,
        ram_gib=HOST_RAM_PER_GPU * mem * gpus,
        ram_assumed=True,
    )


def nominal_gb(name: str, total_mib: float) -> int:
    """The marketing size of a card from nvidia-smi's total (23028 MiB A10G -> 24)."""
    for (known_name, size), mib in KNOWN_TOTAL_MIB.items():
        if known_name == name.upper() and abs(mib - total_mib) <= 0.02 * mib:
            return size
    return round(total_mib / 1024)


def _ram_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return 0.0


def _query_gpus(smi: str) -> list[dict[str, str]]:
    """index, name, memory.total (MiB) and compute capability of every GPU, from nvidia-smi (no CUDA init).

    Older drivers do not know `compute_cap`; the query is retried without it."""
    for fields in ("index,name,memory.total,compute_cap", "index,name,memory.total"):
        try:
            out = subprocess.run(
                [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        keys = fields.split(",")
        rows = [dict(zip(keys, (c.strip() for c in r.split(",")), strict=False)) for r in out.splitlines() if r.strip()]
        if rows and all(len(r) == len(keys) for r in rows):
            return rows
    return []


def _visible(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The GPUs CUDA_VISIBLE_DEVICES leaves visible (when it lists indices)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None or not all(p.strip().isdigit() for p in env.split(",") if p.strip()):
        return rows
    wanted = {p.strip() for p in env.split(",") if p.strip()}
    return [r for r in rows if r["index"] in wanted]


def detect() -> Hardware:
    """The local machine: GPUs from `nvidia-smi` (CUDA is never initialised here), else the CPU."""
    cores, ram = os.cpu_count() or 1, _ram_gib()
    smi = shutil.which("nvidia-smi")
    rows = _visible(_query_gpus(smi)) if smi else []
    if rows:
        name = rows[0]["name"].replace("NVIDIA ", "").split()[0]
        mib = min(float(r["memory.total"]) for r in rows)  # mixed cards: plan for the smallest
        cc = rows[0].get("compute_cap", "") or COMPUTE_CAPABILITY.get(name.upper(), "")
        mem = math.floor(mib / 1024 * 10) / 10
        return Hardware(
            spec=f"{len(rows)}x{name}-{nominal_gb(name, mib)}GB",
            gpus_per_node=len(rows),
            gpu_name=name,
            gpu_memory_gib=mem,
            cpu_cores=cores,
            ram_gib=ram,
            compute_capability=cc,
            gpu_usable_gib=mem,
        )
    return Hardware(spec="cpu", cpu_cores=cores, ram_gib=ram)


def has_local_gpu() -> bool:
    """Whether this machine has NVIDIA GPUs (nvidia-smi on PATH); a GPU plan made without them is for elsewhere."""
    return shutil.which("nvidia-smi") is not None


def resolve(spec: str) -> Hardware:
    """`auto` detects the local machine; anything else is parsed."""
    return detect() if spec == "auto" else parse_spec(spec)


def free_disk_gib(path: Path | str) -> float:
    """Free disk space where `path` (or its nearest existing parent) lives."""
    path = Path(path).resolve()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free / 2**30
