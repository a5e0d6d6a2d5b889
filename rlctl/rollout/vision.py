"""Vision-language models (the Qwen2-VL family and Gemma 3): their processor, and a prompt's images as model inputs.

A prompt with images is rendered by the chat template (one image placeholder per image part: Qwen2-VL's
`<|vision_start|><|image_pad|><|vision_end|>`, Gemma 3's `<start_of_image>`), then the processor resizes the images
(Qwen2-VL: within its min/max pixels, cut into patches; Gemma 3: to its fixed size) and expands each placeholder into
the image's tokens, so the prompt ids already hold every image token. `VisionInputs` is what the model's forward pass
needs beside them; `model_inputs` merges those of a batch's rows, with the token types the family reads (Qwen2-VL's
multimodal rotary positions, Gemma 3's bidirectional attention within an image). `FAMILIES` holds what differs.

transformers 5.17 refuses to build a Qwen2-VL processor without torchvision (for its video processor) even for images
alone; `load_processor` then builds the same processor with no video side (`ImagesOnly`), saved as the family's own
processor class so a machine with torchvision loads it through AutoProcessor as usual."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import Qwen2_5_VLProcessor
from transformers.processing_utils import ProcessorMixin

from rlctl.data import images as image_entries


class ImagesOnly(Qwen2_5_VLProcessor):
    """Qwen2.5-VL's processor with images and text only (no video processor: it needs torchvision)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
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
        """The processor's files, and the image side's own preprocessor_config.json (what older transformers and
        other tools read)."""
        out = super().save_pretrained(save_directory, *args, **kwargs)
        self.image_processor.save_pretrained(save_directory)
        return out


def is_vision_model(config: Any) -> bool:
    """Whether a model config is a vision-language model's (it has a vision tower's config)."""
    return getattr(config, "vision_config", None) is not None


def load_processor(path: str, trust_remote_code: bool = False):
    """The model folder's processor: AutoProcessor's, or, where transformers wants torchvision for a Qwen2-VL
    family's video side, the same processor for images and text (`ImagesOnly`)."""
    from transformers import AutoProcessor, AutoTokenizer, Qwen2VLImageProcessorPil

    try:
        return AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    except ImportError as e:  # transformers' message names the missing backend
        if "Torchvision" not in str(e):
            raise
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    template = Path(path) / "chat_template.jinja"
    chat_template = template.read_text() if template.is_file() else tokenizer.chat_template
    image_processor = Qwen2VLImageProcessorPil.from_pretrained(path)
    return ImagesOnly(image_processor, tokenizer, chat_template=chat_template)


def processor_of(path: str | Path, trust_remote_code: bool = False):
    """The processor of the model folder or Hub id at `path` when it is a vision-language model's, else None (a
    text model, or an adapter folder without a config)."""
    from transformers import AutoConfig

    if Path(path).is_dir() and not (Path(path) / "config.json").is_file():
        return None
    config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    return load_processor(str(path), trust_remote_code) if is_vision_model(config) else None


@dataclass(frozen=True)
class Family:
    """What differs between the vision-language families rlctl trains: the forward's image-token-type argument,
    whether the model computes its own positions from it (else the batch's position ids are passed), and the
    config keys of the image tokens a completion must never hold."""

    token_types: str
    own_positions: bool
    special_tokens: tuple[str, ...]


QWEN2_VL = Family(
    "mm_token_type_ids", True, ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
)
FAMILIES = {
    "qwen2_vl": QWEN2_VL,
    "qwen2_5_vl": QWEN2_VL,
    # Gemma 3: image tokens attend to each other both ways (token_type_ids); plain 1D rotary positions
    "gemma3": Family("token_type_ids", False, ("image_token_id", "boi_token_id", "eoi_token_id")),
}


def family(model: Any) -> Family:
    """The vision-language family of `model` (a DDP wrapper's inner model), by its config's model_type."""
    config = getattr(model, "module", model).config
    return FAMILIES.get(config.model_type, QWEN2_VL)


@dataclass
class VisionInputs:
    """One prompt's images as the model reads them: `pixel_values` (Qwen2-VL: [patches, channels x temporal x
    patch^2]; Gemma 3: [images, channels, size, size]) and `image_grid_thw` [images, 3] (Qwen2-VL's patch grid of
    each image: frames, rows, columns; None for a fixed-size family)."""

    pixel_values: Tensor
    image_grid_thw: Tensor | None = None


