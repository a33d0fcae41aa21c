"""The run console: `hango-worker console`, a separate process serving server-rendered
pages over the runs (docs/operations.md, "The run console").

Pages: the runs list (filters, keyset paging on an index), one run (transcript, todos,
usage and cost, attempts and workers, errors, trace link), its live text (server-sent
events over the `hango_text` NOTIFY stream) and the waiting runs with approve, reject
and answer (through `store.decisions`, the CLI's code path). Every request is
authenticated (`auth.py`); every value reaches the page escaped (`html.py`).

A program of its own over the store. May import: `config`, `render`, `store`,
`telemetry`, `vocab`. Never imports `provider`, `tool`, `agent`, `run`,
`service`, `cli` or `testing` (import-linter contracts in `.importlinter`,
`make lint`).
"""
