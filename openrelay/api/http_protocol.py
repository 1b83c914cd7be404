"""The HTTP/1.1 connection: uvicorn's httptools protocol, with limits on reading a request (431 for a head over
``max_header_bytes``, 408 for a head or body not read in time, 400 for malformed HTTP), each answered in the OpenAI
envelope. It leans on uvicorn's internals, so uvicorn is pinned: docs/design.md, "The HTTP connection's limits"."""

from __future__ import annotations

import logging
from asyncio import TimerHandle, Transport
from typing import Any

import httptools
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from ..config import HttpLimits
from ..errors import HeadersTooLarge, InvalidRequest, OpenRelayError, RequestTimeout
from ..http.request_ids import id_headers, request_id_of
from ..ids import new_request_id
from .errors import error_answer

__all__ = ["limited_http_protocol", "LimitedHttpToolsProtocol"]

_log = logging.getLogger("openrelay.api")

# Where a connection is in reading its current request.
_AWAITING = 0  # connected, no byte of a first request yet: the header clock runs from the connection's start
_HEAD = 1  # a request has begun: its request line and headers are coming in
_BODY = 2  # its headers are in, its body is coming
_IDLE = 3  # the request is read (it may still be answered); the wait for the next one is uvicorn's keep-alive


class _Refused(Exception):
    """Raised in a parser callback to stop the parser; ``data_received`` then answers ``_refusal``."""


