"""Vision-language datasets (issue 41): image rows as TRL and verl keep them are recognised by the same detector and
normalised to one form (images a list, message contents as image and text parts, one image part per image); the
pre-flight opens every image and refuses a missing or unreadable one naming its file and row, before anything
trains."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image

from rlctl import data
from rlctl.data import images
from rlctl.errors import UserError
from tests.helpers import rlctl

IMAGE = {"type": "image"}


def _png(path: Path, size: tuple[int, int] = (64, 48)) -> None:
    Image.new("RGB", size, "red").save(path)


def _png_bytes(size: tuple[int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, "blue").save(out, format="PNG")
    return out.getvalue()


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_trl_messages_with_image_parts_and_paths(tmp_path):
    """TRL's layout: `images` paths beside messages whose content is a list of parts; text-only messages become
    text parts, the image parts stay where they are."""
    _png(tmp_path / "a.png")
    row = {
        "messages": [
            {"role": "system", "content": "Count."},
            {"role": "user", "content": [{"type": "text", "text": "How many?"}, IMAGE]},
            {"role": "assistant", "content": "3"},
        ],
        "images": ["a.png"],
    }
    rows, info = data.load(_jsonl(tmp_path / "sft.jsonl", [row]), "sft")
    assert info.format == "messages" and info.base == tmp_path
    assert rows[0]["images"] == ["a.png"]
    assert [m["content"] for m in rows[0]["messages"]] == [
        [{"type": "text", "text": "Count."}],
        [{"type": "text", "text": "How many?"}, IMAGE],
        [{"type": "text", "text": "3"}],
    ]
    assert images.open_image(rows[0]["images"][0], info.base).size == (64, 48)


def test_verl_parquet_with_image_features(tmp_path):
    """verl's parquet layout, written by `datasets` with an Image feature: the entries come back as {"bytes",
    "path"} mappings, the `<image>` placeholder of a string prompt becomes an image part in its place."""
    import datasets

    features = datasets.Features(
        {
            "data_source": datasets.Value("string"),
            "prompt": [{"role": datasets.Value("string"), "content": datasets.Value("string")}],
            "images": datasets.Sequence(datasets.Image()),
            "reward_model": {"ground_truth": datasets.Value("string"), "style": datasets.Value("string")},
        }
    )
    ds = datasets.Dataset.from_dict(
        {
            "data_source": ["hiyouga/geometry3k"] * 2,
            "prompt": [
                [{"role": "user", "content": "<image>Find x. Answer in \\boxed{}."}],
                [{"role": "user", "content": "Compare <image> with <image>."}],
            ],
            "images": [[Image.new("RGB", (300, 200))], [Image.new("RGB", (20, 20)), Image.new("RGB", (640, 480))]],
            "reward_model": [{"ground_truth": "3", "style": "rule"}, {"ground_truth": "left", "style": "rule"}],
        },
        features=features,
    )
    ds.to_parquet(tmp_path / "geo.parquet")
    rows, info = data.load(tmp_path / "geo.parquet", "rl")
    assert info.format == "verl" and rows[0]["answer"] == "3"
    first, second = rows
    assert isinstance(first["images"][0], dict) and set(first["images"][0]) == {"bytes", "path"}
    assert first["prompt"][0]["content"] == [IMAGE, {"type": "text", "text": "Find x. Answer in \\boxed{}."}]
    assert second["prompt"][0]["content"] == [
        {"type": "text", "text": "Compare "},
        IMAGE,
        {"type": "text", "text": " with "},
        IMAGE,
        {"type": "text", "text": "."},
    ]
    assert [images.size_of(e) for e in second["images"]] == [(20, 20), (640, 480)]
    assert images.open_image(first["images"][0]).size == (300, 200)


def test_one_image_column_without_placeholder_leads_the_first_user_message(tmp_path):
    """`image` (one entry) and a text prompt with no placeholder: the prompt becomes a user message with the image
    first, as TRL's prepare_multimodal_messages places it; `images` becomes the one list column."""
    _png(tmp_path / "one.png")
    rows, _ = data.load(
        _jsonl(tmp_path / "rl.jsonl", [{"prompt": "What colour?", "image": "one.png", "answer": 1}]), "rl"
    )
    assert rows == [
        {
            "prompt": [{"role": "user", "content": [IMAGE, {"type": "text", "text": "What colour?"}]}],
            "answer": "1",
            "images": ["one.png"],
        }
    ]


