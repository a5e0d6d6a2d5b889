"""Vision-language models at run time, whichever family (`rlctl.vision`): their processor, and prompts' images as
model inputs.

A prompt with images is rendered by the chat template (one image placeholder per image part, the family's), then the
processor resizes the images and expands each placeholder into the image's tokens, so the prompt ids already hold
every image token. `encode_batch` is that one encoding, for a batch of prompts (evaluation) or one (training,
`encode`); `VisionInputs` is what the model's forward pass needs beside the ids, and `model_inputs` merges those of a
batch's rows with the token types the family reads (its own multimodal positions, or attention within an image).
A model's family is its config's model_type (`family`): one rlctl does not train is refused by name."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlctl import vision as families
from rlctl.data import images as image_entries
from rlctl.vision.family import Family


def is_vision_model(config: Any) -> bool:
    """Whether a model config is a vision-language model's (it has a vision tower's config)."""
    return getattr(config, "vision_config", None) is not None


def family_of(config: Any, where: str) -> Family:
    """The family of a vision-language model's config (`where`: the model, for the message)."""
    return families.of_model_type(getattr(config, "model_type", None), where)


def family(model: Any) -> Family:
    """The vision-language family of `model` (a DDP wrapper's inner model), by its config's model_type."""
    config = getattr(model, "module", model).config
    return family_of(config, getattr(config, "name_or_path", None) or type(model).__name__)


def load_processor(path: str, trust_remote_code: bool = False):
    """The model folder's processor: AutoProcessor's, or, where transformers wants torchvision for a part images do
    not need, the family's own (`Family.fallback_processor`)."""
    from transformers import AutoConfig, AutoProcessor

    try:
        return AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    except ImportError as e:  # transformers' message names the missing backend
        if "Torchvision" not in str(e):
            raise
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        fallback = family_of(config, path).fallback_processor(path, trust_remote_code)
        if fallback is None:
            raise
        return fallback


def processor_of(path: str | Path, trust_remote_code: bool = False):
    """The processor of the model folder or Hub id at `path` when it is a vision-language model's of a family rlctl
    trains (another family's is refused by name), else None (a text model, or an adapter folder without a config)."""
    from transformers import AutoConfig

    if Path(path).is_dir() and not (Path(path) / "config.json").is_file():
        return None
    config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    if not is_vision_model(config):
        return None
    family_of(config, str(path))
    return load_processor(str(path), trust_remote_code)


@dataclass
class VisionInputs:
    """One prompt's images as the model reads them: `pixel_values` (the family's layout: patches, or whole resized
    images) and `image_grid_thw` [images, 3] (a family of dynamic resolution's patch grid of each image: frames,
    rows, columns; None for a fixed-size family)."""

    pixel_values: Tensor
    image_grid_thw: Tensor | None = None


def row_images(row: dict[str, Any], base: Path | None) -> list:
    """The row's images as RGB Pillow images (relative paths from `base`, the data file's folder)."""
    return [image_entries.open_image(e, base) for e in image_entries.entries(row)]


def encode_batch(processor: Any, tokenizer: Any, texts: list[str], images: list[list] | None) -> Any:
    """Rendered prompts and each one's images (one list per prompt) as model inputs, in tensors: through the
    processor when any prompt has an image (the image tokens expanded, pixel values beside), else the tokenizer
    alone; padded on the tokenizer's side when there are several. The one encoding training and evaluation share."""
    pad = len(texts) > 1
    if images and any(images):
        return processor(text=texts, images=images, return_tensors="pt", padding=pad, add_special_tokens=False)
    return tokenizer(texts, return_tensors="pt", padding=pad, add_special_tokens=False)


def encode(processor: Any, text: str, images: list) -> tuple[list[int], VisionInputs | None]:
    """A rendered prompt and its images through the processor (`encode_batch`): the prompt ids (image tokens
    expanded) and the images' model inputs (None without images)."""
    enc = encode_batch(processor, processor.tokenizer, [text], [images])
    ids = enc["input_ids"][0].tolist()
    return ids, (VisionInputs(enc["pixel_values"], enc.get("image_grid_thw")) if images else None)


def vision_token_ids(model: Any) -> list[int]:
    """The ids of a vision-language model's image tokens and their delimiters (its family's `special_tokens`): a
    completion must never hold one (the next forward pass would look for pixel values of an image that is not
    there)."""
    config = getattr(model, "module", model).config
    return [i for i in (getattr(config, k, None) for k in family(model).special_tokens) if i is not None]


def model_inputs(
    model: Any, input_ids: Tensor, vision: list[VisionInputs | None], position_ids: Tensor | None = None
) -> dict[str, Tensor]:
    """The forward pass's image arguments for a batch whose rows carry `vision` (empty when none does): the rows'
    pixel values (and patch grids) in row order, the token types (1: image token) the family reads, and
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
    (gloo fails, NCCL hangs). Such a process runs the tower on one blank image (its family's `blank_tower`) and adds
    0 x its output to the text embeddings, so the backward pass reduces the tower's gradients there too (verl does
    the same). One all-reduce of a flag per forward pass tells whether any process has an image (decoding steps
    carry none anywhere). A family without the pass is not sharded so (the planner refuses it: `Family.fsdp2`)."""
    import torch.distributed as dist

    fam = family(model)
    if not fam.fsdp2:
        return model
    tower_name = fam.tower_modules[0]
    for module in model.modules():
        children = dict(module.named_children())
        if tower_name not in children or fam.language_model not in children:
            continue
        tower, blank = children[tower_name], {}

        def any_image(_module, _args, kwargs, blank=blank) -> None:
            if not dist.is_initialized():
                return
            mine = kwargs.get("pixel_values") is not None
            ids = kwargs.get("input_ids")
            ref = ids if ids is not None else kwargs["inputs_embeds"]
            flag = torch.tensor([int(mine)], device=ref.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            blank["run"] = bool(flag.item()) and not mine

        def with_blank(_module, args, kwargs, blank=blank, tower=tower):
            if not blank.pop("run", False):
                return None
            embeds = kwargs["inputs_embeds"]
            out = fam.blank_tower(tower, embeds)
            return args, {**kwargs, "inputs_embeds": embeds + 0.0 * out.mean().to(embeds.dtype)}

        module.register_forward_pre_hook(any_image, with_kwargs=True)
        children[fam.language_model].register_forward_pre_hook(with_blank, with_kwargs=True)
    return model
