// The Plover console: three modules (this, metrics.js and output.js), no
// build step, no other origin. Every string from the server (names,
// output lines, error messages) reaches the page through text nodes (el
// below, pane in output.js), never parsed as markup: a function that
// prints HTML shows as text.

import { parseMetrics, histBuckets, bucketQuantiles, histQuantiles } from "./metrics.js";
import { visible, logText, pane } from "./output.js";

const main = document.getElementById("main");
const statusLine = document.getElementById("status");
const KEY = "plover-token";
let stop = []; // what the current view must end when the route changes
// refusedToken says why a token was not taken (a link's) or was dropped
// (one held), for the sign-in form until a token is given: the server's
// 401 to the page's tokenless requests would replace it.
let refusedToken = "";

// A button that changes state (class "deliberate": a rollback) takes a
// click only once it and the page have been in view for settleMs: a
// site that opens the console in a tab of its own under a double-click's
// pointer would otherwise land the second click on it (the page cannot
// be framed, so this is the click-jacking left). Until then it is
// aria-disabled, which also says so to a screen reader and a test.
const settleMs = 500;
let settling = 0;
function unsettle() {
  const all = () => document.querySelectorAll("button.deliberate");
  for (const b of all()) b.setAttribute("aria-disabled", "true");
  clearTimeout(settling);
  settling = setTimeout(() => { for (const b of all()) b.removeAttribute("aria-disabled"); }, settleMs);
}
document.addEventListener("visibilitychange", () => { if (!document.hidden) unsettle(); });
window.addEventListener("focus", unsettle);
// settled says whether a click on b is taken (see unsettle).
const settled = (b) => b.getAttribute("aria-disabled") !== "true";

// el makes an element; string children become text nodes.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
  return e;
}

// takeToken moves a token given in the address fragment (#token=T, or
// #/functions/NAME?token=T) to sessionStorage and out of the address bar,
// so that it is not bookmarked or shown. The browser has recorded the
// address as it loaded, before this runs: the token stays in its history
// and session files (README says so).
function takeToken() {
  const h = location.hash.slice(1);
  let route = h, query = "";
  const q = h.indexOf("?");
  if (q >= 0) { route = h.slice(0, q); query = h.slice(q + 1); }
  else if (h.startsWith("token=")) { route = "/"; query = h; }
  const params = new URLSearchParams(query);
  const given = params.get("token");
  if (given === null) return;
  const t = given.trim();
  const bad = unsendable(t);
  // A link is anyone's: it signs no one in silently, whether as a first
  // token (a link that opens a new tab would act as its sender's) or as
  // someone else than the user (whose functions the user would then
  // upload to). The same token again changes nothing.
  const held = sessionStorage.getItem(KEY);
  const ask = held ? `This link signs in with token ${tokenTag(t)} instead of yours (${tokenTag(held)}).`
    : `This link signs you in with token ${tokenTag(t)}: what you do on this page, you do as that token.`;
  if (bad) {
    // Held, it would fail every request in the browser before one went
    // out, the page showing it signed in: refused here, said on the form
    // (or, where another token is held, on the status line).
    // Kept for the form only where it shows: with a token held, a later
    // sign-out or 401 would show it to whoever signs in next.
    const why = "The link's token was not taken: " + bad;
    if (held) say(why);
    else document.getElementById("signin-error").textContent = refusedToken = why;
  } else if (held === t || window.confirm(ask + " Use it?")) {
    sessionStorage.setItem(KEY, t);
  }
  params.delete("token");
  const rest = params.toString();
  history.replaceState(null, "", location.pathname + "#" + (route || "/") + (rest ? "?" + rest : ""));
}

// unsendable says why t cannot go out in an Authorization header ("" if it
// can): a browser's Headers refuses code points past U+00FF (a token
// pasted with typographic quotes), which threw before any request went
// out, so that no 401 ever dropped it. Plover's tokens are printable ASCII.
function unsendable(t) {
  if (t === "") return "it is empty.";
  if (!/^[\x21-\x7e]+$/.test(t)) return "a token is printable ASCII without spaces, and this one has other characters (quotes or spaces pasted with it?).";
  return "";
}

// tokenTag names a token by its first characters: enough for its holder
// to tell which one the page holds, too few to stand for it.
const tokenTag = (t) => t.slice(0, 6) + "…";

// showSignedIn says which token the page acts as, and offers to sign out.
function showSignedIn() {
  const t = sessionStorage.getItem(KEY);
  document.getElementById("signout").hidden = !t;
  document.getElementById("whoami").textContent = t ? "token " + tokenTag(t) : "";
}

class Unauthenticated extends Error {}

// ApiError is an answer other than 2xx or 401; status is its HTTP status,
// retryAfter the ms its Retry-After asks the page to wait (0: none said).
class ApiError extends Error {
  constructor(msg, status, retryAfter = 0) { super(msg); this.status = status; this.retryAfter = retryAfter; }
}

