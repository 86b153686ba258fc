// Hallmark's page: plain JavaScript, no build step, no third-party code. It calls the same
// JSON API as any client with the token entered once per tab (sessionStorage only).
"use strict";

const TOKEN_KEY = "hallmark.token";
const PAGES = ["check", "generate", "record", "keys"];
const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------- small DOM helpers

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }

function fact(dl, term, value) {
  dl.append(el("dt", { text: term }), el("dd", {}, value === null || value === undefined ? "—" : value));
}

// A p-value from its log10, readable at any size: "p = 0.31", "p = 3.2 × 10⁻⁴³" (10 and a <sup>).
// `bounded`: the tenant tier's p, rounded up to a power of ten, is a bound: "p ≤ 10⁻⁴³". Rounded
// up to 10⁰ it says only that p is above 0.1 (the power below was not reached), not "p ≤ 1".
function pValue(log10p, bounded = false) {
  if (log10p === null || log10p === undefined) return document.createTextNode("p unknown");
  if (bounded) {
    const exponent = Math.round(log10p);
    if (exponent >= 0) return document.createTextNode("p > 0.1");
    return el("span", { "aria-label": `p at most 10 to the ${exponent}` },
      "p ≤ 10", el("sup", { text: String(exponent).replace("-", "−") }));
  }
  if (log10p <= -307) return el("span", {}, "p < 10", el("sup", { text: "−307" }));
  if (log10p > -3) return document.createTextNode("p = " + Math.pow(10, log10p).toPrecision(2));
  let exponent = Math.floor(log10p);
  let mantissa = Math.pow(10, log10p - exponent);
  if (mantissa >= 9.95) { mantissa = 1; exponent += 1; }
  return el("span", { "aria-label": `p = ${mantissa.toFixed(1)} times 10 to the ${exponent}` },
    `p = ${mantissa.toFixed(1)} × 10`, el("sup", { text: String(exponent).replace("-", "−") }));
}

// Powers of ten in plain text (a list item, a hint) written as pValue() writes them in markup:
// "10⁻¹⁴⁰", "p = 8.5 × 10⁻⁴", never "10^-140".
const SUPERSCRIPT = { "-": "⁻", 0: "⁰", 1: "¹", 2: "²", 3: "³", 4: "⁴", 5: "⁵", 6: "⁶", 7: "⁷", 8: "⁸", 9: "⁹" };
function tenTo(exponent) { return "10" + Array.from(String(exponent), (c) => SUPERSCRIPT[c]).join(""); }

function pText(log10p, bounded = false) {
  if (log10p === null || log10p === undefined) return "p unknown";
  if (bounded) return Math.round(log10p) >= 0 ? "p > 0.1" : "p ≤ " + tenTo(Math.round(log10p));
  if (log10p <= -307) return "p < " + tenTo(-307);
  if (log10p > -3) return "p = " + Math.pow(10, log10p).toPrecision(2);
  let exponent = Math.floor(log10p);
  let mantissa = Math.pow(10, log10p - exponent);
  if (mantissa >= 9.95) { mantissa = 1; exponent += 1; }
  return `p = ${mantissa.toFixed(1)} × ${tenTo(exponent)}`;
}

// A bound given by its log10, as a power of ten it does not exceed.
function boundText(log10) { return tenTo(Math.ceil(log10)); }

function thresholdText(threshold) {
  const e = Math.log10(threshold);
  return Math.abs(e - Math.round(e)) < 1e-9 ? tenTo(Math.round(e)) : String(threshold);
}

function thresholdNode(threshold) {
  const e = Math.log10(threshold);
  if (Math.abs(e - Math.round(e)) >= 1e-9) return document.createTextNode(String(threshold));
  return el("span", { "aria-label": `10 to the ${Math.round(e)}` }, "10", el("sup", { text: String(Math.round(e)).replace("-", "−") }));
}

