"""One run's page: what it is, what it waits for (with the decision forms), its
transcript, plan, usage and cost, attempts, files, events, trace and live text."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from hango_worker.console import pages
from hango_worker.console.html import Html, href, join, render, status_span
from hango_worker.vocab import FINISHED


def _trace(run_id: str, trace_url: str) -> Html:
    if trace_url:
        link = trace_url.replace("{run_id}", quote(run_id, safe=""))
        return render('<a id="trace" href="{link}" rel="noopener">trace in Tempo</a>', link=link)
    query = f'{{ span.hango.run.id = "{run_id}" }}'
    return render('trace: Tempo → TraceQL <code id="trace">{q}</code>', q=query)


def _head(run: dict[str, Any], agent: str, trace_url: str) -> Html:
    parent = (
        render(' · subagent of <a href="{l}">{p}</a>', l=href(f"/runs/{run['parent_run_id']}"),
               p=run["parent_run_id"])
        if run.get("parent_run_id") else Html("")
    )  # fmt: skip
    return render(
        "<h1>Run <code>{id}</code></h1><p>{status} · agent <strong>{agent}</strong> · "
        "attempt {attempt} · created {created}{started}{finished}"
        "{parent}</p><p class=muted>session {session} · {trace}</p>",
        id=run["id"],
        status=status_span(run["status"]),
        agent=agent,
        attempt=run["attempt"],
        created=str(run["created_at"])[:19],
        started=f" · started {str(run['started_at'])[:19]}" if run.get("started_at") else "",
        finished=f" · finished {str(run['finished_at'])[:19]}" if run.get("finished_at") else "",
        parent=parent,
        session=run["session_id"],
        trace=_trace(run["id"], trace_url),
    )


_CSRF = '<input type="hidden" name="csrf" value="{csrf}">'


def _forms(run_id: str, call: dict[str, Any], question: bool, csrf: str) -> Html:
    base = f"/runs/{run_id}"
    hidden = render(_CSRF + '<input type="hidden" name="call" value="{call}">', csrf=csrf,
                    call=call.get("tool_use_id"))  # fmt: skip
    if question:
        return render(
            '<form class="inline" method="post" action="{a}/answer">{h}'
            '<textarea name="text" required placeholder="your answer"></textarea><br>'
            '<button id="answer">Answer</button></form>',
            a=base, h=hidden,
        )  # fmt: skip
    return render(
        '<form class="inline" method="post" action="{a}/approve">{h}'
        '<textarea name="input" placeholder="edited arguments (JSON object), or leave empty">'
        '</textarea><br><button id="approve">Approve</button></form>'
        '<form class="inline" method="post" action="{a}/reject">{h}'
        '<textarea name="reason" required placeholder="why not (the model reads it)"></textarea>'
        '<br><button id="reject">Reject</button></form>',
        a=base, h=hidden,
    )  # fmt: skip


def waiting_box(run: dict[str, Any], csrf: str | None) -> Html:
    waiting = run.get("waiting_for")
    if run["status"] != "waiting" or not isinstance(waiting, dict):
        return Html("")
    if waiting.get("reason") == "children":
        return Html('<section id="waiting"><p>Waiting for its subagent runs.</p></section>')
    raw = waiting.get("call")
    call: dict[str, Any] = raw if isinstance(raw, dict) else {}
    question = waiting.get("reason") == "question"
    forms = (
        _forms(run["id"], call, question, csrf)
        if csrf is not None
        else Html('<p class="muted">Read-only: deciding needs the act role.</p>')
    )
    return render(
        '<section id="waiting"><h2>Waiting for {what}</h2><p>since {since}{until} · call '
        "<code>{id}</code> <strong>{name}</strong></p>{q}<pre>{input}</pre>{forms}</section>",
        what="an answer" if question else "approval",
        since=str(run.get("waiting_since"))[:19],
        until=f" (until {str(run['waiting_until'])[:19]})" if run.get("waiting_until") else "",
        id=call.get("tool_use_id"),
        name=call.get("name"),
        q=render("<p>question: {q}</p>", q=call["question"]) if call.get("question") else "",
        input=json.dumps(call.get("input"), ensure_ascii=False, indent=1),
        forms=forms,
    )


def _children(run: dict[str, Any]) -> Html:
    kids = run.get("children") or []
    if not kids:
        return Html("")
    lis = join(
        render('<li><a href="{l}">{id}</a> {s} (task {t})</li>', l=href(f"/runs/{c['id']}"),
               id=c["id"], s=status_span(c["status"]), t=c["parent_tool_use_id"])
        for c in kids
    )  # fmt: skip
    return render("<section><h2>Subagent runs</h2><ul>{lis}</ul></section>", lis=lis)


def _files(files: list[dict[str, Any]]) -> Html:
    if not files:
        return Html("")
    lis = join(
        render("<li><code>{p}</code> {n} bytes</li>", p=f["path"], n=f["size"]) for f in files
    )
    return render('<section id="files"><h2>Files</h2><ul>{lis}</ul></section>', lis=lis)


def _events(events: list[dict[str, Any]]) -> Html:
    lis = join(
        render("<li>#{seq} {type} <span class=muted>attempt {a}, {w}, {at}</span></li>",
               seq=e["seq"], type=e["type"], a=e["attempt"], w=e["worker_id"],
               at=str(e["created_at"])[:19])
        for e in events
    )  # fmt: skip
    return render(
        "<section><details><summary>{n} events</summary><ul>{lis}</ul></details></section>",
        n=len(events),
        lis=lis,
    )


def live_pane(run: dict[str, Any]) -> Html:
    """Only while the run can still produce text (the stream ends the page reloads)."""
    waits_for_person = run["status"] == "waiting" and not (
        isinstance(run.get("waiting_for"), dict) and run["waiting_for"].get("reason") == "children"
    )
    if run["status"] in FINISHED or waits_for_person:
        return Html("")
    return render(
        '<section><h2>Live</h2><pre id="live" data-src="{src}"></pre></section>',
        src=f"/runs/{run['id']}/live",
    )


def run_page(
    run: dict[str, Any],
    *,
    agent: str,
    attempts: list[dict[str, Any]],
    files: list[dict[str, Any]],
    csrf: str | None,
    trace_url: str,
    notice: str | None = None,
) -> Html:
    note = render('<p class="err" id="notice">{n}</p>', n=notice) if notice else Html("")
    return join(
        [
            _head(run, agent, trace_url),
            note,
            waiting_box(run, csrf),
            pages.error(run),
            pages.usage(run),
            live_pane(run),
            render(
                '<section id="transcript"><h2>Transcript</h2>{t}</section>',
                t=pages.transcript(run.get("transcript") or [], run_id=run["id"]),
            ),
            pages.todos(run.get("state_json")),
            pages.attempts_table(attempts),
            _children(run),
            _files(files),
            _events(run.get("events") or []),
        ]
    )


def login(message: str = "") -> Html:
    return render(
        "<h1>Sign in</h1>{m}<form method=post action=/login>"
        '<input type="password" name="token" placeholder="console token" size="50" required>'
        ' <button id="signin">Sign in</button></form>'
        "<p class=muted>Or send <code>Authorization: Bearer &lt;token&gt;</code>.</p>",
        m=render("<p class=err>{m}</p>", m=message) if message else Html(""),
    )
