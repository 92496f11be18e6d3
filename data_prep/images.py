"""Images of a dataset row as slime's ``--multimodal-keys`` reads them: ``data:`` URIs.

A hub dataset hands images as ``datasets`` Image structs (``{"bytes", "path"}``) or decoded PIL images; slime's
loader silently DROPS an image given as such a struct (it takes only strings or rich ``{"type": "image", ...}``
dicts), so every image is written as a self-contained data URI of its original bytes (a PIL image as PNG):
slime's loader, qwen-vl-utils, SGLang and slime-strands all accept it, and the file needs no image folder
beside it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
from typing import Any

__all__ = ["ImageRowError", "image_digest", "image_uri"]

_MAGIC = ((b"\x89PNG\r\n\x1a\n", "png"), (b"\xff\xd8\xff", "jpeg"), (b"GIF8", "gif"), (b"RIFF", "webp"))


class ImageRowError(ValueError):
    """An image of a row that cannot be used (the row is dropped, counted by reason)."""


def image_uri(item: Any) -> str:
    """The ``data:image/...;base64,...`` URI of a row's image (an Image struct, a PIL image, bytes, a data URI,
    raw base64 or an absolute path)."""
    if isinstance(item, str) and item.startswith("data:image/"):
        return item
    return _uri(_bytes_of(item))


def image_digest(uri: str) -> str:
    """A short digest of an image (rows with the same text and different figures are different problems)."""
    return hashlib.sha256(uri.encode()).hexdigest()[:16]


def _bytes_of(item: Any) -> bytes:
    if isinstance(item, dict):
        if item.get("bytes"):
            return bytes(item["bytes"])
        if item.get("path"):
            return _bytes_of(str(item["path"]))
        raise ImageRowError("an image struct with neither bytes nor a path")
    if isinstance(item, (bytes, bytearray)):
        return bytes(item)
    if hasattr(item, "save"):  # a PIL image: datasets decodes Image features to these
        out = io.BytesIO()
        item.save(out, format="PNG")
        return out.getvalue()
    if isinstance(
        item, str
    ):  # a data URI's payload, or base64 (a JPEG's starts "/9j/"), unless a file is there
        payload = item.partition(",")[2] if item.startswith("data:") else item
        if payload is item and os.path.isabs(item) and os.path.isfile(item):
            try:
                with open(item, "rb") as handle:
                    return handle.read()
            except OSError as exc:
                raise ImageRowError(f"cannot read the image file {item!r}: {exc}") from exc
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ImageRowError(
                f"an image string is neither a data URI, base64 nor an absolute path to a file: {item[:40]!r}"
            ) from exc
    raise ImageRowError(f"an image is a {type(item).__name__}")


def _uri(data: bytes) -> str:
    kind = next((name for magic, name in _MAGIC if data.startswith(magic)), None)
    if kind is None:
        raise ImageRowError("an image is not a PNG, JPEG, GIF or WebP file")
    return f"data:image/{kind};base64,{base64.b64encode(data).decode('ascii')}"
