"""What a vision-language family is to rlctl: `Family`, its description (model types, tower and projector module
names, special tokens and positions, chat placeholder, defaults, capabilities) and the operations that differ from
one family to the next (the planner's tower numbers and image tokens, the image processor's refusals, the
blank-tower pass, the processor fallback, the built-in tiny model). One subclass per family, in its own module.

Torch-free, so the planner and the pre-flight read it: the operations that need torch or transformers import them
inside the function."""

from __future__ import annotations

import abc
from typing import Any, Protocol


class Tower(Protocol):
    """A vision tower's numbers, as the config (`model.arch.vision`) and the memory model (`rlctl.plan.memory.arch.
    Vision`, whose `out` is the language model's hidden size) hold them."""

    kind: str
    layers: int
    hidden: int
    heads: int
    intermediate: int
    patch: int
    merge: int
    temporal_patch: int
    image_size: int | None
    tokens_per_image: int | None


class Kinded(Protocol):
    """Anything that names its tower's kind: the config's tower, or the memory model's (`of_tower` reads no more)."""

    @property
    def kind(self) -> str: ...


class Family(abc.ABC):
    """One vision-language family. Its class attributes describe it; its methods are what differs between families.

    - `name`: the family in words (messages, docs); `model_types`: the config.json model_type of its models;
      `text_model_type`: the model_type its language model is planned as (a dense decoder, `rlctl.plan.arch`).
    - `tower_kind`: its tower's `model.arch.vision.kind`, `tower_name` the tower's design by name and
      `tower_summary` the kind in words (docs/config.md).
    - `tower_modules`: the module names of its vision tower (and projector): what model.freeze_vision freezes and
      LoRA leaves alone unless model.lora_vision; `language_model`: its language model's module name.
    - `special_tokens`: the config keys of its image tokens, which a completion must never hold (suppressed);
      `token_types`: the forward argument marking image tokens (1) in the ids; `own_positions`: the model computes
      its own (multimodal) positions, else a scoring pass gives the batch's 1D position ids.
    - `placeholder`: what a built-in chat template writes for an image part (the processor expands it);
      `tokenizer_tokens`: the special tokens a built-in tokenizer adds for it, and `named_tokens` those it names as
      attributes (what the family's processor reads).
    - `pixel_bounds`: the processor's default (min, max) pixels an image is resized within, None when every image
      is resized to a fixed size (`fixed_size`).
    - Capabilities: `stages` that train it, `vllm` (rlctl's vLLM engines generate for it), `fsdp2` (sharded by FSDP2
      over several processes, which needs its `blank_tower` pass)."""

    name: str
    model_types: tuple[str, ...]
    text_model_type: str
    tower_kind: str
    tower_name: str
    tower_summary: str
    tower_modules: tuple[str, ...]
    language_model = "language_model"
    special_tokens: tuple[str, ...]
    token_types: str
    own_positions: bool
    placeholder: str
    tokenizer_tokens: tuple[str, ...] = ()
    named_tokens: dict[str, str] = {}  # noqa: RUF012 (read only)
    pixel_bounds: tuple[int, int] | None = None
    stages: tuple[str, ...] = ("sft", "rl")
    vllm = False
    fsdp2 = False

    # ------------------------------------------------------------------------------------------- planner
    @abc.abstractmethod
    def text_config(self, top: dict[str, Any]) -> dict[str, Any]:
        """The language model's numbers from the family's config.json (`top`), with `text_model_type`."""

    @abc.abstractmethod
    def tower_config(self, top: dict[str, Any]) -> dict[str, Any]:
        """The tower's `model.arch.vision` keys from the family's config.json (`top`)."""

    def tower_problem(self, tower: Tower) -> str | None:
        """Why `model.arch.vision` cannot be this family's tower (None: it can)."""
        return None

    @abc.abstractmethod
    def image_tokens(self, tower: Tower, width: int, height: int, min_pixels: int, max_pixels: int) -> int:
        """The image tokens one width x height image becomes."""

    @abc.abstractmethod
    def most_image_tokens(self, tower: Tower, min_pixels: int, max_pixels: int) -> int:
        """The most image tokens one image can become (the planner's worst case)."""

    def fixed_size(self, tower: Tower) -> int:
        """The side in pixels every image is resized to (0: images keep their size within the pixel bounds)."""
        return 0

    def image_problem(self, width: int, height: int) -> str | None:
        """Why the family's image processor would refuse a width x height image (None: it takes it)."""
        return None

    def preprocessor_bounds(self, preprocessor: dict[str, Any]) -> tuple[int | None, int | None]:
        """The (min_pixels, max_pixels) a model's preprocessor_config.json sets (None where it says nothing)."""
        return None, None

    @abc.abstractmethod
    def tower_shape(self, tower: Tower) -> str:
        """The tower in words, as the plan explains it."""

    @abc.abstractmethod
    def tower_brief(self, tower: Tower) -> str:
        """The tower's width and image handling, as `rlctl plan` shows it after its block count."""

    # ------------------------------------------------------------------------------------- memory model
    @abc.abstractmethod
    def patches_per_token(self, tower: Any) -> int:
        """Patches the tower encodes per image token."""

    @abc.abstractmethod
    def embedding_params(self, tower: Any) -> int:
        """The patch embedding's weights."""

    @abc.abstractmethod
    def block_linear(self, tower: Any) -> int:
        """One block's matmul weights."""

    @abc.abstractmethod
    def block_params(self, tower: Any) -> int:
        """One block's weights: its matmuls, its norms (and biases where counted)."""

    @abc.abstractmethod
    def merger_linear(self, tower: Any) -> int:
        """The matmul weights between the tower and the language model (merger, projector)."""

    @abc.abstractmethod
    def head_params(self, tower: Any) -> int:
        """The norms after the last block (and the projector's)."""

    @abc.abstractmethod
    def lora_params(self, tower: Any, r: int) -> int:
        """LoRA of rank r on every linear layer of the tower."""

    @abc.abstractmethod
    def saved_per_patch(self, tower: Any) -> int:
        """Elements one block saves for backward per patch."""

    # ----------------------------------------------------------------------- runtime (torch inside)
    def blank_tower(self, tower: Any, like: Any) -> Any:
        """The tower's output for one blank image (on `like`'s device), which a process whose batch holds no image
        runs so that FSDP2's collectives stay in step (`fsdp2`); None for a family without the pass."""
        return None

    def fallback_processor(self, path: str, trust_remote_code: bool) -> Any:
        """The model folder's processor where AutoProcessor cannot build it here (transformers wants torchvision
        for a part images do not need); None: no fallback."""
        return None

    @abc.abstractmethod
    def tiny_model(self, arch: Any, tokenizer: Any, text: dict[str, Any]) -> Any:
        """A random-init model of the family (the built-in tiny VLM): the language model of `text` (transformers
        config keys), the tower of `arch.vision`, the image tokens of `tokenizer`."""

    @abc.abstractmethod
    def tiny_processor(self, arch: Any, tokenizer: Any, template: str, pixels: tuple[int | None, int | None]) -> Any:
        """The built-in tiny model's processor: the family's image processor sized by `arch.vision` (and `pixels`,
        data.min_pixels / max_pixels), `tokenizer` and the chat `template`."""
