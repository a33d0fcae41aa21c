"""The run console: `hango-worker console`, a separate process serving server-rendered
pages over the runs (docs/operations.md, "The run console").

Pages: the runs list (filters, keyset paging on an index), one run (transcript, todos,
usage and cost, attempts and workers, errors, trace link), its live text (server-sent
events over the `hango_text` NOTIFY stream) and the waiting runs with approve, reject
and answer (through `store.decisions`, the CLI's code path). Every request is
authenticated (`auth.py`); every value reaches the page escaped (`html.py`). The same
process serves the HTTP API under `/v1/` (`api.py`, docs/http-api.md).

A program of its own over the store. May import: `agent`, `config`, `render`,
`store`, `telemetry`, `vocab` (`agent` for the run rules the API validates with). Never
imports `provider`, `tool`, `run`, `service`, `cli` or `testing` (import-linter
contracts in `.importlinter`, `make lint`).
"""
