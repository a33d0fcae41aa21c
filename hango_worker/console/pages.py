"""The pages, as escaped HTML (html.py): runs list, waiting runs, one run, login.

A malformed row (content that is not a list of blocks, an error that is not an object,
todos that are not todos) is shown as a marker, never a server error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hango_worker.console.html import Html, href, join, render, status_span
from hango_worker.console.images import image_path
from hango_worker.render import ATTACHMENTS, attachment, attachments_text, usage_line
from hango_worker.vocab import RunStatus

STATUSES = tuple(str(s) for s in RunStatus)


def _options(values: list[tuple[str, str]], chosen: str | None) -> Html:
    return join(
        render('<option value="{v}"{sel}>{label}</option>', v=v, label=label,
               sel=Html(" selected") if v == chosen else Html(""))
        for v, label in values
    )  # fmt: skip


def runs_list(
    rows: list[dict[str, Any]],
    *,
    filters: dict[str, str | None],
    agents: list[dict[str, Any]],
    tenants: dict[str, str],
    next_cursor: str | None,
) -> Html:
    form = render(
        '<form method="get" action="/runs">tenant <select name="tenant">{tenants}</select> '
        'status <select name="status">{statuses}</select> '
        'agent <select name="agent">{agents}</select> <button>Filter</button></form>',
        tenants=_options(list(tenants.items()), filters["tenant"]),
        statuses=_options([("", "any")] + [(s, s) for s in STATUSES], filters["status"]),
        agents=_options([("", "any")] + [(a["name"], a["name"]) for a in agents], filters["agent"]),
    )
    body = join(
        render(
            '<tr><td><a href="{link}">{id}</a></td><td>{agent}</td><td>{status}</td>'
            "<td>{attempt}</td><td>{created}</td><td>{finished}</td><td>{note}</td></tr>",
            link=href(f"/runs/{r['id']}"),
            id=r["id"],
            agent=r["agent"],
            status=status_span(r["status"]),
            attempt=r["attempt"],
            created=_when(r["created_at"]),
            finished=_when(r["finished_at"]),
            note=r["error_type"] or r["waiting_reason"] or "",
        )
        for r in rows
    )
    more = (
        render('<p><a href="{link}" rel="next">Older runs →</a></p>',
               link=href("/runs", **filters, after=next_cursor))
        if next_cursor else Html("")
    )  # fmt: skip
    return render(
        '<h1>Runs</h1>{form}<table id="runs"><thead><tr><th>run</th><th>agent</th>'
        "<th>status</th><th>attempt</th><th>created</th><th>finished</th><th>error / waits for"
        "</th></tr></thead><tbody>{body}</tbody></table>{empty}{more}",
        form=form,
        body=body,
        empty=Html("" if rows else '<p class="muted">No runs match.</p>'),
        more=more,
    )


def waiting_list(rows: list[dict[str, Any]]) -> Html:
    body = join(
        render(
            '<tr><td><a href="{link}">{id}</a></td><td>{agent}</td><td>{what}</td>'
            "<td>{tool}</td><td>{question}</td><td>{since}</td><td>{until}</td></tr>",
            link=href(f"/runs/{r['id']}"),
            id=r["id"],
            agent=r["agent"],
            what="an answer" if r["reason"] == "question" else "approval",
            tool=r["tool"],
            question=r["question"] or "",
            since=_when(r["waiting_since"]),
            until=_when(r["waiting_until"]),
        )
        for r in rows
    )
    return render(
        '<h1>Waiting for a person</h1><table id="waiting"><thead><tr><th>run</th><th>agent</th>'
        "<th>needs</th><th>tool</th><th>question</th><th>since</th><th>until</th></tr></thead>"
        "<tbody>{body}</tbody></table>{empty}",
        body=body,
        empty=Html("" if rows else '<p class="muted">No run waits for a person.</p>'),
    )


def _when(value: Any) -> str:
    return "" if value is None else str(value)[:19]


def _dumps(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=1)


def _result_text(content: Any) -> str:
    if isinstance(content, list) and any(isinstance(b, dict) and b.get("source") for b in content):
        return attachments_text([b for b in content if isinstance(b, dict)])
    if isinstance(content, list):
        parts = [b.get("text", "") if isinstance(b, dict) else "" for b in content]
        if all(isinstance(b, dict) and b.get("type") == "text" for b in content):
            return "\n".join(str(p) for p in parts)
    return _dumps(content)


def thumb(b: dict[str, Any], src: str | None) -> Html:
    """An image block as a thumbnail of its bytes (console/images.py), with its line."""
    if src is None:
        return render('<div class="muted">[{k}]</div>', k=attachment(b))
    return render(
        '<figure class="thumb"><a href="{src}"><img src="{src}" alt="{k}" loading="lazy"></a>'
        '<figcaption class="muted">[{k}]</figcaption></figure>',
        src=src,
        k=attachment(b),
    )


def _result_images(b: dict[str, Any], src: Callable[[str], str] | None, i: int) -> Html:
    content = b.get("content")
    if src is None or not isinstance(content, list):
        return Html("")
    return join(
        thumb(c, src(f"{i}.{j}"))
        for j, c in enumerate(content)
        if isinstance(c, dict) and c.get("type") == "image"
    )


def block(b: Any, src: Callable[[str], str] | None = None, i: int = 0) -> Html:
    """One content block; `src(where)`: the URL of an image block's bytes, by its place
    in the message (`i`, or `i.j` inside a tool result)."""
    if not isinstance(b, dict):
        return render('<div class="err">[malformed block: {t}]</div>', t=type(b).__name__)
    kind = b.get("type")
    if kind == "text":
        return render('<div class="text">{t}</div>', t=b.get("text", ""))
    if kind == "tool_use":
        return render(
            '<div class="call">→ <strong>{name}</strong> <span class="muted">{id}</span>'
            "<pre>{input}</pre></div>",
            name=b.get("name"),
            id=b.get("id"),
            input=_dumps(b.get("input")),
        )
    if kind == "tool_result":
        cls = "result error" if b.get("is_error") else "result"
        return render(
            '<div class="{cls}">{mark} <span class="muted">{id}</span><pre>{content}</pre>'
            "{images}</div>",
            cls=cls,
            mark="✗" if b.get("is_error") else "←",
            id=b.get("tool_use_id"),
            content=_result_text(b.get("content", "")),
            images=_result_images(b, src, i),
        )
    if kind == "thinking":
        return render(
            '<details class="muted"><summary>thinking</summary><div class="text">{t}</div>'
            "</details>",
            t=b.get("thinking", ""),
        )
    if kind == "image":  # a thumbnail of its bytes, served on their own (never inline)
        return thumb(b, src(str(i)) if src is not None else None)
    if kind in ATTACHMENTS:  # by name, media type and size: never the bytes
        return render('<div class="muted">[{k}]</div>', k=attachment(b))
    return render('<div class="muted">[{k}]</div>', k=kind)


def transcript(messages: list[dict[str, Any]], run_id: str | None = None) -> Html:
    """The messages; with `run_id`, image blocks as thumbnails (console/images.py)."""

    def one(m: dict[str, Any]) -> Html:
        content = m.get("content")
        seq = m.get("seq")
        src = (
            (lambda where: image_path(run_id, seq, where))
            if run_id is not None and isinstance(seq, int)
            else None
        )
        blocks = (
            join(block(b, src, i) for i, b in enumerate(content))
            if isinstance(content, list)
            else render('<div class="err">[malformed message: {t}]</div>',
                        t=type(content).__name__)
        )  # fmt: skip
        return render(
            '<div class="msg {role}"><span class="role">{role}</span> '
            '<span class="muted">#{seq}</span>{blocks}</div>',
            role=m.get("role"),
            seq=m.get("seq"),
            blocks=blocks,
        )

    return join(one(m) for m in messages) or Html('<p class="muted">No messages yet.</p>')


def todos(state: Any) -> Html:
    items = state.get("todos") if isinstance(state, dict) else None
    if not items:
        return Html("")
    if not isinstance(items, list):
        return Html('<section><h2>Plan</h2><p class="err">[malformed todos]</p></section>')
    marks = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]"}
    lis = join(
        render("<li><code>{mark}</code> {content}</li>",
               mark=marks.get(str(t.get("status")), "[?]"), content=t.get("content"))
        if isinstance(t, dict) else render("<li>[malformed todo]</li>")
        for t in items
    )  # fmt: skip
    return render('<section id="todos"><h2>Plan</h2><ul>{lis}</ul></section>', lis=lis)


def attempts_table(rows: list[dict[str, Any]]) -> Html:
    body = join(
        render("<tr><td>{a}</td><td>{w}</td><td>{s}</td><td>{e}</td><td>{ends}</td></tr>",
               a=r["attempt"], w=r["worker_id"] or "", s=_when(r["started_at"]),
               e=_when(r["last_event_at"]), ends=", ".join(r["ends"] or []))
        for r in rows
    )  # fmt: skip
    return render(
        '<section id="attempts"><h2>Attempts</h2><table><thead><tr><th>attempt</th>'
        "<th>worker</th><th>started</th><th>last event</th><th>ended with</th></tr></thead>"
        "<tbody>{body}</tbody></table></section>",
        body=body,
    )


def usage(run: dict[str, Any]) -> Html:
    if not run.get("usage"):
        return Html("")
    return render('<p id="usage" class="muted">{u}</p>', u=usage_line(run["usage"]))


def error(run: dict[str, Any]) -> Html:
    err = run.get("error")
    if err is None:
        return Html("")
    if not isinstance(err, dict):
        return render('<p class="err" id="error">error (malformed): {e}</p>', e=repr(err)[:500])
    return render(
        '<p class="err" id="error">error {type}: {message}</p>',
        type=err.get("type"),
        message=err.get("message"),
    )