// retryAfter reads an answer's Retry-After (seconds, or an HTTP date) in
// ms, at most 5 minutes; 0 when it has none. The server sends it with a
// 429 (the token's rate: the seconds until its bucket holds a request)
// and a 503. Bounded: a token of a tiny rate is told hours, and a
// setTimeout past 2^31 ms fires at once.
function retryAfter(r) {
  const v = r.headers.get("Retry-After");
  if (!v) return 0;
  const n = /^\d+$/.test(v.trim()) ? Number(v) * 1000 : Date.parse(v) - Date.now();
  return Number.isFinite(n) && n > 0 ? Math.min(n, 300000) : 0;
}

// serverMessage is the status and the server's {"error":{"code","message"}}
// of an answer, or its status line when it sent none.
async function serverMessage(r) {
  try { const j = await r.clone().json(); if (j.error) return r.status + " " + j.error.code + ": " + j.error.message; } catch (_) {}
  return r.status + " " + r.statusText;
}

// lastOutput is the blob: URL of the last invoke's output, revoked when the
// next one comes or the page that shows it goes (dropOutput).
let lastOutput = null;

// dropOutput revokes the last invoke's output: the view that offered it
// is gone (signed out, another route), and the blob would otherwise hold
// the previous tenant's bytes in the tab, reachable by its URL, until the
// tab closes.
function dropOutput() {
  if (lastOutput) URL.revokeObjectURL(lastOutput);
  lastOutput = null;
}

// reads chains the page's reads (GETs): one is sent only once the one
// before has its answer's headers, when the server has given its token's
// place back (a followed output stream then holds a place of its own,
// among the token's streams). So the page's polls and its stream hold one
// place of the token's concurrency at a time, and a token limited to 1 is
// not refused by its own page. Writes (invoke, rollback) are sent at once:
// a run may take minutes, and the refresh goes on meanwhile.
let reads = Promise.resolve();

// readWait bounds how long a read waits for its whole answer: one the
// server holds (a slow store behind the listing), or whose body stalls
// after its headers (a proxy that holds it), would otherwise hold that
// view's refresh for ever, and before its headers every later read of the
// page in the chain above, each view's too.
const readWait = 15000;

// api calls the server with the user's token; an error's message is the
// server's {"error":{"message"}} when it sent one. opts.accept lists
// statuses besides 2xx whose answer the caller reads (/healthz's 503);
// opts.anonymous sends no token (a route open to all, where a token's
// request would be counted against its rate); opts.signal ends a read,
// asked or waiting its turn (a view that ended); opts.stream is a read
// whose body goes on (the followed output): readWait bounds its headers
// only, and its caller watches the body.
async function api(path, opts = {}) {
  const headers = new Headers(opts.headers || {});
  // The token is read as the request goes out, not before its turn: one
  // that waited through a sign-out carries none.
  let t = null;
  const auth = () => {
    t = opts.anonymous ? null : sessionStorage.getItem(KEY);
    if (t && unsendable(t)) { // held before the page checked (an older page's)
      sessionStorage.removeItem(KEY);
      showSignedIn();
      refusedToken = "The token held was dropped: " + unsendable(t);
      showSignIn("");
      throw new Unauthenticated(path);
    }
    if (t) headers.set("Authorization", "Bearer " + t);
  };
  let r;
  if ((opts.method || "GET") === "GET") {
    // late ends the request: readWait without the whole answer, or the
    // caller's signal (followed here, not joined with AbortSignal.any:
    // Safari before 17.4 and Firefox before 124 have none).
    const late = new AbortController(), end = () => late.abort();
    let timer = null;
    const send = () => {
      if (opts.signal) {
        if (opts.signal.aborted) late.abort();
        else opts.signal.addEventListener("abort", end, { once: true });
      }
      auth();
      timer = setTimeout(() => late.abort(), readWait);
      return fetch(path, { ...opts, headers, signal: late.signal });
    };
    const sent = reads.then(send);
    reads = sent.then(() => {}, () => {});
    try {
      r = await sent;
      // The body is read here, under the timer: headers then nothing would
      // leave r.json() waiting for ever. A stream that answers 2xx is its
      // caller's to watch; its refusal's body is read here as any other.
      if (!(opts.stream && r.ok)) {
        const body = [101, 103, 204, 205, 304].includes(r.status) ? null : await r.arrayBuffer();
        r = new Response(body, { status: r.status, statusText: r.statusText, headers: r.headers });
      }
    } catch (e) {
      if (late.signal.aborted && !(opts.signal && opts.signal.aborted)) throw new ApiError(path + (r ? ": the answer stopped short of its end" : ": no answer") + " within " + readWait / 1000 + " s");
      throw e;
    } finally {
      clearTimeout(timer);
      // A poll's signal lives as long as its view: each read's listener
      // goes once the read is done (a stream's, once the stream is).
      if (opts.signal && !(opts.stream && r && r.ok)) opts.signal.removeEventListener("abort", end);
    }
  } else {
    auth();
    r = await fetch(path, { ...opts, headers });
  }
  if (r.status === 401 && !opts.anonymous) { // no token sent: none to drop
    // A request sent with a token since replaced (signed in again while it
    // ran) speaks for no one now: its view has ended.
    if (sessionStorage.getItem(KEY) !== t) throw new Unauthenticated(path);
    // The server does not take the token (unknown, or revoked by a reload
    // of its auth file): the page drops it rather than go on showing it
    // signed in, and says why in the server's words.
    sessionStorage.removeItem(KEY);
    showSignedIn();
    showSignIn(await serverMessage(r));
    throw new Unauthenticated(path);
  }
  if (!r.ok && !(opts.accept || []).includes(r.status)) throw new ApiError(path + ": " + await serverMessage(r), r.status, retryAfter(r));
  return r;
}

