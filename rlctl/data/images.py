"""Images of vision-language datasets, as TRL and verl keep them: an `images` column (or `image`, one) of file
paths (relative to the data file's folder), raw bytes, or `datasets` Image features (`{"bytes": ..., "path": ...}`,
verl's parquet layout). Opened with Pillow (torch-free, so the pre-flight can check every image before launch).

`canonical` turns a dataset's image rows into the one form the stages read: `images` a list (entries as given) and
every message's content a list of parts, `{"type": "image"}` or `{"type": "text", "text": ...}`, with exactly as
many image parts as images (verl's `<image>` placeholders become image parts; a row without any gets its image parts
at the start of its first user message, as TRL's `prepare_multimodal_messages` does).

The image tokens an image becomes, which the planner adds to the prompt (`ImageBudget`), are its family's
arithmetic (`rlctl.vision`)."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl import vision as vision_families
from rlctl.errors import DataRowError, UserError
from rlctl.rundir.records import typed

if TYPE_CHECKING:
    from PIL.Image import Image

    from rlctl.config.sections import VisionArch

IMAGE_COLUMNS = ("images", "image")  # TRL's `images` (a list) and `image` (one)
PLACEHOLDER = "<image>"  # verl's (and LLaVA's) image placeholder in text content
MESSAGE_COLUMNS = ("prompt", "messages", "completion", "chosen", "rejected")  # where image parts may be
PLAN_READS = 1000  # images per dataset `rlctl plan` checks and reads the size of (`rlctl train`: every one)


def entries(row: dict[str, Any]) -> list[Any]:
    """The row's image entries, in order (none for a text-only row)."""
    for column in IMAGE_COLUMNS:
        value = row.get(column)
        if value is not None:
            return list(value) if isinstance(value, list | tuple) else [value]
    return []


class UnreadableImage(DataRowError):
    """An image entry that cannot be opened (missing, not an image, truncated, a decompression bomb): the message
    names the image and why. Raised at runtime, where the pre-flight's check (`read_sizes`) did not see it."""


# Pillow's own bound (PIL.Image.MAX_IMAGE_PIXELS): an image of more pixels is refused before it is decoded, as a
# possible decompression bomb (a 110 kB PNG of 30000 x 30000 pixels decodes into 2.7 GB)
MAX_IMAGE_PIXELS = 89_478_485


def _source(entry: Any, base: Path | None) -> Any:
    """What Pillow opens for an entry: a file-like object of its bytes, or its path (relative paths from `base`)."""
    if isinstance(entry, dict):
        entry = entry.get("bytes") or entry.get("path")
    if isinstance(entry, bytes | bytearray):
        return io.BytesIO(entry)
    if not isinstance(entry, str | Path):
        raise TypeError(f"an image entry is a path, bytes or a {{'bytes', 'path'}} mapping, not {type(entry).__name__}")
    path = Path(str(entry))
    path = base / path if base is not None and not path.is_absolute() else path
    if path.exists() and not path.is_file():  # a folder, or a device or pipe that would never end or block
        raise ValueError(f"{path} is not a regular file")
    return path


def _checked(image: Image) -> Image:
    """`image` (opened, not decoded) when its size can be decoded: not a decompression bomb, not empty."""
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        raise ValueError(
            f"{width} x {height} pixels, more than {MAX_IMAGE_PIXELS:,} (Pillow's decompression-bomb limit): "
            "shrink it before training"
        )
    if not width or not height:
        raise ValueError(f"it has no pixels ({width} x {height})")
    return image


def _reason(error: BaseException) -> str:
    """Why an image failed to open, in words."""
    if isinstance(error, FileNotFoundError):
        return f"no such file: {error.filename}"
    if type(error).__name__.startswith("DecompressionBomb"):  # Pillow's error, or its warning made one
        return f"{error} Shrink it before training"
    if type(error) is ValueError:  # rlctl's own reason (_source, _checked)
        return str(error)
    return f"{type(error).__name__}: {error}"


def _opened(entry: Any, base: Path | None, decode: bool) -> tuple[Image | None, tuple[int, int]]:
    """(the RGB image, its size) of an entry, decoded (`decode`), else (None, its size) read from the header; any
    failure of Pillow's (a missing file, bytes that are no image, a truncated file, a decompression bomb) is
    raised as a ValueError saying why, chained to Pillow's own."""
    import warnings

    from PIL import Image as PILImage

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PILImage.DecompressionBombWarning)
            if isinstance(entry, PILImage.Image):
                return (_checked(entry).convert("RGB") if decode else None), entry.size
            with PILImage.open(_source(entry, base)) as image:
                size = _checked(image).size
                return (image.convert("RGB") if decode else None), size
    except MemoryError:
        raise
    except Exception as e:  # Pillow's decoders raise many kinds on damaged data (OSError, SyntaxError, struct.error)
        raise ValueError(_reason(e)) from e


