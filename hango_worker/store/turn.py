"""The records of a run's two fenced writes, each field named once.

`TurnWrite` is everything a turn boundary writes (sql.CHECKPOINT, and for several runs
at once sql.CHECKPOINT_MANY); `ToolWrite` what a completed tool call writes
(sql.RECORD_TOOL). The statements (store/sql_checkpoint.py) name their parameters
(`:run_id`), and `compile_named` turns them into asyncpg's `$n` once, at import, by the
record's field order; a placeholder that names no field, or a field no placeholder
uses, fails the import. The arguments come from the record by the same order
(`TurnWrite.args`: one `operator.attrgetter` built once), so no list of a write's
values is spelled by position anywhere else.

The records are keyword-only (no positional construction) and not frozen: a frozen
dataclass sets each field through `object.__setattr__`, two dozen calls a turn on the
hot path. Nothing changes a record once made.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any, TypeAlias

from hango_worker.provider.types import compact_json

# `:name`, not the second colon of a cast (`::jsonb`) nor inside a word
_PLACEHOLDER = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_POSITIONAL = re.compile(r"\$\d")


def compile_named(sql: str, names: Sequence[str]) -> str:
    """`sql` with each `:name` replaced by `$n`, n the name's place in `names` (from 1).
    Raises ValueError when a placeholder names none of `names`, when one of `names` is
    never used, or when `sql` already holds a positional parameter."""
    if len(set(names)) != len(names):
        raise ValueError(f"a field is named twice: {list(names)}")
    if _POSITIONAL.search(sql):
        raise ValueError("a named statement holds a positional parameter ($n)")
    place = {name: i for i, name in enumerate(names, 1)}
    used: set[str] = set()

    def number(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in place:
            raise ValueError(f"placeholder :{name} names no field (fields: {', '.join(names)})")
        used.add(name)
        return f"${place[name]}"

    out = _PLACEHOLDER.sub(number, sql)
    unused = [n for n in names if n not in used]
    if unused:
        raise ValueError(f"no placeholder for the field(s) {', '.join(unused)}")
    return out


@dataclass(slots=True, kw_only=True)
class TurnWrite:
    """One turn boundary's write (sql.CHECKPOINT): the run's fence, its runs row, and the
    rows it appends. The field order is the statement's parameter order."""

    # the fence: this run, leased by this worker, in this attempt
    run_id: str
    owner: str
    attempt: int
    lease_s: float  # the lease renewed while the run goes on
    # the runs row (None: left as found)
    state_json: Any = None  # runs.state_json (jsonb)
    status: str | None = None  # None: still running; else the run's outcome, or 'released'
    error: Any = None  # jsonb, with a final status
    usage: Any = None  # jsonb
    trace_parent: str | None = None
    limit_reached: str | None = None
    waiting: Any = None  # runs.waiting_for (jsonb), with status 'waiting'
    output: str | None = None  # runs.output as JSON text (a structured final answer)
    # a model turn was committed (an assistant message among the messages): the run
    # made progress, so its count of lost leases starts again (runs.lost_count)
    progressed: bool = False
    # messages, one element per message (content: JSON text)
    msg_seqs: Sequence[int] = ()
    msg_roles: Sequence[str] = ()
    msg_contents: Sequence[str] = ()
    # run_events (payload: JSON text)
    ev_seqs: Sequence[int] = ()
    ev_types: Sequence[str] = ()
    ev_payloads: Sequence[str] = ()
    # run_files still in the outbox (State.file_writes)
    file_paths: Sequence[str] = ()
    file_contents: Sequence[str] = ()
    file_sizes: Sequence[int] = ()
    file_tool_use_ids: Sequence[str | None] = ()
    # run_states: the state kept at the end of a turn (state: JSON text)
    state_turns: Sequence[int] = ()
    state_jsons: Sequence[str] = ()

    def args(self) -> tuple[Any, ...]:
        """sql.CHECKPOINT's arguments."""
        return _turn_args(self)