function showSignIn(why) {
  dropOutput(); // the view that showed it is cleared below
  // The last view's status (its errors, the function it named, "asking
  // again") is the last user's: it outlived a sign-out beside the form.
  say("");
  document.getElementById("signin").hidden = false;
  document.getElementById("signin-error").textContent = [refusedToken, why].filter(Boolean).join(" ");
  main.replaceChildren();
  document.getElementById("token").focus();
}

function setupSignIn() {
  const form = document.getElementById("signin");
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const t = document.getElementById("token").value.trim(), bad = unsendable(t);
    if (bad) {
      document.getElementById("signin-error").textContent = bad;
      return;
    }
    sessionStorage.setItem(KEY, t);
    refusedToken = "";
    document.getElementById("token").value = "";
    document.getElementById("signin-error").textContent = "";
    form.hidden = true;
    route();
  });
  document.getElementById("signout").addEventListener("click", () => {
    for (const s of stop) s(); // the live views end with the token they ran under
    stop = [];
    sessionStorage.removeItem(KEY);
    refusedToken = ""; // the last user's
    showSignedIn();
    showSignIn("");
  });
}

// ---- figures from /metrics (Prometheus text): metrics.js ----

// quantiles: each function's total request time.
const totalTime = (l) => (l.phase && l.phase !== "total" ? null : l.function);
const quantiles = (samples) => histQuantiles(samples, "plover_request_duration_seconds", totalTime);

// recentLatency follows one function's total request time over a sliding
// window of the last windowMs: the server's histogram is cumulative over
// its life (a function slow an hour ago and fast since would read slow,
// and one slow since a minute ago fast), so each poll's bucket counts are
// kept and the quantiles read from what came since the poll windowMs ago.
// add takes a poll's samples and returns the window's {p50, p99, count}
// (p50 and p99 null when no request came in it), or null while the page
// has seen one poll only: it cannot yet tell what is recent.
function recentLatency(name, windowMs) {
  let polls = []; // {t, buckets}, oldest first
  return {
    add(samples, now) {
      const buckets = histBuckets(samples, "plover_request_duration_seconds", totalTime)[name] || [];
      polls.push({ t: now, buckets });
      // The base is the newest poll at least windowMs old, or the oldest
      // kept while the page has been open for less.
      while (polls.length > 1 && polls[1].t <= now - windowMs) polls.shift();
      if (polls.length < 2) return null;
      const base = new Map(polls[0].buckets);
      // A count lower than the base's: the series started again (the
      // server restarted, the function was deleted and deployed again),
      // and all of it is newer than the base.
      const restarted = buckets.some(([le, c]) => c < (base.get(le) || 0));
      return bucketQuantiles(buckets.map(([le, c]) => [le, restarted ? c : c - (base.get(le) || 0)]));
    },
    reset() { polls = []; },
  };
}

// chartWindow is the latency chart's window in ms, from a function page's
// ?window= (10s, 5m, 1h; 10 s to 1 h), else 1 minute.
function chartWindow(query) {
  const m = /^(\d+)(s|m|h)$/.exec(new URLSearchParams(query).get("window") || "");
  const ms = m ? Number(m[1]) * { s: 1000, m: 60000, h: 3600000 }[m[2]] : 60000;
  return Math.min(3600000, Math.max(10000, ms));
}

// span says a window in words: "1 min", "10 s", "1 h 30 min".
function span(ms) {
  const h = Math.floor(ms / 3600000), m = Math.floor(ms / 60000) % 60, s = Math.floor(ms / 1000) % 60;
  return [h && h + " h", m && m + " min", s && s + " s"].filter(Boolean).join(" ");
}

const ms = (s) => s === null || s === undefined ? "–" : (s * 1000).toFixed(s < 0.01 ? 2 : 1) + " ms";
const bytes = (n) => n >= 1 << 30 ? (n / (1 << 30)).toFixed(1) + " GiB" : n >= 1 << 20 ? (n / (1 << 20)).toFixed(1) + " MiB" : n >= 1024 ? (n / 1024).toFixed(1) + " KiB" : n + " B";
const pct = (f) => (100 * (f || 0)).toFixed(1) + "%";
const short = (v) => (v || "").slice(0, 12);

async function figures(signal) {
  const [fr, mr] = await Promise.all([api("/v1/functions", { signal }), api("/metrics", { signal })]);
  const fns = (await fr.json()).functions;
  const samples = parseMetrics(await mr.text());
  return { fns: fns || [], samples, q: quantiles(samples) };
}

// say puts m on the status line, a live region: the same error again each
// refresh is not read out again.
const say = (m) => { if (statusLine.textContent !== m) statusLine.textContent = m; };

// pollCap bounds how long a failing poll waits before it asks again.
const pollCap = 30000;