def test_text_rows_beside_image_rows_share_one_form_that_arrow_builds(tmp_path):
    """A dataset mixing image and text-only rows: every row gets `images` (empty for text rows) and part lists,
    so each column holds one kind of value and `datasets.Dataset.from_list` (what the stages hand rows to) builds."""
    import datasets

    _png(tmp_path / "a.png")
    raw = [
        {"prompt": "<image>Which shape?", "completion": "a square", "images": ["a.png"]},
        {"prompt": "Say hi.", "completion": "hi"},
    ]
    rows, _ = data.load(_jsonl(tmp_path / "sft.jsonl", raw), "sft")
    assert rows[1]["images"] == [] and rows[1]["prompt"][0]["content"] == [{"type": "text", "text": "Say hi."}]
    assert rows[0]["completion"] == [{"role": "assistant", "content": [{"type": "text", "text": "a square"}]}]
    built = datasets.Dataset.from_list(rows)
    assert built.num_rows == 2 and built[0]["images"] == ["a.png"]


def test_a_count_that_cannot_match_is_refused_naming_the_row(tmp_path):
    """Two images, one placeholder: refused with the file and line of the row."""
    raw = [
        {"prompt": "<image>ok", "answer": "1", "images": ["a.png"]},
        {"prompt": "<image> and what?", "answer": "2", "images": ["a.png", "b.png"]},
    ]
    with pytest.raises(UserError, match=r"rl\.jsonl:2: the row has 2 image\(s\) but 1 image placeholder"):
        data.load(_jsonl(tmp_path / "rl.jsonl", raw), "rl")
    rows = [{"prompt": "<image>", "answer": "1"}]  # a text-only dataset keeps its text as it is
    assert data.load(_jsonl(tmp_path / "plain.jsonl", rows), "rl")[0][0]["prompt"] == "<image>"


def test_a_malformed_content_part_is_refused():
    from rlctl.data import kinds

    rows = [{"messages": [{"role": "user", "content": [{"type": "audio"}]}, {"role": "assistant", "content": "x"}]}]
    with pytest.raises(UserError, match=r"row 1: column messages has a user message with a content part"):
        kinds.check_messages(rows, lambda i: f"row {i + 1}")


