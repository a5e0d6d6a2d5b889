"""The Qwen2-VL family (Qwen2-VL, Qwen2.5-VL): images at their own resolution (resized within min / max pixels by
`smart_resize`) cut into `patch` x `patch` pixel patches `temporal_patch` frames deep, encoded by the `visual`
tower, each `merge` x `merge` square of patches merged into one image token; the model computes its own multimodal
(3D rotary) positions from the image tokens (`mm_token_type_ids`).

transformers 5.17 refuses to build this family's processor without torchvision (for its video processor) even for
images alone; `fallback_processor` then builds the same processor with no video side (`images_only`), saved as the
family's own processor class so a machine with torchvision loads it through AutoProcessor as usual."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

from rlctl.vision.family import Family, Tower

# the processor's default resize bounds (Qwen2VLImageProcessor.size, also in the models' preprocessor_config.json)
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 1280
MAX_ASPECT_RATIO = 200  # the longest side over the shortest smart_resize takes (transformers raises above)
IMAGE_TOKEN, VIDEO_TOKEN = "<|image_pad|>", "<|video_pad|>"
START, END = "<|vision_start|>", "<|vision_end|>"


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) the processor resizes an image to: both sides rounded to multiples of `factor` (patch x
    merge), the area clamped into [min_pixels, max_pixels] keeping the aspect ratio (transformers' smart_resize)."""
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def tokens_per_image(width: int, height: int, patch: int, merge: int, min_pixels: int, max_pixels: int) -> int:
    """Image tokens of one width x height image: (h / patch) x (w / patch) patches after `smart_resize`, each
    merge x merge square of them one token."""
    h, w = smart_resize(height, width, patch * merge, min_pixels, max_pixels)
    return (h // patch) * (w // patch) // (merge * merge)


@functools.cache
def images_only() -> type:
    """Qwen2.5-VL's processor class with images and text only (no video processor: it needs torchvision)."""
    from transformers import Qwen2_5_VLProcessor
    from transformers.processing_utils import ProcessorMixin

    class ImagesOnly(Qwen2_5_VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            self.image_token, self.video_token = IMAGE_TOKEN, VIDEO_TOKEN
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

        def to_dict(self) -> dict[str, Any]:
            """Saved as Qwen2.5-VL's processor, with the family's video processor at the image side's patch sizes
            (what AutoProcessor builds where torchvision is installed)."""
            ip = self.image_processor
            video = {"video_processor_type": "Qwen2VLVideoProcessor", "patch_size": ip.patch_size}
            video |= {"temporal_patch_size": ip.temporal_patch_size, "merge_size": ip.merge_size}
            return super().to_dict() | {"processor_class": Qwen2_5_VLProcessor.__name__, "video_processor": video}

        def save_pretrained(self, save_directory, *args, **kwargs):
            """The processor's files, and the image side's own preprocessor_config.json (what older transformers
            and other tools read)."""
            out = super().save_pretrained(save_directory, *args, **kwargs)
            self.image_processor.save_pretrained(save_directory)
            return out

    return ImagesOnly


class Qwen2VL(Family):
    name = "Qwen2-VL / Qwen2.5-VL"
    model_types = ("qwen2_vl", "qwen2_5_vl")
    text_model_type = "qwen2"
    tower_kind = "qwen2_vl"
    tower_name = "Qwen2-VL"
    tower_summary = "dynamic resolution, merged patches"
    tower_modules = ("visual",)  # its patch merger included
    special_tokens = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    token_types = "mm_token_type_ids"
    own_positions = True
    placeholder = START + IMAGE_TOKEN + END
    tokenizer_tokens = (START, END, IMAGE_TOKEN, VIDEO_TOKEN)
    pixel_bounds = (MIN_PIXELS, MAX_PIXELS)
    fsdp2 = True

    def text_config(self, top: dict[str, Any]) -> dict[str, Any]:
        """text_config's numbers over the top level's (transformers 5 nests them, older files do not)."""
        outer = {k: v for k, v in top.items() if k != "text_config"}
        return {**outer, **(top.get("text_config") or {}), "model_type": self.text_model_type}

    def tower_config(self, top: dict[str, Any]) -> dict[str, Any]:
        """The width is `embed_dim` in Qwen2-VL's vision_config (its `hidden_size` is the language model's), and its
        MLP two matrices of mlp_ratio x width, read as the planner's three-matrix MLP of 2/3 that size (as Phi's)."""
        vision = top["vision_config"]
        hidden = vision.get("embed_dim") or vision["hidden_size"]
        intermediate = vision.get("intermediate_size") or int(hidden * vision.get("mlp_ratio", 4)) * 2 // 3
        return {
            "layers": vision["depth"],
            "hidden": hidden,
            "heads": vision["num_heads"],
            "intermediate": intermediate,
            "patch": vision.get("patch_size", 14),
            "merge": vision.get("spatial_merge_size", 2),
            "temporal_patch": vision.get("temporal_patch_size", 2),
        }

    def image_tokens(self, tower: Tower, width: int, height: int, min_pixels: int, max_pixels: int) -> int:
        return tokens_per_image(width, height, tower.patch, tower.merge, min_pixels, max_pixels)

    def most_image_tokens(self, tower: Tower, min_pixels: int, max_pixels: int) -> int:
        """A grid of merged patches of at most max_pixels: max_pixels // (patch x merge)^2 tokens, e.g. 1,280 at
        28 x 28 x 1280 pixels; at least the min_pixels image's."""
        least = self.image_tokens(tower, 1, 1, min_pixels, max_pixels)
        return max(max_pixels // (tower.patch * tower.merge) ** 2, least)

    def image_problem(self, width: int, height: int) -> str | None:
        """smart_resize refuses an aspect ratio above MAX_ASPECT_RATIO."""
        ratio = max(width, height) / min(width, height)
        if ratio > MAX_ASPECT_RATIO:
            return (
                f"its aspect ratio {width} x {height} ({ratio:,.0f}:1) is above the {MAX_ASPECT_RATIO}:1 the model's "
                "image processor takes (Qwen2-VL's smart_resize refuses it)"
            )
        return None

    def preprocessor_bounds(self, preprocessor: dict[str, Any]) -> tuple[int | None, int | None]:
        """The `min_pixels` / `max_pixels` keys (the models' own files), else transformers 5's `size`
        (`shortest_edge`, `longest_edge`)."""
        size = preprocessor.get("size") if isinstance(preprocessor.get("size"), dict) else {}
        low = preprocessor.get("min_pixels") or size.get("shortest_edge")
        high = preprocessor.get("max_pixels") or size.get("longest_edge")
        return (low if isinstance(low, int) else None, high if isinstance(high, int) else None)

    def tower_shape(self, tower: Tower) -> str:
        v = tower
        return f"{v.layers} blocks of {v.hidden}, {v.patch}px patches merged {v.merge}x{v.merge} into one token"

    def tower_brief(self, tower: Tower) -> str:
        return f"{tower.hidden}, {tower.patch} px patches merged {tower.merge}x{tower.merge})"

    # A patch embedding (a 3D convolution over `temporal_patch` frames of `patch` x `patch` pixels), `layers`
    # transformer blocks of width `hidden` (attention with a fused qkv, a three-matrix MLP of `intermediate`), and the
    # patch merger: each `merge` x `merge` square of patches through a two-layer MLP into the language model's hidden
    # size `out` (one image token). Biases are ignored (< 0.1%).
    def patches_per_token(self, tower: Any) -> int:
        return tower.merge * tower.merge

    def embedding_params(self, tower: Any) -> int:
        return 3 * tower.temporal_patch * tower.patch * tower.patch * tower.hidden

    def block_linear(self, tower: Any) -> int:
        """qkv (h x 3h), proj (h x h) and the MLP's gate, up, down (h x I each)."""
        return 4 * tower.hidden * tower.hidden + 3 * tower.hidden * tower.intermediate

    def block_params(self, tower: Any) -> int:
        """Its matmuls and two RMSNorms."""
        return self.block_linear(tower) + 2 * tower.hidden

    def merger_linear(self, tower: Any) -> int:
        """The merger's two layers, on merged squares of hidden x merge^2."""
        merged = tower.hidden * tower.merge * tower.merge
        return merged * merged + merged * tower.out

    def head_params(self, tower: Any) -> int:
        """The merger's norm."""
        return tower.hidden

    def lora_params(self, tower: Any, r: int) -> int:
        """qkv (h + 3h), proj (2h), gate, up, down (h + I each) per block, and the merger's two layers."""
        h, i, merged = tower.hidden, tower.intermediate, tower.hidden * tower.merge * tower.merge
        return tower.layers * r * (9 * h + 3 * i) + r * (2 * merged + merged + tower.out)

    def saved_per_patch(self, tower: Any) -> int:
        """As a decoder layer's with as many key/value heads as heads: 12h + 4I."""
        return 12 * tower.hidden + 4 * tower.intermediate

    def blank_tower(self, tower: Any, like: Any) -> Any:
        """One merged square of zero patches (grid 1 x merge x merge) through `visual`."""
        import torch

        patch, merge = tower.patch_embed, tower.spatial_merge_size
        width = patch.in_channels * patch.temporal_patch_size * patch.patch_size**2
        pixels = torch.zeros(merge * merge, width, dtype=tower.dtype, device=like.device)
        grid = torch.tensor([[1, merge, merge]], device=like.device)
        return tower(pixels, grid_thw=grid).pooler_output

    def fallback_processor(self, path: str, trust_remote_code: bool) -> Any:
        """The same processor for images and text, with the family's Pillow image processor (`images_only`)."""
        from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        template = Path(path) / "chat_template.jinja"
        chat_template = template.read_text() if template.is_file() else tokenizer.chat_template
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(path)
        return images_only()(image_processor, tokenizer, chat_template=chat_template)

    def tiny_model(self, arch: Any, tokenizer: Any, text: dict[str, Any]) -> Any:
        """A Qwen2.5-VL model, full attention in every block (the demo's images fit one window anyway)."""
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

        v = arch.vision
        ids = {t: tokenizer.convert_tokens_to_ids(t) for t in self.tokenizer_tokens}
        text = text | {
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": _mrope(arch)}
        }
        vision = {
            "depth": v.layers,
            "hidden_size": v.hidden,
            "intermediate_size": v.intermediate,
            "num_heads": v.heads,
            "patch_size": v.patch,
            "spatial_merge_size": v.merge,
            "temporal_patch_size": v.temporal_patch,
            "out_hidden_size": arch.hidden,
            "window_size": v.patch * v.merge * 4,
            "fullatt_block_indexes": list(range(v.layers)),
        }
        config = Qwen2_5_VLConfig(
            text_config=text,
            vision_config=vision,
            tie_word_embeddings=arch.tie_embeddings,
            image_token_id=ids[IMAGE_TOKEN],
            video_token_id=ids[VIDEO_TOKEN],
            vision_start_token_id=ids[START],
            vision_end_token_id=ids[END],
        )
        return Qwen2_5_VLForConditionalGeneration(config)

    def tiny_processor(self, arch: Any, tokenizer: Any, template: str, pixels: tuple[int | None, int | None]) -> Any:
        """The family's Pillow image processor sized by `arch.vision` and the pixel bounds (`images_only`)."""
        from transformers import Qwen2VLImageProcessorPil

        v, (min_pixels, max_pixels), bounds = arch.vision, pixels, {}
        if min_pixels is not None:
            bounds["min_pixels"] = min_pixels
        if max_pixels is not None:
            bounds["max_pixels"] = max_pixels
        images = Qwen2VLImageProcessorPil(
            patch_size=v.patch, temporal_patch_size=v.temporal_patch, merge_size=v.merge, **bounds
        )
        return images_only()(images, tokenizer, chat_template=template)


def _mrope(arch: Any) -> list[int]:
    """The multimodal rotary split of a head's half-dimension into (time, height, width) sections."""
    half = (arch.head_dim or arch.hidden // arch.heads) // 2
    side = half * 3 // 8
    return [half - 2 * side, side, side]


FAMILY = Qwen2VL()
