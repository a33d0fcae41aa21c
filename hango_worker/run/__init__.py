"""The worker: claim, lease, heartbeat, run, checkpoint, shut down.

Belongs here: the Postgres side of a run attempt (the ports of `agent` implemented
on `store`) and the worker's loops. May import: `agent`, `tool`, `provider`,
`store`, `telemetry`, `config`, `vocab`. Never imports `service`, `cli`,
`console` or the test helpers in `testing` (import-linter contracts in
`.importlinter`, `make lint`).
"""