def _vlm_folder(tmp_path: Path) -> Path:
    """A local model folder with a (small) Qwen2.5-VL config.json: the pre-flight needs no weights."""
    folder = tmp_path / "vlm"
    folder.mkdir()
    config = {
        "model_type": "qwen2_5_vl",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 1000,
        "tie_word_embeddings": True,
        "vision_config": {
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
        },
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _train_args(tmp_path: Path, command: str) -> list[str]:
    return [
        command,
        "--preset",
        "qwen2.5-vl-3b-grpo",
        "--hardware",
        "cpu",
        "--set",
        f"model.name_or_path={_vlm_folder(tmp_path)}",
        "--set",
        f"data.rl={tmp_path / 'rl.jsonl'}",
        "--set",
        "data.eval=null",
        "--set",
        "data.chat_template=chatml",
        "--run-dir",
        str(tmp_path / "run"),
    ]


@pytest.mark.parametrize("command", ["train", "plan"])
def test_a_missing_image_exits_2_naming_the_row_before_anything_trains(tmp_path, command):
    _png(tmp_path / "here.png")
    raw = [
        {"prompt": "<image>How many?", "answer": "1", "images": ["here.png"]},
        {"prompt": "<image>How many?", "answer": "2", "images": ["gone.png"]},
    ]
    _jsonl(tmp_path / "rl.jsonl", raw)
    proc = rlctl(*_train_args(tmp_path, command))
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, out
    assert f"{tmp_path / 'rl.jsonl'}:2: image 1 of the row, gone.png, cannot be opened" in out
    assert f"relative paths start from {tmp_path}" in out
    assert "Traceback" not in out and not (tmp_path / "run").exists()


def test_an_unreadable_image_exits_2_naming_the_row(tmp_path):
    (tmp_path / "bad.png").write_bytes(b"not an image at all")
    _jsonl(tmp_path / "rl.jsonl", [{"prompt": "What?", "answer": "1", "images": ["bad.png"]}])
    proc = rlctl(*_train_args(tmp_path, "train"))
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, out
    assert f"{tmp_path / 'rl.jsonl'}:1: image 1 of the row, bad.png, cannot be opened (UnidentifiedImageError" in out
    assert not (tmp_path / "run").exists()


def test_image_data_for_a_text_model_is_refused(tmp_path):
    _png(tmp_path / "a.png")
    _jsonl(tmp_path / "rl.jsonl", [{"prompt": "<image>What?", "answer": "1", "images": ["a.png"]}])
    proc = rlctl(
        "plan", "--preset", "tiny-demo", "--set", "data.generate=null", "--set", f"data.rl={tmp_path}/rl.jsonl"
    )
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2 and "builtin:tiny has no vision tower (model.arch.vision)" in out, out


def test_the_preflight_reads_image_sizes_into_a_budget(tmp_path):
    """Sizes read from the headers (Pillow, no decoding), tokens by Qwen2-VL's arithmetic: a 280 x 280 image is
    10 x 10 merged patches of 28 px (100 tokens), a 56 x 560 one 2 x 20 (40 tokens)."""
    from rlctl import config
    from rlctl.launch import preflight

    _png(tmp_path / "sq.png", (280, 280))
    _png(tmp_path / "tall.png", (56, 560))
    raw = [
        {"prompt": "<image><image>Same?", "answer": "no", "images": ["sq.png", "tall.png"]},
        {"prompt": "<image>Colour?", "answer": "red", "image": "sq.png"},
    ]
    cfg = config.resolve("qwen2.5-vl-3b-grpo", None, None, "cpu", [f"data.rl={_jsonl(tmp_path / 'rl.jsonl', raw)}"])
    report = preflight.Report()
    rows = preflight.read_data(cfg, report, full=False, paths={"rl": tmp_path / "rl.jsonl"})
    preflight.check_images(cfg, rows, False, report)
    assert not report.errors
    assert report.images["rl"] == images.ImageBudget(140, 100, 2, 3136, 1003520, read=3, seen=3)


def test_lengths_count_the_text_of_part_lists(tmp_path):
    """The pre-flight's length count renders part lists as their text with `<image>` where an image is (any chat
    template; the image tokens are counted from the sizes): the same count as the verl string it came from."""
    from rlctl.data import tokens

    tok = tokens.FileTokenizer.builtin(["Find x in the figure. <image>"] * 20, 300, tokens.template_text("chatml"))
    verl = {"prompt": [{"role": "user", "content": "<image>Find x in the figure."}], "answer": "3"}
    rows, _ = data.load(_jsonl(tmp_path / "rl.jsonl", [{**verl, "images": ["a.png"]}]), "rl")
    assert rows[0]["prompt"][0]["content"][0] == IMAGE
    assert tokens.length(rows[0], tok, "rl") == tokens.length(verl, tok, "rl") > 5


def test_plan_reads_a_capped_number_of_images_and_says_so(tmp_path, monkeypatch):
    """`rlctl plan` reads the sizes of the first PLAN_READS images (the budget says how many of how many); `rlctl
    train` (full) opens every one, so an image missing past the cap is refused there."""
    from rlctl import config
    from rlctl.launch import preflight

    _png(tmp_path / "a.png", (280, 280))
    raw = [{"prompt": "<image>?", "answer": "1", "images": [name]} for name in ("a.png", "a.png", "gone.png")]
    cfg = config.resolve("qwen2.5-vl-3b-grpo", None, None, "cpu", [f"data.rl={_jsonl(tmp_path / 'rl.jsonl', raw)}"])
    monkeypatch.setattr(images, "PLAN_READS", 2)
    for full in (False, True):
        report = preflight.Report()
        rows = preflight.read_data(cfg, report, full=full, paths={"rl": tmp_path / "rl.jsonl"})
        preflight.check_images(cfg, rows, full, report)
        if not full:
            assert not report.errors and (report.images["rl"].read, report.images["rl"].seen) == (2, 3)
            assert "sizes of 2 of 3 images read (every image is checked when training starts)" in (
                report.images["rl"].describe()
            )
        else:
            assert len(report.errors) == 1 and "rl.jsonl:3: image 1 of the row, gone.png" in report.errors[0]


def test_images_follow_their_rows_when_kto_and_preference_data_convert(tmp_path):
    """KTO rows paired for DPO/RM, preference pairs unpaired for KTO, desirable KTO rows for SFT: each row keeps
    its images (the same prompt with other images is another prompt)."""
    kto = [
        {"prompt": "<image>Colour?", "completion": "red", "label": True, "images": ["r.png"]},
        {"prompt": "<image>Colour?", "completion": "blue", "label": False, "images": ["r.png"]},
        {"prompt": "<image>Colour?", "completion": "red", "label": False, "images": ["b.png"]},
        {"prompt": "<image>Colour?", "completion": "blue", "label": True, "images": ["b.png"]},
    ]
    pairs, _ = data.load(_jsonl(tmp_path / "kto.jsonl", kto), "preference")
    assert [(p["images"], p["chosen"][0]["content"][0]["text"]) for p in pairs] == [
        (["r.png"], "red"),
        (["b.png"], "blue"),
    ]
    assert [r["images"] for r in data.load(tmp_path / "kto.jsonl", "sft")[0]] == [["r.png"], ["b.png"]]
    pref = [{"prompt": "<image>Colour?", "chosen": "red", "rejected": "blue", "images": ["r.png"]}]
    rows, _ = data.load(_jsonl(tmp_path / "pref.jsonl", pref), "kto")
    assert [(r["images"], r["label"]) for r in rows] == [(["r.png"], True), (["r.png"], False)]
