// The live data panel: a data session, rows pushed over REST, events over SSE
// (the data API in docs/api.md). Loaded after app.js: uses its authHeaders() and canCall().
"use strict";
(() => {
  const el = (id) => document.getElementById(id);
  const params = new URLSearchParams(location.search);
  const LAST_ROWS = 10;
  const RECONNECT_MS = 1000;
  // The first {n} of a page: far above the ids of the Spider sample databases,
  // so sample rows do not collide with the rows a database already holds.
  const FIRST_N = 1000000;
  const TABLES_SQL = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name";

  let sid = null, abort = null, lastEventId = "", counter = FIRST_N, sampleTable = 0;
  let version = 0, ingested = 0, numPushed = 0;
  let pushed = [];            // [{seq, table, values, state}], oldest first, at most LAST_ROWS
  const flash = new Map();    // qid -> {id, question, answer}

  function setError(text) { el("data-error").textContent = text || ""; }

  async function api(method, path, body) {
    const headers = { ...authHeaders(), ...(body === undefined ? {} : { "Content-Type": "application/json" }) };
    const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const data = await resp.json().catch(() => ({}));
    if (!resp.ok) throw new Error(`${data.code || resp.status}: ${data.message || resp.statusText}`);
    return data;
  }

  async function start() {
    if (params.get("view") === "data") el("typing-panel").hidden = true;
    el("data-open").addEventListener("click", () => openSession().catch((e) => setError("open: " + e.message)));
    el("data-push").addEventListener("click", () => pushRows().catch((e) => setError("push: " + e.message)));
    el("data-sample").addEventListener("click", () => sampleRows().catch((e) => setError("sample: " + e.message)));
    el("flash-add").addEventListener("click", () => register().catch((e) => setError("register: " + e.message)));
    el("flash-question").addEventListener("keydown", (ev) => { if (ev.key === "Enter") el("flash-add").click(); });
    el("token").addEventListener("change", () => loadDatabases());
    await loadDatabases();
  }

  async function loadDatabases() {
    if (!(await canCall())) { el("data-status").textContent = "enter the token above"; return; }
    el("data-status").textContent = "";
    let databases;
    try { ({ databases } = await api("GET", "/v1/databases")); } catch (e) { setError("databases: " + e.message); return; }
    const wanted = params.get("data_db") || params.get("db") || "world_1";
    el("data-db").innerHTML = "";
    for (const d of databases) {
      const opt = new Option(d.id, d.id, false, d.id === wanted);
      opt.dataset.canExecute = d.can_execute;
      el("data-db").add(opt);
    }
  }

  async function openSession() {
    setError("");
    if (sid) closeSession();
    const db = el("data-db").value;
    el("data-status").textContent = "opening…";
    const opened = await api("POST", "/v1/data", { db });
    sid = opened.session_id;
    version = opened.data_version || 0; ingested = 0; numPushed = 0; pushed = []; lastEventId = "";
    flash.clear();
    el("data-status").textContent = `data session ${sid.slice(0, 8)} on ${opened.db || db}`;
    el("data-status").dataset.session = sid;
    for (const id of ["data-push", "data-sample", "flash-add", "flash-question"]) el(id).disabled = false;
    showCounts(); showRows(); showFlash();
    abort = new AbortController();
    subscribe(sid, abort.signal);
    await loadFlash();
    if (!el("data-rows").value.trim()) await sampleRows().catch((e) => setError("sample rows: " + e.message));
  }

  function closeSession() {
    abort.abort();
    const old = sid;
    sid = null;
    api("DELETE", `/v1/data/${old}`).catch(() => {});  // best effort: the gateway also expires idle sessions
  }

  // ---- rows -------------------------------------------------------------------------

  // A template's string "{n}" becomes the row's number, "{r}" a random number; inside a
  // longer string both are replaced as text. All {n} of one row share one number.
  function expand(value, n) {
    if (value === "{n}") return n;
    if (value === "{r}") return Math.round(Math.random() * 10000) / 100;
    if (typeof value === "string") return value.replaceAll("{n}", String(n)).replaceAll("{r}", String(Math.random()));
    if (Array.isArray(value)) return value.map((v) => expand(v, n));
    if (value && typeof value === "object") return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, expand(v, n)]));
    return value;
  }

  function rowsToPush() {
    let template;
    try { template = JSON.parse(el("data-rows").value); } catch (e) { throw new Error("the rows are not JSON: " + e.message); }
    template = Array.isArray(template) ? template : [template];
    const repeat = Math.max(1, Math.min(500, parseInt(el("data-repeat").value, 10) || 1));
    const rows = [];
    for (let i = 0; i < repeat; i++) for (const row of template) rows.push(expand(row, counter++));
    return rows;
  }

  async function pushRows() {
    setError("");
    const rows = rowsToPush();
    const ack = await api("POST", `/v1/data/${sid}/rows`, { rows });
    numPushed += rows.length;
    const dropped = new Set(ack.dropped_seqs || []);
    rows.forEach((row, i) => {
      const seq = ack.seqs[i];
      pushed.push({ seq, table: row.table, values: row.values, state: dropped.has(seq) ? "dropped" : stateOf(seq) });
    });
    pushed = pushed.slice(-LAST_ROWS);
    if (ack.dropped_total !== undefined) el("data-dropped").dataset.dropped = ack.dropped_total;
    showCounts(); showRows();
  }

  // Sample rows for the chosen database: a template made from a row of one of its tables
  // (the next table on each press), read with read-only Runs: integers count up ({n}: a
  // fresh key), other numbers are random ({r}), text keeps the example's value.
  async function sampleRows() {
    const opt = el("data-db").selectedOptions[0];
    if (!opt || opt.dataset.canExecute !== "true") return;
    const db = opt.value;
    const tables = (await api("POST", "/v1/execute", { db, sql: TABLES_SQL })).rows.map((r) => r[0]);
    if (!tables.length) return;
    const table = tables[sampleTable++ % tables.length];
    const example = await api("POST", "/v1/execute", { db, sql: `SELECT * FROM "${table.replaceAll('"', '""')}" LIMIT 1` });
    const row = example.rows[0] || [];
    const values = {};
    example.columns.forEach((column, i) => {
      const v = row[i];
      values[column] = typeof v === "number" ? (Number.isInteger(v) ? "{n}" : "{r}") : v === undefined ? `${column} {n}` : v;
    });
    el("data-rows").value = "[\n" + JSON.stringify({ table, values }) + "\n]";
  }

  function stateOf(seq) { return seq <= version ? "ingested" : "buffered"; }

  function showCounts() {
    el("data-version").textContent = `version ${version}`;
    el("data-version").dataset.version = version;
    el("data-count").textContent = `${ingested} rows ingested`;
    el("data-count").dataset.rows = ingested;
    el("data-pushed").textContent = `${numPushed} rows pushed`;
    el("data-pushed").dataset.rows = numPushed;
    el("data-dropped").textContent = `${el("data-dropped").dataset.dropped || 0} dropped`;
  }

  function showRows() {
    if (!pushed.length) { el("data-last").replaceChildren(); return; }
    el("data-last").replaceChildren(table(["seq", "table", "values", "state"],
      pushed.slice().reverse().map((r) => [r.seq, r.table, JSON.stringify(r.values), r.state])));
  }

  function table(columns, rows) {
    const t = document.createElement("table");
    const head = t.insertRow();
    for (const c of columns) head.appendChild(Object.assign(document.createElement("th"), { textContent: c }));
    for (const row of rows) {
      const tr = t.insertRow();
      for (const v of row) tr.insertCell().textContent = v === null ? "NULL" : String(v);
    }
    return t;
  }

  // ---- events (SSE over fetch: EventSource cannot send the bearer token) ------------

  async function subscribe(id, signal) {
    while (!signal.aborted) {
      try {
        const headers = { Accept: "text/event-stream", ...authHeaders() };
        // resume after the last event seen; none yet: from the session's first ("0"), so
        // nothing pushed before this (re)subscription answered is missed
        headers["Last-Event-ID"] = lastEventId || "0";
        const resp = await fetch(`/v1/data/${id}/events`, { headers, signal });
        if (resp.status === 404) {  // closed (here, by another client, or expired): nothing to resume
          el("data-status").dataset.events = "closed";
          el("data-status").textContent = `data session ${id.slice(0, 8)} is closed`;
          return;
        }
        if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
        el("data-status").dataset.events = "open";
        await readEvents(resp.body.pipeThrough(new TextDecoderStream()).getReader());
      } catch (e) {
        if (signal.aborted) return;
        el("data-status").dataset.events = "retrying: " + e.message;
      }
      await new Promise((r) => setTimeout(r, RECONNECT_MS));
    }
  }

  async function readEvents(reader) {
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer = (buffer + value).replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        parseEvent(block);
      }
    }
  }

  function parseEvent(block) {
    let kind = "message", id = null;
    const data = [];
    for (const line of block.split("\n")) {
      if (!line || line.startsWith(":")) continue;  // a comment: the server's keep-alive
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") kind = value;
      else if (field === "data") data.push(value);
      else if (field === "id") id = value;
    }
    if (id !== null) lastEventId = id;
    if (!data.length) return;
    let payload = JSON.parse(data.join("\n"));
    if (kind === "message" && payload.kind) kind = payload.kind;  // kind in the data, not the SSE event name
    if (payload.payload && payload.kind) payload = payload.payload;
    onEvent(kind, payload);
  }

  function onEvent(kind, p) {
    if (kind === "data_updated") {
      version = Math.max(version, p.version || 0);
      ingested += p.rows_added || 0;
      if (p.dropped_total !== undefined) el("data-dropped").dataset.dropped = p.dropped_total;
      for (const r of pushed) if (r.state === "buffered") r.state = stateOf(r.seq);
      showCounts(); showRows();
    } else if (kind === "rows_dropped") {
      const seqs = new Set(p.dropped_seqs || p.seqs || []);
      for (const r of pushed) if (seqs.has(r.seq)) r.state = "dropped";
      if (p.dropped_total !== undefined) el("data-dropped").dataset.dropped = p.dropped_total;
      showCounts(); showRows();
    } else if (kind === "flash_ready") {
      const entry = flash.get(p.id);
      if (!entry) { loadFlash(); return; }  // registered elsewhere (another page, the API)
      if (!entry.answer || (p.version || 0) >= (entry.answer.version || 0)) entry.answer = p;
      showFlash();
    } else if (kind === "session_failed") {  // ingestion failed: every call is SESSION_FAILED now
      setError(`data session failed: ${p.reason}`);
    } else if (kind === "error") {  // the stream's last event; the loop reconnects
      if (p.code === "OUT_OF_RANGE") {  // our last id is no longer kept: resume from the oldest kept
        lastEventId = "0";
        setError(`some events were missed (${p.message})`);
      } else {
        setError(`${p.code}: ${p.message}`);  // UNAVAILABLE (Redis away): retried with our last id
      }
    }
  }

  // ---- flash questions ----------------------------------------------------------------

  async function loadFlash() {
    if (!sid) return;
    const body = await api("GET", `/v1/data/${sid}/flash`);
    const list = Array.isArray(body) ? body : body.questions || body.flash || [];
    for (const q of list) {
      const known = flash.get(q.id);
      flash.set(q.id, { ...q, answer: newer(known && known.answer, q.answer) });
    }
    showFlash();
  }

  function newer(a, b) {
    if (!a) return b || null;
    if (!b) return a;
    return (b.version || 0) > (a.version || 0) ? b : a;
  }

  async function register() {
    const question = el("flash-question").value.trim();
    if (!question) return;
    setError("");
    const q = await api("POST", `/v1/data/${sid}/flash`, { question });
    if (!flash.has(q.id)) flash.set(q.id, { id: q.id, question: q.question || question, answer: null });
    el("flash-question").value = "";
    showFlash();
    await loadFlash();  // an answer stored before this page subscribed
  }

  async function unregister(qid) {
    await api("DELETE", `/v1/data/${sid}/flash/${qid}`);
    flash.delete(qid);
    showFlash();
  }

  function showFlash() {
    el("flash-list").replaceChildren(...[...flash.values()].map(card));
  }

  function card(q) {
    const div = Object.assign(document.createElement("div"), { className: "flash" });
    div.dataset.qid = q.id;
    const a = q.answer;
    div.dataset.version = a ? a.version : "";
    const head = document.createElement("h3");
    head.append(Object.assign(document.createElement("span"), { className: "question", textContent: q.question }));
    const meta = Object.assign(document.createElement("span"), { className: "meta" });
    meta.textContent = a ? [`version ${a.version}`, gap(a), a.computed_at ? "at " + clock(a.computed_at) : ""]
      .filter(Boolean).join(" · ") : "waiting for the next data version";
    const remove = Object.assign(document.createElement("button"), { textContent: "×", title: "delete" });
    remove.addEventListener("click", () => unregister(q.id).catch((e) => setError("delete: " + e.message)));
    meta.append(" ", remove);
    head.append(meta);
    div.append(head);
    if (!a) return div;
    div.append(Object.assign(document.createElement("pre"), { className: "sql", textContent: a.sql || a.text || "" }));
    if (a.error) {
      div.append(Object.assign(document.createElement("div"), { className: "answer-error error", textContent: a.error }));
    } else {
      const rows = typeof a.rows_json === "string" && !a.rows ? JSON.parse(a.rows_json || "[]") : a.rows || [];
      const t = table(a.columns || [], rows);
      t.className = "answer-rows";
      div.append(t);
    }
    return div;
  }

  function gap(a) { return typeof a.logit_gap === "number" ? `gap ${a.logit_gap.toFixed(2)}` : ""; }
  function clock(unixSeconds) { return new Date(unixSeconds * 1000).toLocaleTimeString(); }

  start();
})();
