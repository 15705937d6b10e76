// The typing page: one WebSocket per database (protocol in docs/api.md). With candidates (the
// server's HEADSTART_CANDIDATES, or ?candidates=K; &wait_all=1 waits for all K at Enter) the checked
// answer follows the greedy one as a `choice` message: its SQL replaces the greedy SQL and its rows
// show without a Run click.
"use strict";
const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
// The bearer token lives in this variable only: never in the URL, localStorage or a cookie.
let token = "";
let ws = null, seq = 0, submittedSeq = 0, sql = "", decoded = 0;
// Whether the gateway wants a token (GET /healthz says); data.js awaits it too.
const authRequired = fetch("/healthz").then((r) => r.json()).then((h) => h.auth);

function authHeaders() { return token ? { Authorization: "Bearer " + token } : {}; }
function setError(text) { $("error").textContent = text || ""; }
// A WebSocket cannot carry an Authorization header: the token rides in the
// Sec-WebSocket-Protocol header instead, base64url-encoded (as Kubernetes does).
function wsProtocols() {
  if (!token) return undefined;
  const b64 = btoa(String.fromCharCode(...new TextEncoder().encode(token)));
  return ["headstart", "bearer." + b64.replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "")];
}
// True once the page may call the API: no auth, or a token was entered.
async function canCall() { return !(await authRequired) || token !== ""; }

async function start() {
  if (params.has("token")) {  // an old link: the token must not stay in the address bar (or be used from it)
    params.delete("token");
    history.replaceState(null, "", location.pathname + (params.toString() ? "?" + params : ""));
    $("auth-note").textContent = "the token is no longer read from the URL: type it here";
  }
  $("auth-bar").hidden = !(await authRequired);
  $("token").addEventListener("change", () => { token = $("token").value; setError(""); loadDatabases(); });
  $("db").addEventListener("change", connect);
  $("question").addEventListener("input", onInput);
  $("question").addEventListener("keydown", onKey);
  $("run").addEventListener("click", runSql);
  await loadDatabases();
}

async function loadDatabases() {
  if (!(await canCall())) { $("status").textContent = "enter the token above"; return; }
  const resp = await fetch("/v1/databases", { headers: authHeaders() });
  if (!resp.ok) { setError("databases: " + (await resp.json()).message); return; }
  const { databases } = await resp.json();
  const wanted = params.get("db") || "world_1";
  $("db").innerHTML = "";
  for (const d of databases) {
    const opt = new Option(`${d.id} (${d.num_tables} tables)`, d.id, false, d.id === wanted);
    opt.dataset.canExecute = d.can_execute;
    $("db").add(opt);
  }
  if (params.get("view") !== "data") connect();  // the data panel alone: no typing session
}

// The bar is the question's part of the prompt: its tokens cached over its tokens typed (with the
// template's few tokens after it). The schema (P0, cached before a key is typed) is most of the
// prompt: counted in, the bar stood at ~98% on an empty question. It is said apart, in the label.
function showProgress(cached, prompt, schema) {
  const question = Math.max(0, prompt - schema);
  const cachedQuestion = Math.min(question, Math.max(0, cached - schema));
  const pct = question ? (100 * cachedQuestion) / question : 0;
  Object.assign($("bar").dataset, { cached: cachedQuestion, question, schema, prompt });
  $("bar").style.width = pct.toFixed(1) + "%";
  $("bar-label").textContent = prompt ? `question: ${cachedQuestion} / ${question} tokens cached · schema: ` +
    `${schema} tokens${cached >= schema ? ", cached" : ""}` : "";
}

function connect() {
  if (ws) { ws.onmessage = ws.onclose = null; ws.close(); }  // the old session's last events: not ours
  const db = $("db").value;
  const url = new URL("/v1/sessions/ws", location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  url.searchParams.set("db", db);
  if (params.has("candidates")) url.searchParams.set("candidates", params.get("candidates"));
  seq = 0; submittedSeq = 0; sql = ""; decoded = 0;
  // another database: nothing of the last one's question, answer or cache stays on the page
  $("question").value = ""; $("sql").textContent = ""; $("rows").replaceChildren();
  $("ttft").textContent = ""; $("computed").textContent = ""; $("checked").textContent = "";
  $("run").disabled = true; setError(""); showProgress(0, 0, 0);
  $("status").textContent = "connecting…";
  $("question").disabled = true;
  ws = new WebSocket(url, wsProtocols());
  ws.onmessage = (ev) => onMessage(JSON.parse(ev.data));
  ws.onclose = (ev) => { $("status").textContent = `disconnected (${ev.code})`; $("question").disabled = true; };
}

function send(message) { if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(message)); }