// every runs f(signal) now and then ms after each run ends, while the
// view lives. Each request counts against the token's rate, as a client's
// would: a run that fails waits longer each time in a row (twice ms,
// doubling, at most pollCap) and at least what the server's Retry-After
// asks (a 429's is when the token's bucket holds a request again), so that
// a page over its token's rate does not go on taking what the token's
// other clients could have. A hidden tab asks nothing (no one reads it),
// and asks at once when shown again. The view's end (sign-out, another
// route) aborts signal, which f passes to each request: one asked or
// waiting its turn goes no further, and what a run that ended with its
// view did or failed to do is not said on the status line, which is the
// next view's (or the sign-in page's, where the last user's function names
// and errors are no one's to read).
function every(ms, f) {
  let live = true, timer = null, parked = false, fails = 0;
  const ended = new AbortController();
  const tick = async () => {
    if (!live) return;
    if (document.hidden) { parked = true; return; }
    let wait = ms;
    try {
      await f(ended.signal);
      if (!live) return;
      fails = 0; say("");
    } catch (e) {
      if (!live) return;
      if (e instanceof Unauthenticated) { live = false; return; }
      fails++;
      wait = Math.max(Math.min(pollCap, ms * 2 ** fails), e.retryAfter || 0);
      say(visible(e.message) + " (asking again in " + Math.ceil(wait / 1000) + " s)");
    }
    timer = setTimeout(tick, wait);
  };
  const seen = () => { if (!document.hidden && parked) { parked = false; tick(); } };
  document.addEventListener("visibilitychange", seen);
  tick();
  stop.push(() => { live = false; ended.abort(); clearTimeout(timer); document.removeEventListener("visibilitychange", seen); });
}

// ---- overview ----

// pinning is /healthz's fields of a device's pinned host memory, by the
// metric that carries each.
const pinning = new Map([["plover_pinned_host_bytes", "pinned_host_bytes"], ["plover_pinned_host_limit_bytes", "pinned_host_limit_bytes"], ["plover_pin_refusals_total", "pin_refusals"]]);

// nodeHealth is /healthz's answer with each device's memory, for the
// overview. It is asked without the token: the server answers anyone
// (a probe) and counts nothing, where a token's request costs one of its
// rate each refresh. With tokens, that answer holds each device's name,
// target and health only; its memory comes from /metrics (samples, read
// with the token for the functions already) and, while a device is
// unhealthy, its error from /healthz asked with the token: one request
// more a refresh only then. An unhealthy device is a 503 with the same
// body: shown, not taken for a failed read.
async function nodeHealth(samples, signal) {
  const ask = async (anonymous) => (await api("/healthz", { accept: [503], anonymous, signal })).json();
  const h = await ask(true);
  const withheld = (h.devices || []).some((d) => !("mem_total_bytes" in d));
  if (!withheld || !sessionStorage.getItem(KEY)) return h;
  if (h.status !== "ok") return ask(false);
  const mem = Object.create(null); // by device name
  const set = (dev, k, v) => { (mem[dev] ||= {})[k] = v; };
  for (const s of samples) {
    if (s.name === "plover_device_memory_bytes" && ["total", "free", "used"].includes(s.labels.kind)) set(s.labels.device, "mem_" + s.labels.kind + "_bytes", s.value);
    // /healthz leaves these out when 0 (none pinned, no bound, none
    // refused): so here, that a device shows the same fields whether
    // read from /metrics or, while one is unhealthy, from /healthz.
    else if (pinning.has(s.name) && s.value) set(s.labels.device, pinning.get(s.name), s.value);
  }
  return { ...h, devices: h.devices.map((d) => ({ ...d, ...mem[d.name] })) };
}

function overview() {
  const fnBody = el("tbody", { id: "functions" });
  const health = el("div", { id: "health" });
  const flows = el("tbody", { id: "flows" });
  main.replaceChildren(
    el("section", {}, el("h2", {}, "Functions"),
      el("table", {}, el("thead", {}, el("tr", {}, ...["function", "version", "target", "warm", "requests", "client errors", "server errors", "p50", "p99", "device share", "memory"].map((h) => el("th", {}, h)))), fnBody)),
    el("section", {}, el("h2", {}, "Node"), health),
    el("section", {}, el("h2", {}, "Scheduler flows"), el("table", {}, el("thead", {}, el("tr", {}, ...["function", "priority", "share", "queued", "device seconds", "device share"].map((h) => el("th", {}, h)))), flows)));
  every(2000, async (signal) => {
    const { fns, samples, q } = await figures(signal);
    fnBody.replaceChildren(...fns.map((f) => {
      const l = q[f.name] || {};
      return el("tr", { "data-function": f.name },
        el("td", {}, el("a", { href: "#/functions/" + encodeURIComponent(f.name) }, f.name)),
        el("td", {}, short(f.version)), el("td", {}, f.target || f.kind || ""),
        el("td", { class: "num" }, (f.instances_busy || 0) + (f.instances_idle || 0)),
        el("td", { class: "num requests" }, f.requests || 0),
        el("td", { class: "num" }, f.client_errors || 0), el("td", { class: "num" }, f.errors || 0),
        el("td", { class: "num p50" }, ms(l.p50)), el("td", { class: "num p99" }, ms(l.p99)),
        el("td", { class: "num" }, pct(f.device_fraction)), el("td", { class: "num" }, bytes(f.device_memory_bytes || 0)));
    }));
    // A flow is a function's claim on the device's scheduler: its
    // priority and share (README, Sharing a device), what waits, what it used.
    flows.replaceChildren(...fns.filter((f) => f.kind !== "pipeline").map((f) =>
      el("tr", { "data-flow": f.name }, el("td", {}, f.name), el("td", {}, f.priority || ""), el("td", { class: "num" }, f.share ?? ""),
        el("td", { class: "num" }, f.queue_depth || 0), el("td", { class: "num" }, (f.device_seconds || 0).toFixed(3)), el("td", { class: "num" }, pct(f.device_fraction)))));
    const h = await nodeHealth(samples, signal);
    health.replaceChildren(el("p", { class: h.status === "ok" ? "ok" : "error", id: "health-status" }, "status: " + h.status),
      el("table", {}, el("tbody", {}, ...(h.devices || []).map((d) =>
        el("tr", {}, ...Object.entries(d).map(([k, v]) => el("td", {}, k + ": " + (typeof v === "object" ? JSON.stringify(v) : v))))))));
  });
}