// Every time on the page in one form, the viewer's local time: "2026-12-07 05:10:29".
function when(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  if (isNaN(d)) return iso;
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

function detailsText(details) {
  return Object.entries(details || {}).map(([k, v]) => {
    if (v && typeof v === "object") v = k === "spec" ? `${v.algorithm}, w=${v.context_width}` : JSON.stringify(v);
    return `${k}: ${v}`;
  }).join(" · ");
}

// ---------------------------------------------------------------- token and API calls

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

// The token field is what the page uses: a token typed there counts as soon as Check or
// Generate is pressed, without "Use token" first. True when the token changed.
function setToken(value) {
  value = (value || "").trim();
  if (value === token()) return false;
  if (value) sessionStorage.setItem(TOKEN_KEY, value); else sessionStorage.removeItem(TOKEN_KEY);
  clearTokenResults();
  return true;
}

async function adoptTypedToken() {
  if (setToken($("token-input").value)) await refreshIdentity();
}

// What another token fetched (a check result, an output, a record, tables) leaves the screen
// when the token changes, so no result is shown beside a token that did not produce it.
function clearTokenResults() {
  $("check-result").hidden = true;
  $("gen-result").hidden = true;
  clear($("gen-output"));
  lastGeneration = null;
  $("record-result").hidden = true;
  clear($("record-facts"));
  clear($("recent").tBodies[0]);
  $("recent-page").textContent = "";
  clear($("keys-table").tBodies[0]);
  clear($("audit-table").tBodies[0]);
}

class ApiError extends Error {
  // `code`: the error's stable code (`probe_guard`, ...); `retryAfter`: seconds, from Retry-After.
  constructor(status, message, type, code, retryAfter) {
    super(message);
    this.status = status; this.type = type; this.code = code; this.retryAfter = retryAfter;
  }
}

// Retry-After as seconds: a number of seconds or an HTTP date (RFC 9110); null when absent.
function retryAfterSeconds(response) {
  const value = response.headers.get("Retry-After");
  if (!value) return null;
  if (/^\d+$/.test(value.trim())) return Number(value);
  const at = Date.parse(value);
  return isNaN(at) ? null : Math.max(0, (at - Date.now()) / 1000);
}

// "Try again in about 45 minutes (after 14:05)." from a Retry-After in seconds.
function retryText(seconds) {
  if (seconds === null || seconds === undefined) return "";
  const at = new Date(Date.now() + seconds * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  const count = (n, unit) => `${n} ${unit}${n === 1 ? "" : "s"}`;
  const span = seconds < 90 ? count(Math.max(1, Math.round(seconds)), "second") :
    seconds < 90 * 60 ? count(Math.round(seconds / 60), "minute") : count(Math.round(seconds / 3600), "hour");
  return ` Try again in about ${span} (after ${pad(at.getHours())}:${pad(at.getMinutes())}).`;
}

async function api(method, path, body) {
  return (await apiRaw(method, path, body)).payload;
}

async function apiRaw(method, path, body) {
  const headers = { "Accept": "application/json" };
  if (token()) headers["Authorization"] = "Bearer " + token();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (exc) {
    throw new ApiError(0, "the server could not be reached (" + exc.message + ")", "network_error");
  }
  const raw = await response.clone().text();
  return { payload: await readJson(response), raw };
}

async function readJson(response) {
  let payload = null;
  const text = await response.text();
  try { payload = text ? JSON.parse(text) : null; } catch (_) { payload = null; }
  if (!response.ok) {
    const err = payload && payload.error;
    const message = err && err.message ? err.message : (text || response.statusText || "request failed");
    throw new ApiError(response.status, message, err && err.type, err && err.code, retryAfterSeconds(response));
  }
  return payload;
}

function showError(exc) {
  const box = $("error");
  clear(box);
  if (!exc) { box.hidden = true; return; }
  const status = exc.status ? `${exc.status}` : "";
  const hint = exc.status === 401 ? " Check the API token at the top of the page." :
    exc.status === 403 ? " This token is not allowed to do that." :
    exc.status === 429 ? retryText(exc.retryAfter) : "";
  box.append(el("span", { class: "error-status", text: status }), (exc.message || String(exc)) + hint);
  // What else can be done (a caller's advice, e.g. Check's: detect on the gateway's machine).
  if (exc.advice) box.append(el("span", { class: "error-advice" }, ...exc.advice));
  box.hidden = false;
}

async function busy(button, work) {
  showError(null);
  button.disabled = true;
  button.setAttribute("aria-busy", "true");
  try { return await work(); } catch (exc) { showError(exc); } finally {
    button.disabled = false;
    button.removeAttribute("aria-busy");
  }
}

// ---------------------------------------------------------------- who am I, navigation

let me = null;

async function refreshIdentity() {
  const status = $("token-status");
  me = null;
  $("tab-keys").hidden = true;
  if (!token()) { status.textContent = "No token yet: it stays in this tab only."; return; }
  try {
    me = await api("GET", "/v1/me");
    const scope = me.admin ? (me.tenant ? `admin of tenant ${me.tenant}` : "admin of every tenant") : `tenant ${me.tenant}`;
    status.textContent = `Using a token of ${scope} (this tab only).`;
    $("tab-keys").hidden = !me.admin;
  } catch (exc) {
    status.textContent = "This token was not accepted.";
    showError(exc);
  }
}

let shownPage = null;

function show(page) {
  if (!PAGES.includes(page)) page = "check";
  // An error belongs to the page it happened on: it leaves with it.
  if (shownPage !== null && page !== shownPage) showError(null);
  shownPage = page;
  for (const name of PAGES) {
    $("page-" + name).hidden = name !== page;
    const tab = $("tab-" + name);
    if (name === page) tab.setAttribute("aria-current", "page"); else tab.removeAttribute("aria-current");
  }
  document.title = `Hallmark — ${page === "check" ? "check a text" : page}`;
  // The Keys page is for admin tokens; anyone else who opens #keys is told so (no controls).
  const admin = !!(me && me.admin);
  $("keys-admin").hidden = !admin;
  $("keys-admin-only").hidden = admin;
  if (page === "keys") loadKeysPage();
  if (page === "record") loadRecent(0);
}

function route() { show((location.hash || "#check").slice(1)); }

// ---------------------------------------------------------------- signed documents

// Verify the signed part `field` of a raw JSON response text in the browser and say so in `node`.
// `check`: the options of HallmarkVerify.verifySigned, or a function (document) -> its promise.
function showSigned(node, rawText, field, check, label, then) {
  node.hidden = true;
  clear(node);
  node.removeAttribute("data-verified");
  let document;
  try { document = window.HallmarkVerify.parseRaw(rawText)[field]; } catch (_) { document = null; }
  if (!document) return;
  const status = el("span", { text: "checking…" });
  node.append(`${label}: `, status);
  node.hidden = false;
  const verify = typeof check === "function" ? check : (doc) => window.HallmarkVerify.verifySigned(doc, check);
  verify(document).then((out) => {
    status.textContent = out.message;
    status.className = out.ok === true ? "ok" : out.ok === false ? "bad" : "";
    node.dataset.verified = String(out.ok);
    if (then) then(out);
  });
}

// ---------------------------------------------------------------- Generate

let lastGeneration = null;

function number(id, integer) {
  const raw = $(id).value.trim();
  if (raw === "") return undefined;
  const value = integer ? parseInt(raw, 10) : parseFloat(raw);
  return Number.isNaN(value) ? undefined : value;
}

async function generate() {
  await adoptTypedToken();
  const body = { prompt: $("gen-prompt").value, stream: true, max_tokens: number("gen-max", true),
                 temperature: number("gen-temp"), top_p: number("gen-top-p"), top_k: number("gen-top-k", true),
                 seed: number("gen-seed", true) };
  for (const name of Object.keys(body)) if (body[name] === undefined) delete body[name];
  const output = $("gen-output");
  clear(output);
  $("gen-summary-panel").hidden = true;
  $("gen-result").hidden = false;
  lastGeneration = null;
  const headers = { "Content-Type": "application/json", "Accept": "text/event-stream" };
  if (token()) headers["Authorization"] = "Bearer " + token();
  let response;
  try {
    response = await fetch("/v1/generate", { method: "POST", headers, body: JSON.stringify(body) });
  } catch (exc) { throw new ApiError(0, "the server could not be reached (" + exc.message + ")"); }
  if (!response.ok) { await readJson(response); return; }
  output.classList.add("streaming");
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let finished = false;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of frame.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const event = JSON.parse(data);
          if (event.type === "delta") output.append(event.text);
          else if (event.type === "done") {
            finished = true;
            // The receipt is checked against the text the page shows (the streamed deltas),
            // not the `done` event's copy of it: a stream whose deltas differ from the text
            // recorded fails the check instead of being replaced silently.
            const shown = output.textContent;
            finishGeneration(event, shown);
            showSigned($("receipt-status"), data, "receipt", { text: shown, expectedType: "hallmark.receipt" },
              "Receipt");
          }
          else if (event.type === "error" || event.error) {
            const err = event.error || {};
            throw new ApiError(err.code || 500, err.message || "generation failed", err.type);
          }
        }
      }
    }
  } finally { output.classList.remove("streaming"); }
  // A stream cut before its `done` event (the server or the network went away) is not a result.
  if (!finished) {
    throw new ApiError(0, "the stream ended before the generation finished: the output above is incomplete " +
      "(its ledger record says how it ended)", "stream_cut");
  }
}

