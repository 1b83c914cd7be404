"""``kind = "rapidocr"``: OCR as a chat model, run in-process by RapidOCR on the engine's own threads: the text of
the base64 data URLs of the last user message (it fetches nothing), line by line. The rules: docs/builtin-models.md,
"openrelay/rapidocr" and "Threads and memory"."""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import re
import uuid
from typing import Any

from ..clock import now
from ..errors import error_envelope
from .base import EngineReply
from .params import INT, wrong_type
from .threads import EngineThreads

__all__ = ["IMAGE_TOKENS", "MAX_IMAGE_PIXELS", "RapidOcrEngine", "text_tokens"]

IMAGE_TOKENS = 85  # what OpenAI bills a low-detail image, whatever its size
# An A4 page scanned at 600 dpi is 35 megapixels. Decoded as RGB, 40 are 120 MB, and OCR holds a few copies.
MAX_IMAGE_PIXELS = 40_000_000
# What comes before the data: the data starts after the first comma (the parameters hold none).
_DATA_URL_HEAD = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?);base64,")


class _BadRequest(Exception):
    """The record's own fault: its message becomes the 400 reply."""


def text_tokens(text: str) -> int:
    return (len(text) + 3) // 4


def _load() -> Any:
    import cv2  # imported on first use: the API process need not pay for them
    from rapidocr import RapidOCR

    cv2.setNumThreads(1)  # OpenCV's own pool would spread each request over every core, as onnxruntime's would
    return RapidOCR(params={"Global.log_level": "error", "EngineConfig.onnxruntime.intra_op_num_threads": 1,
                            "EngineConfig.onnxruntime.inter_op_num_threads": 1})


