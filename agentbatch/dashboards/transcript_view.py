"""A transcript shown as text (`agentbatch show`) or as an HTML page of the report.

Both keep recorded content inert: in the terminal, control characters (ANSI escapes that could
move the cursor, recolour or retitle the terminal) are shown as `\\x1b`-style escapes; in HTML
every text is escaped and the page runs no script at all (its Content-Security-Policy says so).
Long observations are folded: the terminal shows the first `FOLD_CHARS` characters unless asked
for all, the page puts them in a closed `<details>`.
"""

from __future__ import annotations

import html
import json
import re

from agentbatch.dashboards.transcript import Message, StepView, Transcript

FOLD_CHARS = 2000  # longer texts are folded
HTML_MAX_CHARS = 200_000  # a page shows at most this much of one message
PREVIEW_CHARS = 160  # a folded text's summary line shows its start
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_PAGE_CSS = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1100px; }
.msg { border-left: 4px solid #ccc; margin: 6px 0; padding: 4px 10px; }
.msg.user { border-color: #2171b5; } .msg.assistant { border-color: #31a354; } .msg.tool { border-color: #e6550d; }
.msg.system { border-color: #969696; } .role { font-weight: bold; font-size: 0.85em; color: #555; }
pre { white-space: pre-wrap; word-break: break-word; margin: 4px 0; background: #f6f6f6; padding: 6px; }
.step { margin: 14px 0; } .meta { font-size: 0.85em; color: #555; } .bad { color: #cb181d; font-weight: bold; }
.call { font-family: monospace; background: #eef5ee; padding: 4px 6px; margin: 3px 0; white-space: pre-wrap; }
table.figures td, table.figures th { border: 1px solid #ddd; padding: 2px 8px; text-align: left; }
table.figures { border-collapse: collapse; font-size: 0.9em; }
"""
PAGE_CSP = ("default-src 'none'; script-src 'none'; style-src 'unsafe-inline'; img-src 'none'; "
            "connect-src 'none'; base-uri 'none'; form-action 'none'")


def terminal_safe(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", text)


def _num(x: float | None, unit: str = " s") -> str:
    return "-" if x is None else f"{x:.3f}{unit}"


def step_line(s: StepView) -> str:
    """The step's accounting on one line: kind, attempt, status, worker, queued/running, tokens."""
    parts = [f"step {s.index} {s.kind}", f"attempt {s.attempt}", s.status]
    if s.worker:
        parts.append(f"worker {s.worker}")
    parts.append(f"queued {_num(s.queued_s)}, running {_num(s.running_s)}")
    if s.prompt_tokens is not None:
        cached = f" ({s.cached_tokens} cached)" if s.cached_tokens is not None else ""
        parts.append(f"tokens {s.prompt_tokens} in{cached}, {s.output_tokens if s.output_tokens is not None else '-'} out")
    return "; ".join(parts)


def header_lines(t: Transcript) -> list[str]:
    group = f" [{t.group}]" if t.group else ""
    score = "-" if t.score is None else f"{t.score:g}"
    completed = sum(1 for s in t.steps if s.status == "completed")
    return [f"batch {t.batch_id} sample {t.sample_id} (index {t.index}), task {t.task_id}{group}: {t.status}, "
            f"score {score}, {completed} steps, {t.retries} failed attempt(s), latency {_num(t.latency_s)}",
            "scorer: " + (json.dumps(t.result, ensure_ascii=False, default=str) if t.result is not None else "-")]


def _fold_text(text: str, full: bool) -> str:
    if full or len(text) <= FOLD_CHARS:
        return text
    return f"{text[:FOLD_CHARS]}\n... ({len(text) - FOLD_CHARS} more characters; --full shows them)"


def _message_text(m: Message, full: bool) -> list[str]:
    name = f" {m.name}" if m.name else ""
    lines = [f"[{m.role}{name}] {_fold_text(m.content, full)}" if m.content else f"[{m.role}{name}]"]
    lines += [f"  -> call {c.name}({_fold_text(c.arguments, full)})" for c in m.tool_calls]
    return lines


def to_text(t: Transcript, *, full: bool = False) -> str:
    """The transcript for a terminal: control characters escaped, long texts folded unless `full`."""
    lines = header_lines(t)
    if t.error:
        lines.append(f"error: {t.error}")
    for s in t.steps:
        lines.append("")
        lines.append(f"--- {step_line(s)}")
        if s.error:
            lines.append(f"error: {s.error}")
        for m in s.inputs:
            lines += _message_text(m, full)
        if s.call is not None:
            lines.append(f"  -> call {s.call.name}({_fold_text(s.call.arguments, full)})")
        for m in s.outputs:
            lines += _message_text(m, full)
    return terminal_safe("\n".join(lines))


# --- HTML ---------------------------------------------------------------------------------------------
def _pre(text: str) -> str:
    shown = text[:HTML_MAX_CHARS]
    note = (f"\n... ({len(text) - HTML_MAX_CHARS} more characters: `agentbatch show --full`)"
            if len(text) > HTML_MAX_CHARS else "")
    body = f"<pre>{html.escape(shown + note)}</pre>"
    if len(text) <= FOLD_CHARS:
        return body
    preview = html.escape(text[:PREVIEW_CHARS].replace("\n", " "))
    return (f"<details><summary>{len(text)} characters (folded): <code>{preview}</code> ...</summary>"
            f"{body}</details>")


def _call_html(name: str, arguments: str) -> str:
    return f'<div class="call">call {html.escape(name)}({html.escape(arguments[:HTML_MAX_CHARS])})</div>'


def _message_html(m: Message) -> str:
    role = html.escape(m.role)
    name = f" {html.escape(m.name)}" if m.name else ""
    calls = "".join(_call_html(c.name, c.arguments) for c in m.tool_calls)
    body = _pre(m.content) if m.content else ""
    return f'<div class="msg {role}"><div class="role">{role}{name}</div>{body}{calls}</div>'


def _step_html(s: StepView) -> str:
    cls = "" if s.status == "completed" else ' bad'
    parts = [f'<div class="step" id="step-{s.index}-{s.attempt}"><div class="meta{cls}">'
             f"{html.escape(step_line(s))}</div>"]
    if s.error:
        parts.append(f'<div class="bad">error: {html.escape(s.error)}</div>')
    parts += [_message_html(m) for m in s.inputs]
    if s.call is not None:
        parts.append(_call_html(s.call.name, s.call.arguments))
    parts += [_message_html(m) for m in s.outputs]
    return "".join(parts) + "</div>"


def to_html(t: Transcript, back: str = "../index.html") -> str:
    """A standalone page; it runs no script (its policy forbids any)."""
    head, scorer = header_lines(t)
    parts = [f'<p><a href="{html.escape(back)}">back to the report</a></p>',
             f"<h1>{html.escape(head)}</h1>", f"<pre id=\"scorer\">{html.escape(scorer)}</pre>"]
    if t.error:
        parts.append(f'<p class="bad" id="sample-error">error: {html.escape(t.error)}</p>')
    parts.append('<section id="transcript">' + "".join(_step_html(s) for s in t.steps) + "</section>")
    title = html.escape(f"batch {t.batch_id} sample {t.sample_id}: {t.task_id}")
    return (f'<!DOCTYPE html><html lang="en"><head><meta http-equiv="Content-Security-Policy" '
            f'content="{PAGE_CSP}"><meta charset="utf-8"><title>{title}</title><style>{_PAGE_CSS}</style>'
            f"</head><body>{''.join(parts)}</body></html>")


def page_name(batch_id: int, sample_id: int, tag: str = "") -> str:
    """The transcript page's path inside the report folder."""
    return f"samples/b{batch_id}{tag}-s{sample_id}.html"