function finishGeneration(event, shown) {
  lastGeneration = { ...event, text: shown };  // Send to Check sends what the page showed
  const dl = clear($("gen-summary"));
  const w = event.watermark || {};
  fact(dl, "Generation id", el("code", { id: "gen-id", text: event.generation_id }));
  fact(dl, "Model", event.model);
  if (w.key_id) {
    fact(dl, "Key", `${w.key_id} (version ${w.version})`);
    fact(dl, "Fingerprint", el("code", { text: w.fingerprint }));
    fact(dl, "Algorithm", w.algorithm);
    const share = typeof w.watermarked_share === "number" ? ` (${Math.round(w.watermarked_share * 100)} %)` : "";
    fact(dl, "Watermarked tokens", `${w.watermarked_tokens ?? "—"} of ${event.token_ids.length}${share}`);
  } else {
    fact(dl, "Watermark", "none (opted out or temperature 0)");
  }
  fact(dl, "Finish reason", event.finish_reason);
  $("gen-summary-panel").hidden = false;
}

// ---------------------------------------------------------------- Record

const PAGE_SIZE = 20;
let recentOffset = 0;

async function lookUp(id) {
  id = id.trim();
  // The previous record leaves first: a failed look-up must not leave it under the error.
  $("record-result").hidden = true;
  clear($("record-facts"));
  $("record-receipt-status").hidden = true;
  if (!id) throw new ApiError(0, "enter a generation id (32 hex digits) to look up its record", "empty");
  await adoptTypedToken();
  const record = await api("GET", "/v1/generations/" + encodeURIComponent(id));
  $("record-title").textContent = record.id;
  const dl = clear($("record-facts"));
  const labels = [["tenant", "Tenant"], ["key_id", "Key id"], ["key_version", "Key version"],
    ["key_state_at_generation", "Key state at generation"], ["key_state_now", "Key state now"],
    ["status", "Status"], ["finish_reason", "Finish reason"], ["engine", "Engine"], ["model", "Model"],
    ["prompt_tokens", "Prompt tokens"], ["output_tokens", "Output tokens"], ["watermarked_tokens", "Watermarked tokens"],
    ["unwatermarked_reason", "Why not (all) watermarked"], ["output_sha256", "SHA-256 of the output"],
    ["created_at", "Created"], ["updated_at", "Updated"], ["seq", "Ledger sequence"], ["entry_hash", "Entry hash"]];
  for (const [name, label] of labels) {
    if (!(name in record)) continue;
    let value = record[name];
    if (name === "created_at" || name === "updated_at") value = when(value);
    if (name === "output_sha256" || name === "entry_hash") value = el("code", { text: value });
    if (name === "unwatermarked_reason" && value && "unwatermarked_tokens" in record) {
      value = `${value} (${record.unwatermarked_tokens} of ${record.output_tokens} tokens)`;
    }
    fact(dl, label, value);
  }
  if (record.spec) fact(dl, "Watermark spec", el("code", { text: JSON.stringify(record.spec) }));
  $("record-result").hidden = false;
}

