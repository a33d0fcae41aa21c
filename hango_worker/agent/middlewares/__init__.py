"""The middlewares of the chain, one module each (docs/system-architecture.md).

Each module holds one middleware: its class, the state it keeps in `State`, its
config section (a pydantic model with exactly the `agents.config` keys it reads,
inherited by agent/spec.py:AgentConfig) and `build(ctx: StackContext)`, which
makes it for one run attempt or returns None when it is idle for the agent; its
slot is one line of agent/stack.py:ORDER. Belongs here: code that wraps a model
call or a tool call. May import: `agent/` (its interfaces, state, files, limits;
never agent/spec.py or agent/stack.py, which import the middlewares), `tool/`,
`provider/` and `telemetry/`; never `run/`, `store/`, `cli/` or `console/` (the
layering is checked by import-linter, `make lint`).
"""
