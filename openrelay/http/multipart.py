"""Streaming multipart/form-data for uploads: the ``file`` part flows into an async sink, in pieces of about
``SINK_BYTES``, the small text fields are collected. Nothing is spooled: the sink decides where the bytes go (the
upload's sink writes them to the blob store from a thread, so a slow object store never holds the event loop).

A form is taken only whole: it must end with its closing boundary (``--BOUNDARY--``), hold exactly one ``file``
part and each text field once. Otherwise ``stream_form`` raises ``InvalidRequest``, possibly after the sink got
bytes: its caller discards them (a body cut short would otherwise be stored as a partial file, and a second
``file`` part appended to the first)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from ..errors import InvalidRequest

__all__ = ["stream_form", "SINK_BYTES"]

_FIELD_LIMIT = 64 * 1024  # text fields are tiny; anything bigger is not a form we take
SINK_BYTES = 1 << 20  # the file part's bytes go to the sink in pieces of about this size (and at the end)


class _Form:
    def __init__(self) -> None:
        self.file_data: list[bytes] = []  # the file part's bytes the sink has not had yet
        self.file_pending = 0
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self._field = b""
        self._value = b""
        self._headers: dict[bytes, bytes] = {}
        self._name = ""
        self._is_file = False
        self._buffer = bytearray()
        self.complete = False  # the closing boundary was read

    def on_part_begin(self) -> None:
        self._headers, self._name, self._is_file, self._buffer = {}, "", False, bytearray()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def on_header_end(self) -> None:
        self._headers[self._field.lower()] = self._value
        self._field = self._value = b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._name = options.get(b"name", b"").decode("utf-8", "replace")
        if self._name == "file":
            if self.filename is not None:
                raise InvalidRequest("the form has more than one 'file' part; upload one file per request",
                                     param="file")
            self._is_file = True
            self.filename = options.get(b"filename", b"upload.jsonl").decode("utf-8", "replace")

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._is_file:
            self.file_data.append(data[start:end])
            self.file_pending += end - start
            return
        self._buffer += data[start:end]
        if len(self._buffer) > _FIELD_LIMIT:
            raise InvalidRequest(f"form field {self._name!r} is too large")

    def on_part_end(self) -> None:
        if not self._is_file and self._name:
            if self._name in self.fields:
                raise InvalidRequest(f"the form has more than one {self._name!r} field", param=self._name)
            self.fields[self._name] = self._buffer.decode("utf-8", "replace")

    def on_end(self) -> None:
        self.complete = True


async def stream_form(content_type: str | None, body: AsyncIterator[bytes],
                      sink: Callable[[bytes], Awaitable[None]]) -> tuple[dict[str, str], str | None]:
    """Parse the form, giving the file part's bytes to ``sink`` in order; returns its text fields and the file
    part's filename (None when there was no file)."""
    kind, params = parse_options_header(content_type or "")
    boundary = params.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise InvalidRequest("upload as multipart/form-data with fields 'file' and 'purpose'")
    form = _Form()

    async def drain() -> None:
        data = b"".join(form.file_data)
        form.file_data.clear()
        form.file_pending = 0
        await sink(data)

    callbacks = {name: getattr(form, name) for name in (
        "on_part_begin", "on_header_field", "on_header_value", "on_header_end", "on_headers_finished",
        "on_part_data", "on_part_end", "on_end")}
    parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
    try:
        async for chunk in body:
            parser.write(chunk)
            if form.file_pending >= SINK_BYTES:
                await drain()
        parser.finalize()
    except MultipartParseError as exc:
        raise InvalidRequest(f"malformed multipart body: {exc}") from exc
    if not form.complete:  # python-multipart's finalize() does not check this itself
        raise InvalidRequest("the multipart body ended before its closing boundary (--boundary--): the upload "
                             "is incomplete")
    if form.file_pending:
        await drain()
    return form.fields, form.filename
