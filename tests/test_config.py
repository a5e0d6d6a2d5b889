"""The config schema and preset layering: every shipped preset validates, overrides apply in order,
mistakes are explained with suggestions."""

from __future__ import annotations

import pytest

from rlctl import config
from rlctl.config import presets
from rlctl.errors import UserError

REQUIRED_RECIPES = [
    "tiny-demo",
    "qwen0.5b-grpo",
    "qwen1.5b-grpo",
    "qwen7b-grpo",
    "qwen7b-sft",
    "qwen7b-dpo",
    "llama8b-grpo",
]


@pytest.mark.parametrize("name", REQUIRED_RECIPES)
def test_required_recipe_resolves(name):
    cfg = config.resolve(preset=name)
    assert cfg.name == name
    assert cfg.model.arch is not None, "recipes carry architecture numbers for offline planning"
    assert cfg.hardware.spec != "auto", "a recipe names the minimum hardware it was tuned for"


@pytest.mark.parametrize("name", sorted(presets.all_presets()))
def test_every_preset_layer_validates(name):
    config.validate(presets.load(name), source=name)


def test_preset_names_are_unique_across_kinds():
    stems = [p.stem for kind in presets.KINDS for p in (presets.data_dir("presets") / kind).glob("*.yaml")]
    assert len(stems) == len(set(stems))


def test_real_model_numbers():
    arch = config.resolve(preset="qwen7b-grpo").model.arch
    assert (arch.layers, arch.hidden, arch.heads, arch.kv_heads, arch.vocab, arch.intermediate) == (
        28,
        3584,
        28,
        4,
        152064,
        18944,
    )
    arch = config.resolve(preset="llama8b-grpo").model.arch
    assert (arch.layers, arch.hidden, arch.kv_heads, arch.vocab) == (32, 4096, 8, 128256)


