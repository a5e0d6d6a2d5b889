"""Gemma 3 (`Gemma3ForConditionalGeneration`): every image resized to the SigLIP tower's `image_size` square
(pan-and-scan off, the processor's default), its patches encoded by `vision_tower`, then average-pooled by the
`multi_modal_projector` into `mm_tokens_per_image` image soft tokens (an RMSNorm, one matrix). Image tokens attend
to each other both ways (`token_type_ids`); positions are plain 1D ones, which a scoring pass gives.

Not sharded by FSDP2 over several processes: it has no blank-tower pass yet, so a process whose batch holds no image
would leave the processes' collectives out of step."""

from __future__ import annotations

from typing import Any

from rlctl.vision.family import Family, Tower

# what transformers 5.17 reads where a Gemma 3 config.json leaves a number out (Gemma3TextConfig's, and
# SiglipVisionConfig's and Gemma3Config's defaults): google/gemma-3-*-it's files omit several
TEXT_DEFAULTS = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 131_072,
    "tie_word_embeddings": True,
}
SIGLIP_DEFAULTS = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "image_size": 224,
    "patch_size": 16,
}
TOKENS_PER_IMAGE = 256
# its tokenizer's image tokens, as it names them (Gemma3Processor reads these attributes): the placeholder the chat
# template writes, the soft token it expands into (one per image token) and the closing delimiter
NAMED_TOKENS = {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"}


class Gemma3(Family):
    name = "Gemma 3"
    model_types = ("gemma3",)
    text_model_type = "gemma3_text"
    tower_kind = "siglip"
    tower_name = "SigLIP"
    tower_summary = "Gemma 3: fixed image size, pooled into a fixed number of tokens per image"
    tower_modules = ("vision_tower", "multi_modal_projector")
    special_tokens = ("image_token_id", "boi_token_id", "eoi_token_id")
    token_types = "token_type_ids"
    own_positions = False
    placeholder = NAMED_TOKENS["boi_token"]
    tokenizer_tokens = tuple(NAMED_TOKENS.values())
    named_tokens = NAMED_TOKENS

    def text_config(self, top: dict[str, Any]) -> dict[str, Any]:
        """The text numbers under text_config alone, transformers' defaults filled in."""
        tied = {k: top[k] for k in ("tie_word_embeddings",) if k in top}
        return TEXT_DEFAULTS | tied | (top.get("text_config") or {}) | {"model_type": self.text_model_type}

    def tower_config(self, top: dict[str, Any]) -> dict[str, Any]:
        """The SigLIP tower (SiglipVisionConfig's defaults filled in), pooled into mm_tokens_per_image tokens."""
        v = SIGLIP_DEFAULTS | top["vision_config"]
        return {
            "kind": self.tower_kind,
            "layers": v["num_hidden_layers"],
            "hidden": v["hidden_size"],
            "heads": v["num_attention_heads"],
            "intermediate": v["intermediate_size"],
            "patch": v["patch_size"],
            "image_size": v["image_size"],
            "tokens_per_image": top.get("mm_tokens_per_image") or TOKENS_PER_IMAGE,
        }

    def tower_problem(self, tower: Tower) -> str | None:
        """The tower needs its image size and tokens per image, the patches pooling evenly into the tokens."""
        if tower.image_size is None or tower.tokens_per_image is None:
            return "a siglip vision tower needs image_size and tokens_per_image"
        side, per_side = tower.image_size // tower.patch, round(tower.tokens_per_image**0.5)
        if tower.image_size % tower.patch or per_side * per_side != tower.tokens_per_image or side % per_side:
            return (
                f"a siglip tower's image_size ({tower.image_size}) must be a multiple of patch ({tower.patch}) and "
                f"tokens_per_image ({tower.tokens_per_image}) a square whose side divides image_size / patch"
            )
        return None

    def image_tokens(self, tower: Tower, width: int, height: int, min_pixels: int, max_pixels: int) -> int:
        """tokens_per_image, whatever the image's size."""
        return tower.tokens_per_image or 0

    def most_image_tokens(self, tower: Tower, min_pixels: int, max_pixels: int) -> int:
        return tower.tokens_per_image or 0

    def fixed_size(self, tower: Tower) -> int:
        return tower.image_size or 0

    def tower_shape(self, tower: Tower) -> str:
        v = tower
        return (
            f"{v.layers} SigLIP blocks of {v.hidden}, each image at {v.image_size}px in {v.patch}px patches "
            f"pooled into {v.tokens_per_image} token(s)"
        )

    def tower_brief(self, tower: Tower) -> str:
        v = tower
        return f"{v.hidden}, SigLIP: {v.image_size} px images, {v.patch} px patches, {v.tokens_per_image} tokens each)"

    # Every image resized to `image_size` pixels square, its patches embedded (a 2D convolution and a learnt position
    # per patch), `layers` SigLIP blocks (q, k, v, o and a two-matrix GELU MLP, two LayerNorms, with biases), a final
    # LayerNorm, and the projector: the patches average-pooled into `tokens_per_image` image tokens, an RMSNorm and one
    # matrix into `out`. Counted exactly, biases included.
    @staticmethod
    def patches_per_image(tower: Any) -> int:
        """The patches of one (resized) image."""
        return (tower.image_size // tower.patch) ** 2

    def patches_per_token(self, tower: Any) -> int:
        return self.patches_per_image(tower) // tower.tokens_per_image

    def embedding_params(self, tower: Any) -> int:
        """The convolution (and its bias) and one position embedding per patch."""
        h = tower.hidden
        return 3 * tower.patch * tower.patch * h + h + self.patches_per_image(tower) * h

    def block_linear(self, tower: Any) -> int:
        """q, k, v, o (h x h each) and the MLP's fc1, fc2 (h x I each)."""
        return 4 * tower.hidden * tower.hidden + 2 * tower.hidden * tower.intermediate

    def block_params(self, tower: Any) -> int:
        """q, k, v, o biases (4h), fc1's (I) and fc2's (h), two LayerNorms (2 x 2h)."""
        return self.block_linear(tower) + 9 * tower.hidden + tower.intermediate

    def merger_linear(self, tower: Any) -> int:
        """The projector's matrix."""
        return tower.hidden * tower.out

    def head_params(self, tower: Any) -> int:
        """The final LayerNorm (2h) and the projector's RMSNorm (h)."""
        return 3 * tower.hidden

    def lora_params(self, tower: Any, r: int) -> int:
        """q, k, v, o (2h each), fc1, fc2 (h + I each) per block (the projector is a plain matrix, no linear
        layer)."""
        return tower.layers * r * (10 * tower.hidden + 2 * tower.intermediate)

    def saved_per_patch(self, tower: Any) -> int:
        """As a decoder layer's with as many key/value heads as heads, its two-matrix MLP: 12h + 2I."""
        return 12 * tower.hidden + 2 * tower.intermediate

    def tiny_model(self, arch: Any, tokenizer: Any, text: dict[str, Any]) -> Any:
        """Its sliding window as long as the context (every layer attends to it all). transformers initialises the
        projection at zero; a random one here makes the random-init model read its images from the start, as the
        tiny Qwen2.5-VL does."""
        import torch
        from transformers import Gemma3Config, Gemma3ForConditionalGeneration

        v, head_dim = arch.vision, arch.head_dim or arch.hidden // arch.heads
        ids = {k: tokenizer.convert_tokens_to_ids(t) for k, t in NAMED_TOKENS.items()}
        text = text | {"head_dim": head_dim, "query_pre_attn_scalar": head_dim, "sliding_window": arch.max_position}
        vision = {
            "num_hidden_layers": v.layers,
            "hidden_size": v.hidden,
            "intermediate_size": v.intermediate,
            "num_attention_heads": v.heads,
            "patch_size": v.patch,
            "image_size": v.image_size,
            "vision_use_head": False,
        }
        config = Gemma3Config(
            text_config=text,
            vision_config=vision,
            mm_tokens_per_image=v.tokens_per_image,
            tie_word_embeddings=arch.tie_embeddings,
            boi_token_index=ids["boi_token"],
            eoi_token_index=ids["eoi_token"],
            image_token_index=ids["image_token"],
        )
        model = Gemma3ForConditionalGeneration(config)
        projection = model.model.multi_modal_projector.mm_input_projection_weight
        torch.nn.init.normal_(projection.data, std=config.initializer_range)
        return model

    def tiny_processor(self, arch: Any, tokenizer: Any, template: str, pixels: tuple[int | None, int | None]) -> Any:
        """Gemma 3's Pillow image processor at the tower's image size (the pixel bounds do not apply), and
        `tokens_per_image` soft tokens per image."""
        from transformers import Gemma3Processor
        from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

        v = arch.vision
        images = Gemma3ImageProcessorPil(size={"height": v.image_size, "width": v.image_size})
        return Gemma3Processor(images, tokenizer, chat_template=template, image_seq_length=v.tokens_per_image)


FAMILY = Gemma3()
