"""The HTTP API under `/v1/` (docs/http-api.md), served by the console's process.

Bearer tokens only (`Authorization: Bearer <token>`, the console's own
`HANGO_CONSOLE_TOKENS`): `read` for the reads and the event stream, `act` for the
writes, each token scoped to its tenants exactly as in the console (another tenant's
run is a 404, like no run at all). No cookie and no proxy header: a browser never adds
an Authorization header to a cross-site request, so no CSRF token is needed or checked.
Errors are `application/problem+json` (RFC 9457). Every rule is the one the CLI, the
Python client and the SQL API apply (console/api_models.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

import asyncpg
from pydantic import BaseModel, ValidationError
from pydantic_core import to_jsonable_python
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route

from hango_worker.agent.spec import check_run_params
from hango_worker.console import api_models as m
from hango_worker.console.api_openapi import document
from hango_worker.console.auth import Authenticator, Refused, Who, tenant_of
from hango_worker.console.live import TextHub
from hango_worker.console.pages import STATUSES
from hango_worker.store import console_queries, decisions, fork, repo, run_stream
from hango_worker.store.json_limits import loads_json
from hango_worker.telemetry.metrics import CONSOLE_DECISIONS, CONSOLE_REQUESTS
from hango_worker.vocab import Decision

M = TypeVar("M", bound=BaseModel)

log = logging.getLogger(__name__)

MAX_BODY = 1024 * 1024  # bytes of a JSON request body
PING_S = 15.0  # seconds between the event stream's keep-alive comments
PROBLEM = "application/problem+json"
HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
DECISIONS = {"approve": Decision.APPROVE, "reject": Decision.REJECT, "answer": Decision.ANSWER}
TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    409: "Conflict",
    413: "Content Too Large",
    405: "Method Not Allowed",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
}

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

ApiHandler = Callable[[Request, Who], Awaitable[Response]]


def problem(status: int, detail: str) -> Response:
    body = m.Problem(title=TITLES.get(status, "Error"), status=status, detail=detail)
    headers = dict(HEADERS)
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="hango-worker"'
    return JSONResponse(body.model_dump(), status, headers=headers, media_type=PROBLEM)


def ok(model: BaseModel, status: int = 200) -> Response:
    return JSONResponse(model.model_dump(mode="json"), status, headers=HEADERS)


def jsonable(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = to_jsonable_python(row)
    return out


async def read_json(request: Request, model: type[M]) -> M:
    """The request's JSON body (at most MAX_BODY bytes) as `model`; Refused otherwise."""
    kind = request.headers.get("content-type", "application/json").split(";")[0].strip()
    if kind != "application/json":
        raise Refused(415, "send JSON (Content-Type: application/json)")
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise Refused(413, f"the body is larger than {MAX_BODY} bytes")
    try:
        value = loads_json(raw.decode() or "{}", "the body")
    except (UnicodeDecodeError, ValueError) as e:
        raise Refused(400, str(e) if isinstance(e, ValueError) else "not UTF-8") from None
    return model.model_validate(value)


