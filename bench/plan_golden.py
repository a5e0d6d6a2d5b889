"""The plan's JSON for every preset x hardware spec x --set variant, with and without counted data lengths, saved
(`record DIR`) or compared with a saved set (`compare DIR`): a refactor of the planner must leave every file
byte-identical. Plans build in-process (no pre-flight, so no tokenizer is needed); refusals are saved as their
message. Volatile: the free disk where the run directory lives (the memory table's disk line, and the GiB free in
the warning of CPU plans whose checkpoints would not fit), masked on both sides; run_dir is a fixed path."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from rlctl import config
from rlctl.errors import UserError
from rlctl.plan import engine, planner

PRESETS = sorted(p.stem for p in Path(__file__).parent.parent.glob("presets/recipes/*.yaml"))
SPECS = ("cpu", "1xA10G-24GB", "1xL4-24GB", "1xH100-80GB", "8xH100-80GB", "2x8xH100-80GB")
SETS = (
    (),
    ("model.adapter=lora",),
    ("model.adapter=qlora",),
    ("rl.use_vllm=false",),
    ("rl.async_rollout.enabled=true",),
    ("hardware.strategy=fsdp2",),
    ("hardware.optimizer_offload=true",),
    ("rl.use_vllm=true",),
    ("model.arch=null",),
    ("rl.epochs=1", "model.adapter=lora"),
)
ALGORITHMS = (None, "ppo", "rloo")
LENGTHS = (None, {"rl": 100, "sft": 300, "rm": 200, "dpo": 250, "kto": 120})
RUN_DIR = "/tmp/rlctl-plan-golden-run"
FREE_DISK = re.compile(r"GiB but \d+ GiB are free")


def masked(text: str) -> str:
    """`text` with the free disk (which changes while the golden is used) masked."""
    return FREE_DISK.sub("GiB but ? GiB are free", text)


def plans() -> dict[str, str]:
    """{name: the plan's JSON, or the refusal} for each case."""
    out = {}
    for preset in PRESETS:
        for spec in SPECS:
            for algorithm, sets in [(a, s) for a in ALGORITHMS for s in SETS]:
                for i, lengths in enumerate(LENGTHS):
                    name = f"{preset}__{spec}__{algorithm}__{'_'.join(sets) or 'default'}__{i}".replace("=", "-")
                    try:
                        cfg = config.resolve(preset, None, algorithm, spec, list(sets))
                        plan = planner.build(cfg, RUN_DIR, lengths=lengths)
                        data = plan.to_json()
                        if data.get("memory") and "disk" in data["memory"]:
                            data["memory"]["disk"] = "masked"
                        out[name] = json.dumps(data, indent=2)  # key order kept: the order tables show
                    except (UserError, ValueError) as e:
                        out[name] = f"{type(e).__name__}: {e}"
    return out


def main() -> int:
    engine.installed = lambda: True  # the same plans whether or not vllm is installed here
    mode, folder = sys.argv[1], Path(sys.argv[2])
    got = plans()
    if mode == "record":
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in got.items():
            (folder / f"{name}.json").write_text(text)
        print(f"recorded {len(got)} plans in {folder}")
        return 0
    bad = [name for name, text in got.items() if masked((folder / f"{name}.json").read_text()) != masked(text)]
    print(f"{len(got) - len(bad)} of {len(got)} plans identical; differ: {bad[:20]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
