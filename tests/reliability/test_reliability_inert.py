"""Finding 6 (untrusted text): hostile task ids, names, tool outputs and errors stay inert.

- The HTML report, rendered in headless Chromium: no injected script or event handler runs, and
  even markup smuggled past the escaping (simulated by inserting it raw) is blocked by the
  report's Content-Security-Policy.
- The Prefect artifacts (markdown and table) show the same strings as text on a real Prefect server.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

from agentbatch.dashboards.browser import find_chromium, render
from agentbatch.dashboards.report import write_report
from agentbatch.db.models import Batch, Sample, Step
from agentbatch.db.store import Store

PWN = "document.documentElement.setAttribute('data-pwned','{}')"
HOSTILE = [
    "<script>" + PWN.format("script") + "</script>",
    "<img src=x onerror=\"" + PWN.format("img") + "\">",
    "<svg onload=\"" + PWN.format("svg") + "\"></svg>",
    "[click](javascript:" + PWN.format("link") + ")",
    "</script><script>" + PWN.format("breakout") + "</script>",
]


def hostile_batch(store: Store) -> int:
    t0 = time.time() - 100
    with store.session() as s, s.begin():
        batch = Batch(name=HOSTILE[0][:190], config={"name": HOSTILE[1]}, status="completed_with_failures",
                      created_at=t0, started_at=t0, finished_at=t0 + 50)
        s.add(batch)
        s.flush()
        for i, payload in enumerate(HOSTILE):
            failed = i % 2 == 1
            sample = Sample(batch_id=batch.id, index=i, task_id=payload[:190], task={}, task_group=payload[:190],
                            status="failed" if failed else "completed", steps_done=2, score=None if failed else 1.0,
                            admitted_at=t0 + i, finished_at=t0 + 20 + i, error=payload if failed else None)
            s.add(sample)
            s.flush()
            for index, kind in enumerate(("inference", "environment")):
                s.add(Step(batch_id=batch.id, sample_id=sample.id, index=index, kind=kind, status="completed",
                           attempt=1, enqueued_at=t0 + i + index, started_at=t0 + i + index + 0.1,
                           finished_at=t0 + i + index + 1, worker=payload[:190],
                           response={"messages": [{"role": "tool", "content": payload}]}))
        return batch.id


def pwned(dom: str) -> list[str]:
    """Markers set by an injected script (an attribute on <html>; the escaped text does not count)."""
    head = re.search(r"<html[^>]*>", dom)
    return re.findall(r"data-pwned=\"(\w+)\"", head.group(0)) if head else []


@pytest.mark.browser
@pytest.mark.skipif(find_chromium() is None, reason="chromium not installed (run .ci/setup_chromium.sh)")
def test_report_runs_no_injected_script(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'h.sqlite'}")
    batch_id = hostile_batch(store)
    page = write_report(store, [batch_id], tmp_path / "report")
    store.close()
    text = page.read_text()
    assert "Content-Security-Policy" in text and "unsafe-inline'; img" not in text.split("script-src")[1][:50]
    rendered = render(page, dump_dom=True)
    assert rendered.returncode == 0, rendered.stderr[-2000:]
    assert 'class="chart-svg"' in rendered.dom  # the report's own script ran (it drew the charts)
    assert pwned(rendered.dom) == []

    # Markup that got past the escaping (inserted raw here) is still blocked by the policy.
    smuggled = tmp_path / "report" / "smuggled.html"
    smuggled.write_text(text.replace("<body>", "<body>" + HOSTILE[0] + HOSTILE[1] + HOSTILE[2], 1))
    rendered = render(smuggled, dump_dom=True)
    assert rendered.returncode == 0, rendered.stderr[-2000:]
    assert 'class="chart-svg"' in rendered.dom
    assert pwned(rendered.dom) == [], "the Content-Security-Policy let an injected script run"


def test_artifacts_show_hostile_text_as_text(tmp_path: Path, prefect_api: str) -> None:
    import httpx
    from prefect import flow

    from agentbatch.dashboards.artifacts import publish_batch_artifacts, report_key, summary_key

    store = Store(f"sqlite:///{tmp_path / 'a.sqlite'}")
    batch_id = hostile_batch(store)
    keys = [report_key(batch_id, store.url), summary_key(batch_id, store.url)]  # this store's batch only

    @flow(name="hostile-artifacts", persist_result=False)
    async def publish() -> None:
        await publish_batch_artifacts(store, batch_id, report_path=None)

    asyncio.run(publish())
    store.close()
    ours = httpx.post(f"{prefect_api}/artifacts/filter", json={"artifacts": {"key": {"any_": keys}}, "limit": 10},
                      timeout=30).json()
    assert {a["type"] for a in ours} == {"markdown", "table"}, ours
    for a in ours:
        data = str(a["data"])
        assert "<script" not in data and "<img" not in data and "<svg" not in data, data[:500]
        assert "](javascript:" not in data, data[:500]
    markdown = next(str(a["data"]) for a in ours if a["type"] == "markdown")
    assert "&lt;script&gt;" in markdown or "&lt;script" in markdown  # shown, as text
