"""Plan decisions about how each stage trains: embeddings beside adapters, and each stage's distribution strategy
where the hardware cannot run the plan's."""

from __future__ import annotations

from rlctl.config import RunConfig
from rlctl.errors import UserError
from rlctl.plan import hardware as hw
from rlctl.plan.arch import BUILTIN_MODELS
from rlctl.plan.parts import Noted


def embeddings_for_adapters(cfg: RunConfig) -> Noted[RunConfig]:
    """`cfg` with model.train_embeddings=auto resolved (so config.yaml holds it): on for builtin:tiny (and
    builtin:tiny-vlm, builtin:tiny-gemma3), a random-init model whose frozen embeddings, small and tied to the output
    head, cap how sure its predictions can get, so adapters alone barely learn (SFT loss 5.1 against 1.1 with them
    trained); off for pretrained models. Its decision is the one the plan shows when adapters train (none when
    embeddings stay frozen)."""
    m = cfg.model
    why = "set by you"
    if m.train_embeddings == "auto":
        why = f"{m.name_or_path} is random-init: frozen random embeddings would cap what the adapters learn"
        m = m.model_copy(update={"train_embeddings": m.name_or_path in BUILTIN_MODELS})
        cfg = cfg.model_copy(update={"model": m})
    if not m.train_embeddings:
        return Noted(cfg)
    value = "true (embeddings and output head train)"
    return Noted(cfg, decisions=({"setting": "model.train_embeddings", "value": value, "why": why},))


def stage_strategies(cfg: RunConfig, hardware: hw.Hardware, strategy: str) -> Noted[dict[str, str]]:
    """Each stage's strategy: the plan's, except fsdp2 on CPU. There rlctl's own RL loop shards itself (torch's
    fully_shard over gloo); the stages TRL trains through accelerate run DDP, as accelerate engages FSDP only on
    GPUs, and the plan says so (a decision and a warning). fsdp2 on CPU with no stage that can shard is refused."""
    if not (hardware.is_cpu and strategy == "fsdp2"):
        return Noted(dict.fromkeys(cfg.stages, strategy))
    out: dict[str, str] = {name: "fsdp2" if name == "rl" else "ddp" for name in cfg.stages}
    ddp = [name for name, how in out.items() if how == "ddp"]
    if len(ddp) == len(out):
        raise UserError(
            f"Invalid config: hardware.strategy=fsdp2 on CPU, but no stage of this run can shard there: "
            f"{', '.join(ddp)} train through TRL and accelerate, which engages FSDP only on GPUs (on CPU it would be "
            "plain DDP under an FSDP2 label). On CPU rlctl's own RL loop shards itself: run the rl stage (the plan "
            "then states which other stages run DDP), or use --set "
            "hardware.strategy=ddp (or auto)."
        )
    if not ddp:
        return Noted(out)
    why = "accelerate engages FSDP only on GPUs; on CPU only rlctl's own RL loop shards (torch fully_shard, gloo)"
    decision = {"setting": "strategy per stage", "value": f"ddp for {', '.join(ddp)}; fsdp2 for rl", "why": why}
    return Noted(out, (f"fsdp2 on CPU: stage(s) {', '.join(ddp)} run DDP ({why})",), (decision,))
