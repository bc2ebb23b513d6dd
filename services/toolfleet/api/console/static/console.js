// toolfleet console: one small script, no build step, no dependencies.
// The token lives in sessionStorage and travels only in the Authorization header:
// never in a URL, never in the page, never logged. Every value from the API is put
// on the page as text (textContent), never parsed as HTML.
"use strict";

(() => {
  const TOKEN_KEY = "toolfleet.console.token";
  const PAGE_SIZE = 50;
  // Rows the live list keeps: past it the oldest go (the "Older calls" button pages them
  // back in), so a tab left open for days holds a bounded DOM. Each page asked for with
  // that button raises it by a page.
  const MAX_ROWS = 200;
  const FILTERS = ["status", "tool_id", "agent", "since", "until", "invocation_id"];
  const $ = (selector) => document.querySelector(selector);
  const state = { me: null, rows: new Map(), pending: new Map(), selected: null, stop: null, cursor: null, filters: {}, maxRows: MAX_ROWS };

  // --- small DOM helpers --------------------------------------------------------------
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (key === "class") node.className = value;
      else if (key === "data") for (const [k, v] of Object.entries(value)) node.dataset[k] = v;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  const SVG_NS = "http://www.w3.org/2000/svg";
  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }
  const show = (node, visible) => { node.hidden = !visible; };
  const when = (iso) => (iso ? new Date(iso).toLocaleTimeString() : "");
  const stamp = (iso) => (iso ? new Date(iso).toLocaleString() : "");
  const ms = (n) => (n >= 1000 ? `${(n / 1000).toFixed(2)} s` : `${n} ms`);
  const sleep = (t) => new Promise((resolve) => setTimeout(resolve, t));
  function debounce(fn, wait) {
    let timer = null;
    return (...args) => { clearTimeout(timer); timer = setTimeout(() => fn(...args), wait); };
  }

  // --- the API ------------------------------------------------------------------------
  function token() { return sessionStorage.getItem(TOKEN_KEY); }
  function authHeaders(extra) {
    return { Authorization: `Bearer ${token()}`, Accept: "application/json", ...(extra || {}) };
  }
  async function api(path, options) {
    const response = await fetch(path, {
      ...(options || {}),
      headers: authHeaders((options || {}).headers),
      credentials: "omit",
      cache: "no-store",
    });
    if (response.status === 401) signOut("Your token was refused (expired or revoked).");
    return response;
  }
  async function problem(response) {
    try { return (await response.json()).detail || response.statusText; }
    catch { return response.statusText; }
  }

  // --- sign in and out ----------------------------------------------------------------
  async function signIn(candidate) {
    sessionStorage.setItem(TOKEN_KEY, candidate);
    const response = await api("/v1/me");
    if (!response.ok) {
      sessionStorage.removeItem(TOKEN_KEY);
      const error = $("#sign-in-error");
      error.textContent = response.status === 401 ? "That token was refused." : await problem(response);
      show(error, true);
      return;
    }
    state.me = await response.json();
    $("#token").value = "";
    show($("#sign-in-error"), false);
    const scopes = state.me.scopes.length ? ` · ${state.me.scopes.join(" ")}` : "";
    $("#who").textContent = `${state.me.subject} · ${state.me.admin ? "every tenant" : state.me.tenant_id}${scopes}`;
    document.body.classList.toggle("may-decide", state.me.may_decide);
    show($("#who"), true);
    show($("#sign-out"), true);
    show($("#sign-in"), false);
    show($("#console"), true);
    if (document.body.dataset.page === "invocation") {
      loadCall(document.body.dataset.invocation);
      return;
    }
    readFilters();
    if (state.stop) state.stop.abort();
    state.stop = new AbortController(); // ends both streams at sign-out
    loadList(false).then(follow);
    loadApprovals();
    loadCircuits();
    searchTools("");
    loadAnalytics().then(followAnalytics);
  }

  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    if (state.stop) state.stop.abort();
    state.stop = null;
    state.me = null;
    state.rows.clear();
    state.pending.clear();
    state.selected = null;
    state.cursor = null;
    state.maxRows = MAX_ROWS;
    show($("#console"), false);
    show($("#who"), false);
    show($("#sign-out"), false);
    show($("#sign-in"), true);
    const error = $("#sign-in-error");
    error.textContent = message || "";
    show(error, Boolean(message));
  }

  // --- live list and charts: Server-Sent Events over fetch ---------------------------
  // EventSource cannot send an Authorization header, and a token must not go in a URL,
  // so a stream is read with fetch and parsed here (text/event-stream framing). Both
  // streams stop with the same AbortController (sign-out).
  async function stream(path, stop, onEvent, onState) {
    let backoff = 500;
    while (!stop.signal.aborted) {
      try {
        const response = await fetch(path, {
          headers: authHeaders({ Accept: "text/event-stream" }),
          signal: stop.signal,
          cache: "no-store",
          credentials: "omit",
        });
        if (response.status === 401) { signOut("Your token was refused (expired or revoked)."); return; }
        if (response.status === 404) return; // nothing to follow (no analytics route)
        if (!response.ok || !response.body) throw new Error(`stream answered ${response.status}`);
        onState("live");
        backoff = 500;
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value.replace(/\r\n/g, "\n");
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            const parsed = parseEvent(buffer.slice(0, end));
            buffer = buffer.slice(end + 2);
            if (!parsed) continue;
            if (parsed.event === "stream_closed") {
              // The token ended (revoked or expired): the server closes the stream; so do we.
              signOut(parsed.payload.reason === "token_expired"
                ? "Your token has expired."
                : "Your token was revoked.");
              return;
            }
            onEvent(parsed.event, parsed.payload);
          }
        }
      } catch (error) {
        if (stop.signal.aborted) return;
      }
      onState("reconnecting");
      await sleep(backoff);
      backoff = Math.min(backoff * 2, 10000);
    }
  }

  function follow() {
    if (!state.stop) return undefined;
    return stream("/v1/events/invocations", state.stop, dispatch, setLive);
  }

  // The charts follow the analytics worker's snapshots, pushed as it writes them.
  function followAnalytics() {
    const stop = state.stop;
    if (!stop || !state.me) return undefined;
    const tenant = encodeURIComponent(state.me.tenant_id);
    return stream(`/v1/analytics/tenants/${tenant}/events`, stop, (event, payload) => {
      if (event === "snapshot") renderAnalytics(payload);
    }, (text) => { $("#analytics").dataset.live = text; });
  }

  function setLive(text) {
    const badge = $("#live");
    badge.textContent = text;
    badge.dataset.state = text;
  }

  function parseEvent(block) {
    let event = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") event = value;
      else if (field === "data") data.push(value);
    }
    if (!data.length) return null;
    return { event, payload: JSON.parse(data.join("\n")) };
  }

  function dispatch(event, payload) {
    if (event === "snapshot") {
      // The newest calls: merged into the list (which may hold older pages), filtered.
      for (const item of payload.items) if (matches(item)) state.rows.set(item.invocation_id, item);
      renderRows();
      for (const item of payload.items) trackApproval(item);
    } else if (event === "invocation") {
      const before = state.rows.get(payload.invocation_id);
      if (before || matches(payload)) state.rows.set(payload.invocation_id, payload);
      renderRows();
      trackApproval(payload);
      if (payload.invocation_id === state.selected) refreshTimeline();
      const finished = ["success", "error", "timeout", "cancelled", "permission_denied"];
      if (finished.includes(payload.status) && (!before || before.status !== payload.status)) {
        if (payload.error && payload.error.code === "circuit_breaker_open") refreshCircuits();
      }
    }
  }

  // --- the list: filters from the URL (a view is a link), pages by keyset cursor -------
  function readFilters() {
    const query = new URLSearchParams(window.location.search);
    state.filters = {};
    for (const name of FILTERS) {
      const value = (query.get(name) || "").trim();
      if (value) state.filters[name] = value;
    }
    const form = $("#filters");
    for (const name of FILTERS) {
      const input = form.elements[name];
      const value = state.filters[name] || "";
      input.value = input.type === "datetime-local" && value ? localInput(value) : value;
    }
  }

  // datetime-local inputs hold local wall time without an offset; the API wants an instant.
  function localInput(iso) {
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return "";
    const pad = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
  }
  function instant(value) {
    const d = new Date(value);
    return Number.isNaN(d.getTime()) ? "" : d.toISOString();
  }

  function matches(item) {
    const f = state.filters;
    if (f.status && item.status !== f.status) return false;
    if (f.tool_id && item.tool_id !== f.tool_id) return false;
    if (f.agent && item.agent_did !== f.agent) return false;
    // The id filter is an id or its prefix (the short id the list shows).
    if (f.invocation_id && !String(item.invocation_id).startsWith(f.invocation_id.toLowerCase())) return false;
    if (f.since && new Date(item.created_at) < new Date(f.since)) return false;
    if (f.until && new Date(item.created_at) >= new Date(f.until)) return false;
    return true;
  }

  async function loadList(more) {
    const query = new URLSearchParams({ ...state.filters, limit: String(PAGE_SIZE) });
    if (more && state.cursor) query.set("cursor", state.cursor);
    const response = await api(`/v1/console/invocations?${query}`);
    const note = $("#invocations-error");
    if (!response.ok) {
      note.textContent = await problem(response);
      show(note, true);
      return;
    }
    show(note, false);
    const page = await response.json();
    if (!more) state.rows.clear();
    else state.maxRows += PAGE_SIZE; // asked for: kept beside the live rows
    for (const item of page.items) state.rows.set(item.invocation_id, item);
    state.cursor = page.next_cursor;
    show($("#more"), Boolean(state.cursor));
    renderRows();
    if (!more && state.filters.invocation_id && page.items.length === 1) select(page.items[0].invocation_id);
  }

  function duration(item) {
    if (item.status === "pending_approval") return "waiting";
    if (!item.completed_at) return item.status === "running" ? "running" : "";
    const start = new Date(item.started_at || item.created_at);
    return ms(Math.max(0, new Date(item.completed_at) - start));
  }

  // The key of the list's order, as the API's opaque cursor encodes it: paging on from
  // a row the cap dropped the older rows after.
  function cursorAfter(item) {
    const raw = JSON.stringify({ c: item.created_at, i: item.invocation_id });
    return btoa(raw).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  function newestFirst(a, b) {
    if (a.created_at !== b.created_at) return new Date(a.created_at) < new Date(b.created_at) ? 1 : -1;
    return a.invocation_id < b.invocation_id ? 1 : -1;
  }

  function renderRows() {
    let items = [...state.rows.values()].sort(newestFirst);
    if (items.length > state.maxRows) {
      // Over the cap: drop the oldest; "Older calls" pages on from the oldest kept.
      for (const item of items.slice(state.maxRows)) state.rows.delete(item.invocation_id);
      items = items.slice(0, state.maxRows);
      state.cursor = cursorAfter(items[items.length - 1]);
      show($("#more"), true);
    }
    const body = $("#invocations tbody");
    body.replaceChildren(...items.map((item) => el(
      "tr",
      {
        data: { invocation: item.invocation_id, status: item.status },
        class: item.invocation_id === state.selected ? "selected" : "",
        tabindex: "0",
        onclick: () => select(item.invocation_id),
        onkeydown: (e) => { if (e.key === "Enter") select(item.invocation_id); },
      },
      el("td", { class: "id" }, el("a", {
        href: `/console/invocations/${encodeURIComponent(item.invocation_id)}`,
        title: item.invocation_id,
      }, String(item.invocation_id).slice(0, 8))),
      el("td", {}, item.tool_id, item.tool_version ? el("span", { class: "muted" }, ` @${item.tool_version}`) : null),
      el("td", { title: item.agent_did || "" }, item.agent_did || ""),
      el("td", {}, el("span", { class: `status s-${item.status}` }, item.status)),
      el("td", {}, duration(item)),
      el("td", {}, item.error && item.error.code ? item.error.code : ""),
      el("td", {}, stamp(item.created_at)),
    )));
    show($("#invocations-empty"), items.length === 0);
  }

  // --- timeline -----------------------------------------------------------------------
  function select(id) {
    state.selected = id;
    renderRows();
    refreshTimeline();
  }

  async function refreshTimeline() {
    const id = state.selected;
    if (!id) return;
    const response = await api(`/v1/invocations/${encodeURIComponent(id)}/timeline`);
    if (!response.ok || id !== state.selected) return;
    renderTimeline(await response.json());
  }

  // The executor pool of a call, where one of its steps names it (outside "default").
  function poolFacts(steps) {
    const named = steps.find((s) => s.detail && s.detail.pool);
    return named ? [el("li", {}, `pool ${named.detail.pool}`)] : [];
  }

  // What the call's time means in its state: a pending call waits, a running one runs.
  function timeFact(t) {
    const since = t.steps.length ? stamp(t.steps[0].at) : "";
    if (t.status === "pending_approval") return `waiting for approval since ${since}`;
    if (t.status === "queued") return `queued since ${since}`;
    if (t.duration_ms === null) return "running";
    return `duration ${ms(t.duration_ms)}`;
  }

  function renderTimeline(t) {
    $("#timeline-title").textContent = `${t.tool_id} · ${t.invocation_id}`;
    const facts = el(
      "ul", { class: "facts" },
      el("li", {}, "status ", el("span", { class: `status s-${t.status}` }, t.status)),
      el("li", {}, timeFact(t)),
      el("li", {}, t.attempts ? `attempts ${t.attempts}` : "not run"),
      el("li", {}, `resumes ${t.resumes}`),
      el("li", {}, `worker hand-overs ${t.handovers}`),
      ...poolFacts(t.steps),
    );
    const steps = t.steps;
    const total = Math.max(1, ...steps.map((s) => s.since_start_ms));
    const rowHeight = 26;
    const width = 720;
    const left = 230;
    const chart = svg("svg", {
      viewBox: `0 0 ${width} ${steps.length * rowHeight + 24}`,
      class: "timeline-chart",
      role: "img",
      "aria-label": "timeline of the invocation",
    });
    steps.forEach((step, i) => {
      const y = i * rowHeight + 4;
      const next = steps[i + 1];
      const start = left + ((width - left - 10) * step.since_start_ms) / total;
      const end = next ? left + ((width - left - 10) * next.since_start_ms) / total : start;
      chart.append(svg("text", { x: 4, y: y + 15, class: "t-label" }, step.label));
      chart.append(svg("rect", {
        x: start, y: y + 3, width: Math.max(4, end - start), height: rowHeight - 8, rx: 3,
        class: `t-bar k-${step.kind}`,
      }));
      // The time beside the bar: after it where it fits, else before it.
      const after = end + 6 + 70 <= width;
      chart.append(svg("text", {
        x: after ? end + 6 : start - 6, y: y + 15, class: "t-time", "text-anchor": after ? "start" : "end",
      }, `+${ms(step.since_start_ms)}`));
    });
    chart.append(svg("text", { x: left, y: steps.length * rowHeight + 18, class: "t-axis" }, "0"));
    chart.append(svg("text", { x: width - 70, y: steps.length * rowHeight + 18, class: "t-axis" }, ms(total)));
    const list = el("ol", { class: "steps" }, ...steps.map((step) => el(
      "li", { data: { kind: step.kind } },
      el("strong", {}, step.label), ` at ${when(step.at)} `,
      el("span", { class: "muted" }, `(+${ms(step.since_previous_ms)})`),
      step.detail.worker_id ? el("span", { class: "muted" }, ` on ${step.detail.worker_id}`) : null,
      step.detail.reason ? el("span", { class: "muted" }, ` (${step.detail.reason})`) : null,
    )));
    $("#timeline").replaceChildren(facts, chart, list);
  }

  // --- one call's page (/console/invocations/{id}) -----------------------------------
  async function loadCall(id) {
    const response = await api(`/v1/console/invocations/${encodeURIComponent(id)}`);
    if (!response.ok) {
      // Another tenant's call and a missing one read the same.
      show($("#call-missing"), true);
      $("#call-missing").textContent = response.status === 404 ? "No such invocation." : await problem(response);
      $("#timeline").replaceChildren(el("p", { class: "empty" }, "No timeline."));
      return;
    }
    const call = await response.json();
    const item = call.invocation;
    $("#call-facts").replaceChildren(
      el("li", {}, "tool ", el("strong", {}, item.tool_id), item.tool_version ? ` @${item.tool_version}` : ""),
      el("li", {}, `agent ${item.agent_did || "unknown"}`),
      el("li", {}, `tenant ${item.tenant_id}`),
      el("li", {}, `created ${stamp(item.created_at)}`),
      el("li", {}, "trace ", el("code", { id: "call-trace" }, item.trace_id || "none")),
      item.warnings.length ? el("li", {}, `warnings: ${item.warnings.join("; ")}`) : null,
    );
    const error = item.error || null;
    show($("#call-error"), Boolean(error));
    if (error) {
      $("#call-error-code").textContent = error.code || "";
      $("#call-error-message").textContent = error.message || "";
    }
    $("#call-parameters").textContent = call.parameters ? JSON.stringify(call.parameters, null, 2) : "(not recorded)";
    $("#call-hash").textContent = call.parameters_hash || "none";
    $("#call-result").textContent = item.result ? JSON.stringify(item.result, null, 2).slice(0, 20000) : "(no result)";
    const attachments = ((item.result || {}).attachments || []).filter((a) => a && typeof a === "object");
    $("#call-attachments").replaceChildren(...attachments.map((a) => {
      const url = typeof a.url === "string" && /^(https?:\/\/|\/(?!\/))/.test(a.url) ? a.url : null;
      const name = a.name || a.filename || a.url || "attachment";
      return el("li", {}, url ? el("a", { href: url, rel: "noopener noreferrer" }, String(name)) : String(name));
    }));
    state.selected = id;
    refreshTimeline();
  }

  // --- approvals ----------------------------------------------------------------------
  async function loadApprovals() {
    const response = await api("/v1/invocations?status=pending_approval&limit=100");
    if (!response.ok) return;
    for (const item of (await response.json()).items) trackApproval(item);
  }

  function trackApproval(item) {
    if (item.status === "pending_approval") state.pending.set(item.invocation_id, item);
    else state.pending.delete(item.invocation_id);
    renderApprovals();
  }

  function renderApprovals() {
    const cards = [...state.pending.values()].map((item) => {
      const approval = item.approval || {};
      const note = el("p", { class: "note", role: "status" });
      const reason = el("textarea", { class: "reason", rows: "2", maxlength: "1024", placeholder: "reason (optional)", "aria-label": "reason" });
      const decide = async (verb) => {
        const body = approval.parameters_hash ? { parameters_hash: approval.parameters_hash } : {};
        if (reason.value.trim()) body.reason = reason.value.trim();
        const response = await api(`/v1/invocations/${encodeURIComponent(item.invocation_id)}/${verb}`, {
          method: "POST",
          headers: { "Content-Type": "application/json" },
          body: JSON.stringify(body),
        });
        note.textContent = response.ok ? (await response.json()).message : await problem(response);
      };
      const actions = state.me && state.me.may_decide
        ? el("div", {},
            reason,
            el("div", { class: "actions" },
              el("button", { type: "button", class: "approve", onclick: () => decide("approve") }, "Approve"),
              el("button", { type: "button", class: "deny", onclick: () => decide("deny") }, "Deny")))
        : el("p", { class: "muted" }, "An approver or admin token can decide this call.");
      return el(
        "article", { class: "approval", data: { invocation: item.invocation_id } },
        el("h3", {}, approval.tool_id || item.tool_id, el("span", { class: "muted" }, ` @${approval.tool_version || item.tool_version || "?"}`)),
        el("p", { class: "muted" }, `${item.tenant_id} · requested by ${item.agent_did || "unknown"} · ${when(item.created_at)}`),
        el("pre", { class: "parameters wrap" }, JSON.stringify(approval.parameters ?? {}, null, 2)),
        el("p", { class: "muted hash" }, "parameters_hash ", el("code", {}, approval.parameters_hash || "none")),
        el("p", {}, el("a", { href: `/console/invocations/${encodeURIComponent(item.invocation_id)}` }, "open the call")),
        actions,
        note,
      );
    });
    $("#approvals").replaceChildren(...cards);
    show($("#approvals-empty"), cards.length === 0);
  }

  // --- circuits -----------------------------------------------------------------------
  async function loadCircuits() {
    const response = await api("/v1/circuits");
    if (!response.ok) return;
    const circuits = await response.json();
    $("#circuits tbody").replaceChildren(...circuits.map((c) => el(
      "tr", { data: { circuit: c.circuit_name, state: c.state } },
      el("td", {}, c.circuit_name),
      el("td", {}, el("span", { class: `status c-${c.state}` }, c.state)),
      el("td", {}, c.since ? new Date(c.since).toLocaleString() : ""),
    )));
    show($("#circuits-empty"), circuits.length === 0);
  }
  const refreshCircuits = debounce(loadCircuits, 1000);

  // --- tool catalog -------------------------------------------------------------------
  async function searchTools(q) {
    const query = new URLSearchParams({ page_size: "50" });
    if (q) query.set("q", q);
    const response = await api(`/v1/tools?${query}`);
    if (!response.ok) return;
    const page = await response.json();
    const items = page.items.map((tool) => el(
      "li", { data: { tool: tool.tool_id } },
      el("strong", {}, tool.tool_id), " ",
      el("span", { class: "muted" }, tool.versions.map((v) => `${v.version} ${v.lifecycle_state}`).join(", ")),
      el("div", {}, tool.description),
    ));
    $("#tools").replaceChildren(...(items.length ? items : [el("li", { class: "empty" }, "No tool matches.")]));
  }

  // --- per-tenant charts (served by the analytics worker's endpoint) ------------------
  async function loadAnalytics() {
    const tenant = state.me.tenant_id;
    $("#analytics-tenant").textContent = tenant;
    let data = null;
    try {
      const response = await api(`/v1/analytics/tenants/${encodeURIComponent(tenant)}`);
      if (response.ok) data = await response.json();
    } catch { data = null; }
    renderAnalytics(data);
  }

  function renderAnalytics(data) {
    const charts = data ? (isSnapshot(data) ? snapshotCharts(data) : chartsOf(data)) : [];
    $("#analytics").replaceChildren(...(charts.length
      ? charts
      : [el("p", { class: "empty" }, "No analytics for this tenant yet.")]));
  }

  // The analytics worker's tenant snapshot: newest 1 minute windows, the 1 hour window,
  // recent anomalies.
  function isSnapshot(data) {
    return data && Array.isArray(data.minutes) && "hour" in data;
  }

  function snapshotCharts(data) {
    const charts = [];
    const minutes = [...data.minutes].reverse();
    if (minutes.length) {
      charts.push(barChart("calls per minute", minutes.map((w) => [when(w.start), w.totals.calls])));
    }
    const hour = data.hour;
    if (hour) {
      const entries = (o) => Object.entries(o || {});
      const tools = entries(hour.tools);
      if (entries(hour.totals.by_status).length) charts.push(barChart("outcomes by status, last hour", entries(hour.totals.by_status)));
      if (entries(hour.totals.by_error_code).length) charts.push(barChart("errors by code, last hour", entries(hour.totals.by_error_code)));
      if (tools.length) charts.push(barChart("calls per tool, last hour", tools.map(([t, s]) => [t, s.calls])));
      const p95 = tools.filter(([, s]) => typeof s.p95_ms === "number").map(([t, s]) => [t, s.p95_ms]);
      if (p95.length) charts.push(barChart("p95 duration per tool (ms), last hour", p95));
    }
    if ((data.anomalies || []).length) {
      charts.push(el("figure", { class: "chart" }, el("figcaption", {}, "anomalies"),
        el("ul", { class: "anomalies" }, ...data.anomalies.slice(0, 10).map((a) =>
          el("li", {}, el("strong", {}, a.kind), ` ${a.summary} `, el("span", { class: "muted" }, when(a.window_start)))))));
    }
    return charts;
  }

  // Any other shape: any object of numbers (outcomes by status, calls per tool, ...) becomes a
  // bar chart, and so does a list of objects with a label and a number; at most six.
  function chartsOf(data) {
    const found = [];
    const walk = (value, path) => {
      if (found.length >= 6 || value === null || typeof value !== "object") return;
      if (Array.isArray(value)) {
        const bars = value
          .filter((v) => v && typeof v === "object")
          .map((v) => {
            const label = Object.values(v).find((x) => typeof x === "string");
            const number = Object.entries(v).find(([, x]) => typeof x === "number");
            return label && number ? [label, number[1], number[0]] : null;
          })
          .filter(Boolean);
        if (bars.length) found.push(barChart(`${path} (${bars[0][2]})`, bars));
        return;
      }
      const numbers = Object.entries(value).filter(([, v]) => typeof v === "number");
      if (numbers.length && numbers.length === Object.keys(value).length) {
        found.push(barChart(path || "totals", numbers));
        return;
      }
      for (const [key, child] of Object.entries(value)) walk(child, path ? `${path}.${key}` : key);
    };
    walk(data, "");
    return found;
  }

  function barChart(title, bars) {
    const max = Math.max(1, ...bars.map(([, n]) => n));
    const height = bars.length * 22 + 8;
    const chart = svg("svg", { viewBox: `0 0 360 ${height}`, class: "bar-chart", role: "img", "aria-label": title });
    bars.slice(0, 20).forEach(([label, n], i) => {
      const y = i * 22 + 4;
      chart.append(svg("text", { x: 2, y: y + 14, class: "t-label" }, String(label).slice(0, 22)));
      chart.append(svg("rect", { x: 150, y: y + 2, width: Math.max(2, (170 * n) / max), height: 16, rx: 2, class: "bar" }));
      chart.append(svg("text", { x: 154 + (170 * n) / max, y: y + 14, class: "t-time" }, String(Math.round(n * 100) / 100)));
    });
    return el("figure", { class: "chart" }, el("figcaption", {}, title), chart);
  }

  // --- wiring -------------------------------------------------------------------------
  document.addEventListener("DOMContentLoaded", () => {
    $("#sign-in-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const candidate = $("#token").value.trim();
      if (candidate) signIn(candidate);
    });
    $("#sign-out").addEventListener("click", () => signOut(""));
    if (document.body.dataset.page === "invocation") {
      if (token()) signIn(token());
      return;
    }
    $("#more").addEventListener("click", () => loadList(true));
    $("#filters").addEventListener("submit", (event) => {
      // The view becomes the page's URL: empty filters are left out, times become instants.
      event.preventDefault();
      const form = event.target;
      const query = new URLSearchParams();
      for (const name of FILTERS) {
        const input = form.elements[name];
        const value = input.value.trim();
        if (!value) continue;
        query.set(name, input.type === "datetime-local" ? instant(value) : value);
      }
      const text = query.toString();
      window.location.assign(text ? `/console?${text}` : "/console");
    });
    const search = debounce(() => searchTools($("#tool-q").value.trim()), 250);
    $("#tool-q").addEventListener("input", search);
    $("#tool-search").addEventListener("submit", (event) => { event.preventDefault(); search(); });
    if (token()) signIn(token());
  });
})();