// ---- a function ----

function functionPage(name, query) {
  const enc = encodeURIComponent(name);
  const windowMs = chartWindow(query);
  const recent = recentLatency(name, windowMs);
  const win = span(windowMs);
  const summary = el("div", { id: "summary" });
  const versions = el("tbody", { id: "versions" });
  // Kept apart from the status line, which each refresh clears.
  const rollbackError = el("p", { class: "error", id: "rollback-error" });
  // What a rollback that landed says its caller should know (the
  // pipelines running the function that will now fail), as plover
  // rollback prints it: kept until the next rollback, refreshes or not.
  const rollbackWarnings = el("div", { class: "warning", id: "rollback-warnings", role: "status", "aria-live": "polite" });
  // Focusable, so that a keyboard scrolls it; a region named for what it
  // holds (not a live one: a function printing fast would be read out).
  const logs = el("pre", { class: "logs", id: "logs", tabindex: "0", role: "region", "aria-label": "output of " + name });
  const chart = svg("svg", { class: "chart", id: "chart", width: "600", height: "160", role: "img", "aria-label": "p50 and p99 latency of " + name + " over the last " + win + ": measuring" });
  const file = el("input", { type: "file", id: "invoke-file" });
  const result = el("div", { id: "invoke-result", role: "status", "aria-live": "polite" });
  const form = el("form", { id: "invoke" }, el("label", { for: "invoke-file" }, "Input file "), file, " ", el("button", { type: "submit" }, "Invoke"));
  form.addEventListener("submit", (ev) => { ev.preventDefault(); invoke(name, file.files[0], result); });
  main.replaceChildren(el("h2", {}, name), summary,
    el("section", {}, el("h3", {}, "Versions"), el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "version"), el("th", {}, "deployed"), el("th", {}, "by"), el("th", {}, "size"), el("th", {}, ""))), versions), rollbackError, rollbackWarnings),
    el("section", {}, el("h3", {}, "Invoke"), form, result),
    el("section", {}, el("h3", { id: "chart-title" }, "Latency of the requests in the last " + win + " (p50 blue, p99 orange, from the server's histogram, sampled every 2 s)"), chart),
    el("section", {}, el("h3", {}, "Output"), logs));

  let shown = "";
  // A rollback's refresh of the versions ends with the view, as the
  // polls' do (every).
  const view = new AbortController();
  stop.push(() => view.abort());
  const showVersions = async (signal = view.signal) => {
    const rec = await (await api("/v1/functions/" + enc + "/versions", { signal })).json();
    // Redrawn only when the record changed, so that a button is not
    // replaced under the pointer every 2 s.
    const key = JSON.stringify(rec);
    if (key === shown) return;
    shown = key;
    versions.replaceChildren(...(rec.versions || []).slice().reverse().map((v) => {
      const cur = v.id === rec.current;
      const b = cur ? el("span", { class: "ok" }, "current") : el("button", { class: "rollback deliberate", "data-version": v.id, onclick: async (ev) => {
        if (!settled(ev.currentTarget)) {
          rollbackError.textContent = "Not rolled back: the button had just come into view (clicks within " + settleMs + " ms of it are not taken); click again.";
          return;
        }
        rollbackError.textContent = "";
        rollbackWarnings.replaceChildren();
        try {
          const r = await api("/v1/functions/" + enc + "/rollback", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ version: v.id }) });
          // It landed whatever its answer's body says: a body that is not
          // the JSON expected only loses the warnings.
          let fi = {};
          try { fi = await r.json(); } catch (_) {}
          const warnings = Array.isArray(fi.warnings) ? fi.warnings : [];
          if (warnings.length) {
            rollbackWarnings.replaceChildren(el("p", {}, "Rolled back to " + short(fi.version || v.id) + ", with warnings:"),
              el("ul", {}, ...warnings.map((w) => el("li", {}, "warning: " + visible(String(w))))));
          }
          await showVersions().catch(() => {}); // landed: the next refresh shows it, or says why not
        } catch (e) { if (!(e instanceof Unauthenticated)) rollbackError.textContent = visible(e.message); }
      }, "aria-label": "Roll back to " + short(v.id) }, "Roll back");
      return el("tr", { "data-version": v.id, class: cur ? "current" : "" }, el("td", {}, short(v.id)), el("td", {}, v.created), el("td", { class: "tenant" }, v.tenant || ""), el("td", { class: "num" }, bytes(v.size)), el("td", {}, b));
    }));
    unsettle();
  };
  const points = [];
  // The versions are asked for only when the function's current version
  // or count of versions changed, and every 30 s besides (a deploy that
  // is not made current while an old version is retired changes
  // neither): each request counts against the token's rate, and this one
  // seldom changes. A refresh is two requests so, not three: within a
  // burst of 2.
  let versionsOf = "", versionsAt = 0;
  every(2000, async (signal) => {
    let r;
    try { r = await api("/v1/functions/" + enc, { signal }); }
    catch (e) {
      if (!(e instanceof ApiError) || e.status !== 404) throw e;
      // Deleted: nothing of it is left to show or roll back to. The page
      // keeps asking, and shows it again once it is deployed again.
      summary.replaceChildren(el("p", { class: "error", id: "gone" }, "function " + name + " not found (deleted?)"));
      versions.replaceChildren();
      shown = "";
      versionsOf = "";
      rollbackError.textContent = "";
      rollbackWarnings.replaceChildren();
      points.length = 0;
      recent.reset();
      drawChart(chart, points, name, win);
      return;
    }
    const f = await r.json();
    const m = f.manifest || {};
    summary.replaceChildren(el("table", {}, el("tbody", {},
      ...[["version", short(f.version)], ["kind", f.kind || ""], ["target", f.target || m.target || ""], ["entry / chain", (m.chain || []).map((c) => c.kernel).join(" → ")],
        ["max instances", m.max_instances ?? ""], ["requests", f.requests || 0], ["errors (client / server)", (f.client_errors || 0) + " / " + (f.errors || 0)],
        ["instances busy / idle", (f.instances_busy || 0) + " / " + (f.instances_idle || 0)], ["device memory", bytes(f.device_memory_bytes || 0)]]
        .map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, String(v)))))));
    const of = f.version + " " + f.versions;
    if (of !== versionsOf || performance.now() - versionsAt > 30000) {
      await showVersions(signal);
      versionsOf = of; versionsAt = performance.now();
    }
    const q = recent.add(parseMetrics(await (await api("/metrics", { signal })).text()), performance.now());
    if (q) { points.push(q); if (points.length > 120) points.shift(); drawChart(chart, points, name, win); }
  });
  followLogs(enc, logs);
  stop.push(dropOutput); // its download link goes with the view
}

