"""Untrusted text stays inert wherever it is shown: markdown artifacts and the HTML report.

Task ids, batch names, tool outputs and error messages come from workloads, configs and remote
servers. In Prefect's markdown artifacts they are shown as text (`md_inert`: HTML and markdown
markup escaped). The HTML report escapes them already; `with_csp` adds a Content-Security-Policy
that lets only the report's own scripts run (by their hashes): no injected script, no inline event
handler, no outside request.
"""

from __future__ import annotations

import base64
import hashlib
import re

_MD_SPECIAL = {c: f"\\{c}" for c in "\\`*_{}[]()#+-.!|~>"}
_MD_SPECIAL.update({"<": "&lt;", "&": "&amp;", "\n": " ", "\r": " "})
_MD_TABLE = str.maketrans(_MD_SPECIAL)
_SCRIPT = re.compile(r"<script\b[^>]*>(.*?)</script>", re.DOTALL | re.IGNORECASE)


def md_inert(text: object) -> str:
    """Text for a markdown artifact: shown as written, never as HTML, a link or markup."""
    return str(text).translate(_MD_TABLE)


def cell_inert(text: str) -> str:
    """A table artifact cell: plain strings unchanged, HTML tags shown as text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def csp_for(page: str) -> str:
    """The policy for a page whose inline scripts are all its own."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(body.encode("utf-8")).digest()).decode() + "'"
        for body in dict.fromkeys(m.group(1) for m in _SCRIPT.finditer(page))
    )
    return ("default-src 'none'; script-src " + (hashes or "'none'") + "; style-src 'unsafe-inline'; "
            "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'none'; base-uri 'none'; "
            "form-action 'none'")


def with_csp(page: str) -> str:
    """The page with its Content-Security-Policy as the first element of <head>."""
    meta = f'<meta http-equiv="Content-Security-Policy" content="{csp_for(page)}">'
    return page.replace("<head>", "<head>" + meta, 1)
