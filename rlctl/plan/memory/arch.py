"""The architecture arithmetic of the memory model: parameter, LoRA, quantized, KV-cache and activation counts of a
decoder-only transformer (GQA, SwiGLU, RMSNorm) and of a vision-language model's vision tower, from the numbers in
`model.arch` (pure Python, no torch)."""

from __future__ import annotations

from collections import namedtuple
from typing import TYPE_CHECKING

from rlctl import vision

if TYPE_CHECKING:
    from rlctl.config import ModelArch
    from rlctl.vision.family import Family

# Immutable records are plain namedtuples: `typing.NamedTuple` and dataclasses compile code per field at import,
# which costs tens of milliseconds that `rlctl plan` does not have.


class Vision(
    namedtuple(
        "Vision",
        "layers hidden heads intermediate patch merge temporal_patch out kind image_size tokens",
        defaults=(vision.KINDS[0], 0, 0),
    )
):
    """The vision tower of a vision-language model, of `kind` (its family's, `rlctl.vision`): `layers` blocks of
    width `hidden` (MLP `intermediate`) over `patch` x `patch` pixel patches (`temporal_patch` frames deep, each
    `merge` x `merge` square one image token; or every image resized to `image_size` and pooled into `tokens` image
    tokens), feeding the language model's hidden size `out`. Its family counts its weights and activations."""

    __slots__ = ()

    @property
    def family(self) -> Family:
        return vision.of_tower(self)

    @property
    def tokens_per_image(self) -> int:
        return self.tokens

    @property
    def patches_per_image(self) -> int:
        """A fixed-size tower's patches of one (resized) image."""
        return (self.image_size // self.patch) ** 2

    @property
    def patches_per_token(self) -> int:
        """Patches the tower encodes per image token."""
        return self.family.patches_per_token(self)

    @property
    def linear_params(self) -> int:
        """The blocks' and the merger's (projector's) matmul weights."""
        family = self.family
        return self.layers * family.block_linear(self) + family.merger_linear(self)

    @property
    def params(self) -> int:
        """Every weight: the patch embedding, the blocks, the merger (projector) and the norms around them."""
        f = self.family
        return (
            f.embedding_params(self) + self.layers * f.block_params(self) + f.merger_linear(self) + f.head_params(self)
        )

    def lora_params(self, r: int) -> int:
        """LoRA on every linear layer of the tower."""
        return self.family.lora_params(self, r)

    def act_bytes_per_patch_layer(self, ab: float) -> float:
        """Tensors one block saves for backward per patch, as a decoder layer's (`Arch.act_bytes_per_token_layer`)
        with as many key/value heads as heads (flash or memory-efficient attention, per image), in elements of ab
        bytes."""
        return ab * self.family.saved_per_patch(self)


class Arch(
    namedtuple(
        "Arch",
        "layers hidden heads kv_heads vocab intermediate tie_embeddings head_size vision",
        defaults=(False, None, None),
    )
):
    """The architecture numbers the model needs (a decoder-only, GQA, SwiGLU, RMSNorm transformer):
    layers, hidden, heads, kv_heads, vocab, intermediate (MLP size), tie_embeddings, head_size (None: hidden /
    heads; Qwen3 and Gemma set their own), vision (a vision-language model's `Vision` tower, else None)."""

    __slots__ = ()

    @classmethod
    def of(cls, a: ModelArch) -> Arch:
        v = a.vision
        tower = None
        if v is not None:
            tower = Vision(
                v.layers, v.hidden, v.heads, v.intermediate, v.patch, v.merge, v.temporal_patch, a.hidden,
                v.kind, v.image_size or 0, v.tokens_per_image or 0,
            )  # fmt: skip
        return cls(
            a.layers, a.hidden, a.heads, a.kv_heads, a.vocab, a.intermediate, a.tie_embeddings, a.head_dim, tower
        )

    @property
    def vision_params(self) -> int:
        return self.vision.params if self.vision is not None else 0

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_linear(self) -> int:
        """q, o (h x heads·head_dim), k, v (h x kv_dim), gate, up, down (h x I): the layer's matmul weights."""
        h = self.hidden
        return 2 * h * self.q_dim + 2 * h * self.kv_dim + 3 * h * self.intermediate

    @property
    def layer_params(self) -> int:
        return self.layer_linear + 2 * self.hidden  # + two RMSNorm weights

    @property
    def embedding(self) -> int:
        return self.vocab * self.hidden

    def params(self, head: str = "lm") -> int:
        """All parameters (biases ignored, < 0.1%); `head="score"` is the reward model's 1-output head."""
        out = self.embedding if head == "lm" and not self.tie_embeddings else 0
        if head == "score":
            out = self.hidden
        return self.layers * self.layer_params + self.embedding + out + self.hidden + self.vision_params  # + norm

    @property
    def linear_params(self) -> int:
        """Weights bitsandbytes quantizes for QLoRA (embeddings, LM head and norms stay in bf16; the vision tower is
        counted in bf16 too, as a QLoRA setup that skips it keeps it)."""
        return self.layers * self.layer_linear

    def lora_params(self, r: int) -> int:
        """LoRA on all linear layers (PEFT `all-linear`, LM head excluded): r x (in + out) per adapted matrix."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        # q: h+q, k: h+kv, v: h+kv, o: q+h, gate: h+I, up: h+I, down: I+h
        return self.layers * r * (7 * h + 2 * q + 2 * kv + 3 * i)

    def adapter_params(self, r: int, embeddings: bool = False, vision: bool = False) -> int:
        """Trainable parameters of an adapter layout: LoRA on all linear layers of the language model, plus the
        token embeddings and the output head (one matrix when tied) when they train too (model.train_embeddings),
        plus LoRA on the vision tower's when it trains too (model.lora_vision)."""
        tower = self.vision.lora_params(r) if vision and self.vision is not None else 0
        return self.lora_params(r) + tower + (self.embedding * (1 if self.tie_embeddings else 2) if embeddings else 0)

    def kv_bytes_per_token(self, dtype_bytes: float) -> float:
        """K and V for every layer: 2 x layers x kv_heads x head_dim x dtype bytes."""
        return 2 * self.layers * self.kv_dim * dtype_bytes

    def act_bytes_per_token_layer(self, ab: float) -> float:
        """Tensors one decoder layer saves for backward, per token, in elements of ab bytes (flash attention,
        no dropout): each RMSNorm its input upcast to fp32 (2), its normalised and its output tensor (1 + 1)
        -> 4h per norm, 8h for two; Q and the attention output h each; K and V kv_dim each; the MLP's gate, up,
        act(gate) and act*up I each. Total 10h + 2 kv_dim + 4I (docs/memory-planner.md itemises it)."""
        return ab * (10 * self.hidden + 2 * self.kv_dim + 4 * self.intermediate)

    def act_bytes_per_token_layer_master(self) -> float:
        """Bytes one decoder layer saves per token when the weights are fp32 and autocast computes in bf16 (full
        training on single/DDP): the embedding is fp32, so the residual stream and both RMSNorms stay fp32 (input
        4h + normalised 4h bytes each), and every linear casts its input to bf16 on its own (q, k, v: 3 copies,
        gate, up: 2; 2h bytes each); Q, the attention output, K, V and the MLP tensors are bf16 as above.
        Total 2 x 8h + 5 x 2h + 2 x (2h + 2 kv_dim + 4I) = 30h + 4 kv_dim + 8I."""
        return 30 * self.hidden + 4 * self.kv_dim + 8 * self.intermediate

    def matmul_params(self, head: str = "lm") -> int:
        """Weights autocast casts to bf16 for a forward: the linear layers and the LM head (vocab x h, tied or
        not) or the reward model's h x 1 score head; embeddings and norms are not matmuls."""
        tower = self.vision.linear_params if self.vision is not None else 0
        return self.linear_params + tower + (self.embedding if head == "lm" else self.hidden)

    def lora_dropout_bytes_per_token_layer(self, ab: float) -> float:
        """LoRA dropout keeps a copy of each adapted matrix's input: q, k, v, o, gate, up (h) and down (I)."""
        return ab * (6 * self.hidden + self.intermediate)

    @property
    def largest_fsdp_unit(self) -> int:
        """FSDP2 wraps each decoder layer and the embedding (with the tied head) as units."""
        return max(self.layer_params, self.embedding)
