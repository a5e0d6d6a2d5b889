"""Images that break the pre-flight's promise (issue 49): every image is opened the same way in plan, train, eval,
resume and the stages (rlctl.data.images), so a decompression bomb, a truncated or undecodable file (a path, or
parquet bytes), an image the model's processor would refuse (an extreme aspect ratio) or a moved file is refused
before anything is written, naming the file, the row and the image; over-long rows of a built-in vision-language
model are counted before the run directory exists; a text model's rows with an empty `images` list train."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from PIL import Image

from rlctl import config, data, vision
from rlctl.data import images
from rlctl.errors import UserError
from rlctl.launch import preflight
from tests.helpers import rlctl

PROMPT = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is the shape?"}]}]


def _png_bytes(size: tuple[int, int], mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    Image.new(mode, size).save(out, format="PNG")
    return out.getvalue()


def _bomb(path: Path) -> Path:
    """A decompression bomb: 30000 x 30000 pixels of one colour, about 110 kB on disk."""
    Image.new("1", (30000, 30000)).save(path)
    return path


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rl_rows(names: list[str]) -> list[dict]:
    return [{"prompt": PROMPT, "answer": "red", "images": [n]} for n in names]


def _vlm_args(tmp_path: Path, rl: Path, command: str = "train") -> list[str]:
    """The built-in tiny VLM on the user's RL file (the SFT stage off), into tmp_path/run."""
    return [
        command,
        "--preset",
        "tiny-vlm-demo",
        "--set",
        "data.generate=null",
        "--set",
        "stages=[rl]",
        "--set",
        f"data.rl={rl}",
        "--run-dir",
        str(tmp_path / "run"),
    ]


def _out(proc) -> str:
    return " ".join((proc.stdout + proc.stderr).split())


@pytest.mark.parametrize("command", ["plan", "train"])
def test_a_decompression_bomb_in_a_path_file_exits_2_naming_the_row(tmp_path, command):
    Image.new("RGB", (28, 28), "red").save(tmp_path / "ok.png")
    _bomb(tmp_path / "bomb.png")
    rl = _jsonl(tmp_path / "rl.jsonl", _rl_rows(["ok.png", "bomb.png"]))
    proc = rlctl(*_vlm_args(tmp_path, rl, command))
    out = _out(proc)
    assert proc.returncode == 2, out
    assert f"{rl}:2: image 1 of the row, bomb.png, cannot be opened" in out and "decompression bomb" in out
    assert "Traceback" not in out and not (tmp_path / "run").exists()


