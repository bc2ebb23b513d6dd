"""The console in a real headless browser (Debian's chromium driven by Playwright).

Every service and the API run as their own processes. An approver signs in, watches a
call appear and finish in the live list (pushed over Server-Sent Events: the page never
polls), approves a pending call from its parameters, and opens a timeline, whose
screenshot must not be blank.
"""

from __future__ import annotations

import io
import json
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from PIL import Image, ImageStat
from playwright.async_api import Browser, Page, async_playwright

from tests.support.eventually import eventually
from tests.support.fleet import ProcessFleet, process_fleet
from tests.support.pipeline import Fleet, fleet_settings
from tests.support.servers import kill_quietly
from toolfleet.devstack.children import child_preexec
from toolfleet.settings import FleetSettings

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CHROMIUM = "/usr/bin/chromium"
TENANT = "t_console"
AGENT = "did:agent:console-e2e"
APPROVER = "did:user:approver"
CAP = 200
"""Rows the console's live list keeps (``MAX_ROWS`` in console.js)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _start_api(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """``toolfleet api`` as its own process, its output in ``log_path``."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "toolfleet", "api"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=child_preexec,
        )


def _start_analytics(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """``toolfleet worker analytics`` (the charts' source) as its own process."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "toolfleet", "worker", "analytics"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=child_preexec,
        )


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Fleet, ProcessFleet]]:
    home: Path = tmp_path_factory.mktemp("console")
    async with process_fleet(fleet_settings(settings, home), home) as running:
        yield running


def _text(path: Path) -> str:
    return path.read_text(errors="replace")


async def _serving(proc: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    """Return once the API answers ``/healthz``; fail if its process died."""
    async with httpx.AsyncClient(base_url=url) as http:

        async def healthy() -> bool:
            try:
                return (await http.get("/healthz")).status_code == 200
            except httpx.TransportError:
                assert proc.poll() is None, _text(log_path)
                return False

        await eventually(healthy, timeout=60, interval=0.2)


@pytest.fixture(scope="module")
async def api_url(fleet: tuple[Fleet, ProcessFleet]) -> AsyncIterator[str]:
    _, procs = fleet
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**procs.env, "TOOLFLEET_API_PORT": str(port), "TOOLFLEET_API_URL": url}
    proc = _start_api(env, procs.log_dir / "api.log")
    try:
        await _serving(proc, url, procs.log_dir / "api.log")
        yield url
    finally:
        kill_quietly(proc)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        # Root in CI containers: chromium's sandbox needs user namespaces it may not have.
        launched = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        yield launched
        await launched.close()


async def _invoke(api_url: str, token: str, body: dict[str, Any]) -> str:
    async with httpx.AsyncClient(base_url=api_url) as http:
        answer = await http.post(
            "/v1/invocations", json=body, headers={"Authorization": f"Bearer {token}"}
        )
    assert answer.status_code == 202, answer.text
    invocation_id: str = answer.json()["invocation_id"]
    return invocation_id


def _row(invocation_id: str, status: str | None = None) -> str:
    selector = f'#invocations tr[data-invocation="{invocation_id}"]'
    return f'{selector}[data-status="{status}"]' if status else selector


def _pixel_spread(png: bytes) -> tuple[float, int]:
    """Standard deviation of the grey levels, and how many distinct colours there are."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    spread = ImageStat.Stat(image.convert("L")).stddev[0]
    colours = image.getcolors(maxcolors=1 << 16) or []
    return spread, len(colours)


async def _sign_in(page: Page, api_url: str, token: str) -> None:
    await page.goto(f"{api_url}/console")
    await page.fill("#token", token)
    await page.click("#sign-in-form button[type=submit]")
    await page.wait_for_selector("#console:not([hidden])")
    await page.wait_for_selector('#live[data-state="live"]')


async def test_an_approver_follows_calls_live_approves_one_and_reads_a_timeline(
    fleet: tuple[Fleet, ProcessFleet], api_url: str, browser: Browser, tmp_path: Path
) -> None:
    running, _ = fleet
    agent_token = running.token(TENANT, AGENT)
    approver_token = running.token(TENANT, APPROVER, scopes=["approver"])
    page = await browser.new_page(viewport={"width": 1280, "height": 1000})
    requests: list[str] = []
    problems: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    failed: list[str] = []
    page.on("response", lambda r: failed.append(r.url) if r.status >= 400 else None)
    # Console errors other than failed loads (listed by URL below): CSP, script errors.
    page.on(
        "console",
        lambda m: (
            problems.append(m.text)
            if m.type == "error" and not m.text.startswith("Failed to load resource")
            else None
        ),
    )
    page.on("pageerror", lambda e: problems.append(str(e)))

    await _sign_in(page, api_url, approver_token)
    assert await page.inner_text("#who") == f"{APPROVER} · {TENANT} · approver"

    # A call appears and finishes in the list, pushed by the feed.
    long_call = await _invoke(
        api_url,
        agent_token,
        {
            "tool_id": "core__long_running",
            "agent_context": {"agent_did": AGENT, "tenant_id": TENANT},
            "parameters": {"steps": 4, "step_seconds": 0.5},
        },
    )
    await page.wait_for_selector(_row(long_call), timeout=30_000)
    await page.wait_for_selector(_row(long_call, "running"), timeout=30_000)
    await page.wait_for_selector(_row(long_call, "success"), timeout=60_000)

    # A call that needs approval shows its parameters; the approver approves it.
    parked = await _invoke(
        api_url,
        agent_token,
        {
            "tool_id": "core__echo",
            "agent_context": {"agent_did": AGENT, "tenant_id": TENANT},
            "parameters": {"message": "ship the release"},
            "execution_options": {"require_approval": True},
        },
    )
    card = f'#approvals article[data-invocation="{parked}"]'
    await page.wait_for_selector(card, timeout=30_000)
    assert "ship the release" in await page.inner_text(f"{card} pre.parameters")
    assert len(await page.inner_text(f"{card} .hash code")) >= 32
    # The approver gives a reason, sent with the decision.
    await page.fill(f"{card} textarea.reason", "release window is open")
    async with page.expect_request(lambda r: r.url.endswith(f"{parked}/approve")) as sent:
        await page.click(f"{card} button.approve")
    decision = (await sent.value).post_data_json
    assert decision is not None
    assert decision["reason"] == "release window is open"
    await page.wait_for_selector(_row(parked, "success"), timeout=60_000)
    await page.wait_for_selector(card, state="detached", timeout=10_000)

    # The long call's timeline: requested → authorized → invoked → checkpoints → outcome.
    await page.click(_row(long_call))
    await page.wait_for_selector("#timeline svg.timeline-chart", timeout=10_000)
    kinds = await page.eval_on_selector_all(
        "#timeline ol.steps li", "items => items.map(i => i.dataset.kind)"
    )
    assert kinds[:3] == ["requested", "authorized", "invoked"]
    assert kinds.count("checkpoint") == 4
    assert kinds[-1] == "terminal"
    assert "attempts 1" in await page.inner_text("#timeline .facts")
    shot = await page.locator("#timeline-panel").screenshot()
    (tmp_path / "console-timeline.png").write_bytes(shot)
    await page.screenshot(path=str(tmp_path / "console.png"), full_page=True)
    spread, colours = _pixel_spread(shot)
    assert spread > 20, "the timeline screenshot is (nearly) one flat colour"
    assert colours > 8

    # Live means pushed: one feed request, no polling of the list.
    feeds = [u for u in requests if "/v1/events/invocations" in u]
    lists = [u for u in requests if "/v1/invocations?" in u]
    assert len(feeds) == 1, feeds
    assert len(lists) <= 1, lists  # the pending approvals, read once at sign-in
    assert not [u for u in requests if "token" in u.lower() or agent_token in u]
    assert problems == [], problems
    # Until the analytics worker serves this tenant, its charts show the empty state.
    # Nothing else fails to load: the favicon included (the page links its own).
    assert [u for u in failed if "/v1/analytics/" not in u] == []
    if any("/v1/analytics/" in u for u in failed):
        assert "No analytics" in await page.inner_text("#analytics")


async def test_the_list_filters_by_url_links_each_call_and_shows_its_columns(
    fleet: tuple[Fleet, ProcessFleet], api_url: str, browser: Browser
) -> None:
    running, _ = fleet
    agent_token = running.token(TENANT, AGENT)
    context = {"agent_did": AGENT, "tenant_id": TENANT}
    echoed = await _invoke(
        api_url,
        agent_token,
        {"tool_id": "core__echo", "agent_context": context, "parameters": {"message": "hi"}},
    )
    slow = await _invoke(
        api_url,
        agent_token,
        {
            "tool_id": "core__long_running",
            "agent_context": context,
            "parameters": {"steps": 1, "step_seconds": 0.1},
        },
    )
    page = await browser.new_page(viewport={"width": 1280, "height": 1000})
    failed: list[str] = []
    page.on("response", lambda r: failed.append(r.url) if r.status >= 400 else None)
    await _sign_in(page, api_url, running.token(TENANT, "did:user:viewer"))
    await page.wait_for_selector(_row(echoed, "success"), timeout=60_000)
    await page.wait_for_selector(_row(slow, "success"), timeout=60_000)
    cells = await page.eval_on_selector_all(
        f"{_row(echoed)} td", "cells => cells.map(c => c.textContent)"
    )
    short_id, tool, agent, status, took, error, created = cells
    assert short_id == echoed[:8]
    assert tool.startswith("core__echo")
    assert (agent, status, error) == (AGENT, "success", "")
    assert took.endswith((" ms", " s"))
    assert "/" in created or "." in created or "-" in created, created  # a date, not a time

    # The filter form turns the view into a link; the list then holds only matching calls.
    await page.select_option("#f-status", "success")
    await page.fill("#f-tool", "core__long_running")
    await page.click("#filters button[type=submit]")
    await page.wait_for_url("**/console?status=success&tool_id=core__long_running")
    await page.wait_for_selector(_row(slow, "success"), timeout=30_000)
    tools = await page.eval_on_selector_all(
        "#invocations tbody tr td:nth-child(2)", "cells => cells.map(c => c.textContent)"
    )
    assert tools
    assert all(t.startswith("core__long_running") for t in tools), tools
    assert await page.query_selector(_row(echoed)) is None
    assert await page.input_value("#f-tool") == "core__long_running"

    # Search by id narrows the list to the call and opens its timeline.
    await page.goto(f"{api_url}/console?invocation_id={slow}")
    await page.wait_for_selector("#timeline svg.timeline-chart", timeout=10_000)
    assert len(await page.query_selector_all("#invocations tbody tr")) == 1
    assert slow in await page.inner_text("#timeline-title")
    # ... and so does the short id the list shows (a prefix of it).
    await page.goto(f"{api_url}/console?invocation_id={slow[:8]}")
    await page.wait_for_selector(_row(slow), timeout=10_000)
    assert await page.input_value("#f-id") == slow[:8]
    assert [
        row.startswith(slow[:8])
        for row in await page.eval_on_selector_all(
            "#invocations tbody tr", "rows => rows.map(r => r.dataset.invocation)"
        )
    ] == [True]

    # The id links to the call's page: parameters, result, trace id, timeline.
    await page.click(f"{_row(slow)} td.id a")
    await page.wait_for_url(f"**/console/invocations/{slow}")
    await page.wait_for_selector("#timeline svg.timeline-chart", timeout=10_000)
    assert '"steps": 1' in await page.inner_text("#call-parameters")
    assert await page.inner_text("#call-result") != "(no result)"
    assert len(await page.inner_text("#call-trace")) == 32
    assert "duration" in await page.inner_text("#timeline .facts")
    assert "attempts 1" in await page.inner_text("#timeline .facts")
    assert await page.is_hidden("#call-error")
    # Another tenant's call reads like a missing one.
    other = await _invoke(
        api_url,
        running.token("t_console_other", AGENT),
        {
            "tool_id": "core__echo",
            "agent_context": {"agent_did": AGENT, "tenant_id": "t_console_other"},
            "parameters": {"message": "not yours"},
        },
    )
    for hidden in (other, "00000000-0000-0000-0000-000000000000"):
        await page.goto(f"{api_url}/console/invocations/{hidden}")
        await page.wait_for_selector("#call-missing:not([hidden])")
        assert await page.inner_text("#call-missing") == "No such invocation."
        assert "not yours" not in await page.content()
    failed = [u for u in failed if "/v1/console/invocations/" not in u]
    # An id the caller cannot see lists nothing.
    await page.goto(f"{api_url}/console?invocation_id=00000000-0000-0000-0000-000000000000")
    await page.wait_for_selector("#invocations-empty:not([hidden])")
    assert [u for u in failed if "/v1/analytics/" not in u] == []


ATTACK = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


async def test_the_call_page_shows_hostile_values_as_text(
    fleet: tuple[Fleet, ProcessFleet], api_url: str, browser: Browser
) -> None:
    running, _ = fleet
    called = await _invoke(
        api_url,
        running.token(TENANT, AGENT),
        {
            "tool_id": "core__echo",
            "agent_context": {"agent_did": AGENT, "tenant_id": TENANT},
            "parameters": {"message": ATTACK},
        },
    )
    page = await browser.new_page(viewport={"width": 1280, "height": 1000})
    await _sign_in(page, api_url, running.token(TENANT, "did:user:viewer"))
    await page.wait_for_selector(_row(called, "success"), timeout=60_000)
    await page.goto(f"{api_url}/console/invocations/{called}")
    await page.wait_for_selector("#timeline svg.timeline-chart", timeout=10_000)
    assert json.dumps(ATTACK) in await page.inner_text("#call-parameters")
    assert await page.query_selector("main img, main script") is None
    assert await page.evaluate("window.__pwned") is None


SNAPSHOT = {
    "tenant_id": TENANT,
    "generated_at": "2026-11-25T12:05:00Z",
    "minutes": [
        {
            "window": "1m",
            "start": f"2026-11-25T12:0{m}:00Z",
            "end": f"2026-11-25T12:0{m + 1}:00Z",
            "totals": {"calls": 3 * m + 1},
            "tools": {},
        }
        for m in (4, 3, 2)
    ],
    "hour": {
        "window": "1h",
        "start": "2026-11-25T11:10:00Z",
        "end": "2026-11-25T12:10:00Z",
        "totals": {
            "calls": 40,
            "by_status": {"success": 30, "error": 6, "permission_denied": 4},
            "by_error_code": {"timeout": 4, "tool_execution_error": 2},
        },
        "tools": {
            "core__echo": {"calls": 25, "p95_ms": 12.5},
            "core__long_running": {"calls": 15, "p95_ms": 2100.0},
        },
    },
    "anomalies": [
        {
            "id": "a1",
            "kind": "denial_spike",
            "summary": "did:agent:x was denied 4 times",
            "subject": "did:agent:x",
            "window_start": "2026-11-25T12:00:00Z",
            "observed": 4,
        }
    ],
}


async def test_tenant_charts_are_drawn_from_the_analytics_snapshot(
    fleet: tuple[Fleet, ProcessFleet], api_url: str, browser: Browser
) -> None:
    running, _ = fleet
    page = await browser.new_page(viewport={"width": 1280, "height": 1000})
    # The analytics worker's answer, as the API serves it once that worker runs.
    await page.route(
        f"**/v1/analytics/tenants/{TENANT}",
        lambda route: route.fulfill(
            status=200, content_type="application/json", body=json.dumps(SNAPSHOT)
        ),
    )
    # ... and as its live stream pushes it.
    await page.route(
        f"**/v1/analytics/tenants/{TENANT}/events",
        lambda route: route.fulfill(
            status=200,
            content_type="text/event-stream",
            body=f"id: 1\nevent: snapshot\ndata: {json.dumps(SNAPSHOT)}\n\n",
        ),
    )
    await _sign_in(page, api_url, running.token(TENANT, "did:user:viewer"))
    await page.wait_for_selector("#analytics figure svg.bar-chart")
    captions = await page.eval_on_selector_all(
        "#analytics figcaption", "items => items.map(i => i.textContent)"
    )
    assert captions == [
        "calls per minute",
        "outcomes by status, last hour",
        "errors by code, last hour",
        "calls per tool, last hour",
        "p95 duration per tool (ms), last hour",
        "anomalies",
    ]
    bars = await page.eval_on_selector_all("#analytics svg rect.bar", "items => items.length")
    assert bars == 3 + 3 + 2 + 2 + 2
    assert "denial_spike" in await page.inner_text("#analytics")
    # A viewer without the approver scope sees pending calls but no decision buttons.
    assert await page.eval_on_selector("body", "b => b.classList.contains('may-decide')") is False


async def _calls_charted(page: Page) -> int:
    """The calls the "calls per minute" chart shows, summed over its minutes."""
    total: int = await page.evaluate(
        """() => {
          const figure = [...document.querySelectorAll("#analytics figure")]
            .find((f) => f.querySelector("figcaption").textContent === "calls per minute");
          if (!figure) return 0;
          return [...figure.querySelectorAll("text.t-time")]
            .reduce((sum, t) => sum + Number(t.textContent), 0);
        }"""
    )
    return total


async def test_the_charts_follow_calls_made_while_the_page_is_open(
    fleet: tuple[Fleet, ProcessFleet], api_url: str, browser: Browser, tmp_path: Path
) -> None:
    running, procs = fleet
    tenant = f"t_charts_{uuid.uuid4().hex[:8]}"
    agent = "did:agent:charted"
    log_path = tmp_path / "analytics.log"
    analytics = _start_analytics(
        {**procs.env, "TOOLFLEET_ANALYTICS_SNAPSHOT_INTERVAL_S": "0.5"}, log_path
    )
    try:
        page = await browser.new_page(viewport={"width": 1280, "height": 1000})
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        navigations: list[str] = []
        page.on("framenavigated", lambda f: navigations.append(f.url))
        await _sign_in(page, api_url, running.token(tenant, "did:user:viewer"))
        assert await _calls_charted(page) == 0
        token = running.token(tenant, agent)
        body = {
            "tool_id": "core__echo",
            "agent_context": {"agent_did": agent, "tenant_id": tenant},
            "parameters": {"message": "chart me"},
        }
        made = 0
        for expected in (2, 3):  # two calls, then one more: each shows up, live
            while made < expected:
                await _invoke(api_url, token, body)
                made += 1

            async def charted(n: int = expected) -> bool:
                assert analytics.poll() is None, _text(log_path)
                return await _calls_charted(page) == n

            await eventually(charted, timeout=90, interval=0.2)
        # Pushed, not polled or reloaded: the snapshot was read once, then streamed.
        reads = [u for u in requests if u.endswith(f"/v1/analytics/tenants/{tenant}")]
        streams = [u for u in requests if u.endswith(f"/v1/analytics/tenants/{tenant}/events")]
        assert len(reads) == 1, reads
        assert len(streams) >= 1, streams
        assert [u for u in navigations if "/console" in u] == [f"{api_url}/console"]
    finally:
        kill_quietly(analytics)


async def test_a_long_open_list_keeps_at_most_its_cap_of_live_rows(
    fleet: tuple[Fleet, ProcessFleet], api_url: str, browser: Browser
) -> None:
    running, _ = fleet
    tenant = f"t_cap_{uuid.uuid4().hex[:8]}"
    page = await browser.new_page(viewport={"width": 1280, "height": 1000})
    await _sign_in(page, api_url, running.token(tenant, "did:user:viewer"))
    ids = [uuid.uuid4() for _ in range(CAP + 60)]
    start = datetime.now(UTC)
    conn = await asyncpg.connect(running.settings.database_url)
    try:
        # Live arrivals through the real feed (the projection's trigger notifies each row),
        # in batches as the projection commits them.
        for first in range(0, len(ids), 20):
            await conn.executemany(
                "INSERT INTO tool_invocations (invocation_id, tenant_id, agent_did, tool_id, "
                "status, status_rank, created_at) "
                "VALUES ($1, $2, 'did:agent:cap', 'core__echo', 'success', 3, $3)",
                [
                    (ids[n], tenant, start + timedelta(milliseconds=n))
                    for n in range(first, min(first + 20, len(ids)))
                ],
            )
            await page.wait_for_selector(_row(str(ids[min(first + 19, len(ids) - 1)])))
    finally:
        await conn.close()
    rows = await page.eval_on_selector_all(
        "#invocations tbody tr", "rows => rows.map(r => r.dataset.invocation)"
    )
    assert rows == [str(i) for i in reversed(ids)][:CAP]  # the newest, newest first
    # The older ones are a click away, through the same keyset paging as before.
    assert await page.is_visible("#more")
    await page.click("#more")
    await page.wait_for_selector(_row(str(ids[len(ids) - CAP - 50])))
    after = await page.eval_on_selector_all("#invocations tbody tr", "rows => rows.length")
    assert after == CAP + 50


async def test_sigterm_stops_the_api_while_a_console_follows_the_live_list(
    fleet: tuple[Fleet, ProcessFleet], tmp_path: Path
) -> None:
    running, procs = fleet
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**procs.env, "TOOLFLEET_API_PORT": str(port), "TOOLFLEET_DRAIN_TIMEOUT_S": "1"}
    log_path = tmp_path / "api.log"
    proc = _start_api(env, log_path)
    try:
        await _serving(proc, url, log_path)
        headers = {"Authorization": f"Bearer {running.token(TENANT, APPROVER)}"}
        async with (
            httpx.AsyncClient(base_url=url, timeout=30) as http,
            http.stream("GET", "/v1/events/invocations", headers=headers) as feed,
        ):
            lines = feed.aiter_lines()
            while (await anext(lines)) != "event: snapshot":
                pass
            stopping = time.monotonic()
            proc.send_signal(signal.SIGTERM)

            async def exited() -> bool:
                return proc.poll() is not None

            await eventually(exited, timeout=20)
        assert time.monotonic() - stopping < 10, "an open stream held up the shutdown"
        # uvicorn re-raises the signal it handled once it has shut down.
        assert proc.returncode in {0, -signal.SIGTERM}, _text(log_path)
    finally:
        kill_quietly(proc)