def test_override_order(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("defaults: [tiny-demo]\nrl:\n  beta: 0.5\n  max_steps: 7\nhardware: {spec: 1xH100-80GB}\n")
    cfg = config.resolve(preset="qwen7b-grpo", config_file=cfg_file)
    assert cfg.rl.beta == 0.5 and cfg.rl.max_steps == 7
    cfg = config.resolve(preset="tiny-demo", config_file=cfg_file, hardware="cpu", sets=["rl.beta=0.25"])
    assert cfg.hardware.spec == "cpu", "--hardware beats --config"
    assert cfg.rl.beta == 0.25, "--set beats everything"
    assert cfg.rl.max_steps == 7, "--config beats the preset"


def test_set_values_are_typed():
    cfg = config.resolve(
        preset="tiny-demo", sets=["rl.group_size=4", "stages=[sft,rm]", "model.trust_remote_code=true"]
    )
    assert cfg.rl.group_size == 4 and cfg.stages == ["sft", "rm"] and cfg.model.trust_remote_code is True


def test_stages_run_in_pipeline_order():
    assert config.resolve(preset="tiny-demo", sets=["stages=[rl,sft,rm]"]).stages == ["sft", "rm", "rl"]


def test_unknown_key_suggests():
    with pytest.raises(UserError, match=r"unknown key 'rl\.lerning_rate'.*Did you mean: learning_rate"):
        config.resolve(preset="tiny-demo", sets=["rl.lerning_rate=1e-5"])
    with pytest.raises(UserError, match=r"unknown key 'modle'.*Did you mean: model"):
        config.resolve(preset="tiny-demo", sets=["modle.dtype=float32"])


def test_bad_values_name_the_key():
    with pytest.raises(UserError, match=r"rl\.group_size.*greater than or equal to 1"):
        config.resolve(preset="tiny-demo", sets=["rl.group_size=0"])
    with pytest.raises(UserError, match=r"sft\.learning_rate"):
        config.resolve(preset="tiny-demo", sets=["sft.learning_rate=abc"])


def test_unknown_preset_lists_close_matches():
    with pytest.raises(UserError, match=r"Unknown preset 'qwen7b-grop'.*qwen7b-grpo"):
        config.resolve(preset="qwen7b-grop")


def test_invalid_algorithm():
    with pytest.raises(UserError, match=r"Unknown algorithm preset 'gpro'.*grpo"):
        config.resolve(preset="tiny-demo", algorithm="gpro")
    with pytest.raises(UserError, match=r"rl\.algorithm 'gpro' is not a known algorithm.*grpo"):
        config.resolve(preset="tiny-demo", sets=["rl.algorithm=gpro"])


def test_reward_model_reward_needs_rm_stage():
    with pytest.raises(UserError, match=r"reward_model.*rl\.rewards=\[\{name: exact_match\}\]"):
        config.resolve(preset="tiny-demo", sets=["stages=[sft,rl]"])


def test_nothing_to_run():
    with pytest.raises(UserError, match="--preset"):
        config.resolve()


def test_malformed_config_file_names_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rl:\n  beta: [1, 2\n")
    with pytest.raises(UserError, match=r"bad\.yaml:\d+"):
        config.resolve(config_file=bad)


def test_dump_roundtrips():
    cfg = config.resolve(preset="qwen7b-grpo")
    assert config.validate(__import__("yaml").safe_load(config.dump(cfg))) == cfg


def test_every_key_is_documented():
    def walk(model):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            ann = field.annotation
            for sub in getattr(ann, "__args__", None) or (ann,):
                if isinstance(sub, type) and issubclass(sub, config.Section):
                    walk(sub)

    walk(config.RunConfig)


@pytest.mark.parametrize(
    "item",
    [
        "rl.temperature=.inf",
        "rl.rewards=[{name: exact_match, weight: .nan}]",
        "sft.learning_rate=nan",
        "rl.loss.dual_clip=.inf",
        "kto.desirable_weight=-.inf",
        "logging.console_every_s=.inf",
    ],
)
def test_float_keys_refuse_nan_and_inf(item):
    with pytest.raises(UserError, match=r"finite number"):
        config.resolve(preset="tiny-demo", sets=[item])


@pytest.mark.parametrize(
    "item", ["sft.max_steps=true", "hardware.num_processes=true", "sft.micro_batch_size=false", "rl.beta=true"]
)
def test_booleans_are_not_numbers(item):
    with pytest.raises(UserError, match=rf"{item.split('=')[0]}: a number is needed, not a boolean"):
        config.resolve(preset="tiny-demo", sets=[item])


def test_boolean_keys_still_take_booleans():
    cfg = config.resolve(preset="tiny-demo", sets=["model.train_embeddings=true", "rl.use_vllm=false"])
    assert cfg.model.train_embeddings is True and cfg.rl.use_vllm is False


@pytest.mark.parametrize(
    ("defaults", "needles"),
    [
        ("[tiny-demo, {rl: grpo}]", ["Hydra", "defaults: [tiny-demo, grpo]", "--algorithm grpo"]),
        ("[{hardware: cpu}]", ["defaults: [cpu]", "--hardware cpu"]),
        ("5", ["list of preset names", "int 5"]),
        ("[tiny-demo, null]", ["entry null is not a preset name"]),
        ("[tiny-demo, _self_]", ["_self_ is Hydra's", "defaults: [tiny-demo]"]),
    ],
)
def test_defaults_must_list_preset_names(tmp_path, defaults, needles):
    path = tmp_path / "c.yaml"
    path.write_text(f"defaults: {defaults}\n")
    with pytest.raises(UserError) as e:
        config.resolve(config_file=path)
    assert str(path) in str(e.value)
    for needle in needles:
        assert needle in str(e.value)


def test_user_files_beat_a_generated_task_below(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("defaults: [tiny-demo]\ndata: {sft: s.jsonl, rl: r.jsonl, eval: e.jsonl}\n")
    cfg = config.resolve(config_file=path)
    assert cfg.data.generate is None and (cfg.data.sft, cfg.data.rl, cfg.data.eval) == ("s.jsonl", "r.jsonl", "e.jsonl")
    cfg = config.resolve(config_file=path, sets=["data.generate=arithmetic"])  # the upper layer's choice again
    assert cfg.data.generate == "arithmetic" and cfg.data.sft is None and cfg.data.eval is None


def test_generate_and_files_in_one_layer_are_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("defaults: [tiny-demo]\ndata: {generate: arithmetic, rl: r.jsonl}\n")
    with pytest.raises(UserError, match=r"data\.generate=arithmetic and data\.rl=r\.jsonl.*data\.generate: null"):
        config.resolve(config_file=path)