function svg(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

// drawChart draws points' p50 and p99 (each of the requests in the win
// before it), a line broken where a window held no request, and says the
// last of them in the chart's accessible name: a window with no request
// says so rather than show an older figure.
function drawChart(chart, points, name, win) {
  const what = "p50 and p99 latency of " + name + " over the last " + win;
  if (!points.length) { chart.replaceChildren(); chart.setAttribute("aria-label", what + ": measuring"); return; }
  const last = points[points.length - 1];
  chart.setAttribute("aria-label", `${what}, last ${points.length} samples: ` +
    (last.count ? `now p50 ${ms(last.p50)}, p99 ${ms(last.p99)} (${last.count} requests)` : "now no requests"));
  const W = 600, H = 160, max = Math.max(1e-6, ...points.map((p) => p.p99 || 0));
  const xy = (p, i, key) => `${(i * W) / 119},${H - 12 - (p[key] / max) * (H - 24)}`;
  const lines = [];
  for (const key of ["p50", "p99"]) {
    let run = [];
    points.forEach((p, i) => {
      if (p[key] !== null) run.push(xy(p, i, key));
      if ((p[key] === null || i === points.length - 1) && run.length) { lines.push(svg("polyline", { class: key, points: run.join(" ") })); run = []; }
    });
  }
  const label = svg("text", { x: "4", y: "10" });
  label.textContent = "max " + ms(max) + " · requests in the last " + win + ": " + (last.count || "none");
  chart.replaceChildren(...lines, label);
}

// followLogs streams the function's output (NDJSON) into pre as text.
// The stream ends when the function is deleted, the server goes down or
// the token no longer reads it: the page says so and follows again after
// a pause (1 s, doubling to 30 s while it fails), from the last line's
// time on, so that a function deployed again under the name is followed.
// A hidden tab follows nothing: a stream holds one of the 6 connections a
// browser keeps to a server over HTTP/1.1, and six function pages open in
// tabs left every other request of every tab waiting for ever. It follows
// again, from where it was, once shown. A stream that sends no byte for
// stallMs (the server sends an empty line after 15 s of quiet,
// httpapi/logs.go's followKeepAlive: three of them missed) is taken for
// stalled (a proxy that holds it, a server that hangs): the pane says so
// and it is followed again, after the same pauses.
const stallMs = 45000;
async function followLogs(enc, pre) {
  // round ends one request: the view's end, a hidden tab or a stall
  // aborts it. shown ends the wait of a hidden tab, and the tab shown
  // again ends nothing else: the pause after a failure (the server's
  // Retry-After, the back-off) is waited in full whether the tab was hidden
  // meanwhile or not. The view's end ends both waits (halt).
  let live = true, shown = null, halt = null, round = null;
  const seen = () => { if (document.hidden) { if (round) round.abort(); } else if (shown) shown(); };
  document.addEventListener("visibilitychange", seen);
  stop.push(() => { live = false; if (round) round.abort(); document.removeEventListener("visibilitychange", seen); if (shown) shown(); if (halt) halt(); });
  const show = pane(pre);
  // The last line's time, and how many lines at that time were shown: a
  // stream that starts again from that time sends them again.
  let since = "1h", last = null, atLast = 0, pause = 1000, note = "", refusedSince = null;
  const end = (why) => { if (why !== note) show([why]); note = why; }; // once while it keeps failing
  while (live) {
    if (document.hidden) {
      await new Promise((res) => { shown = res; });
      shown = null;
      continue;
    }
    round = new AbortController();
    let quiet = null, stalled = false;
    try {
      const r = await api("/v1/functions/" + enc + "/logs?follow=true&since=" + encodeURIComponent(since), { signal: round.signal, stream: true });
      refusedSince = null;
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      const thisRound = round;
      const watch = () => { clearTimeout(quiet); quiet = setTimeout(() => { stalled = true; thisRound.abort(); }, stallMs); };
      watch();
      let buf = "", skip = atLast, flowing = false;
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        watch();
        // Bytes came, a keep-alive's at least: the stream works, and its
        // next failure is said and paused for afresh.
        if (!flowing) { flowing = true; note = ""; pause = 1000; }
        buf += value;
        const lines = [];
        let i;
        while ((i = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, i); buf = buf.slice(i + 1);
          if (!line) continue; // the stream's keep-alive
          let j;
          try { j = JSON.parse(line); } catch (_) { lines.push(visible(line)); continue; }
          if (j.time === last && skip > 0) { skip--; continue; }
          skip = 0;
          if (j.time === last) atLast++; else { last = j.time; atLast = 1; }
          lines.push(...logText(j));
        }
        show(lines);
      }
      end("[output stream ended]");
    } catch (e) {
      if (e instanceof Unauthenticated || !live) return;
      // A token limited to one stream is refused its new one until the
      // server sees the last page's go (a reload: up to a second's poll):
      // asked again quietly for a few seconds before it is said.
      const refused = e.status === 429 && /stream/.test(e.message);
      if (stalled) end("[output stream stalled: nothing from the server in " + stallMs / 1000 + " s; following again]");
      else if (round.signal.aborted) { if (last) since = last; continue; } // hidden: followed again once shown
      else if (refused && (refusedSince ??= Date.now()) > Date.now() - 5000) pause = 500;
      else end("[output stream ended: " + visible(e.message) + "]");
      // Over the token's rate: not before the server says it may be.
      if (e.retryAfter) pause = Math.max(pause, e.retryAfter);
    } finally { clearTimeout(quiet); }
    if (last) since = last;
    await new Promise((res) => { halt = res; setTimeout(res, pause); });
    pause = Math.min(2 * pause, 30000);
  }
}

