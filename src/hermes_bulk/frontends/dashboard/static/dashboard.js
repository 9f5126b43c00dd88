// hermes-bulk dashboard: fetches the JSON API every two seconds and builds the page from it.
// Every piece of data goes into the page as text (textContent, attributes set one by one),
// never as HTML: item names, instructions and errors are untrusted and show as typed.
"use strict";

const EVERY_MS = 2000;
const $ = (id) => document.getElementById(id);

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (key === "text") node.textContent = value;
    else if (key === "cls") node.className = value;
    else if (value !== null && value !== undefined && value !== false) node.setAttribute(key, String(value));
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

const num = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"));
const clock = (s) => (s ? new Date(s * 1000).toLocaleTimeString("en-GB") : "–");
function duration(s) {
  if (s === null || s === undefined) return "–";
  s = Math.round(s);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}
function rate(job) {  // a job that is not processing and did nothing lately has no rate to show
  const r = job.items_per_minute;
  if (job.state !== "processing" && !r) return "–";
  return r === null || r === undefined ? "measuring…" : `${r.toFixed(r < 10 ? 1 : 0)}/min`;
}

function bar(job) {  // the completed share green, the failed share red, the rest empty
  const share = (n) => `${(job.total ? Math.min(100, Math.max(0, (n / job.total) * 100)) : 0).toFixed(1)}%`;
  const done = el("span", { cls: "done" }), failed = el("span", { cls: "failed" });
  done.style.width = share(job.completed);
  failed.style.width = share(job.failed);
  return el("span", { cls: "bar", role: "progressbar", "aria-valuemin": 0, "aria-valuemax": job.total,
                      "aria-valuenow": job.completed + job.failed,
                      "aria-valuetext": `${job.completed} completed, ${job.failed} failed of ${job.total}` }, done, failed);
}

function pauseReason(job) {  // why a job paused itself (its token limit, its endpoint); "" otherwise
  return job.state === "paused" && job.pause_reason && job.pause_reason !== "user" ? job.pause_reason : "";
}

function stateCell(job) {
  const why = pauseReason(job);
  return el("span", { cls: `state state-${job.state}`, text: job.state_label, ...(why ? { title: why } : {}) });
}

function waitText(job) {
  return job.rate_limited_until ? `until ${clock(job.rate_limited_until)}` : "–";
}

class Refused extends Error {}  // 403: the token is wrong or gone (the dashboard restarted)

async function api(path, options) {
  const response = await fetch(path, { credentials: "same-origin", ...options });
  if (response.status === 403) throw new Refused("refused");
  let body = {};
  try { body = await response.json(); } catch (e) { body = { error: `HTTP ${response.status}` }; }
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

function problem(text) {
  const p = $("problem");
  p.hidden = !text;
  p.textContent = text || "";
}

// Jobs ---------------------------------------------------------------------------------------
const JOB_COLUMNS = ["job", "state", "progress", "done", "failed", "pending", "running", "items/min",
                     "time to finish", "tokens used", "reserved", "cost", "rate-limit wait", "instruction"];

function jobsPage(main) {
  const body = el("tbody", {});
  const head = el("tr", {}, ...JOB_COLUMNS.map((c, i) => el("th", { cls: i >= 3 && i <= 11 ? "num" : "", text: c })));
  main.replaceChildren(el("h1", { text: "Jobs" }),
                       el("div", { cls: "scroll" }, el("table", { id: "jobs" }, el("thead", {}, head), body)));
  return (data) => {
    if (!data.jobs.length) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: JOB_COLUMNS.length, cls: "muted",
        text: "No jobs yet. Create one with: hermes-bulk create \"…\" --over PATH" })));
      return;
    }
    body.replaceChildren(...data.jobs.map((job) => el("tr", { "data-job": job.job_id },
      el("td", {}, el("a", { href: `/jobs/${encodeURIComponent(job.job_id)}`, text: job.job_id })),
      el("td", {}, stateCell(job)),
      el("td", {}, bar(job), " ", el("span", { cls: "muted", "data-field": "progress",
                                              text: `${num(job.completed + job.failed)}/${num(job.total)}` })),
      el("td", { cls: "num", "data-field": "completed", text: num(job.completed) }),
      el("td", { cls: "num", "data-field": "failed", text: num(job.failed) }),
      el("td", { cls: "num", text: num(job.pending) }),
      el("td", { cls: "num", text: num(job.running) }),
      el("td", { cls: "num", text: rate(job) }),
      el("td", { cls: "num", text: duration(job.eta_s) }),
      el("td", { cls: "num", text: num(job.tokens_used) }),
      el("td", { cls: "num", text: num(job.tokens_reserved) }),
      el("td", { cls: "num", "data-field": "cost", text: job.cost_shown }),
      el("td", { cls: "num", text: waitText(job) }),
      el("td", { cls: "wrap instruction", text: job.instruction.length > 80 ? job.instruction.slice(0, 79) + "…" : job.instruction }),
    )));
  };
}

