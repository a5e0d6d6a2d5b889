"""Settings no run should start with (issue 49): every numeric key that can make sampling or training meaningless is
bounded by the schema, so config validation refuses it naming the key (exit 2, nothing written), and the bounds
are stated in docs/config.md, which is generated from the schema."""

from __future__ import annotations

import math
import re
import typing

import pytest
from pydantic import BaseModel

from rlctl import config
from rlctl.config import RunConfig
from rlctl.errors import UserError
from tests.helpers import rlctl


def _number_keys(model: type[BaseModel] = RunConfig, prefix: str = "") -> dict[str, typing.Any]:
    """{dotted key: its field} of every number key of the schema (a list of sections: its first item's)."""
    out = {}
    for name, field in model.model_fields.items():
        kinds = typing.get_args(field.annotation) or (field.annotation,)
        inner = typing.get_args(kinds[0]) if typing.get_origin(field.annotation) is list else ()
        sections = [k for k in (*kinds, *inner) if isinstance(k, type) and issubclass(k, BaseModel)]
        if sections:
            out |= _number_keys(sections[0], f"{prefix}{name}.")
        elif {int, float} & set(kinds) and bool not in kinds:
            out[prefix + name] = field
    return out


def _set(key: str, value: typing.Any) -> list[str]:
    """--set items giving `key` the value (a reward's key: the list of one reward)."""
    if key.startswith("rl.rewards."):
        return [f"rl.rewards=[{{name: exact_match, {key.rsplit('.', 1)[1]}: {value}}}]"]
    return [f"{key}={value}"]


def _refused(key: str, value: typing.Any) -> str | None:
    """The refusal of `key` set to `value` on the tiny demo, or None when it is accepted."""
    try:
        config.resolve("tiny-demo", None, None, "cpu", _set(key, value))
    except UserError as e:
        return str(e)
    return None


# Keys whose largest value switches something off and harms no run: the gradient and value clipping, the weight-sync
# check, the console's spacing; the seed and the port have bounds of their own (2^32 - 1, 65535)
UNBOUNDED_ABOVE = {
    *(f"{stage}.max_grad_norm" for stage in ("sft", "dpo", "kto", "rm", "rl")),
    "rl.critic.value_clip",
    "rl.mismatch.sync_tolerance",
    "logging.console_every_s",
    "seed",
    "hardware.main_port",
}


@pytest.mark.parametrize("key", sorted(_number_keys()))
def test_every_number_key_refuses_nan_inf_and_absurd_values_naming_the_key(key):
    """NaN, infinities, booleans, 1e300 and whole numbers beyond 2^31 are refused for every number key, naming it;
    so is a value below the key's least (a negative count, a temperature of 1e-300)."""
    field = _number_keys()[key]
    floats = float in (typing.get_args(field.annotation) or (field.annotation,))
    absurd = ["true", "1.0e300" if floats else str(2**40)] if key not in UNBOUNDED_ABOVE else ["true"]
    absurd += [".nan", ".inf", "-.inf"] if floats else []
    lows = [m.ge if hasattr(m, "ge") else m.gt for m in field.metadata if hasattr(m, "ge") or hasattr(m, "gt")]
    if lows and lows[0] > 0:
        absurd.append("1.0e-300" if floats else "0")
    elif lows:
        absurd.append(f"{lows[0] - 1:g}")
    for value in absurd:
        refused = _refused(key, value)
        assert refused is not None and key.replace("rl.rewards.", "rl.rewards.0.") in refused, (key, value, refused)