def test_bombs_truncated_and_undecodable_bytes_in_parquet_are_named_by_row(tmp_path):
    """verl's parquet layout ({"bytes", "path"} entries): each damaged image is a UserError naming the row; the
    header read by `rlctl plan` already refuses a bomb (its size), decoding (`rlctl train`) a truncated file."""
    import pandas as pd

    bomb = io.BytesIO()
    Image.new("1", (30000, 30000)).save(bomb, format="PNG")
    good, big = _png_bytes((28, 28)), _png_bytes((64, 64))
    cases = {"bomb": bomb.getvalue(), "truncated": big[: len(big) // 2], "garbage": b"\x89PNG not really"}
    for name, payload in cases.items():
        frame = pd.DataFrame(
            {
                "prompt": [[{"role": "user", "content": "<image>What colour?"}]] * 2,
                "reward_model": [{"ground_truth": "red"}] * 2,
                "data_source": ["shapes"] * 2,
                "images": [[{"bytes": good, "path": None}], [{"bytes": payload, "path": None}]],
            }
        )
        frame.to_parquet(tmp_path / f"{name}.parquet")
        rows, info = data.load(tmp_path / f"{name}.parquet", "rl")
        with pytest.raises(UserError, match=rf"{name}\.parquet row 2: image 1 of the row, \d+ bytes of image data"):
            images.read_sizes(rows, info.base, info.row, decode=True, cap=None)


def test_every_kind_of_damage_is_an_unreadable_image_never_a_raw_pillow_error(tmp_path):
    """What the stages open at runtime (rollout.vision.row_images): an UnreadableImage (a DataRowError the runner
    explains, exit 1) naming the image, for every way an image fails; other formats and modes open."""
    big = _png_bytes((64, 64))
    (tmp_path / "cut.png").write_bytes(big[: len(big) // 2])
    Image.new("RGB", (10000, 9000)).save(tmp_path / "over.png")  # over Pillow's limit, under twice it: a warning
    (tmp_path / "zero.png").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "pipe.png")
    for entry in ["gone.png", "cut.png", "over.png", "zero.png", "pipe.png", ".", b"not an image", {"bytes": None}, 7]:
        with pytest.raises(images.UnreadableImage, match="cannot be opened"):
            images.open_image(entry, tmp_path)
    for mode, suffix in [("I;16", "png"), ("CMYK", "jpg"), ("RGBA", "webp"), ("P", "gif"), ("F", "tiff")]:
        Image.new(mode, (30, 20)).save(tmp_path / f"x.{suffix}")
        assert images.open_image(f"x.{suffix}", tmp_path).size == (30, 20)


def test_the_processors_aspect_ratio_rule_matches_transformers(tmp_path):
    """The pre-flight refuses what Qwen2-VL's smart_resize refuses (an aspect ratio above 200), torch-free, and
    nothing it takes; a SigLIP tower (Gemma 3) resizes any image."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    for width, height in [(4000, 3), (3, 4000), (600, 3), (601, 3), (201, 1), (200, 1), (1, 1), (28, 1)]:
        try:
            smart_resize(height, width)
            refused = False
        except ValueError:
            refused = True
        assert (vision.image_problem(width, height, None) is not None) == refused, (width, height)
    cfg = config.resolve("tiny-gemma3-demo", None, None, "cpu", [])
    assert vision.image_problem(4000, 3, cfg.model.arch.vision) is None


def test_an_image_the_processor_refuses_is_refused_by_plan_and_train_before_launch(tmp_path):
    Image.new("RGB", (28, 28), "red").save(tmp_path / "ok.png")
    Image.new("RGB", (4000, 3), "red").save(tmp_path / "wide.png")
    rl = _jsonl(tmp_path / "rl.jsonl", _rl_rows(["ok.png", "wide.png"]))
    for command in ("plan", "train"):
        proc = rlctl(*_vlm_args(tmp_path, rl, command))
        out = _out(proc)
        assert proc.returncode == 2, out
        assert f"{rl}:2: image 1 of the row, wide.png, cannot be trained on: its aspect ratio 4000 x 3" in out
        assert "Traceback" not in out and not (tmp_path / "run").exists()


def test_a_row_of_a_builtin_vlm_with_many_images_is_refused_before_the_run_directory_exists(tmp_path):
    Image.new("RGB", (28, 28), "red").save(tmp_path / "ok.png")
    rows = _rl_rows(["ok.png"] * 20)
    rows.append({"prompt": [{"role": "user", "content": [{"type": "image"}] * 1000}], "answer": "red"})
    rows[-1]["images"] = ["ok.png"] * 1000
    rl = _jsonl(tmp_path / "rl.jsonl", rows)
    proc = rlctl(*_vlm_args(tmp_path, rl), "--set", "data.over_length=refuse")
    out = _out(proc)
    assert proc.returncode == 2, out
    assert f"1 of 21 rl rows are longer than data.max_prompt_length=32 tokens (first: {rl}:21" in out
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("preset", ["tiny-vlm-demo", "tiny-gemma3-demo"])
def test_the_preflight_counts_a_builtin_vlm_row_as_its_own_tokenizer_does(preset):
    """The tokenizer the pre-flight trains for a built-in VLM counts a row with images as the one the run builds
    (rlctl.stages.tiny) does, under the same chat template."""
    from rlctl.data import tokens
    from rlctl.stages import tiny

    cfg = config.resolve(preset, None, None, "cpu", [])
    texts = ["What colour is the shape?", "red", "green", "blue", "yellow"] * 20
    mine = tokens.FileTokenizer.builtin(texts, cfg.model.arch.vocab, None, cfg.model.arch)
    real = tiny.model_tokenizer(cfg.model.arch, texts)
    real.chat_template = mine.chat_template  # the processor's (CHATML, or Gemma 3's image placeholder)
    rows = [
        {"prompt": [{"role": "user", "content": [{"type": "image"}] * 3 + [{"type": "text", "text": "Colour?"}]}]},
        {"messages": [*PROMPT, {"role": "assistant", "content": [{"type": "text", "text": "red"}]}]},
    ]
    for row, stage in zip(rows, ["rl", "sft"], strict=True):
        assert tokens.length(row, mine, stage) == tokens.length(row, real, stage), (row, stage)


def _vlm_folder(tmp_path: Path) -> Path:
    """A model folder with a small Qwen2.5-VL config.json: `rlctl eval` checks the data before it loads weights."""
    folder = tmp_path / "vlm"
    folder.mkdir()
    text = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    text |= {"intermediate_size": 128, "vocab_size": 1000, "tie_word_embeddings": True}
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64}
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl", **text, "vision_config": vision}))
    return folder


def test_eval_with_an_unreadable_or_refused_image_exits_2_naming_the_row(tmp_path):
    Image.new("RGB", (28, 28), "red").save(tmp_path / "ok.png")
    Image.new("RGB", (3, 4000), "red").save(tmp_path / "tall.png")
    big = _png_bytes((64, 64))
    (tmp_path / "cut.png").write_bytes(big[: len(big) // 2])
    model = _vlm_folder(tmp_path)
    for bad, said in (("cut.png", "cannot be opened (OSError: image file is truncated"), ("tall.png", "3 x 4000")):
        held = _jsonl(tmp_path / "held.jsonl", _rl_rows(["ok.png", bad]))
        proc = rlctl("eval", str(model), "--data", str(held), "--out", str(tmp_path / "e.json"))
        out = _out(proc)
        assert proc.returncode == 2, out
        assert f"{held}:2: image 1 of the row, {bad}," in out and said in out
        assert "Traceback" not in out and not (tmp_path / "e.json").exists()


@pytest.mark.slow
def test_resume_of_a_vlm_run_whose_images_moved_exits_2_naming_the_row(tmp_path):
    """An interrupted run whose image files were moved: `rlctl resume` opens every image of the unfinished stages'
    data before launch (exit 2 naming the file, row and image; nothing written), and resumes once they are back."""
    from tests.helpers import RLCTL, kill_after_checkpoint

    (tmp_path / "imgs").mkdir()
    for colour in ("red", "blue"):
        Image.new("RGB", (28, 28), colour).save(tmp_path / "imgs" / f"{colour}.png")
    rows = [{"prompt": PROMPT, "answer": c, "images": [f"imgs/{c}.png"]} for c in ("red", "blue") * 4]
    rl = _jsonl(tmp_path / "rl.jsonl", rows)
    run = tmp_path / "run"
    small = ["rl.max_steps=8", "rl.save_every=2", "rl.prompts_per_step=2", "rl.group_size=2", "rl.eval_samples=2"]
    cmd = [RLCTL, *_vlm_args(tmp_path, rl)] + [a for item in small for a in ("--set", item)]
    kill_after_checkpoint(run, cmd, "rl", every=2)
    before = sorted(p.name for p in (run / "rl" / "checkpoints").iterdir())
    (tmp_path / "imgs").rename(tmp_path / "moved")
    proc = rlctl("resume", str(run), timeout=600)
    out = _out(proc)
    assert proc.returncode == 2, out
    assert f"{rl}:1: image 1 of the row, imgs/red.png, cannot be opened (no such file: {tmp_path}/imgs/red.png)" in out
    assert "Traceback" not in out
    assert sorted(p.name for p in (run / "rl" / "checkpoints").iterdir()) == before


def test_a_text_models_sft_rows_with_an_empty_images_list_train(tmp_path):
    """`images: []` on every row of a text model's SFT file: no row has an image, so the column is left out (TRL
    would take the data for a vision dataset and refuse the text model after launch)."""
    rows = [{"prompt": f"{a}+{a}=", "completion": str(2 * a), "images": []} for a in range(40)]
    sft = _jsonl(tmp_path / "sft.jsonl", rows)
    loaded, info = data.load(sft, "sft")
    assert all("images" not in r for r in loaded) and "empty images column left out" in info.describe()
    run = tmp_path / "run"
    args = ["--set", "data.generate=null", "--set", "stages=[sft]", "--set", f"data.sft={sft}", "--set"]
    proc = rlctl("train", "--preset", "tiny-demo", *args, "sft.max_steps=2", "--run-dir", str(run), timeout=600)
    assert proc.returncode == 0, _out(proc)


def test_the_preflight_refuses_images_past_the_cap_only_in_train(tmp_path):
    """`rlctl plan` reads headers (a truncated file passes), `rlctl train` decodes every image as training will."""
    big = _png_bytes((64, 64))
    (tmp_path / "cut.png").write_bytes(big[: len(big) // 2])
    rl = _jsonl(tmp_path / "rl.jsonl", _rl_rows(["cut.png"]))
    cfg = config.resolve("tiny-vlm-demo", None, None, "cpu", ["data.generate=null", f"data.rl={rl}", "stages=[rl]"])
    for full, refused in ((False, False), (True, True)):
        report = preflight.Report()
        rows = preflight.read_data(cfg, report, full=full, paths={"rl": rl})
        preflight.check_images(cfg, rows, full, report)
        assert bool(report.errors) == refused, report.errors