def _invalid(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(body)"
    return f"{loc}: {err['msg']}"


def api_route(
    auth: Authenticator, route: str, fn: ApiHandler, *, act: bool
) -> Callable[[Request], Awaitable[Response]]:
    """`fn` for a bearer-token caller with the role the route needs; every refusal a
    problem document with its status code."""

    async def handler(request: Request) -> Response:
        try:
            if not request.headers.get("authorization"):
                raise Refused(401, "send Authorization: Bearer <token>")
            who = auth.identify(request)
            if act and not who.can_act:
                raise Refused(403, "this token is read-only; this needs the act role")
            response = await fn(request, who)
        except Refused as e:
            response = problem(e.status, e.reason)
        except ValidationError as e:
            response = problem(422, _invalid(e))
        except repo.NotFound as e:
            response = problem(404, str(e))
        except repo.Conflict as e:
            response = problem(409, str(e))
        except ValueError as e:  # the rules of the enqueue, a decision, a fork
            response = problem(400, str(e))
        CONSOLE_REQUESTS.labels(route, str(response.status_code)).inc()
        return response

    return handler


class Api:
    def __init__(self, pool: asyncpg.Pool, hub: TextHub) -> None:
        self.pool = pool
        self.hub = hub

    async def tenant_run(self, request: Request, who: Who) -> tuple[str, str]:
        run_id = request.path_params["run_id"]
        return await console_queries.tenant_of_run(self.pool, who.tenants, run_id), run_id

    async def enqueue(self, request: Request, who: Who) -> Response:
        req = await read_json(request, m.EnqueueRequest)
        tenant = tenant_of(who, req.tenant)
        params = None
        if req.params is not None:
            params = check_run_params(
                await repo.agent_config(self.pool, tenant, req.agent), req.params
            )
        r = await repo.enqueue_run(
            self.pool,
            tenant_id=tenant,
            agent=req.agent,
            input_text=req.input,
            session_id=req.session_id,
            idempotency_key=request.headers.get("idempotency-key"),
            limits=req.limits.model_dump(mode="json", exclude_unset=True) if req.limits else None,
            memory_key=req.memory_key,
            priority=req.priority,
            params=params,
            content=req.content,
        )
        body = m.Enqueued(run_id=r.run_id, session_id=r.session_id, created=r.created)
        return ok(body, 201 if r.created else 200)

    async def get(self, request: Request, who: Who) -> Response:
        tenant, run_id = await self.tenant_run(request, who)
        run = await repo.get_run(self.pool, tenant, run_id)
        run.pop("state_json", None)  # the worker's private state
        return ok(m.Run.model_validate(jsonable(run)))

    async def runs(self, request: Request, who: Who) -> Response:
        q = request.query_params
        tenant = tenant_of(who, q.get("tenant"))
        status = q.get("status") or None
        if status is not None and status not in STATUSES:
            raise Refused(400, f"status must be one of {', '.join(STATUSES)}")
        agent_id = None
        if q.get("agent"):
            agents = await console_queries.agents(self.pool, tenant)
            agent_id = next((a["id"] for a in agents if q["agent"] in (a["name"], a["id"])), None)
            if agent_id is None:
                raise Refused(404, f"no agent {q['agent']!r} in this tenant")
        limit = _limit(q.get("limit"))
        rows, nxt = await console_queries.runs_page(
            self.pool, tenant, status=status, agent_id=agent_id, after=q.get("after"), size=limit
        )
        runs = [m.RunSummary.model_validate(jsonable(r)) for r in rows]
        return ok(m.RunPage(runs=runs, next=nxt))

    async def cancel(self, request: Request, who: Who) -> Response:
        tenant, run_id = await self.tenant_run(request, who)
        status = await repo.request_cancel(self.pool, tenant, run_id)
        return ok(m.Cancelled(run_id=run_id, status=status))

    async def decide(self, action: str, request: Request, who: Who) -> Response:
        tenant, run_id = await self.tenant_run(request, who)
        body = await read_json(request, m.BODIES[action])
        decision = DECISIONS[action]
        kw: dict[str, Any] = {"call_id": getattr(body, "call_id", None)}
        if isinstance(body, m.Approve):
            kw["edited"] = body.input
        else:
            kw["text"] = body.reason if isinstance(body, m.Reject) else getattr(body, "text", None)
        decided = await decisions.decide(
            self.pool, tenant, run_id, decision, decided_by=f"api:{who.name}", **kw
        )
        CONSOLE_DECISIONS.labels(str(decision)).inc()
        log.info("api decision", extra={"run_id": run_id, "decision": str(decision)})
        return ok(m.Decided.model_validate(decided))

    async def fork(self, request: Request, who: Who) -> Response:
        tenant, run_id = await self.tenant_run(request, who)
        body = await read_json(request, m.Fork)
        forked = await fork.fork(self.pool, tenant, run_id, body.at_turn, body.input)
        return ok(m.Forked.model_validate(forked), 201)

    async def events(self, request: Request, who: Who) -> Response:
        tenant, run_id = await self.tenant_run(request, who)
        last = request.headers.get("last-event-id") or request.query_params.get("last_event_id")
        run_stream.parse_event_id(last)  # a bad id: 400 before the stream starts
        headers = {**HEADERS, "X-Accel-Buffering": "no"}
        return EventSourceResponse(self._sse(tenant, run_id, last), ping=PING_S, headers=headers)

    async def _sse(
        self, tenant: str, run_id: str, last: str | None
    ) -> AsyncIterator[ServerSentEvent]:
        hub = self.hub
        q = await hub.subscribe(run_id)
        try:
            events = run_stream.events(
                self.pool, tenant, run_id, q, last, stopping=lambda: hub.closing
            )
            async for e in events:
                data = json.dumps(e.data, ensure_ascii=False, default=_default)
                yield ServerSentEvent(data=data, event=e.event, id=e.id)
        finally:
            hub.unsubscribe(run_id, q)


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _limit(raw: str | None) -> int:
    if not raw:
        return console_queries.PAGE_SIZE
    try:
        n = int(raw)
    except ValueError:
        raise Refused(400, f"limit must be an integer, got {raw!r}") from None
    if not 1 <= n <= 200:
        raise Refused(400, f"limit must be 1 to 200, got {n}")
    return n


def routes(pool: asyncpg.Pool, auth: Authenticator, hub: TextHub) -> list[Route]:
    api = Api(pool, hub)
    doc = document()

    async def openapi(request: Request) -> Response:
        return JSONResponse(doc, headers={"Cache-Control": "max-age=300"})

    def r(path: str, fn: ApiHandler, method: str, act: bool = False) -> Route:
        return Route(path, api_route(auth, path, fn, act=act), methods=[method])

    def decide(action: str) -> ApiHandler:
        async def fn(request: Request, who: Who) -> Response:
            return await api.decide(action, request, who)

        return fn

    known = [
        Route("/v1/openapi.json", openapi),
        r("/v1/runs", api.enqueue, "POST", act=True),
        r("/v1/runs", api.runs, "GET"),
        r("/v1/runs/{run_id}", api.get, "GET"),
        r("/v1/runs/{run_id}/events", api.events, "GET"),
        r("/v1/runs/{run_id}/cancel", api.cancel, "POST", act=True),
        r("/v1/runs/{run_id}/fork", api.fork, "POST", act=True),
        *(r(f"/v1/runs/{{run_id}}/{a}", decide(a), "POST", act=True) for a in DECISIONS),
    ]

    async def elsewhere(request: Request) -> Response:
        """Any other `/v1/` request: 405 for a known path, else 404, as problems."""
        if any(route.matches(request.scope)[0] == Match.PARTIAL for route in known):
            return problem(405, f"{request.method} is not allowed on {request.url.path}")
        return problem(404, f"no endpoint {request.url.path} (see /v1/openapi.json)")

    return [*known, Route("/v1/{rest:path}", elsewhere, methods=list(METHODS))]
