"""The HTTP API's request and response bodies (console/api.py), as pydantic models.

They describe the shape only; the rules are the ones every other way in uses: a run's
limits are `agent.limits.RunOverrides` (the model the CLI, the Python client and the
SQL API's callers validate with), its params are checked by `agent.spec.check_run_params`,
and the priority, keys, content blocks and everything else by `store/repo.py` and the
producer SQL API (`hango_enqueue_run`) — one copy of each rule. The OpenAPI document
(`docs/http-api.json`) is generated from these models.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hango_worker.agent.limits import RunOverrides


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnqueueRequest(Body):
    """`POST /v1/runs`. The `Idempotency-Key` header is the enqueue's idempotency key."""

    agent: str = Field(description="the agent's name or id, in the token's tenant")
    input: str = Field(default="", description="the user's message")
    content: list[dict[str, Any]] | None = Field(
        default=None, description="content blocks beside or instead of `input`"
    )
    session_id: str | None = Field(default=None, description="continue this session")
    memory_key: str | None = Field(default=None, description="whose memory the run uses")
    priority: int = Field(default=0, description="0 to 1000; higher is claimed first")
    limits: RunOverrides | None = Field(default=None, description="this run's own limits")
    params: dict[str, Any] | None = Field(
        default=None, description="Messages API parameters laid over the agent's config"
    )
    tenant: str | None = Field(
        default=None, description="the tenant id (default: the token's first tenant)"
    )


class Enqueued(BaseModel):
    run_id: str
    session_id: str
    created: bool = Field(description="false: an earlier request with this key made the run")


class Run(BaseModel):
    """A run's record (`GET /v1/runs/{id}`)."""

    model_config = ConfigDict(extra="allow")

    id: str
    tenant_id: str
    session_id: str
    agent_id: str
    status: str
    attempt: int
    input: Any = None
    output: Any = None
    error: Any = None
    usage: Any = None
    waiting_for: Any = None
    created_at: str | None = None
    finished_at: str | None = None


class RunSummary(BaseModel):
    """One row of `GET /v1/runs`."""

    id: str
    agent: str
    status: str
    attempt: int
    created_at: str
    finished_at: str | None = None
    error_type: str | None = None
    cost_usd: str | None = None
    waiting_reason: str | None = None


class RunPage(BaseModel):
    runs: list[RunSummary]
    next: str | None = Field(description="the `after` cursor of the next page, or null")


class Approve(Body):
    call_id: str | None = Field(default=None, description="the call the run waits on")
    input: dict[str, Any] | None = Field(default=None, description="run it with these arguments")


class Reject(Body):
    reason: str
    call_id: str | None = None


class Answer(Body):
    text: str
    call_id: str | None = None


class Fork(Body):
    at_turn: int = Field(description="fork from the end of this turn (0: before the first)")
    input: str | None = Field(default=None, description="the user's next message")


class Decided(BaseModel):
    run_id: str
    tool_use_id: str
    decision: str


class Cancelled(BaseModel):
    run_id: str
    status: str = Field(description="the run's status after the request")


class Forked(BaseModel):
    model_config = ConfigDict(extra="allow")

    run_id: str
    session_id: str


class Problem(BaseModel):
    """An error (RFC 9457), sent as `application/problem+json`."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str


BODIES: dict[str, type[Body]] = {
    "approve": Approve,
    "reject": Reject,
    "answer": Answer,
    "fork": Fork,
}
MODELS: tuple[type[BaseModel], ...] = (
    EnqueueRequest,
    Enqueued,
    Run,
    RunSummary,
    RunPage,
    Approve,
    Reject,
    Answer,
    Fork,
    Decided,
    Cancelled,
    Forked,
    Problem,
)