class RapidOcrEngine:
    def __init__(self, config: dict[str, Any], *, concurrency: int, model_name: str) -> None:
        self.model_name = model_name
        self.max_image_pixels = int(config.get("max_image_pixels", MAX_IMAGE_PIXELS))
        self._running = asyncio.Semaphore(max(1, concurrency))
        self._threads = EngineThreads(concurrency, model_name)
        self._ocr: Any = None
        self._loading = asyncio.Lock()

    async def _loaded(self) -> Any:
        async with self._loading:
            if self._ocr is None:
                self._ocr = await self._threads.run(_load)
        return self._ocr

    async def call(self, endpoint: str, body: dict[str, Any]) -> EngineReply:
        if endpoint != "/v1/chat/completions":
            return EngineReply(400, error_envelope(f"{self.model_name} serves only /v1/chat/completions"))
        problem = wrong_type(body, {"max_completion_tokens": INT, "max_tokens": INT})
        if problem is not None:
            return EngineReply(400, error_envelope(problem))
        try:
            images, prompt_text = _request(body)
        except _BadRequest as exc:
            return EngineReply(400, error_envelope(str(exc)))
        try:
            ocr = await self._loaded()
            async with self._running:
                texts = await self._threads.run(_read_all, ocr, images, self.max_image_pixels)
        except _BadRequest as exc:
            return EngineReply(400, error_envelope(str(exc)))
        except Exception as exc:  # the engine's boundary: whatever breaks in the OCR library is a 500 of this record
            return EngineReply(500, error_envelope(f"{self.model_name} failed: {exc.__class__.__name__}: {exc}",
                                                   type_="server_error"))
        answer, finish = "\n\n".join(texts), "stop"
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        if isinstance(limit, int) and text_tokens(answer) > limit:
            answer, finish = answer[:4 * limit], "length"
        prompt, completion = IMAGE_TOKENS * len(images) + text_tokens(prompt_text), text_tokens(answer)
        return EngineReply(200, {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": now(),
            "model": self.model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "logprobs": None,
                         "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        })

    async def healthy(self) -> bool:
        return True

    async def aclose(self) -> None:
        self._ocr = None
        self._threads.close()


def _request(body: dict[str, Any]) -> tuple[list[str], str]:
    """The image data URLs of the last user message, in order, checked up to their data, and the text of every
    message. Cheap whatever the images' size: decoding them is left to the engine's threads."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise _BadRequest("messages must be a non-empty array of message objects")
    texts: list[str] = []
    for message in messages:
        content = message.get("content")
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        texts += [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
    last_user = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    content = last_user.get("content") if last_user else None
    parts = [p for p in content if isinstance(p, dict) and p.get("type") == "image_url"] \
        if isinstance(content, list) else []
    if not parts:
        raise _BadRequest("the last user message carries no image_url part; this OCR model reads images sent as "
                          "base64 data URLs (data:image/png;base64,...)")
    return [_data_url(part, n) for n, part in enumerate(parts, 1)], "".join(texts)


def _data_url(part: dict[str, Any], n: int) -> str:
    image_url = part.get("image_url")
    url = image_url.get("url") if isinstance(image_url, dict) else None
    if not isinstance(url, str):
        raise _BadRequest(f"image {n}: image_url must be an object with a url")
    comma = url.find(",")
    if comma < 0 or _DATA_URL_HEAD.fullmatch(url, 0, comma + 1) is None:
        shown = url[:60] + ("..." if len(url) > 60 else "")
        raise _BadRequest(f"image {n}: only base64 data URLs (data:image/png;base64,...) are read; this model "
                          f"fetches nothing, so {shown!r} cannot be used")
    return url


def _read_all(ocr: Any, urls: list[str], max_pixels: int) -> list[str]:
    """The text of each image. Every image is opened, and its size checked, before any is read."""
    images = [_open(url, n, max_pixels) for n, url in enumerate(urls, 1)]
    return [_read(ocr, image, n) for n, image in enumerate(images, 1)]


def _open(url: str, n: int, max_pixels: int) -> Any:
    """The image of a data URL checked by ``_data_url``, opened: its header read, its pixels not yet decoded."""
    from PIL import Image, UnidentifiedImageError

    try:
        data = base64.b64decode(url[url.index(",") + 1:], validate=True)
    except binascii.Error as exc:
        raise _BadRequest(f"image {n}: the data URL is not valid base64: {exc}") from exc
    try:
        image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError as exc:
        raise _BadRequest(f"image {n} is not in an image format this model reads (PNG, JPEG, ...)") from exc
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise _BadRequest(f"image {n} cannot be decoded: {exc}") from exc
    width, height = image.size
    if width * height > max_pixels:
        raise _BadRequest(f"image {n} is {width}x{height} pixels ({width * height / 1e6:.1f} megapixels); this model "
                          f"reads images of at most {max_pixels / 1e6:g} megapixels")
    return image


def _read(ocr: Any, image: Any, n: int) -> str:
    """The text of one opened image, line by line."""
    from PIL import Image, ImageOps

    try:
        image = ImageOps.exif_transpose(image)
        # Keep transparency (RapidOCR picks a contrasting background for it); everything else as plain RGB.
        image = image.convert("RGBA" if image.has_transparency_data else "RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise _BadRequest(f"image {n} cannot be decoded: {exc}") from exc
    result = ocr(image)
    if not result.txts:
        return ""
    return "\n".join(_lines(result.boxes, result.txts))


def _lines(boxes: Any, texts: tuple[str, ...]) -> list[str]:
    """Group the detected text boxes into lines, top to bottom, each read left to right.

    Two boxes are on one line when their vertical centres are closer than half the smaller box's height; box
    height is measured along its left and right edges, so a slightly rotated line is not taken for a tall one.
    """
    pieces = []  # (vertical centre, height, left edge, text); a box's corners run clockwise from its top left
    for box, text in zip(boxes, texts, strict=True):
        ys = [float(point[1]) for point in box]
        height = ((ys[3] - ys[0]) + (ys[2] - ys[1])) / 2
        pieces.append((sum(ys) / 4, max(height, 1.0), float(min(point[0] for point in box)), text))
    pieces.sort()
    lines: list[list[tuple[float, float, float, str]]] = []
    for piece in pieces:
        if lines:
            centre = sum(p[0] for p in lines[-1]) / len(lines[-1])
            if abs(piece[0] - centre) < min(piece[1], min(p[1] for p in lines[-1])) / 2:
                lines[-1].append(piece)
                continue
        lines.append([piece])
    return [" ".join(p[3] for p in sorted(line, key=lambda p: p[2])) for line in lines]