async function loadRecent(offset) {
  if (!token()) return;
  recentOffset = Math.max(0, offset);
  const body = clear($("recent").tBodies[0]);
  let page;
  try {
    page = await api("GET", `/v1/generations?limit=${PAGE_SIZE}&offset=${recentOffset}`);
  } catch (exc) { showError(exc); return; }
  const items = page.generations || page.data || [];
  for (const g of items) {
    const link = el("a", { href: "#record", text: g.id.slice(0, 12) + "…", title: g.id });
    link.addEventListener("click", () => { $("record-id").value = g.id; busy($("record-submit"), () => lookUp(g.id)); });
    body.append(el("tr", {}, el("td", { class: "nowrap", text: when(g.created_at) }), el("td", {}, link), el("td", { text: g.tenant }),
      el("td", { text: g.key_version ?? "—" }), el("td", { class: "num", text: g.output_tokens }),
      el("td", { text: g.watermarked ? `${g.watermarked_tokens}` : `no (${g.unwatermarked_reason || "—"})` })));
  }
  if (!items.length) body.append(el("tr", {}, el("td", { colspan: 6, text: "No generations yet." })));
  $("recent-page").textContent = items.length ? `${recentOffset + 1}–${recentOffset + items.length}` : "";
  $("recent-prev").disabled = recentOffset === 0;
  $("recent-next").disabled = !page.has_more;
}

