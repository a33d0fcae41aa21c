"""The console's Starlette application: routes, refusals, security headers."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import asyncpg
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from hango_worker.config import Settings
from hango_worker.console import api, images, live, pages, runpage
from hango_worker.console.auth import COOKIE, Authenticator, Refused, Who, same_origin, tenant_of
from hango_worker.console.html import LIVE_JS, STYLE, Html, page, render
from hango_worker.store import console_queries, decisions, repo
from hango_worker.store.json_limits import loads_json
from hango_worker.telemetry.metrics import CONSOLE_DECISIONS, CONSOLE_REQUESTS
from hango_worker.vocab import Decision

log = logging.getLogger(__name__)

MAX_FORM = 256 * 1024  # bytes of a form body (an answer, edited arguments)
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # no-referrer would make form posts send Origin: null
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
ACTIONS = {"approve": Decision.APPROVE, "reject": Decision.REJECT, "answer": Decision.ANSWER}

Handler = Callable[[Request], Awaitable[Response]]


class Console:
    def __init__(self, settings: Settings, pool: asyncpg.Pool, dsn: str) -> None:
        self.settings = settings
        self.pool = pool
        self.auth = Authenticator(settings)
        self.hub = live.TextHub(dsn)

    def _who_line(self, who: Who) -> Html:
        return render(
            '{name} ({role}) <form class="inline" method="post" action="/logout">'
            '<button id="signout">Sign out</button></form>',
            name=who.name,
            role=who.role,
        )

    def html(self, title: str, body: Html, who: Who | None = None, status: int = 200) -> Response:
        who_line = self._who_line(who) if who is not None else Html("")
        return HTMLResponse(page(title, body, who_line), status, headers=HEADERS)

    async def runs(self, request: Request, who: Who) -> Response:
        q = request.query_params
        tenant = tenant_of(who, q.get("tenant"))
        agents = await console_queries.agents(self.pool, tenant)
        agent_id = next((a["id"] for a in agents if a["name"] == q.get("agent")), None)
        if q.get("agent") and agent_id is None:
            raise Refused(404, f"no agent {q.get('agent')!r} in this tenant")
        status = q.get("status") or None
        if status is not None and status not in pages.STATUSES:
            raise Refused(400, f"status must be one of {', '.join(pages.STATUSES)}")
        try:
            rows, nxt = await console_queries.runs_page(
                self.pool, tenant, status=status, agent_id=agent_id, after=q.get("after")
            )
        except ValueError as e:
            raise Refused(400, str(e)) from None
        filters = {"tenant": tenant, "status": status, "agent": q.get("agent") or None}
        names = await console_queries.tenant_names(self.pool, who.tenants)
        tenants = {t: names.get(t, t) for t in who.tenants}
        body = pages.runs_list(
            rows, filters=filters, agents=agents, tenants=tenants, next_cursor=nxt
        )
        return self.html("Runs", body, who)

    async def waiting(self, request: Request, who: Who) -> Response:
        tenant = tenant_of(who, request.query_params.get("tenant"))
        rows = await console_queries.waiting(self.pool, tenant)
        return self.html("Waiting", pages.waiting_list(rows), who)

    async def run(self, request: Request, who: Who, notice: str | None = None) -> Response:
        run_id = request.path_params["run_id"]
        tenant = await console_queries.tenant_of_run(self.pool, who.tenants, run_id)
        run = await repo.run_details(self.pool, tenant, run_id)
        agent = await console_queries.agent_name(self.pool, run["agent_id"])
        body = runpage.run_page(
            run,
            agent=agent or "?",
            attempts=await console_queries.attempts(self.pool, run_id),
            files=await repo.run_files(self.pool, tenant, run_id),
            csrf=self.auth.csrf(who) if who.can_act else None,
            trace_url=self.settings.console_trace_url,
            notice=notice,
        )
        return self.html(f"Run {run_id}", body, who)

    async def image(self, request: Request, who: Who) -> Response:
        """An image block's bytes, for the run page's thumbnails (console/images.py)."""
        run_id = request.path_params["run_id"]
        tenant = await console_queries.tenant_of_run(self.pool, who.tenants, run_id)
        seq, where = request.path_params["seq"], request.path_params["where"]
        found = await images.image(self.pool, tenant, run_id, seq, where)
        if found is None:
            raise Refused(404, f"no image at {seq}/{where} in run {run_id}")
        data, media_type = found
        return Response(data, media_type=media_type, headers=images.HEADERS)

    async def live(self, request: Request, who: Who) -> Response:
        run_id = request.path_params["run_id"]
        tenant = await console_queries.tenant_of_run(self.pool, who.tenants, run_id)
        events = live.follow(self.pool, self.hub, tenant, run_id)
        headers = {**HEADERS, "X-Accel-Buffering": "no"}
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)

    async def act(self, request: Request, who: Who) -> Response:
        form = await read_form(request)
        self.auth.check_action(request, who, form.get("csrf"))
        run_id, action = request.path_params["run_id"], request.path_params["action"]
        decision = ACTIONS.get(action)
        if decision is None:
            raise Refused(404, f"no action {action!r}: approve, reject or answer")
        tenant = await console_queries.tenant_of_run(self.pool, who.tenants, run_id)
        kw: dict[str, Any] = {}
        if decision == Decision.APPROVE:
            kw["edited"] = edited_input(form.get("input"))
        else:
            kw["text"] = form.get("reason" if decision == Decision.REJECT else "text")
        await decisions.decide(
            self.pool,
            tenant,
            run_id,
            decision,
            call_id=form.get("call") or None,
            decided_by=f"console:{who.name}",
            **kw,
        )
        CONSOLE_DECISIONS.labels(str(decision)).inc()
        log.info("console decision", extra={"run_id": run_id, "decision": str(decision)})
        return RedirectResponse(f"/runs/{run_id}", 303, headers=HEADERS)


def edited_input(raw: str | None) -> Any:
    if raw is None or not raw.strip():
        return None
    try:
        value = loads_json(raw, "the edited arguments")
    except ValueError as e:
        raise Refused(400, str(e)) from None
    if not isinstance(value, dict):
        raise Refused(400, "the edited arguments must be a JSON object (the call's arguments)")
    return value


async def read_form(request: Request) -> dict[str, str]:
    """A urlencoded form body (at most MAX_FORM bytes): each field's first value."""
    if request.headers.get("content-type", "").split(";")[0].strip() not in (
        "application/x-www-form-urlencoded",
        "",
    ):
        raise Refused(415, "send a form (application/x-www-form-urlencoded)")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            raise Refused(413, f"the form is larger than {MAX_FORM} bytes")
    try:
        fields = parse_qs(body.decode(), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise Refused(400, "the form is not UTF-8") from None
    return {k: v[0] for k, v in fields.items()}


def _refusal(console: Console, e: Refused, who: Who | None) -> Response:
    if e.status == 401:
        body = runpage.login(e.reason)
        headers = {**HEADERS, "WWW-Authenticate": 'Bearer realm="hango-worker console"'}
        return HTMLResponse(page("Sign in", body), 401, headers=headers)
    body = render('<h1>{status}</h1><p class="err" id="refused">{reason}</p>', status=e.status,
                  reason=e.reason)  # fmt: skip
    return console.html(str(e.status), body, who, e.status)


def guarded(
    console: Console, route: str, fn: Callable[[Request, Who], Awaitable[Response]]
) -> Handler:
    """`fn` for an authenticated caller; every refusal a page with its status code."""

    async def handler(request: Request) -> Response:
        who: Who | None = None
        try:
            who = console.auth.identify(request)
            response = await fn(request, who)
        except Refused as e:
            response = _refusal(console, e, who)
        except repo.NotFound as e:
            response = _refusal(console, Refused(404, str(e)), who)
        except repo.Conflict as e:
            response = _refusal(console, Refused(409, str(e)), who)
        except ValueError as e:  # a decision's text missing or too long, …
            response = _refusal(console, Refused(400, str(e)), who)
        CONSOLE_REQUESTS.labels(route, str(response.status_code)).inc()
        return response

    return handler


async def _login(console: Console, request: Request) -> Response:
    if request.method == "GET":
        return HTMLResponse(page("Sign in", runpage.login()), headers=HEADERS)
    try:
        same_origin(request)
        token = (await read_form(request)).get("token", "").strip()
    except Refused as e:
        return _refusal(console, e, None)
    if not console.auth.valid_token(token):
        return HTMLResponse(page("Sign in", runpage.login("unknown token")), 401, headers=HEADERS)
    response = RedirectResponse("/runs", 303, headers=HEADERS)
    secure = request.url.scheme == "https"
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", secure=secure, path="/")
    return response


async def _logout(request: Request) -> Response:
    try:
        same_origin(request)
    except Refused as e:
        return PlainTextResponse(e.reason, e.status, headers=HEADERS)
    response = RedirectResponse("/login", 303, headers=HEADERS)
    response.delete_cookie(COOKIE, path="/")
    return response


def _static(body: str, media_type: str) -> Handler:
    async def handler(request: Request) -> Response:
        return Response(body, media_type=media_type, headers={"Cache-Control": "max-age=300"})

    return handler


async def _metrics(request: Request) -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


def routes(console: Console) -> list[Route]:
    async def home(request: Request, who: Who) -> Response:
        return RedirectResponse("/runs", 303, headers=HEADERS)

    async def login(request: Request) -> Response:
        return await _login(console, request)

    g = console
    return [
        Route("/", guarded(g, "/", home)),
        Route("/runs", guarded(g, "/runs", g.runs)),
        Route("/waiting", guarded(g, "/waiting", g.waiting)),
        Route("/runs/{run_id}", guarded(g, "/runs/{id}", g.run)),
        Route("/runs/{run_id}/live", guarded(g, "/runs/{id}/live", g.live)),
        Route(
            "/runs/{run_id}/images/{seq:int}/{where}",
            guarded(g, "/runs/{id}/images", g.image),
        ),
        Route(
            "/runs/{run_id}/{action}",
            guarded(g, "/runs/{id}/action", g.act),
            methods=["POST"],
        ),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", _logout, methods=["POST"]),
        Route("/static/console.css", _static(STYLE, "text/css")),
        Route("/static/console.js", _static(LIVE_JS, "text/javascript")),
        Route("/healthz", _static("ok\n", "text/plain")),
        Route("/metrics", _metrics),
        *api.routes(console.pool, console.auth, console.hub),
    ]


def build_app(settings: Settings, pool: asyncpg.Pool, dsn: str) -> tuple[Starlette, Console]:
    console = Console(settings, pool, dsn)
    return Starlette(routes=routes(console)), console