async function invoke(name, f, result) {
  result.replaceChildren(el("p", {}, "running…"));
  try {
    const body = f ? await f.arrayBuffer() : new ArrayBuffer(0);
    const r = await api("/v1/functions/" + encodeURIComponent(name) + "/invoke", { method: "POST", headers: { "Content-Type": "application/octet-stream" }, body });
    const out = await r.arrayBuffer();
    // The function ran: its output is shown and offered whatever comes of
    // its digest. Browsers give crypto.subtle only to secure contexts
    // (HTTPS, localhost): a console read over plain HTTP from a machine's
    // name (gpu-box:8080, with tokens) has none.
    let digest;
    if (globalThis.crypto && crypto.subtle) {
      try {
        digest = ["sha256 ", el("code", { id: "invoke-sha256" }, Array.from(new Uint8Array(await crypto.subtle.digest("SHA-256", out)), (b) => b.toString(16).padStart(2, "0")).join(""))];
      } catch (e) { digest = [el("span", { id: "invoke-sha256-note" }, "no sha256: " + e.message)]; }
    } else {
      digest = [el("span", { id: "invoke-sha256-note" }, "no sha256: the browser computes it only on a page served over HTTPS or from localhost")];
    }
    const parts = (r.headers.get("Server-Timing") || "").split(",").map((p) => p.trim()).filter(Boolean).map((p) => {
      const [n, ...kv] = p.split(";");
      return el("tr", {}, el("td", {}, n), el("td", { class: "num" }, kv.map((x) => x.replace(/^dur=/, "") + (x.startsWith("dur=") ? " ms" : "")).join(" ")));
    });
    // The view ended while it ran (signed out, another route): nothing
    // shows it, so nothing holds it.
    if (!result.isConnected) return;
    dropOutput(); // one output held at a time
    const url = lastOutput = URL.createObjectURL(new Blob([out], { type: "application/octet-stream" }));
    result.replaceChildren(
      el("p", { class: "ok" }, "200 · " + (r.headers.get("X-Plover-Start") || "") + " · version " + short(r.headers.get("X-Plover-Version") || "") + " · " + out.byteLength + " bytes · ",
        ...digest, " ", el("a", { href: url, download: name + ".out", id: "invoke-download" }, "download output")),
      el("table", { id: "server-timing" }, el("tbody", {}, ...parts)));
  } catch (e) {
    result.replaceChildren(el("p", { class: "error", id: "invoke-error" }, visible(e.message)));
  }
}