// ---------------------------------------------------------------- Keys (admin)

async function loadKeysPage() {
  if (!me || !me.admin) return;
  try {
    const select = $("keys-tenant");
    const previous = select.value;
    const { tenants } = await api("GET", "/v1/admin/tenants");
    clear(select);
    for (const t of tenants) select.append(el("option", { value: t.name, text: t.name }));
    if (tenants.some((t) => t.name === previous)) select.value = previous;
    await loadKeys();
  } catch (exc) { showError(exc); }
}

async function loadKeys() {
  const tenant = $("keys-tenant").value;
  if (!tenant) return;
  const { keys } = await api("GET", "/v1/admin/keys?tenant=" + encodeURIComponent(tenant));
  const body = clear($("keys-table").tBodies[0]);
  for (const k of keys.slice().sort((a, b) => b.version - a.version)) {
    const revoke = k.state === "revoked" ? null : el("button", { type: "button", class: "small", text: "Revoke…",
      "aria-label": `Revoke key version ${k.version}`, onclick: () => revokeKey(k) });
    body.append(el("tr", { "data-key": k.key_id }, el("td", { class: "num", text: k.version }), el("td", {}, el("code", { text: k.key_id })),
      el("td", {}, el("span", { class: "state state-" + k.state, text: k.state })), el("td", { text: k.spec.algorithm }),
      // The stored spec leaves `mode` out for `deterministic` keys (written before modes existed).
      el("td", { text: k.spec.mode || "deterministic" }),
      el("td", {}, el("code", { text: k.fingerprint })), el("td", { class: "nowrap", text: when(k.created_at) }), el("td", {}, revoke)));
  }
  const { events } = await api("GET", "/v1/admin/audit?limit=50&tenant=" + encodeURIComponent(tenant));
  const audit = clear($("audit-table").tBodies[0]);
  for (const e of events.slice().reverse()) {
    audit.append(el("tr", {}, el("td", { class: "nowrap", text: when(e.occurred_at) }), el("td", { text: e.actor }),
      el("td", {}, el("code", { text: e.action })), el("td", {}, e.key_id ? el("code", { text: e.key_id }) : "—"),
      el("td", { class: "details", text: detailsText(e.details) })));
  }
}

function confirmAction({ title, body, action, reason }) {
  const dialog = $("confirm");
  $("confirm-title").textContent = title;
  $("confirm-body").textContent = body;
  $("confirm-ok").textContent = action;
  $("confirm-reason-row").hidden = !reason;
  $("confirm-reason").value = "";
  $("confirm-reason").required = !!reason;
  $("confirm-reason").setCustomValidity("");
  return new Promise((resolve) => {
    const done = (ok) => {
      $("confirm-form").onsubmit = null;
      $("confirm-cancel").onclick = null;
      dialog.onclose = null;
      if (dialog.open) dialog.close();
      resolve(ok ? { reason: $("confirm-reason").value.trim() } : null);
    };
    $("confirm-reason").oninput = () => $("confirm-reason").setCustomValidity("");
    $("confirm-form").onsubmit = (event) => {
      event.preventDefault();
      // `required` accepts spaces, which the API refuses (422) after the dialog has closed.
      if (reason && !$("confirm-reason").value.trim()) {
        $("confirm-reason").setCustomValidity("Give a reason: it is recorded in the audit log.");
        $("confirm-reason").reportValidity();
        return;
      }
      done(true);
    };
    $("confirm-cancel").onclick = () => done(false);
    dialog.onclose = () => done(false);
    dialog.showModal();
    (reason ? $("confirm-reason") : $("confirm-cancel")).focus();
  });
}