def open_image(entry: Any, base: Path | None = None) -> Image:
    """One image entry as an RGB Pillow image: a path (relative paths from `base`), bytes, a `{"bytes", "path"}`
    mapping (datasets' Image feature) or a Pillow image. One that cannot be opened is an UnreadableImage naming it."""
    try:
        image, _ = _opened(entry, base, decode=True)
    except ValueError as e:
        where = f" (relative paths start from {base})" if base is not None and isinstance(entry, str) else ""
        raise UnreadableImage(f"An image of the data, {label(entry)}{where}, cannot be opened ({e}).") from e
    assert image is not None
    return image


def size_of(entry: Any, base: Path | None = None) -> tuple[int, int]:
    """(width, height) of one image entry, read from its header (Pillow opens lazily: no pixels are decoded); a
    ValueError saying why when it cannot be opened."""
    return _opened(entry, base, decode=False)[1]


def label(entry: Any) -> str:
    """An image entry in words, for messages: its path, or its kind and size in bytes."""
    if isinstance(entry, dict):
        if entry.get("path"):
            return str(entry["path"])
        entry = entry.get("bytes")
    if isinstance(entry, bytes | bytearray):
        return f"{len(entry)} bytes of image data"
    return str(entry) if entry is not None else "an empty entry"


def read_sizes(
    rows: list[dict[str, Any]],
    base: Path | None,
    where: Callable[[int], str],
    decode: bool,
    cap: int | None,
    vision: VisionArch | None = None,
) -> list[list[tuple[int, int]]]:
    """(width, height) of each row's images, row by row (rows without images: an empty list): every image decoded
    (`decode`, as training opens them) or read from its header, until `cap` images are read. One that cannot be
    opened (missing, not an image, truncated, a decompression bomb) or that the image processor of `vision`'s family
    would refuse (`rlctl.vision.image_problem`) is a UserError naming the file and row (`where`) and the image."""
    out: list[list[tuple[int, int]]] = []
    read = 0
    for i, row in enumerate(rows):
        if cap is not None and read >= cap:
            break
        sizes = []
        for k, entry in enumerate(entries(row)):
            image = f"{where(i)}: image {k + 1} of the row, {label(entry)},"
            try:
                size = _opened(entry, base, decode)[1]
            except ValueError as e:
                start = f" (relative paths start from {base})" if base and isinstance(entry, str) else ""
                raise UserError(f"{image} cannot be opened ({e}){start}. Fix or remove the row.") from None
            problem = vision_families.image_problem(*size, vision)
            if problem:
                raise UserError(f"{image} cannot be trained on: {problem}. Crop or pad it, or remove the row.")
            sizes.append(size)
        read += len(sizes)
        out.append(sizes)
    return out


# ------------------------------------------------------------------------------------------- canonical rows
def _parts(content: Any) -> list[dict[str, Any]]:
    """A message's content as a list of parts: verl's `<image>` placeholders in text become image parts."""
    if isinstance(content, list):
        return [dict(p) if isinstance(p, dict) else p for p in content]
    if not isinstance(content, str):
        return content
    out: list[dict[str, Any]] = []
    for i, piece in enumerate(content.split(PLACEHOLDER)):
        if i:
            out.append({"type": "image"})
        if piece:
            out.append({"type": "text", "text": piece})
    return out or [{"type": "text", "text": content}]  # an empty (system) message stays one, empty


def _image_parts(messages: Any) -> int:
    if not isinstance(messages, list):
        return 0
    return sum(
        1
        for m in messages
        if isinstance(m, dict) and isinstance(m.get("content"), list)
        for p in m["content"]
        if isinstance(p, dict) and p.get("type") == "image"
    )


def _with_parts(messages: Any) -> Any:
    if not isinstance(messages, list):
        return messages
    return [{**m, "content": _parts(m["content"])} if isinstance(m, dict) and "content" in m else m for m in messages]


def _lead(messages: list[Any], n: int) -> bool:
    """Put n image parts at the start of the first user message; False when there is none."""
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), list):
            m["content"] = [{"type": "image"} for _ in range(n)] + m["content"]
            return True
    return False


def _canonical_row(row: dict[str, Any], where: str) -> dict[str, Any]:
    images = entries(row)
    row = {k: v for k, v in row.items() if k not in IMAGE_COLUMNS}
    if isinstance(row.get("prompt"), str):  # a text prompt with images is a user message
        row["prompt"] = [{"role": "user", "content": row["prompt"]}]
    if "prompt" in row:  # text replies to it are assistant messages (as rlctl.data harmonises them)
        for reply in ("completion", "chosen", "rejected"):
            if isinstance(row.get(reply), str):
                row[reply] = [{"role": "assistant", "content": row[reply]}]
    for column in MESSAGE_COLUMNS:
        if column in row:
            row[column] = _with_parts(row[column])
    found = sum(_image_parts(row.get(c)) for c in MESSAGE_COLUMNS)
    if found == 0 and images:
        first = row.get("prompt") if isinstance(row.get("prompt"), list) else row.get("messages")
        if not isinstance(first, list) or not _lead(first, len(images)):
            raise UserError(
                f"{where}: the row has {len(images)} image(s) but no user message to show them in; give it a "
                "prompt or a messages list with a user message."
            )
        found = len(images)
    if found != len(images):
        raise UserError(
            f"{where}: the row has {len(images)} image(s) but {found} image placeholder(s) in its messages "
            f'(`{PLACEHOLDER}` in text, or {{"type": "image"}} parts); each image needs exactly one. Fix the '
            "placeholders or the images column of that row."
        )
    return {**row, "images": images}


