"""Rows measured in tokens as each stage's trainer sees them, and the chat templates that render message lists.

Works with a transformers tokenizer (in the stages) or with `FileTokenizer`, which reads a tokenizer folder's
`tokenizer.json` and chat template with the `tokenizers` library and jinja2 alone: `rlctl plan` counts over-long
rows with it without importing transformers or torch, and without loading any weights.
"""

from __future__ import annotations

import functools
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from rlctl import vision
from rlctl.data.images import PLACEHOLDER
from rlctl.errors import UserError


def content(image: str) -> str:
    """A message's content: its text, or its parts in order (a vision-language prompt), each image part rendered as
    `image`, the family's image placeholder, which the processor expands into the image's tokens."""
    return (
        "{% if message['content'] is string or not message['content'] %}{{ message['content'] or '' }}{% else %}"
        "{% for part in message['content'] %}{% if part['type'] == 'image' or 'image' in part %}"
        "{{ '" + image + "' }}{% elif part['type'] == 'text' %}{{ part['text'] }}"
        "{% endif %}{% endfor %}{% endif %}"
    )


CONTENT = content(vision.placeholder(None))  # a text model's (no image part to render)


def chatml(body: str = CONTENT) -> str:
    """ChatML; with `tools` (OpenAI schemas) and `tool` messages rendered as Qwen2.5 does: the tools listed in the
    system turn, calls as <tool_call>{json}</tool_call>, results as <tool_response> blocks in one user turn. Message
    contents are rendered by `body` (`content`'s, with the family's image placeholder)."""
    return (
        "{% if tools %}{{ '<|im_start|>system\\n' }}{% if messages[0]['role'] == 'system' %}"
        "{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
        "{{ '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided "
        "with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
        "{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}"
        "{{ '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
        "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}{% endif %}"
        "{% for message in messages %}"
        "{% if message['role'] == 'tool' %}"
        "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
        "{{ '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
        "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
        "{% elif not (tools and loop.first and message['role'] == 'system') %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' }}" + body + "{% for call in message.get('tool_calls') or [] %}"
        "{% set f = call['function'] if 'function' in call else call %}"
        "{{ ('\\n' if (message['content'] or not loop.first) else '') "
        "+ '<tool_call>\\n{\\\"name\\\": \\\"' + f['name'] "
        "+ '\\\", \\\"arguments\\\": ' + (f['arguments'] if f['arguments'] is string else f['arguments'] | tojson) "
        "+ '}\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )


CHATML = chatml()
# ChatML for tiny models: tools listed by name only (the Qwen2.5 description would fill a tiny context), tool
# results as <tool_response> blocks in a user turn; calls are written by the model as <tool_call>{json}</tool_call>.
CHATML_COMPACT = (
    "{% if tools %}{{ '<|im_start|>system\\ntools:' }}{% for tool in tools %}{{ ' ' + tool['function']['name'] }}"
    "{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}{% for message in messages %}{% if message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>' + message['content'] + '</tool_response><|im_end|>\\n' }}{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}" + CONTENT + "{{ '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
BUILTIN_TEMPLATES = {"chatml": CHATML, "chatml-compact": CHATML_COMPACT}


def template_text(setting: str, image: str | None = None) -> str:
    """The Jinja text `data.chat_template` names: a built-in (`chatml`), its image parts rendered as `image` (the
    model family's placeholder, `rlctl.vision.placeholder`), or a file."""
    if setting in BUILTIN_TEMPLATES:
        text = BUILTIN_TEMPLATES[setting]
        return text if image is None else text.replace(CONTENT, content(image))
    path = Path(setting).expanduser()
    if not path.is_file():
        raise UserError(
            f"data.chat_template={setting} is neither a built-in template ({', '.join(BUILTIN_TEMPLATES)}) nor a "
            "Jinja file."
        )
    return path.read_text(encoding="utf-8")


def folder_template(folder: Path) -> str | None:
    """The chat template saved with a tokenizer: chat_template.jinja, chat_template.json or tokenizer_config.json."""
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    for name in ("chat_template.json", "tokenizer_config.json"):
        if (folder / name).is_file():
            template = json.loads((folder / name).read_text(encoding="utf-8")).get("chat_template")
            if isinstance(template, list):  # named templates: the default one
                template = next((t["template"] for t in template if t.get("name") == "default"), None)
            if template:
                return template
    return None


def _special(value: Any) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def render(
    template: str,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = False,
    tools: list[dict[str, Any]] | None = None,
    **special: Any,
) -> str:
    """A conversation through a chat template as transformers renders it (sandboxed jinja2, the same globals)."""
    return _compiled(template).render(
        messages=messages, add_generation_prompt=add_generation_prompt, tools=tools, **special
    )


@functools.lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise UserError(f"The chat template refused a conversation: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda f: datetime.now().strftime(f))
    return env.from_string(template)


# The builtin:tiny tokenizer: byte-level BPE trained on the run's own texts with Qwen2's pre-tokenizer regex.
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS, "<|im_start|>", "<|im_end|>"]
CHATML_ROLES = ("system", "user", "assistant")


# BPE training time grows with the text and with the square of a word's length (a 200 KB word: 45 s, a 20 MB row of
# words: 16 s): the builtin tokenizer learns from each text's first TRAIN_CHARS characters (far more than the tiny
# model's context) and from each run of non-space (or space) characters its first LONGEST_RUN, so a 20 MB row trains
# in a moment. Linear: a run is cut only where it starts (the lookbehind) and never re-read (possessive).
TRAIN_CHARS = 1 << 16
LONGEST_RUN = 256
_LONG_RUN = re.compile(rf"(?<!\S)(\S{{{LONGEST_RUN}}})\S++|(?<!\s)(\s{{{LONGEST_RUN}}})\s++")


def train_bpe(texts: list[str], vocab_size: int) -> Any:
    """A `tokenizers.Tokenizer`: byte-level BPE trained on `texts` (cut: TRAIN_CHARS, LONGEST_RUN) with Qwen2's
    pre-tokenizer regex and the special tokens of SPECIAL_TOKENS (the builtin:tiny tokenizer, before transformers
    wraps it).

    Texts with no two bytes in one pre-token (sums: the regex splits digits one by one) give no merge at all, and a
    byte-level BPE without merges cannot go into a GGUF file (its writer stores no empty list, and llama.cpp and
    transformers refuse a BPE vocabulary without merges): such texts are trained on again with ChatML's role names
    added. Their own tokens and ids stay the same, since no merge can join two of their pre-tokens."""
    texts = [_LONG_RUN.sub(r"\1\2", t[:TRAIN_CHARS]) if len(t) > LONGEST_RUN else t for t in texts]
    tok = _bpe(texts, vocab_size)
    if not json.loads(tok.to_str())["model"]["merges"]:
        tok = _bpe([*texts, *CHATML_ROLES], vocab_size)
    return tok


def _bpe(texts: list[str], vocab_size: int) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


class FileTokenizer:
    """The part of a transformers tokenizer that length counting uses, from a `tokenizers.Tokenizer`: a tokenizer
    folder's files (`from_folder`) or the builtin:tiny one trained here (`builtin`). Not a transformers class on
    purpose: importing any transformers tokenizer imports torch (5 s, 1,800 modules), which `rlctl plan` never does;
    tests/test_real_data.py checks that it counts every stage's rows as transformers' own tokenizer does."""

    def __init__(
        self, backend: Any, chat_template: str | None, special: dict[str, str | None], image: str = PLACEHOLDER
    ):
        self.backend, self.chat_template, self.special = backend, chat_template, special
        self.image = image  # what an image part is counted as (see apply_chat_template)

    @classmethod
    def from_folder(cls, folder: Path, chat_template: str | None) -> FileTokenizer:
        """The tokenizer saved in `folder` (tokenizer.json, tokenizer_config.json)."""
        from tokenizers import Tokenizer

        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        special = {k: _special(config.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        return cls(Tokenizer.from_file(str(folder / "tokenizer.json")), chat_template, special)

    @classmethod
    def builtin(cls, texts: list[str], vocab_size: int, chat_template: str | None, arch: Any = None) -> FileTokenizer:
        """The tokenizer of a built-in model (`arch`, its ModelArch) the run will train on `texts`: the same BPE,
        the same counts; a vision-language one's image parts counted as its chat template writes them (its
        family's placeholder, of the family's special tokens as rlctl.stages.tiny adds them)."""
        backend = train_bpe(texts, vocab_size)
        family = vision.of_arch(arch)
        image, default = PLACEHOLDER, CHATML
        if family is not None:
            image, default = family.placeholder, template_text("chatml", family.placeholder)
            backend.add_special_tokens(list(family.tokenizer_tokens))
        eos = "<|im_end|>" if family is not None else EOS  # a chat model's (rlctl.stages.tiny)
        special = {"bos_token": None, "eos_token": eos, "pad_token": EOS, "unk_token": None}
        return cls(backend, chat_template or default, special, image)

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": self.backend.encode(text, add_special_tokens=add_special_tokens).ids}

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        return_dict: bool = False,
        tools: list[dict[str, Any]] | None = None,
    ) -> Any:
        """The conversation rendered as transformers renders it (sandboxed jinja2, the same globals). Contents given
        as image and text parts (vision-language rows) are rendered as their text with `<image>` where an image is:
        this counts text tokens, whatever the template does with parts (a row's image tokens are counted from its
        images' sizes, `rlctl.data.images`)."""
        messages = [
            {**m, "content": _flat(m["content"], self.image)} if isinstance(m.get("content"), list) else m
            for m in messages
        ]
        text = render(self.chat_template or "", messages, add_generation_prompt, tools, **self.special)
        if not tokenize:
            return text
        ids = self(text)["input_ids"]
        return {"input_ids": ids} if return_dict else ids


def _flat(parts: list[dict[str, Any]], image: str) -> str:
    return "".join(image if p.get("type") == "image" else p.get("text") or "" for p in parts)


def prompt_messages(prompt: Any) -> list[dict[str, Any]]:
    """A prompt as a message list: plain text becomes one user message."""
    return [dict(m) for m in prompt] if isinstance(prompt, list) else [{"role": "user", "content": prompt}]


def row_tools(row: dict[str, Any]) -> list[dict[str, Any]] | None:
    """An RL row's own `tools` column: a list of OpenAI tool schemas, or the same as JSON text (parquet); None if
    absent or empty."""
    value = row.get("tools")
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else None
    return list(value) if value else None


def row_tool_kwargs(row: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """verl's agent-loop layout: `extra_info.tools_kwargs` (`{tool: {"create_kwargs": {...}, "execute_kwargs":
    {...}}}`, a dict or JSON text) names the tools a row offers and the keyword arguments each of its calls gets
    (verl's create and execute arguments together; null entries, as parquet fills another row's keys, left out).
    None if absent or empty."""
    extra = row.get("extra_info")
    if isinstance(extra, str):
        extra = json.loads(extra) if extra.strip() else None
    value = extra.get("tools_kwargs") if isinstance(extra, dict) else None
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else None
    if not value:
        return None
    bound: dict[str, dict[str, Any]] = {}
    for name, kwargs in value.items():
        if kwargs is None:
            continue
        parts = [kwargs.get("create_kwargs") or {}, kwargs.get("execute_kwargs") or {}]
        bound[name] = {k: v for part in parts for k, v in part.items() if v is not None}
    return bound or None


def prompt_text(prompt: Any, tokenizer, tools: list[dict[str, Any]] | None = None) -> str:
    """A prompt as text: plain strings as they are, message lists through the chat template; with `tools` (a
    multi-turn run) always a conversation through the template, the tools listed."""
    if tools:
        messages = prompt_messages(prompt)
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, tools=tools)
    if isinstance(prompt, list):
        return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    return prompt


def limit_key(stage: str) -> str:
    return "data.max_prompt_length" if stage == "rl" else f"{stage}.max_length"


def _tokens(text: str, tok) -> int:
    return len(tok(text, add_special_tokens=False)["input_ids"])


def _text(value: Any, tok) -> str:
    """Plain text as is; a message list rendered through the chat template."""
    return tok.apply_chat_template(value, tokenize=False) if isinstance(value, list) else value


def length(row: dict[str, Any], tok, stage: str, tools: list[dict[str, Any]] | None = None) -> int:
    """Tokens of a row as the stage's trainer sees it: the prompt alone for rl (with the tools listed: the row's
    own, else `tools`, rl.tools' schemas); the whole sequence with EOS for sft; prompt plus the longer response
    (tokenized apart, as TRL does) with EOS for rm, dpo and kto."""
    if stage == "rl":
        return _tokens(prompt_text(row["prompt"], tok, (row_tools(row) or tools) if tools else None), tok)
    if stage == "sft":
        if "messages" in row or isinstance(row.get("prompt"), list):
            messages = row["messages"] if "messages" in row else row["prompt"] + row["completion"]
            return len(tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
        text = row["text"] if "text" in row else row["prompt"] + row["completion"]
        return _tokens(text, tok) + 1
    prompt = row.get("prompt") or ""
    responses = [row["chosen"], row["rejected"]] if "chosen" in row else [row["completion"]]
    head = _tokens(prompt_text(prompt, tok), tok) if prompt else 0
    return head + max(_tokens(_text(r, tok), tok) for r in responses) + 1


# A row whose counted text has more than this many times (max bytes of one token x the limit) UTF-8 bytes is over
# its limit whatever the tokenizer does (a normalizer shrinking text by up to this factor included): `rlctl plan`
# does not spend minutes encoding a 20 MB prompt to learn that it is too long.
FAR_OVER = 4


def max_token_bytes(tok: FileTokenizer) -> int:
    """The most UTF-8 bytes one token of `tok` spells (its special tokens included)."""
    return max(len(t.encode("utf-8")) for t in tok.backend.get_vocab(with_added_tokens=True))


def _counted(row: dict[str, Any], stage: str) -> list[Any]:
    """The values of `row` that `length` tokenizes for `stage` (the longer reply only, for preference rows)."""
    if stage == "rl":
        return [row["prompt"]]
    if stage == "sft":
        return [row.get(k) for k in ("messages", "text", "prompt", "completion")]
    replies = [row[k] for k in ("chosen", "rejected", "completion") if k in row]
    return [row.get("prompt"), max(replies, key=lambda r: _utf8(r)) if replies else None]


def _utf8(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, dict):
        return sum(_utf8(v) for v in value.values())
    return sum(_utf8(v) for v in value) if isinstance(value, list) else 0


def far_over(row: dict[str, Any], stage: str, limit: int, per_token: int) -> int | None:
    """A lower bound of the row's tokens when it is far over `limit` (see FAR_OVER), else None."""
    least = sum(_utf8(v) for v in _counted(row, stage)) // (FAR_OVER * per_token)
    return least if least > limit else None


def bounded_length(
    row: dict[str, Any], tok: FileTokenizer, stage: str, limit: int, per_token: int, tools: list | None = None
) -> int:
    """`length`, except for a row far over `limit`: then a lower bound of it (above `limit`), not encoded."""
    return far_over(row, stage, limit, per_token) or length(row, tok, stage, tools)


def keeps_95(sizes: list[int]) -> int:
    """The shortest limit that keeps 95% of rows of these lengths."""
    ordered = sorted(sizes)
    return ordered[max(0, -(-len(ordered) * 95 // 100) - 1)]


def too_many_dropped(stage: str, over: int, total: int, limit: int, fraction: float, sizes: list[int]) -> str | None:
    """The refusal when more than `fraction` of a stage's rows would be dropped as too long, else None."""
    if total == 0 or over / total <= fraction:
        return None
    key = limit_key(stage)
    return (
        f"{over} of {total} {stage} rows ({over / total:.0%}) are longer than {key}={limit} tokens and would be "
        f"dropped, more than data.max_drop_fraction={fraction:g}. {key}={keeps_95(sizes)} keeps 95% of them; or "
        "shorten those rows, or raise data.max_drop_fraction to train on what fits."
    )
