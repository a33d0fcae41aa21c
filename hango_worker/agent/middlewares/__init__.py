"""The middlewares of the chain, one module each (docs/system-architecture.md).

Each module holds one middleware: its class, the state it keeps in `State`, and
what it needs to build. Belongs here: code that wraps a model call or a tool call.
May import: `agent` (its interfaces, state, files, limits), `tool`, `provider`,
`telemetry`, `vocab`. Never imports `run`, `store`, `config`, `cli` or `console`
(import-linter contracts in `.importlinter`, `make lint`).
"""