async function rotateKey() {
  const tenant = $("keys-tenant").value;
  const ok = await confirmAction({ title: `Rotate the key of ${tenant}?`, action: "Rotate",
    body: `A new key becomes active for ${tenant} now; the current active key becomes verify-only (its text is still detected). Servers pick the new key up within a few seconds.` });
  if (!ok) return;
  await busy($("keys-rotate"), async () => {
    await api("POST", "/v1/admin/keys/rotate", { tenant });
    await loadKeys();
  });
  $("keys-rotate").focus();
}

async function revokeKey(key) {
  const ok = await confirmAction({ title: `Revoke key version ${key.version} of ${key.tenant}?`, action: "Revoke", reason: true,
    body: `Revoke only a compromised key: detections under it are reported as revoked from now on. This cannot be undone.` });
  if (!ok) return;
  await busy($("keys-rotate"), async () => {
    await api("POST", `/v1/admin/keys/${encodeURIComponent(key.key_id)}/revoke`, { reason: ok.reason });
    await loadKeys();
  });
}

// ---------------------------------------------------------------- wiring

document.addEventListener("DOMContentLoaded", () => {
  $("token-input").value = token();
  $("token-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    showError(null);
    setToken($("token-input").value);
    await refreshIdentity();
    route();
  });
  $("token-forget").addEventListener("click", async () => {
    setToken("");
    $("token-input").value = "";
    showError(null);
    await refreshIdentity();
    route();
  });

  $("check-form").addEventListener("submit", (event) => { event.preventDefault(); busy($("check-submit"), check); });
  $("check-text").addEventListener("input", updateCount);
  $("check-file").addEventListener("change", (event) => {
    const file = event.target.files[0];
    if (file) busy($("check-submit"), () => readDroppedFile(file));
  });
  const area = $("check-text");
  area.addEventListener("dragover", (event) => { event.preventDefault(); area.classList.add("dragging"); });
  area.addEventListener("dragleave", () => area.classList.remove("dragging"));
  area.addEventListener("drop", (event) => {
    event.preventDefault();
    area.classList.remove("dragging");
    const file = event.dataTransfer.files[0];
    if (file) busy($("check-submit"), () => readDroppedFile(file));
  });
  $("heat").addEventListener("keydown", onHeatKey);
  $("heat").addEventListener("focusin", (event) => { if (event.target.classList.contains("tok")) showToken(event.target); });
  $("heat").addEventListener("mouseover", (event) => { if (event.target.classList.contains("tok")) showToken(event.target); });
  $("token-details").addEventListener("toggle", () => { if ($("token-details").open) renderTokenTable(); });
  $("heat-toggle").addEventListener("change", (event) => {
    $("heat").classList.toggle("heat-on", event.target.checked);
    $("check-result").classList.toggle("heat-off", !event.target.checked);
  });

  $("gen-form").addEventListener("submit", (event) => { event.preventDefault(); busy($("gen-submit"), generate); });
  $("gen-to-check").addEventListener("click", () => {
    if (!lastGeneration) return;
    $("check-text").value = lastGeneration.text;
    updateCount();
    location.hash = "#check";
    busy($("check-submit"), check);
  });
  $("gen-to-record").addEventListener("click", () => {
    if (!lastGeneration) return;
    $("record-id").value = lastGeneration.generation_id;
    location.hash = "#record";
    busy($("record-submit"), () => lookUp(lastGeneration.generation_id));
  });

  $("record-form").addEventListener("submit", (event) => {
    event.preventDefault();
    busy($("record-submit"), () => lookUp($("record-id").value));
  });
  $("recent-load").addEventListener("click", () => loadRecent(0));
  $("recent-prev").addEventListener("click", () => loadRecent(recentOffset - PAGE_SIZE));
  $("recent-next").addEventListener("click", () => loadRecent(recentOffset + PAGE_SIZE));

  $("keys-tenant").addEventListener("change", () => busy($("keys-refresh"), loadKeys));
  $("keys-refresh").addEventListener("click", () => busy($("keys-refresh"), loadKeysPage));
  $("keys-rotate").addEventListener("click", rotateKey);

  window.addEventListener("hashchange", route);
  refreshIdentity().then(route);
});
