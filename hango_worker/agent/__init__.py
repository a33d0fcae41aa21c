"""The agent layer: the loop, the middleware chain and the ports it talks through.

Belongs here: what one agent does in a run, independent of where the run is stored
(`loop.py`, `chain.py`, the middlewares, `state.py`, the ports in `ports.py`).
May import: `provider`, `tool`, `telemetry`, `vocab`. Never imports `store`, `run`,
`config` or any program (`service`, `cli`, `console`): it never touches Postgres,
it talks to the outside world through `ports.RunIO`. The rules are import-linter
contracts (`.importlinter`, checked by `make lint`).
"""
