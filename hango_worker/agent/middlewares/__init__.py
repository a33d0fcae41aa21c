"""The middlewares of the chain, one module each (docs/system-architecture.md).

Each module holds one middleware: its class, the state it keeps in `State`, its
config section (a pydantic model with exactly the `agents.config` keys it reads,
inherited by agent/spec.py:AgentConfig) and `build(ctx: StackContext)`, which
makes it for one run attempt or returns None when it is idle for the agent; its
slot is one line of agent/stack.py:ORDER. Belongs here: code that wraps a model
call or a tool call; never agent/spec.py or agent/stack.py, which import the
middlewares.
May import: `agent` (its interfaces, state, files, limits), `tool`, `provider`,
`telemetry`, `vocab`. Never imports `run`, `store`, `config`, `cli` or `console`
(import-linter contracts in `.importlinter`, `make lint`).
"""
