"""FakeAnthropic: the server (lifecycle, control, serving one request)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

from hango_worker.provider.files import FILES_BETA
from hango_worker.provider.scripted import ScriptedTurn
from hango_worker.testing.fake_anthropic.cache import (
    DEFAULT_MIN_CACHEABLE_TOKENS,
    CacheUsage,
    PromptCache,
)
from hango_worker.testing.fake_anthropic.files import FILES_PATH, FakeFiles
from hango_worker.testing.fake_anthropic.media import check_media
from hango_worker.testing.fake_anthropic.platforms import (
    EVENT_STREAM_TYPE,
    as_messages_request,
    bedrock_frame,
    match_route,
)
from hango_worker.testing.fake_anthropic.ratelimit import FakeRateLimit
from hango_worker.testing.fake_anthropic.roundtrip import SentLog, check_round_trip
from hango_worker.testing.fake_anthropic.script import (
    DEFAULT_MESSAGES,
    TYPE_BY_STATUS,
    FakeTurn,
    Fault,
    RecordedRequest,
    as_entry,
    parse_fake_script,
)
from hango_worker.testing.fake_anthropic.sse import (
    GARBAGE,
    Frame,
    build_answer,
    error_body,
    http_chunk,
    sse_frame,
    stream_frames,
)
from hango_worker.testing.fake_anthropic.structured import check_forced_tool, check_output_format
from hango_worker.testing.fake_anthropic.tokens import count_tokens
from hango_worker.testing.fake_anthropic.validate import ApiError, validate_request
from hango_worker.testing.fake_anthropic.wire import (
    HttpRequest,
    json_response,
    read_request,
    response_head,
)

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
DEFAULT_CONTEXT_WINDOW = 200_000  # tokens, like the current Claude models

Handler = Callable[[RecordedRequest], Any]


class FakeAnthropic:
    """The fake Messages API server. See the `hango_worker.testing.fake_anthropic` docstring."""

    def __init__(
        self,
        script: Sequence[FakeTurn | Fault | ScriptedTurn | dict[str, Any]] | None = None,
        *,
        handler: Handler | None = None,
        api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        chunk_delay_s: float = 0.0,
        min_cacheable_tokens: int = DEFAULT_MIN_CACHEABLE_TOKENS,
        context_window: int = DEFAULT_CONTEXT_WINDOW,
        context_windows: dict[str, int] | None = None,
        rate_limit: FakeRateLimit | None = None,
    ) -> None:
        if (script is None) == (handler is None):
            raise ValueError("give FakeAnthropic either a script or a handler")
        self.turns = parse_fake_script(list(script)) if script is not None else []
        self.handler = handler
        self.api_key = api_key
        self.host = host
        self.chunk_delay_s = chunk_delay_s
        self.cache = PromptCache(min_cacheable_tokens)
        self.context_window = context_window
        self.context_windows = dict(context_windows or {})
        self.requests: list[RecordedRequest] = []
        self.rate_limit = rate_limit  # None: no limit (ratelimit.py)
        self.sent = SentLog()  # assistant content returned (roundtrip.py)
        self.files = FakeFiles()  # the Files API's uploads (files.py)
        self._hold: threading.Event | None = None  # hold_after_first_delta
        self._port = port
        self._injected: list[Fault] = []
        self._attempts: dict[int, int] = {}
        self._ids = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._conns: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        """What to give the SDK as `base_url` / ANTHROPIC_BASE_URL (no `/v1`)."""
        return f"http://{self.host}:{self._port}"

    async def astart(self) -> FakeAnthropic:
        """Serve on the running event loop."""
        self._server = await asyncio.start_server(self._on_connection, self.host, self._port)
        self._port = self._server.sockets[0].getsockname()[1]
        return self

    async def aclose(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._conns.values()):
            writer.transport.abort()  # ends the connection task (no cancel: see 3.11 streams)
        await asyncio.gather(*self._conns, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    def start(self) -> FakeAnthropic:
        """Serve from a thread with its own event loop (works beside any loop)."""
        loop = asyncio.new_event_loop()
        started: list[BaseException | None] = []
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.astart())
                started.append(None)
            except BaseException as e:
                started.append(e)
            ready.set()
            if started[0] is None:
                loop.run_forever()
                loop.run_until_complete(self.aclose())
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="fake-anthropic", daemon=True)
        self._thread.start()
        ready.wait()
        if started[0] is not None:
            raise started[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop = self._thread = None

    def __enter__(self) -> FakeAnthropic:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> FakeAnthropic:
        return await self.astart()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- control ---------------------------------------------------------------------------

    def inject(self, fault: Fault | dict[str, Any] | str | int, **options: Any) -> None:
        """Serve `fault` to the next request(s), before anything the script says."""
        f = fault if isinstance(fault, Fault) else _as_fault(fault, options)
        self._injected.extend([f] * f.times)

    def load(self, script: Sequence[FakeTurn | Fault | ScriptedTurn | dict[str, Any]]) -> None:
        """Play another script from now on (attempt counters start again)."""
        self.turns = parse_fake_script(list(script))
        self._attempts.clear()

    def window_of(self, model: Any) -> int:
        """The context window (tokens) the fake enforces for `model`."""
        return self.context_windows.get(str(model), self.context_window)

    def clear(self) -> None:
        """Forget the recorded requests."""
        self.requests.clear()

    def hold_after_first_delta(self) -> threading.Event:
        """The next stream stops after its first content delta until the returned event
        is set (by the test, e.g. from the client's text callback; at most 30 s): a
        stream that is provably still going while the client reads it."""
        self._hold = threading.Event()
        return self._hold

    # -- serving ---------------------------------------------------------------------------

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns[task] = writer
        try:
            while True:
                req = await read_request(reader)
                if req is None or not await self._serve(req, writer):
                    break
                if req.headers.get("connection", "").lower() == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            self._conns.pop(task, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, req: HttpRequest, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection must be closed."""
        rid = f"req_fake_{next(self._ids):06d}"
        try:
            body = json.loads(req.body) if req.body else None
        except ValueError:
            body = None
        rec = RecordedRequest(req.method, req.path, dict(req.headers), body)
        self.requests.append(rec)
        path = req.path.split("?", 1)[0].rstrip("/")
        route = match_route(req.method, path)
        if route is not None:  # Vertex AI, Bedrock (platforms.py)
            try:
                as_messages_request(route, rec)
            except ApiError as e:
                return await self._send_error(writer, e, rid)
            path = MESSAGES_PATH
        if path == FILES_PATH or path.startswith(FILES_PATH + "/"):
            return await self._serve_files(req, rec, path, writer, rid)
        if req.method != "POST" or path not in (MESSAGES_PATH, COUNT_TOKENS_PATH):
            err = ApiError(404, "not_found_error", f"Not found: {req.method} {req.path}")
            return await self._send_error(writer, err, rid)
        try:
            self._authenticate(rec)
            validate_request(body, rec.headers, counting=path == COUNT_TOKENS_PATH)
            check_output_format(body)
            check_forced_tool(body)
            check_media(rec.body["messages"], self._files_for(rec))
            check_round_trip(rec.body, self.sent)
            rec.input_tokens = count_tokens(rec.body)
            if path == COUNT_TOKENS_PATH:
                out = {"input_tokens": rec.input_tokens}
                writer.write(json_response(200, out, {"request-id": rid}))
                await writer.drain()
                return True
            self._check_window(rec.body, rec.input_tokens)
            if self.rate_limit is not None:
                self._check_rate(rec)
            outcome = await self._pick(rec)
        except ApiError as e:
            return await self._send_error(writer, e, rid)
        if isinstance(outcome, Fault):
            return await self._fault(writer, outcome, rec, rid)
        turn, index = outcome
        if turn.delay_s:
            await asyncio.sleep(turn.delay_s)
        answer = build_answer(turn, index, rec.body, self.cache.account(rec.body))
        answer.message["id"] = f"msg_fake_{rid[9:]}"
        self.sent.add(answer.message["content"])
        if not rec.body.get("stream"):
            writer.write(json_response(200, answer.message, {"request-id": rid}))
            await writer.drain()
            return True
        await self._stream(writer, stream_frames(answer), rid, answer.chunk_delay_s, rec=rec)
        return True

    async def _serve_files(
        self,
        req: HttpRequest,
        rec: RecordedRequest,
        path: str,
        writer: asyncio.StreamWriter,
        rid: str,
    ) -> bool:
        try:
            self._authenticate(rec)
            out = self.files.serve(req.method, path, rec.headers, req.body)
        except ApiError as e:
            return await self._send_error(writer, e, rid)
        writer.write(json_response(200, out, {"request-id": rid}))
        await writer.drain()
        return True

    def _files_for(self, rec: RecordedRequest) -> FakeFiles | None:
        """The uploaded files, when the request has the Files API beta (file sources
        need it)."""
        betas = rec.headers.get("anthropic-beta", "")
        return self.files if FILES_BETA in [b.strip() for b in betas.split(",")] else None

    def _check_window(self, body: dict[str, Any], tokens: int) -> None:
        window = self.window_of(body.get("model"))
        if tokens > window:
            raise ApiError(
                400,
                "invalid_request_error",
                f"prompt is too long: {tokens} tokens > {window} maximum",
            )

    def _check_rate(self, rec: RecordedRequest) -> None:
        assert self.rate_limit is not None
        retry = self.rate_limit.take(rec.input_tokens or 0)
        if retry is not None:
            headers = {**self.rate_limit.headers(), "retry-after": _fmt_seconds(round(retry, 3))}
            raise ApiError(
                429,
                "rate_limit_error",
                "This request would exceed the rate limit for your organization of "
                f"{self.rate_limit.requests_per_minute} requests per minute.",
                headers,
            )

    def _authenticate(self, rec: RecordedRequest) -> None:
        if rec.platform is not None:  # its credentials were checked on its route
            return
        key = rec.api_key
        if not key:
            raise ApiError(401, "authentication_error", "x-api-key header is required")
        if self.api_key is not None and key != self.api_key:
            raise ApiError(401, "authentication_error", "invalid x-api-key")

    async def _pick(self, rec: RecordedRequest) -> Fault | tuple[FakeTurn, int]:
        if self._injected:
            return self._injected.pop(0)
        index = rec.turn_index
        if self.handler is not None:
            try:
                out = self.handler(rec)
                if inspect.isawaitable(out):
                    out = await out
                entry = as_entry(out)
            except Exception as e:
                raise ApiError(500, "api_error", f"fake-anthropic handler failed: {e!r}") from e
            return entry if isinstance(entry, Fault) else (entry, index)
        if index >= len(self.turns):
            raise ApiError(
                400,
                "invalid_request_error",
                f"fake-anthropic: the script has no turn {index + 1} (it has {len(self.turns)})",
            )
        turn = self.turns[index]
        attempt = self._attempts.get(index, 0)
        self._attempts[index] = attempt + 1
        faults = turn.all_faults()
        return faults[attempt] if attempt < len(faults) else (turn, index)

    async def _send_error(self, writer: asyncio.StreamWriter, e: ApiError, rid: str) -> bool:
        headers = {"request-id": rid, **e.headers}
        writer.write(json_response(e.status, error_body(e.type, e.message, rid), headers))
        await writer.drain()
        return True

    async def _fault(
        self, writer: asyncio.StreamWriter, fault: Fault, rec: RecordedRequest, rid: str
    ) -> bool:
        if fault.fault == "drop":
            return False
        status = fault.status
        if status is None:  # a mid-stream fault
            await self._midstream(writer, fault, rec, rid)
            return fault.fault not in ("midstream_drop", "midstream_garbage")
        etype = fault.type or TYPE_BY_STATUS.get(
            status, "api_error" if status >= 500 else "invalid_request_error"
        )
        message = fault.message or DEFAULT_MESSAGES.get(
            status, f"fake-anthropic: injected {status}"
        )
        if fault.request_id is not None:
            rid = fault.request_id.replace("{api_key}", rec.api_key or "")
        headers = {"request-id": rid}
        if status == 429 or fault.retry_after is not None:
            headers["retry-after"] = _fmt_seconds(
                1.0 if fault.retry_after is None else fault.retry_after
            )
        if status == 529:
            headers["x-should-retry"] = "true"
        writer.write(json_response(status, error_body(etype, message, rid), headers))
        await writer.drain()
        return True

    async def _midstream(
        self, writer: asyncio.StreamWriter, fault: Fault, rec: RecordedRequest, rid: str
    ) -> None:
        """Start a real stream (the next turn's), then fail after its first content delta."""
        index = rec.turn_index
        turn = self.turns[index] if index < len(self.turns) else FakeTurn(text="Partial answer")
        answer = build_answer(
            turn, index, rec.body if isinstance(rec.body, dict) else {}, CacheUsage(0)
        )
        answer.message["id"] = f"msg_fake_{rid[9:]}"
        frames = stream_frames(answer)
        first_delta = next((i for i, f in enumerate(frames) if f[0] == "content_block_delta"), 1)
        frames = frames[: first_delta + 1]
        if fault.fault == "midstream_overloaded":
            err = error_body(fault.type or "overloaded_error", fault.message or "Overloaded", rid)
            frames.append(("error", err))
        elif fault.fault == "midstream_garbage":
            frames.append(("content_block_delta", {GARBAGE: fault.message or "{not json"}))
        await self._stream(
            writer, frames, rid, self.chunk_delay_s, finish=fault.fault != "midstream_drop", rec=rec
        )

    async def _stream(
        self,
        writer: asyncio.StreamWriter,
        frames: list[Frame],
        rid: str,
        delay_s: float,
        *,
        finish: bool = True,
        rec: RecordedRequest | None = None,
    ) -> None:
        bedrock = rec is not None and rec.platform == "bedrock"
        encode = bedrock_frame if bedrock else sse_frame
        headers = {
            "content-type": EVENT_STREAM_TYPE if bedrock else "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            "transfer-encoding": "chunked",
            "request-id": rid,
        }
        if self.rate_limit is not None:
            headers.update(self.rate_limit.headers())
        writer.write(response_head(200, headers))
        delay = delay_s or self.chunk_delay_s
        hold, self._hold = self._hold, None
        if hold is not None:
            first = next((i for i, f in enumerate(frames) if f[0] == "content_block_delta"), 0)
            writer.write(http_chunk(b"".join(encode(f) for f in frames[: first + 1])))
            await writer.drain()
            await asyncio.get_running_loop().run_in_executor(None, hold.wait, 30.0)
            frames = frames[first + 1 :]
        if delay:
            for frame in frames:
                await asyncio.sleep(delay)
                writer.write(http_chunk(encode(frame)))
                await writer.drain()
        else:
            writer.write(http_chunk(b"".join(encode(f) for f in frames)))
        if finish:
            writer.write(b"0\r\n\r\n")
        await writer.drain()


def _fmt_seconds(s: float) -> str:
    return str(int(s)) if float(s).is_integer() else repr(float(s))


def _as_fault(fault: dict[str, Any] | str | int, options: dict[str, Any]) -> Fault:
    if isinstance(fault, dict):
        return Fault.model_validate({**fault, **options})
    return Fault.model_validate({"fault": str(fault), **options})