@pytest.mark.parametrize(
    ("item", "named"),
    [
        ("rl.temperature=1.0e-300", "rl.temperature"),
        ("rl.temperature=1000", "rl.temperature"),
        ("rl.learning_rate=1.0e-300", "rl.learning_rate"),
        ("sft.max_grad_norm=1.0e-300", "sft.max_grad_norm"),
        ("sft.weight_decay=5", "sft.weight_decay"),
        ("dpo.beta=1.0e300", "dpo.beta"),
        ("kto.desirable_weight=1.0e-300", "kto.desirable_weight"),
        ("rl.beta=1.0e300", "rl.beta"),
        ("rl.loss.clip_low=1.0e-300", "rl.loss.clip_low"),
        ("rl.loss.cispo_cap=1.0e300", "rl.loss.cispo_cap"),
        ("rl.mismatch.correction_cap=1.0e300", "rl.mismatch.correction_cap"),
        ("rl.async_rollout.max_staleness=1000000000", "rl.async_rollout.max_staleness"),
        ("rl.max_staleness=1000000000", "rl.async_rollout.max_staleness"),
        ("rl.ppo_epochs=1000000000", "rl.ppo_epochs"),
        ("rl.filters.pf_ppo_weight_pow=1.0e300", "rl.filters.pf_ppo_weight_pow"),
        ("sft.micro_batch_size=0", "sft.micro_batch_size"),
        ("rl.max_steps=1000000000000", "rl.max_steps"),
    ],
)
def test_settings_that_make_a_run_meaningless_are_refused(item, named):
    with pytest.raises(UserError, match="Invalid config: .*" + re.escape(named)):
        config.resolve("tiny-demo", None, None, "cpu", [item])


def test_sane_settings_and_every_preset_stay_accepted():
    """The bounds refuse no recipe, and published values near them (GSPO's clip 3e-4, DAPO's 0.28) pass."""
    from rlctl.config import presets

    for name, preset in presets.all_presets().items():
        if preset.kind == "recipes":
            config.resolve(name, None, None, "cpu", [])
    cfg = config.resolve(
        "tiny-demo",
        None,
        None,
        "cpu",
        ["rl.loss.clip_low=0.0003", "rl.loss.clip_high=0.0004", "rl.temperature=0.05", "seed=4294967295"],
    )
    assert math.isclose(cfg.rl.loss.clip_low, 3e-4) and cfg.seed == 2**32 - 1


def test_staleness_above_the_steps_is_refused_when_async_is_on():
    refused = _refused("rl.async_rollout", "{enabled: true, max_staleness: 5}")
    assert refused is None  # the tiny demo trains more than 5 steps
    with pytest.raises(UserError, match=r"max_staleness=5 is above rl.max_steps=2"):
        config.resolve(
            "tiny-demo", None, None, "cpu", ["rl.async_rollout={enabled: true, max_staleness: 5}", "rl.max_steps=2"]
        )


def test_min_pixels_above_max_pixels_is_refused_by_config_and_against_the_models_own_bound(tmp_path):
    with pytest.raises(UserError, match=r"data.min_pixels=5000 is above data.max_pixels=100"):
        config.resolve("tiny-vlm-demo", None, None, "cpu", ["data.min_pixels=5000", "data.max_pixels=100"])
    from rlctl.launch import preflight

    # the preset's max_pixels with a min_pixels above it, set in another layer: the pre-flight sees the pair
    cfg = config.resolve("tiny-vlm-demo", None, None, "cpu", ["data.min_pixels=3000"])
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"max_pixels": 2000})})
    report = preflight.Report()
    preflight.check_images(cfg, {"rl": [{"images": []}]}, False, report)
    assert report.errors and "min_pixels 3,000 is above max_pixels 2,000" in report.errors[0]


def test_the_cli_refuses_a_meaningless_setting_with_exit_2_and_writes_nothing(tmp_path):
    run = tmp_path / "run"
    proc = rlctl("train", "--preset", "tiny-demo", "--set", "rl.temperature=1e-300", "--run-dir", str(run))
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2 and "rl.temperature" in out and "greater than or equal to 0.01" in out, out
    assert "Traceback" not in out and not run.exists()
    proc = rlctl("eval", str(tmp_path), "--temperature", "1e-300")
    assert proc.returncode == 2 and "--temperature" in proc.stdout + proc.stderr


def test_docs_config_states_the_bounds():
    from rlctl.cli import docs_gen

    text = docs_gen.config_md()
    assert "| `rl.temperature` | float | `1.0` | [0.01, 10] |" in text
    assert "| `rl.async_rollout.max_staleness` | int | `1` | [1, 16] |" in text
    assert "| `rl.learning_rate` | float | `1.0e-05` | [1e-09, 1) |" in text
    assert "| `rl.max_steps` | int | `100` | ≥ 1 |" in text and "2,147,483,647" in text