def row_images(row: dict[str, Any], base: Path | None) -> list:
    """The row's images as RGB Pillow images (relative paths from `base`, the data file's folder)."""
    return [image_entries.open_image(e, base) for e in image_entries.entries(row)]


def encode(processor: Any, text: str, images: list) -> tuple[list[int], VisionInputs | None]:
    """A rendered prompt and its images through the processor: the prompt ids (image tokens expanded) and the
    images' model inputs (None without images)."""
    if not images:
        return processor.tokenizer(text, add_special_tokens=False)["input_ids"], None
    enc = processor(text=[text], images=images, return_tensors="pt", add_special_tokens=False)
    return enc["input_ids"][0].tolist(), VisionInputs(enc["pixel_values"], enc.get("image_grid_thw"))


def vision_token_ids(model: Any) -> list[int]:
    """The ids of a vision-language model's image and video placeholders and their delimiters: a completion must
    never hold one (the next forward pass would look for pixel values of an image that is not there)."""
    config = getattr(model, "module", model).config
    return [i for i in (getattr(config, k, None) for k in family(model).special_tokens) if i is not None]


def model_inputs(
    model: Any, input_ids: Tensor, vision: list[VisionInputs | None], position_ids: Tensor | None = None
) -> dict[str, Tensor]:
    """The forward pass's image arguments for a batch whose rows carry `vision` (empty when none does): the rows'
    pixel values (and Qwen2-VL's grids) in row order, the token types (1: image token) the family reads, and
    `position_ids` (a scoring pass's; generation computes its own) for a family that does not compute its own."""
    present = [v for v in vision if v is not None]
    if not present:
        return {}
    config, fam = getattr(model, "module", model).config, family(model)
    image_token = getattr(config, "image_token_id", None)
    device = input_ids.device
    out = {"pixel_values": torch.cat([v.pixel_values for v in present]).to(device)}
    if present[0].image_grid_thw is not None:
        out["image_grid_thw"] = torch.cat([v.image_grid_thw for v in present]).to(device)
    out[fam.token_types] = (input_ids == image_token).int()
    if position_ids is not None and not fam.own_positions:
        out["position_ids"] = position_ids
    return out


def keep_tower_in_step(model: Any) -> Any:
    """`model` (a vision-language model under FSDP2, several processes) made to run its vision tower in every
    forward pass in which any process has an image; returns it. Each process gathers a sharded unit's weights when
    the unit runs, so a process whose batch holds no image (text rows beside image rows, a finished tool rollout's
    stand-in) would skip the tower's units while another runs them, and their collectives would no longer match
    (gloo fails, NCCL hangs). Such a process runs the tower on one blank image and adds 0 x its output to the text
    embeddings, so the backward pass reduces the tower's gradients there too (verl does the same). One all-reduce
    of a flag per forward pass tells whether any process has an image (decoding steps carry none anywhere)."""
    import torch.distributed as dist

    for module in model.modules():
        children = dict(module.named_children())
        if "visual" not in children or "language_model" not in children:
            continue
        visual, blank = children["visual"], {}

        def any_image(_module, _args, kwargs, blank=blank) -> None:
            if not dist.is_initialized():
                return
            mine = kwargs.get("pixel_values") is not None
            ids = kwargs.get("input_ids")
            ref = ids if ids is not None else kwargs["inputs_embeds"]
            flag = torch.tensor([int(mine)], device=ref.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            blank["run"] = bool(flag.item()) and not mine

        def with_blank(_module, args, kwargs, blank=blank, visual=visual):
            if not blank.pop("run", False):
                return None
            patch = visual.patch_embed
            merge = visual.spatial_merge_size
            width = patch.in_channels * patch.temporal_patch_size * patch.patch_size**2
            embeds = kwargs["inputs_embeds"]
            pixels = torch.zeros(merge * merge, width, dtype=visual.dtype, device=embeds.device)
            grid = torch.tensor([[1, merge, merge]], device=embeds.device)
            tower = visual(pixels, grid_thw=grid).pooler_output
            return args, {**kwargs, "inputs_embeds": embeds + 0.0 * tower.mean().to(embeds.dtype)}

        module.register_forward_pre_hook(any_image, with_kwargs=True)
        children["language_model"].register_forward_pre_hook(with_blank, with_kwargs=True)
    return model