// ---- pipelines ----

function pipelines() {
  const body = el("div", { id: "pipelines" });
  main.replaceChildren(el("h2", {}, "Pipelines"), body);
  every(2000, async (signal) => {
    const { fns, samples, q } = await figures(signal);
    const by = new Map(fns.map((f) => [f.name, f]));
    // Per step and function, as the pipeline runner counts them
    // (plover_pipeline_step_*): a parallel step's branches and a nested
    // pipeline's functions ("inner/cnn") share their step's index, each a
    // series of its own.
    const key = (l) => l.pipeline + "\u0000" + l.step + "\u0000" + l.function;
    const stepQ = histQuantiles(samples, "plover_pipeline_step_seconds", key);
    const stepErr = Object.create(null);
    const seen = Object.create(null); // pipeline and step: the functions counted
    for (const s of samples) {
      if (s.name === "plover_pipeline_step_errors_total") stepErr[key(s.labels)] = (stepErr[key(s.labels)] || 0) + s.value;
      else if (s.name !== "plover_pipeline_step_seconds_count") continue;
      (seen[s.labels.pipeline + "\u0000" + s.labels.step] ||= new Set()).add(s.labels.function);
    }
    const ps = fns.filter((f) => f.kind === "pipeline");
    if (!ps.length) { body.replaceChildren(el("p", {}, "No pipelines deployed.")); return; }
    body.replaceChildren(...ps.map((p) => el("section", { "data-pipeline": p.name }, el("h3", {}, p.name + " (" + (p.requests || 0) + " requests, p50 " + ms((q[p.name] || {}).p50) + ")"),
      el("table", {}, el("thead", {}, el("tr", {}, ...["step", "function", "version", "runs", "errors", "p50", "p99"].map((h) => el("th", {}, h)))),
        el("tbody", {}, ...(p.steps || []).flatMap((s, i) => stepRows(s, seen[p.name + "\u0000" + i], by).map(([label, version], j, rows) => {
          const k = p.name + "\u0000" + i + "\u0000" + label, l = stepQ[k] || {};
          // A nested pipeline's function is counted as "inner/cnn": its
          // page is cnn's.
          const fn = label.slice(label.lastIndexOf("/") + 1);
          return el("tr", { "data-step": String(i), "data-function": label },
            j === 0 ? el("td", { rowspan: String(rows.length) }, String(i + 1)) : null,
            // "": a step the token may not see (another tenant's function).
            el("td", {}, label ? el("a", { href: "#/functions/" + encodeURIComponent(fn) }, label) : "–"),
            el("td", {}, short(version)), el("td", { class: "num runs" }, l.count || 0), el("td", { class: "num errors" }, stepErr[k] || 0),
            el("td", { class: "num p50" }, ms(l.p50)), el("td", { class: "num p99" }, ms(l.p99)));
        })))))));
  });
}

// stepRows is the rows of a pipeline's step s: one per function it runs,
// [label as the runner counts it, version]. A step is a function's name,
// {function, version} or {parallel: [...]} of them; a function that is a
// pipeline has a row for each of its functions counted at the step so far
// (seen), labelled "inner/cnn", with no version: the pipeline may pin one.
function stepRows(s, seen, by) {
  const counted = [...(seen || [])].sort();
  const rows = [];
  for (const b of s.parallel || [s]) {
    const fn = typeof b === "string" ? b : b.function || "";
    const f = by.get(fn) || {};
    if (f.kind !== "pipeline") { rows.push([fn, b.version || f.version]); continue; }
    const inner = counted.filter((c) => c.startsWith(fn + "/"));
    if (inner.length) for (const c of inner) rows.push([c, ""]);
    else rows.push([fn, b.version || f.version]);
  }
  return rows;
}

// ---- routing ----

async function route() {
  for (const s of stop) s();
  stop = [];
  takeToken();
  showSignedIn();
  // A token held (a link's, one signed in with in another view) is tried:
  // the form comes back if the server refuses it.
  if (sessionStorage.getItem(KEY)) document.getElementById("signin").hidden = true;
  const h = location.hash.slice(1).split("?")[0] || "/";
  if (h.startsWith("/functions/")) {
    // The fragment is anyone's link: only a function name goes into the
    // API paths the page calls with the user's token.
    let name = "";
    try { name = decodeURIComponent(h.slice("/functions/".length)); } catch (_) {}
    if (/^[a-z0-9][a-z0-9-]{0,62}$/.test(name)) functionPage(name, location.hash.slice(1).split("?")[1] || "");
    else main.replaceChildren(el("p", { class: "error" }, "not a function name: " + h.slice("/functions/".length)));
  }
  else if (h === "/pipelines") pipelines();
  else overview();
}

setupSignIn();
window.addEventListener("hashchange", route);
route();