@dataclass(slots=True, kw_only=True)
class ToolWrite:
    """One completed tool call's write (sql.RECORD_TOOL): its result in the resume
    journal, the state, its event, and the run files it made."""

    run_id: str
    owner: str
    attempt: int
    lease_s: float
    state_json: Any  # runs.state_json (jsonb)
    tool_use_id: str
    tool_name: str
    result: Any  # tool_calls.result (jsonb)
    message_seq: int  # the assistant message whose call it answers
    ev_seq: int
    ev_type: str
    ev_payload: str  # JSON text
    file_paths: Sequence[str] = ()
    file_contents: Sequence[str] = ()
    file_sizes: Sequence[int] = ()
    file_tool_use_ids: Sequence[str | None] = ()

    def args(self) -> tuple[Any, ...]:
        """sql.RECORD_TOOL's arguments."""
        return _tool_args(self)


TURN_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(TurnWrite))
TOOL_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ToolWrite))
_turn_args: Callable[[TurnWrite], tuple[Any, ...]] = attrgetter(*TURN_FIELDS)
_tool_args: Callable[[ToolWrite], tuple[Any, ...]] = attrgetter(*TOOL_FIELDS)

# -- several runs' TurnWrites as one sql.CHECKPOINT_MANY ------------------------------------
# Each group of rows, by the name of its run-id array: CHECKPOINT_MANY tags each row
# with its run. Every other field of TurnWrite is one value per run: an array there,
# one element per run, under the field's own name.
TURN_ROWS: dict[str, tuple[str, ...]] = {
    "msg_runs": ("msg_seqs", "msg_roles", "msg_contents"),
    "ev_runs": ("ev_seqs", "ev_types", "ev_payloads"),
    "file_runs": ("file_paths", "file_contents", "file_sizes", "file_tool_use_ids"),
    "state_runs": ("state_turns", "state_jsons"),
}
_IN_ROWS = {name for group in TURN_ROWS.values() for name in group}
# the jsonb values the pool's codec encodes in CHECKPOINT; CHECKPOINT_MANY takes them as
# text arrays
TURN_JSON: frozenset[str] = frozenset({"state_json", "error", "usage", "waiting"})


def many_fields(turn_fields: Sequence[str]) -> tuple[str, ...]:
    """CHECKPOINT_MANY's parameters for a turn record's fields: the per-run ones first
    (in their order), then each group of rows behind its run-id array."""
    per_run = [n for n in turn_fields if n not in _IN_ROWS]
    return (*per_run, *(name for tag, group in TURN_ROWS.items() for name in (tag, *group)))


TURN_PER_RUN: tuple[str, ...] = tuple(n for n in TURN_FIELDS if n not in _IN_ROWS)
MANY_FIELDS: tuple[str, ...] = many_fields(TURN_FIELDS)

if not (_IN_ROWS.issubset(TURN_FIELDS) and TURN_JSON.issubset(TURN_PER_RUN)):
    raise ValueError("TURN_ROWS and TURN_JSON must name fields of TurnWrite")

_per_run: Callable[[TurnWrite], tuple[Any, ...]] = attrgetter(*TURN_PER_RUN)
_JSON_AT = frozenset(i for i, n in enumerate(TURN_PER_RUN) if n in TURN_JSON)
_row_groups: tuple[Callable[[TurnWrite], tuple[Sequence[Any], ...]], ...] = tuple(
    attrgetter(*group) for group in TURN_ROWS.values()
)


def _json(v: Any) -> str | None:
    return None if v is None else compact_json(v)


def checkpoint_many_args(writes: Sequence[TurnWrite]) -> tuple[list[Any], ...]:
    """The TurnWrites of several runs as sql.CHECKPOINT_MANY's arguments (MANY_FIELDS'
    order): each per-run field one element per run, each run's rows tagged with its id."""
    per_run: tuple[list[Any], ...] = tuple([] for _ in TURN_PER_RUN)
    rows: list[list[list[Any]]] = [[[] for _ in range(1 + len(g))] for g in TURN_ROWS.values()]
    for w in writes:
        for i, v in enumerate(_per_run(w)):
            per_run[i].append(_json(v) if i in _JSON_AT else v)
        for get, out in zip(_row_groups, rows, strict=True):
            columns = get(w)
            out[0].extend([w.run_id] * len(columns[0]))
            for k, column in enumerate(columns, 1):
                out[k].extend(column)
    return (*per_run, *(array for group in rows for array in group))


# a run's fenced write, as its record
FencedWrite: TypeAlias = TurnWrite | ToolWrite