// One job ------------------------------------------------------------------------------------
function figure(label, id) {
  return el("div", { cls: "figure" }, el("span", { cls: "muted", text: label }), el("b", { id, text: "–" }));
}

const FIGURES = [["State", "f-state"], ["Done", "f-completed"], ["Failed", "f-failed"], ["Pending", "f-pending"],
  ["Running", "f-running"], ["Items per minute", "f-rate"], ["Time to finish", "f-eta"], ["Tokens used", "f-tokens"],
  ["Tokens reserved", "f-reserved"], ["Cost", "f-cost"], ["Rate-limit wait", "f-wait"]];

function jobPage(main, jobId) {
  const said = el("span", { id: "said" });
  const buttons = {};
  for (const action of ["pause", "resume", "retry"]) {
    buttons[action] = el("button", { id: `do-${action}`, type: "button", disabled: true,
                                     text: action[0].toUpperCase() + action.slice(1) });
    buttons[action].addEventListener("click", async () => {
      buttons[action].disabled = true;
      try {
        said.textContent = (await api(`/api/jobs/${encodeURIComponent(jobId)}/${action}`, { method: "POST" })).message;
      } catch (e) {
        if (e instanceof Refused) { askForToken(); return; }
        said.textContent = e.message;
      }
      refresh();
    });
  }
  const exports = ["md", "csv", "jsonl"].map((f) => el("a", { cls: "button", id: `export-${f}`, download: "",
    href: `/api/jobs/${encodeURIComponent(jobId)}/export?format=${f}`, text: `Export ${f}` }));
  const title = el("h1", { text: `Job ${jobId}` });
  const instruction = el("p", { id: "instruction", cls: "muted" });
  const progress = el("p", { id: "progress" });
  const paused = el("p", { id: "pause-reason", hidden: true });
  const chart = svg("svg", { cls: "chart", viewBox: "0 0 720 180", role: "img", "aria-label": "completions and failures over time" });
  const events = el("tbody", { id: "events" });
  const failed = el("tbody", { id: "failed-items" });
  const failedNote = el("p", { cls: "muted", id: "failed-note" });
  main.replaceChildren(title, instruction, progress, paused, el("div", { cls: "figures" }, ...FIGURES.map(([l, id]) => figure(l, id))),
    el("div", { cls: "actions" }, buttons.pause, buttons.resume, buttons.retry, ...exports, said),
    el("h2", { text: "Completions and failures" }), chart,
    el("h2", { text: "Failed items" }), failedNote,
    el("table", {}, el("thead", {}, el("tr", {}, el("th", { text: "#" }), el("th", { text: "item" }),
                                      el("th", { text: "error" }))), failed),
    el("h2", { text: "Last events" }),
    el("table", {}, el("thead", {}, el("tr", {}, el("th", { text: "time" }), el("th", { text: "event" }),
                                      el("th", { text: "item" }), el("th", { text: "message" }))), events));
  return (data) => {
    const job = data.job;
    instruction.textContent = job.instruction;
    progress.replaceChildren(bar(job), " ", el("span", { "data-field": "progress",
      text: `${num(job.completed + job.failed)}/${num(job.total)} settled (${(job.progress * 100).toFixed(1)}%)` }));
    $("f-state").replaceChildren(stateCell(job));
    paused.textContent = pauseReason(job) ? `Paused: ${pauseReason(job)}` : "";
    paused.hidden = !paused.textContent;
    const set = { "f-completed": num(job.completed), "f-failed": num(job.failed), "f-pending": num(job.pending),
      "f-running": num(job.running), "f-rate": rate(job), "f-eta": duration(job.eta_s),
      "f-tokens": num(job.tokens_used), "f-reserved": num(job.tokens_reserved), "f-cost": job.cost_shown,
      "f-wait": waitText(job) };
    for (const [id, text] of Object.entries(set)) $(id).textContent = text;
    for (const action of Object.keys(buttons)) buttons[action].disabled = !job.actions[action];
    drawChart(chart, data.series);
    failedNote.textContent = job.failed ? (job.failed > data.failed_shown
      ? `The first ${num(data.failed_shown)} of ${num(job.failed)}; all of them: hermes-bulk export ${job.job_id} --only failed`
      : "") : "None.";
    failed.replaceChildren(...data.failed_items.map((i) => el("tr", {}, el("td", { cls: "num", text: i.number }),
      el("td", { cls: "wrap item-name", text: i.name }), el("td", { cls: "wrap", text: i.error }))));
    events.replaceChildren(...data.events.map((e) => el("tr", {}, el("td", { text: clock(e.at) }),
      el("td", { text: e.kind }), el("td", { cls: "wrap", text: e.item || "" }),
      el("td", { cls: "wrap", text: e.message }))));
  };
}