def has_images(rows: list[dict[str, Any]]) -> bool:
    """Whether any row carries an image entry."""
    return any(entries(r) for r in rows)


def canonical(rows: list[dict[str, Any]], where: Callable[[int], str]) -> list[dict[str, Any]]:
    """The rows of a dataset with images in the one form the stages read (see the module docstring); every row of
    it, text-only rows too (an empty `images`), so each column holds one kind of value. A row whose placeholders
    and images do not pair up is a UserError naming its file and row."""
    return [_canonical_row(r, where(i)) for i, r in enumerate(rows)]


# ------------------------------------------------------------------------------------------ image tokens
def pixel_bounds(vision: VisionArch | None, min_pixels: int | None, max_pixels: int | None) -> tuple[int, int]:
    """The resize bounds the images of `vision`'s family are counted with: data.min_pixels / data.max_pixels (the
    model's own where the plan read them), else the family's defaults (rlctl.vision's for a fixed-size family, where
    they do not apply)."""
    family = vision_families.of_tower(vision) if vision is not None else None
    low, high = (family and family.pixel_bounds) or vision_families.DEFAULT_PIXEL_BOUNDS
    return min_pixels or low, max_pixels or high


@dataclass(frozen=True)
class ImageBudget:
    """The image tokens one dataset's rows add to their prompts, as the planner counts them: the most per row, the
    most per image, the most images in a row, the processor's pixel bounds, and how many image sizes were read
    (`read` of `seen`); not `measured`: the data's images were not read (a Hub dataset), the worst case is planned,
    one image per row at max_pixels. `fixed_size`: the side every image is resized to (a fixed-size tower; 0: the
    pixel bounds apply)."""

    tokens_per_row: int
    tokens_per_image: int
    images_per_row: int
    min_pixels: int
    max_pixels: int
    read: int = 0
    seen: int = 0
    measured: bool = True
    fixed_size: int = 0

    def describe(self) -> str:
        """The budget in one line: tokens per row and per image, the pixel bounds and where the numbers came from."""
        source = f"sizes of {self.read} of {self.seen} images read"
        if self.read < self.seen:
            source += " (every image is checked when training starts)"
        if not self.measured:
            largest = "" if self.fixed_size else " at max_pixels"
            source = f"worst case: one image per row{largest} (the data's images are not read before training)"
        elif not self.seen:
            source = "the data holds no images"
        if self.fixed_size:
            size = f"every image resized to {self.fixed_size} x {self.fixed_size} px"
        else:
            size = f"pixels {self.min_pixels:,}..{self.max_pixels:,}"
        return (
            f"up to {self.tokens_per_row:,} image tokens per row ({self.images_per_row} image(s), up to "
            f"{self.tokens_per_image:,} tokens each); {size}; {source}"
        )

    def to_json(self) -> dict[str, Any]:
        """Its fields (`fixed_size` only for a fixed-size tower's)."""
        return {k: v for k, v in asdict(self).items() if k != "fixed_size" or v}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ImageBudget:
        """KeyError naming a key it lacks, WrongKind one of another kind (`rlctl.rundir.typed`)."""
        return typed(cls, data)


def worst_case(vision: VisionArch, min_pixels: int, max_pixels: int) -> ImageBudget:
    """The budget when the data's image sizes are not known: one image per row, as many tokens as its family makes
    of one image at most (within max_pixels, or at its fixed size)."""
    family = vision_families.of_tower(vision)
    most = family.most_image_tokens(vision, min_pixels, max_pixels)
    return ImageBudget(most, most, 1, min_pixels, max_pixels, measured=False, fixed_size=family.fixed_size(vision))


def budget(
    sizes: list[list[tuple[int, int]]], vision: VisionArch, min_pixels: int, max_pixels: int, seen: int
) -> ImageBudget:
    """The budget of rows whose images have these (width, height) sizes (one list per row read), of `seen` images."""
    family = vision_families.of_tower(vision)
    per_row = [[family.image_tokens(vision, w, h, min_pixels, max_pixels) for w, h in row] for row in sizes]
    return ImageBudget(
        max((sum(r) for r in per_row), default=0),
        max((t for r in per_row for t in r), default=0),
        max((len(r) for r in sizes), default=0),
        min_pixels,
        max_pixels,
        sum(len(r) for r in sizes),
        seen,
        fixed_size=family.fixed_size(vision),
    )
