"""Escaping by construction: a value reaches a page only through `esc` or `render`.

`Html` marks markup this module built (already safe). Everything else, whether model
output, tool results, errors or agent names, goes through `esc`: terminal control
sequences are dropped first (`render.safe`: an ANSI escape in a tool's output shows
nothing), then `&<>"'` become entities, so `<script>` renders as text.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

from hango_worker.render import safe


class Html(str):
    """Markup that is safe to send as it is (built here from escaped parts)."""

    __slots__ = ()


def esc(value: Any) -> Html:
    if isinstance(value, Html):
        return value
    return Html(html.escape(safe("" if value is None else value), quote=True))


def render(template: str, **values: Any) -> Html:
    """`template` (a literal of this package, `{name}` placeholders) with each value
    escaped unless it is `Html` already."""
    return Html(template.format_map({k: esc(v) for k, v in values.items()}))


def join(parts: Iterable[Html], sep: str = "") -> Html:
    return Html(sep.join(esc(p) for p in parts))


def href(path: str, **query: Any) -> Html:
    """A link to `path` (ours, a literal) with its query string built and escaped."""
    q = {k: v for k, v in query.items() if v not in (None, "")}
    return esc(path + ("?" + urlencode(q) if q else ""))


# Served as /static/console.css and /static/console.js: the pages' Content-Security-Policy
# allows no inline script or style at all (a second wall behind the escaping).
STYLE = Html("""
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f6f7f9; }
header { background: #1d2330; color: #fff; padding: 8px 16px; display: flex; gap: 16px; }
header a { color: #cfe1ff; text-decoration: none; } header .who { margin-left: auto; }
main { padding: 12px 16px; max-width: 1200px; }
table { border-collapse: collapse; width: 100%; background: #fff; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #e3e6ea; }
.status { font-weight: 600; } .succeeded { color: #1a7f37; }
.failed, .cancelled { color: #cf222e; } .running, .queued, .waiting { color: #9a6700; }
section { background: #fff; border: 1px solid #e3e6ea; margin: 12px 0; padding: 8px 12px; }
.msg { border-left: 3px solid #ccd; padding: 2px 8px; margin: 6px 0; }
.msg.assistant { border-color: #3b82f6; } .role { font-weight: 600; color: #555; }
.text, pre { white-space: pre-wrap; word-break: break-word; margin: 2px 0; }
pre { background: #f3f4f6; padding: 4px 6px; font: 12px/1.4 ui-monospace, monospace; }
.call { color: #8a4b00; } .result.error { color: #cf222e; } .muted { color: #777; }
.thumb { margin: .3em 0; }
.thumb img { max-width: 240px; max-height: 240px; border: 1px solid #ddd; }
#live { max-height: 420px; overflow: auto; background: #111827; color: #e5e7eb; }
form.inline { display: inline-block; margin-right: 12px; vertical-align: top; }
textarea { width: 420px; height: 70px; } .err { color: #cf222e; font-weight: 600; }
""")

LIVE_JS = Html("""
const pane = document.getElementById("live");
if (pane) {
  const source = new EventSource(pane.dataset.src);
  source.addEventListener("text", (e) => {
    pane.textContent += JSON.parse(e.data).text;
    pane.scrollTop = pane.scrollHeight;
  });
  source.addEventListener("end", () => { source.close(); location.reload(); });
}
""")

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · hango-worker</title><link rel="stylesheet" href="/static/console.css">
<script src="/static/console.js" defer></script></head>
<body><header><strong>hango-worker</strong><a href="/runs">Runs</a>
<a href="/waiting">Waiting</a><span class="who">{who}</span></header>
<main>{body}</main></body></html>
"""


def page(title: str, body: Html, who: str = "") -> Html:
    return render(_PAGE, title=title, body=body, who=who)


def status_span(status: Any) -> Html:
    return render('<span class="status {s}">{s}</span>', s=status)