function svg(tag, props) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(props || {})) node.setAttribute(key === "cls" ? "class" : key, String(value));
  return node;
}

function drawChart(chart, series) {
  const W = 720, H = 180, L = 50, R = 10, T = 10, B = 22;
  const parts = [];
  if (series.length < 2) {
    const t = svg("text", { x: L, y: H / 2 });
    t.textContent = "Measuring: the chart starts when this dashboard started watching the job.";
    chart.replaceChildren(t);
    return;
  }
  const t0 = series[0][0], t1 = series[series.length - 1][0];
  const top = Math.max(1, ...series.map((s) => Math.max(s[1], s[2])));
  const x = (t) => L + ((t - t0) / Math.max(t1 - t0, 1)) * (W - L - R);
  const y = (v) => T + (1 - v / top) * (H - T - B);
  for (const [index, cls] of [[1, "done"], [2, "failed"]]) {
    parts.push(svg("polyline", { cls, points: series.map((s) => `${x(s[0]).toFixed(1)},${y(s[index]).toFixed(1)}`).join(" ") }));
  }
  const labels = [[L - 4, y(top) + 4, num(top), "end"], [L - 4, y(0), "0", "end"], [L, H - 6, clock(t0), "start"],
    [W - R, H - 6, clock(t1), "end"], [L + 8, T + 10, "completed (green), failed (red)", "start"]];
  for (const [lx, ly, text, anchor] of labels) {
    const t = svg("text", { x: lx, y: ly, "text-anchor": anchor });
    t.textContent = text;
    parts.push(t);
  }
  chart.replaceChildren(...parts);
}

// Workers ------------------------------------------------------------------------------------
function workersPage(main) {
  const body = el("tbody", {});
  const head = el("tr", {}, ...["worker", "host", "threads", "items held", "last heartbeat", "holding"].map(
    (c) => el("th", { text: c })));
  main.replaceChildren(el("h1", { text: "Workers" }), el("table", { id: "workers" }, el("thead", {}, head), body));
  return (data) => {
    if (!data.workers.length) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: 6, cls: "muted",
        text: "No live workers. Start one with: hermes-bulk worker" })));
      return;
    }
    body.replaceChildren(...data.workers.map((w) => el("tr", { "data-worker": w.id },
      el("td", { text: w.id }), el("td", { text: w.host }), el("td", { cls: "num", text: num(w.threads) }),
      el("td", { cls: "num", text: num(w.holding) }),
      w.answering ? el("td", { text: `${clock(w.heartbeat_at)} (${duration(w.heartbeat_age_s)} ago)` })
                  : el("td", { cls: "late", text: `not answering (last heartbeat ${duration(w.heartbeat_age_s)} ago)` }),
      el("td", { cls: "wrap muted", text: w.holding_shown.join(", ") + (w.holding > w.holding_shown.length ? " …" : "") }))));
  };
}

// Routing and polling ------------------------------------------------------------------------
let render = null, source = null, timer = null;

async function refresh() {
  clearTimeout(timer);
  try {
    const data = await api(source);
    render(data);
    problem("");
    $("updated").textContent = `updated ${clock(data.now)}`;
  } catch (e) {
    if (e instanceof Refused) { askForToken(); return; }  // no stale figures under a refusal
    problem(e.message);
  }
  timer = setTimeout(refresh, EVERY_MS);
}

function askForToken() {
  clearTimeout(timer);
  problem("");
  const input = el("input", { id: "token", type: "password", autocomplete: "off", size: 40 });
  const go = el("button", { id: "token-go", type: "button", text: "Open" });
  const open = () => {
    if (input.value.trim()) location.href = `${location.pathname}?token=${encodeURIComponent(input.value.trim())}`;
  };
  go.addEventListener("click", open);
  input.addEventListener("keydown", (e) => { if (e.key === "Enter") open(); });
  $("updated").textContent = "";
  $("page").replaceChildren(el("h1", { text: "Token needed" }),
    el("p", { id: "ask-token", text: "This dashboard no longer accepts this page's token: it was restarted, or " +
      "started with another token. Open the address it printed (Open: http://…/?token=…), or paste its token here." }),
    el("p", {}, input, " ", go));
  input.focus();
}

function start() {
  const main = $("page");
  const path = location.pathname;
  const match = path.match(/^\/jobs\/([^/]+)$/);
  if (match) {
    const jobId = decodeURIComponent(match[1]);
    document.title = `hermes-bulk: job ${jobId}`;
    render = jobPage(main, jobId);
    source = `/api/jobs/${encodeURIComponent(jobId)}`;
  } else if (path === "/workers") {
    document.title = "hermes-bulk: workers";
    $("nav-workers").className = "here";
    render = workersPage(main);
    source = "/api/workers";
  } else {
    $("nav-jobs").className = "here";
    render = jobsPage(main);
    source = "/api/jobs";
  }
  refresh();
}

start();