function onInput() { send({ type: "input", seq: ++seq, text: $("question").value }); }

function onKey(ev) {
  if (ev.key !== "Enter") return;
  ev.preventDefault();
  const text = $("question").value;
  if (!text.trim()) return;
  submittedSeq = ++seq;
  sql = "";
  $("sql").textContent = ""; $("ttft").textContent = "generating…"; $("computed").textContent = "";
  $("checked").textContent = ""; $("rows").replaceChildren(); $("run").disabled = true; setError("");
  const submit = { type: "submit", seq: submittedSeq, text, max_new_tokens: 128 };
  if (params.has("candidates")) {
    submit.candidates = { k: Number(params.get("candidates")), wait_all: params.get("wait_all") === "1" };
  }
  send(submit);
}

function onMessage(m) {
  switch (m.type) {
    case "ready":
      $("status").textContent = `session ${m.session.slice(0, 8)} on ${m.db}`;
      $("question").disabled = false; $("question").focus();
      break;
    case "progress":
      showProgress(m.cached_tokens, m.prompt_tokens, m.schema_tokens || 0);
      break;
    case "token":
      sql += m.text; $("sql").textContent = sql;
      break;
    case "done":
      $("sql").textContent = m.sql || m.text;
      $("ttft").textContent = `TTFT ${m.ttft_ms.toFixed(1)} ms`;
      $("computed").textContent = `${m.computed_tokens_at_submit} tokens computed at submit ` +
        `(${m.cached_tokens_at_submit} of ${m.prompt_tokens} cached)`;
      $("run").disabled = $("db").selectedOptions[0]?.dataset.canExecute !== "true";
      decoded = m.num_candidates;
      if (decoded > 1) $("checked").textContent = `checking ${decoded} candidates…`;
      break;
    case "choice":  // the checked answer of the submit: its SQL and rows, no Run click
      if (m.seq !== submittedSeq) break;
      $("sql").textContent = m.sql;
      if (m.error) {
        $("checked").textContent = `no candidate's SQL ran (${m.num_candidates} checked)`;
        setError(m.error);
      } else {
        // without wait_all the choice is among the candidates ready when the greedy answer ended
        const late = decoded - m.num_candidates;
        $("checked").textContent = `${m.agreed} of ${m.num_candidates} candidates agree` +
          (late > 0 ? ` (${late} not ready at Enter)` : "");
        showRows(m.columns, m.rows, m.truncated);
      }
      break;
    case "error":
      setError(`${m.code}: ${m.message}`);
      if (m.seq && m.seq === submittedSeq) $("ttft").textContent = "";
      break;
  }
}

async function runSql() {
  const resp = await fetch("/v1/execute", {
    method: "POST", headers: { "Content-Type": "application/json", ...authHeaders() },
    body: JSON.stringify({ db: $("db").value, sql: $("sql").textContent }),
  });
  const body = await resp.json();
  if (!resp.ok) { setError(`${body.code}: ${body.message}`); return; }
  showRows(body.columns, body.rows, body.truncated);
}

// A result as a table (a Run's, or a checked answer's first rows).
function showRows(columns, rows, truncated) {
  const table = document.createElement("table");
  const head = table.insertRow();
  for (const c of columns) head.appendChild(Object.assign(document.createElement("th"), { textContent: c }));
  for (const row of rows) {
    const tr = table.insertRow();
    for (const v of row) tr.insertCell().textContent = v === null ? "NULL" : String(v);
  }
  const parts = [table];
  if (truncated) parts.push(Object.assign(document.createElement("div"), { className: "meta", textContent: "(more rows)" }));
  $("rows").replaceChildren(...parts);
}

start();
