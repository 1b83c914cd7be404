"""Streaming multipart/form-data for uploads: the ``file`` part flows chunk by chunk into a sink, the small
text fields are collected. Nothing is spooled: the sink decides where the bytes go.

A form is taken only whole: it must end with its closing boundary (``--BOUNDARY--``), hold exactly one ``file``
part and each text field once. Otherwise ``stream_form`` raises ``InvalidRequest``, possibly after the sink got
bytes: its caller discards them (a body cut short would otherwise be stored as a partial file, and a second
``file`` part appended to the first)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from ..errors import InvalidRequest

__all__ = ["stream_form"]

_FIELD_LIMIT = 64 * 1024  # text fields are tiny; anything bigger is not a form we take


class _Form:
    def __init__(self, on_file_data: Callable[[bytes], None]) -> None:
        self.on_file_data = on_file_data
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
            self.on_file_data(data[start:end])
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
                      on_file_data: Callable[[bytes], None]) -> tuple[dict[str, str], str | None]:
    """Parse the form; returns its text fields and the file part's filename (None when there was no file)."""
    kind, params = parse_options_header(content_type or "")
    boundary = params.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise InvalidRequest("upload as multipart/form-data with fields 'file' and 'purpose'")
    form = _Form(on_file_data)
    callbacks = {name: getattr(form, name) for name in (
        "on_part_begin", "on_header_field", "on_header_value", "on_header_end", "on_headers_finished",
        "on_part_data", "on_part_end", "on_end")}
    parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
    try:
        async for chunk in body:
            parser.write(chunk)
        parser.finalize()
    except MultipartParseError as exc:
        raise InvalidRequest(f"malformed multipart body: {exc}") from exc
    if not form.complete:  # python-multipart's finalize() does not check this itself
        raise InvalidRequest("the multipart body ended before its closing boundary (--boundary--): the upload "
                             "is incomplete")
    return form.fields, form.filename
