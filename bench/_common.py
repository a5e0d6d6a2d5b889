"""Shared by the bench scripts: where results go, the machine description, one rich table + one JSON file."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
PYTHON = sys.executable
RLCTL = shutil.which("rlctl", path=str(Path(sys.executable).parent)) or "rlctl"


def _load_1m() -> float:
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else 0.0


STARTED = (time.strftime("%Y-%m-%d %H:%M %Z"), _load_1m())  # when the bench script imported this module


def machine() -> dict:
    gpu = ""
    if shutil.which("nvidia-smi"):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"], capture_output=True, text=True
        )
        gpu = "; ".join(sorted(set(out.stdout.strip().splitlines())))
    return {
        "cpu_cores": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "gpu": gpu or "none",
        "python": platform.python_version(),
        "load_avg_1m_at_start": STARTED[1],
        "load_avg_1m_at_end": _load_1m(),
        "date": STARTED[0],
        "finished": time.strftime("%Y-%m-%d %H:%M %Z"),
    }


def report(name: str, title: str, columns: list[str], rows: list[list], payload: dict) -> Path:
    """Print one table and write bench/results/NAME.json with the machine, the command and the numbers."""
    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*[f"{v:.3g}" if isinstance(v, float) else str(v) for v in row])
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{name}.json"
    doc = {"command": "python " + " ".join([f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]]), "machine": machine()}
    out.write_text(json.dumps(doc | payload, indent=2) + "\n")
    Console().print(f"wrote {out}")
    return out