class _FlowNotingResumes(FlowControl):
    """uvicorn's flow control, noting when reading resumes: a client's silence counts from then, not from
    before the pause (the app may hold a body's first 64 KiB for long before it reads on)."""

    def __init__(self, transport: Transport, protocol: LimitedHttpToolsProtocol) -> None:
        super().__init__(transport)
        self._protocol = protocol

    def resume_reading(self) -> None:
        if self.read_paused:
            self._protocol._last_read = self._protocol.loop.time()
        super().resume_reading()


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    max_header_bytes = HttpLimits.max_header_bytes  # limited_http_protocol sets this process's three
    header_timeout = HttpLimits.header_timeout_seconds
    body_idle_timeout = HttpLimits.body_idle_timeout_seconds

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = _AWAITING
        self._head_since = 0.0  # when the current request (or the connection, while _AWAITING) began
        self._last_read = 0.0  # when the last bytes came in
        self._read_size = 0  # of the read being parsed
        self._head_read = 0  # bytes read since the current request began (see the parser callbacks)
        self._head_slack = 0
        self._refusal: OpenRelayError | None = None
        self._deadline_timer: TimerHandle | None = None

    # -- connection --------------------------------------------------------------------------------------------

    def connection_made(self, transport: Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = _FlowNotingResumes(transport, self)
        self._head_since = self._last_read = self.loop.time()
        self._check_by(self._head_since + self.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        super().connection_lost(exc)

    def handle_websocket_upgrade(self) -> None:
        if self._deadline_timer is not None:  # the connection is another protocol's from here on
            self._deadline_timer.cancel()
            self._deadline_timer = None
        super().handle_websocket_upgrade()

    def data_received(self, data: bytes) -> None:
        # uvicorn's own, but a refusal of ours (or malformed HTTP) is answered as JSON.
        self._unset_keepalive_if_required()
        self._last_read = self.loop.time()
        self._read_size = len(data)
        if self._phase == _HEAD:
            self._head_read += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._answer_and_close(self._refusal or InvalidRequest("The request is not valid HTTP/1.1.",
                                                                   code="invalid_http_request"))
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._phase == _HEAD and self._head_read > self.max_header_bytes + self._head_slack:
            # The parser holds an incomplete header whole: refuse before it holds more than the limit and a read.
            self._answer_and_close(self._headers_too_large())

    # -- parser callbacks --------------------------------------------------------------------------------------
    # The head's size is counted in reads, not per header (a callback per header would cost every request):
    # ``_head_read`` is every read since the one the request began in, that one whole (part of it may be the
    # previous request's: ``_head_slack``). Only a head that may be over the limit is measured exactly.

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = _HEAD
        self._head_since = self._last_read
        self._head_read = self._head_slack = self._read_size
        self._check_by(self._head_since + self.header_timeout)

    def on_headers_complete(self) -> None:
        if self._head_read > self.max_header_bytes and self._head_bytes() > self.max_header_bytes:
            self._refusal = self._headers_too_large()
            raise _Refused  # before uvicorn starts the app on it
        super().on_headers_complete()
        self._phase = _BODY
        self._check_by(self._last_read + self.body_idle_timeout)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._phase = _IDLE

    def _head_bytes(self) -> int:
        """The request line and headers as parsed (the method, version and separators close enough)."""
        return len(self.url) + 14 + sum(len(name) + len(value) + 4 for name, value in self.headers)

    def _headers_too_large(self) -> HeadersTooLarge:
        return HeadersTooLarge(f"The request line and headers are over the {self.max_header_bytes}-byte limit.")

    # -- time ----------------------------------------------------------------------------------------------------

    def _check_by(self, deadline: float) -> None:
        """Make sure the timer fires no later than ``deadline`` (early is fine: it re-arms itself)."""
        timer = self._deadline_timer
        if timer is not None:
            if timer.when() <= deadline:
                return
            timer.cancel()
        self._deadline_timer = self.loop.call_at(deadline, self._on_deadline)

    def _on_deadline(self) -> None:
        self._deadline_timer = None
        if self.transport.is_closing() or self._phase == _IDLE:
            return  # a request that is read arms nothing: the next one's first byte does
        now = self.loop.time()
        if self._phase == _BODY:
            if self.flow.read_paused or (self.cycle is not None and self.cycle.waiting_for_100_continue):
                self._last_read = now  # the app is not taking the body yet: the wait is ours, not the client's
            deadline = self._last_read + self.body_idle_timeout
        else:
            deadline = self._head_since + self.header_timeout
        if now < deadline:
            self._deadline_timer = self.loop.call_at(deadline, self._on_deadline)
        elif self._phase == _AWAITING:
            self.transport.close()  # not a byte sent: there is no request to answer
        else:
            self._answer_and_close(RequestTimeout(
                "The request's headers were not received in time." if self._phase == _HEAD
                else "The request's body stopped arriving."))

    # -- answers -------------------------------------------------------------------------------------------------

    def _answer_and_close(self, error: OpenRelayError) -> None:
        """Answer ``error`` where no other answer is under way on this connection, then close it. A request the
        app is handling is told the client is gone, so nothing it sends afterwards reaches the socket."""
        cycle = self.cycle
        if self._phase == _BODY:
            may_answer = cycle is not None and not cycle.response_started
        else:  # the request the app may hold is an earlier one: answer only once its answer is complete
            may_answer = cycle is None or cycle.response_complete
        # The request the app took has its id already; a head refused before the app saw it gets one.
        request_id = (cycle is not None and self._phase == _BODY and request_id_of(cycle.scope)) or new_request_id()
        _log.info("refused a request from %s: %s %s (request_id=%s)", self.client and self.client[0], error.status,
                  error.code, request_id)
        if may_answer and not self.transport.is_closing():
            status, headers, body = error_answer(error, close=True)
            head = [STATUS_LINE[status]]
            for name, value in [*self.server_state.default_headers, *headers, *id_headers(request_id)]:
                head += [name, b": ", value, b"\r\n"]
            head += [b"\r\n", body]
            self.transport.write(b"".join(head))
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        self._phase = _IDLE
        self.transport.close()


def limited_http_protocol(*, max_header_bytes: int, header_timeout: float,
                          body_idle_timeout: float) -> type[LimitedHttpToolsProtocol]:
    """The protocol class for ``uvicorn.run(http=...)``, with this process's limits (uvicorn makes the instances)."""
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), {
        "max_header_bytes": max_header_bytes, "header_timeout": header_timeout,
        "body_idle_timeout": body_idle_timeout})
