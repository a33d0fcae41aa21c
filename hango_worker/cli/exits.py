"""The CLI's exit codes (documented in README and docs/operations.md) and its error."""

from __future__ import annotations

OK = 0
FAILED = 1  # the command worked, the run did not succeed (`demo`, `runs watch`)
USAGE = 2  # bad arguments or configuration (a HANGO_* value, the metrics port in use)
NOT_FOUND = 3  # no such run, agent, session, run file or memory file (in this tenant)
CONFLICT = 4  # the state forbids it (a name taken, a finished run cancelled, …)
UNAVAILABLE = 5  # the database: unreachable, missing, credentials refused, schema not usable
INTERRUPTED = 130  # Ctrl-C
BROKEN_PIPE = 141  # the reader of stdout went away (e.g. `| head`)


class CliError(Exception):
    """One line for stderr and the exit code that goes with it."""

    def __init__(self, message: str, code: int = USAGE) -> None:
        super().__init__(message)
        self.code = code
