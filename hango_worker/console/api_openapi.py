"""The HTTP API's OpenAPI document, generated from its pydantic models
(console/api_models.py): served at `/v1/openapi.json` and checked in as
`docs/http-api.json` (tests/test_http_api.py checks the two are the same)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from hango_worker.console import api_models as m

REF = "#/components/schemas/{model}"


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


def _json(model: type[BaseModel], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(model)}}}


def _errors(*codes: int) -> dict[str, Any]:
    problem = {"content": {"application/problem+json": {"schema": _ref(m.Problem)}}}
    words = {
        400: "a rule refused the request",
        401: "no or an unknown bearer token",
        403: "the token is read-only",
        404: "no such run (or another tenant's)",
        409: "the run is not in a state for this",
        413: "the body is too large",
        415: "the body is not JSON",
        422: "the body does not fit its schema",
    }
    return {str(c): {"description": words[c], **problem} for c in codes}


def _op(summary: str, ok: dict[str, dict[str, Any]], *errs: int, **more: Any) -> dict[str, Any]:
    return {"summary": summary, "responses": {**ok, **_errors(401, 404, *errs)}, **more}


def _body(model: type[BaseModel]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": _ref(model)}}}


def _param(name: str, where: str, description: str, required: bool = False) -> dict[str, Any]:
    p = {"name": name, "in": where, "description": description, "schema": {"type": "string"}}
    return {**p, "required": True} if where == "path" else {**p, "required": required}


RUN_ID = _param("run_id", "path", "the run's id (a UUID)")
WRITE = (400, 403, 409, 413, 415, 422)


def _decision(model: type[BaseModel], summary: str) -> dict[str, Any]:
    ok = {"200": _json(m.Decided, "recorded; the run is queued again")}
    return {"post": _op(summary, ok, *WRITE, parameters=[RUN_ID], requestBody=_body(model))}


def _events() -> dict[str, Any]:
    stream = {
        "description": "Server-Sent Events: durable events (`id: <seq>`), text deltas "
        "(`event: text_delta`, `id: <seq>.<n>`), keep-alive comments, and `event: end` "
        "with the run's final status (docs/http-api.md)",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
    last = _param("Last-Event-ID", "header", "resume after this event id")
    query = _param("last_event_id", "query", "the same, for clients that cannot set headers")
    summary = "The run's events, resumable"
    return {"get": _op(summary, {"200": stream}, 400, parameters=[RUN_ID, last, query])}


def _paths() -> dict[str, Any]:
    key = _param(
        "Idempotency-Key", "header", "a second request with this key returns the first run"
    )
    created = {
        "201": _json(m.Enqueued, "queued"),
        "200": _json(m.Enqueued, "queued before, same key"),
    }
    filters = [
        _param("status", "query", "only runs in this status"),
        _param("tenant", "query", "the tenant id (default: the token's first)"),
        _param("agent", "query", "only this agent's runs (name or id)"),
        _param("after", "query", "the cursor `next` of the previous page"),
        _param("limit", "query", "runs per page, 1 to 200 (default 50)"),
    ]
    return {
        "/v1/runs": {
            "post": _op(
                "Queue a run",
                created,
                *WRITE,
                parameters=[key],
                requestBody=_body(m.EnqueueRequest),
            ),
            "get": _op(
                "The tenant's runs, newest first",
                {"200": _json(m.RunPage, "a page")},
                400,
                parameters=filters,
            ),
        },
        "/v1/runs/{run_id}": {
            "get": _op("A run", {"200": _json(m.Run, "the run")}, parameters=[RUN_ID]),
        },
        "/v1/runs/{run_id}/events": _events(),
        "/v1/runs/{run_id}/cancel": {
            "post": _op(
                "Cancel a run",
                {"200": _json(m.Cancelled, "requested")},
                403,
                409,
                parameters=[RUN_ID],
            ),
        },
        "/v1/runs/{run_id}/approve": _decision(m.Approve, "Approve the call a run waits on"),
        "/v1/runs/{run_id}/reject": _decision(m.Reject, "Reject the call a run waits on"),
        "/v1/runs/{run_id}/answer": _decision(m.Answer, "Answer the question a run asks"),
        "/v1/runs/{run_id}/fork": {
            "post": _op(
                "Fork a run at a turn",
                {"201": _json(m.Forked, "the new queued run")},
                *WRITE,
                parameters=[RUN_ID],
                requestBody=_body(m.Fork),
            ),
        },
    }


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of `/v1/`."""
    _, schemas = models_json_schema([(model, "validation") for model in m.MODELS], ref_template=REF)
    return {
        "openapi": "3.1.0",
        "info": {"title": "hango-worker HTTP API", "version": "1"},
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": _paths(),
    }


if __name__ == "__main__":  # python -m hango_worker.console.api_openapi > docs/http-api.json
    import json

    print(json.dumps(document(), indent=2, ensure_ascii=False))
