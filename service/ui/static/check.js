// The Check tab: a text checked against the API (the token's tier, or the public check without
// one) and its answer drawn as the API gives it. Loaded after app.js (its helpers: el, clear,
// pValue, api, me, showSigned, ...); classic scripts share one global scope.
"use strict";

async function readDroppedFile(file) {
  if (!/\.(txt|md|markdown)$/i.test(file.name) && !/^text\//.test(file.type)) {
    throw new ApiError(0, `${file.name}: only .txt and .md files can be checked`, "invalid_file");
  }
  $("check-text").value = await file.text();
  updateCount();
}

function updateCount() {
  const n = Array.from($("check-text").value).length;
  $("check-count").textContent = n ? `${n.toLocaleString()} characters` : "";
}

async function check() {
  await adoptTypedToken();
  const text = $("check-text").value;
  if (!text.trim()) throw new ApiError(0, "paste a text (or drop a file) to check", "empty");
  if (!token()) {  // no token: the public check (service/access), which answers in words
    const { payload, raw } = await detectCall("/v1/public/detect", { text });
    renderPublicResult(payload);
    showReport(raw, text);
    return;
  }
  let response;
  let withheld = null;
  try {
    response = await detectCall("/v1/detect", { text, evidence: true });
  } catch (exc) {
    // Per-token evidence is capped (HALLMARK_MAX_EVIDENCE_TOKENS, 413) and needs a token allowed
    // it (403, before anything is counted): check without it rather than not at all, and say why
    // there is no heat map (a text over the detection limit fails again, and says so).
    if (!(exc instanceof ApiError) || (exc.status !== 413 && exc.status !== 403)) throw exc;
    withheld = exc.message;
    response = await detectCall("/v1/detect", { text });
  }
  const { payload: result, raw } = response;
  // The tenant tier answers but withholds per-token evidence of a text that is not its own
  // unedited generation (issue 31): say so, in the server's words.
  renderResult(text, result, withheld || result.evidence_withheld || null);
  showReport(raw, text);
}

// A detection request; a 429 (the probe guard's limit on one text's checks, a daily budget, the
// request rate) is shown with its message, when to retry (Retry-After) and what checks without
// a limit: `hallmark detect`, which reads the store directly (issue 34, item 2).
async function detectCall(path, body) {
  try {
    return await apiRaw("POST", path, body);
  } catch (exc) {
    if (exc instanceof ApiError && exc.status === 429) {
      const scope = me && me.tenant ? `--tenant ${me.tenant}` : "--all-tenants";
      exc.advice = [" Where this gateway runs (its store and KEK on that machine), ",
                    el("code", { text: `hallmark detect ${scope} --text-file FILE` }), " checks a text without this limit."];
    }
    throw exc;
  }
}

// The signed report must be about the text on screen and sign the result shown: otherwise the
// verdict above is marked as not verified (the server's signature covers the report, not the page).
function showReport(raw, text) {
  const verdict = $("verdict");
  verdict.removeAttribute("data-signed");
  let shown = null;
  try { shown = window.HallmarkVerify.parseRaw(raw); } catch (_) { shown = null; }
  const check = (document) => window.HallmarkVerify.verifyReport(document, { text, shown });
  showSigned($("report-status"), raw, "report", check, "Signed report", (out) => {
    verdict.dataset.signed = String(out.ok);
    if (out.ok === false) {
      verdict.classList.add("unverified");
      $("verdict-title").textContent = `Not verified: ${$("verdict-title").textContent}`;
    }
  });
}

// ---------------------------------------------------------------- the verdict

// The answer's verdict: the API's `verdict` where it gives one (the signed report's), else what
// its fields say. Any verdict the page does not know is shown in words, never dropped.
function verdictOf(result) {
  if (result.verdict) return result.verdict;
  if (result.watermarked) return "watermarked";
  return (result.basis || []).includes("ledger") ? "recorded" : "not_watermarked";
}

const VERDICT_TITLES = {
  watermarked: "Watermarked", recorded: "Recorded as generated", not_watermarked: "Not watermarked",
  too_short: "Too short to say", not_tested: "Not tested", key_revoked: "Watermark of a revoked key",
  passes_lenient_threshold: "Passes a lenient threshold only",
};

function verdictTitle(verdict) {
  const words = String(verdict || "no verdict").replaceAll("_", " ");
  return VERDICT_TITLES[verdict] || words.charAt(0).toUpperCase() + words.slice(1);
}

function verdictClass(verdict, key) {
  if (verdict === "key_revoked" || (verdict === "watermarked" && key && key.state === "revoked")) return "revoked";
  return verdict === "watermarked" || verdict === "recorded" ? "yes" : "no";
}

function keyName(k) {
  const who = k.tenant ? `tenant ${k.tenant}` : "an inline key";
  return `${who}, ${k.version !== null && k.version !== undefined ? `key v${k.version}` : `key ${k.key_id}`}`;
}

function verdictWords(result) {
  const verdict = verdictOf(result);
  const k = result.key;
  let title = verdictTitle(verdict);
  if (verdict === "watermarked" && k) title = `Watermarked by ${keyName(k)} (${k.state})`;
  else if (verdict === "key_revoked" && k) title = `Watermark of a revoked key: ${keyName(k)}`;
  else if (verdict === "recorded") {
    const edited = bestKgramMatch(result);
    const exact = (result.ledger_matches || [])[0];
    if (edited) title = `Edited copy of generation ${edited.generation_id}`;
    else if (exact) title = `Recorded: generation ${exact.generation_id}`;
  }
  return { verdict, cls: verdictClass(verdict, k), title };
}

// "p ≤ 10⁻¹³⁰, 153 of 153 tokens scored (threshold 10⁻⁶)."; without a p (a tier that withholds
// it), the band the answer gives instead, if any: the tenant's "p > 10⁻⁶", the public confidence.
function verdictDetail(result) {
  const detail = clear($("verdict-detail"));
  if (typeof result.log10_p_value === "number") detail.append(pValue(result.log10_p_value, result.tier === "tenant"), ", ");
  // The tenant tier above its threshold: one band, no p (service/access/shape.py, issue 31).
  else if (result.p_band && typeof result.threshold === "number") detail.append("p > ", thresholdNode(result.threshold), ", ");
  else if (result.confidence && result.confidence !== "none") detail.append(`${result.confidence} confidence, `);
  detail.append(`${result.scored_tokens} of ${result.total_tokens} tokens scored (threshold `, thresholdNode(result.threshold), ").");
}

// The k-gram match the verdict can rest on (the API marks it `passes` and puts "ledger" in
// `basis` for it), best first.
function bestKgramMatch(result) {
  if (!(result.basis || []).includes("ledger")) return null;
  return (result.kgram_matches || []).find((m) => m.passes) || null;
}

// ---------------------------------------------------------------- keys, not salts

// A `diverse` key is tested under each of its salts: the API lists one `per_key` row (and counts
// one in `tests`) a salt, and counts keys in `keys_tested`. The page counts keys as keys and
// tests as tests (issue 34, item 5).
function keyGroups(rows) {
  const groups = new Map();
  for (const r of rows) {
    const id = `${r.tenant}/${r.key_id}/${r.version}/${r.key_id ? "" : r.fingerprint}`;
    if (!groups.has(id)) groups.set(id, []);
    groups.get(id).push(r);
  }
  return groups;
}

// {keys, tests, states} of a result: keys null where the answer has no per-key rows to tell
// keys from salts (a tier that withholds the table).
function testCounts(result) {
  const rows = Array.isArray(result.per_key) ? result.per_key : [];
  // `tests`: (key, salt) pairs the correction counts; `keys_tested`: keys (salts are not keys).
  const tests = Math.max(result.tests || result.keys_tested || 0, rows.length);
  if (!rows.length) return { keys: null, tests, states: {} };
  const states = {};
  const groups = keyGroups(rows);
  for (const group of groups.values()) states[group[0].state] = (states[group[0].state] || 0) + 1;
  return { keys: groups.size, tests, states };
}

const plural = (n, word, many = word + "s") => `${n} ${n === 1 ? word : many}`;

// "1 key tested under 16 salts (active)", "3 keys tested (18 tests with their salts; 2 verify-only,
// 1 revoked)": the states of the keys the result lists, not every state there could be.
function keysTested(result) {
  const { keys, tests, states } = testCounts(result);
  if (keys === null) return `${plural(tests, "test")} (each key, a diverse key under each of its salts)`;
  const order = ["active", "verify-only", "revoked"];
  const rank = (name) => (order.includes(name) ? order.indexOf(name) : order.length);
  const names = Object.keys(states).sort((a, b) => rank(a) - rank(b));
  const stateWords = names.length === 1 ? `${keys === 1 ? "" : "all "}${names[0]}` :
    names.map((name) => `${states[name]} ${name}`).join(", ");
  if (tests === keys) return `${plural(keys, "key")} tested (${stateWords})`;
  if (keys === 1) return `1 key tested under ${tests} salts (${stateWords})`;
  return `${plural(keys, "key")} tested (${tests} tests with their salts; ${stateWords})`;
}

// What the global p is corrected for: "the 3 keys tested", "16 tests (1 key under each of its 16 salts)".
function correctedFor(result) {
  const { keys, tests } = testCounts(result);
  if (keys === null) return plural(tests, "test");
  if (tests === keys) return `the ${plural(keys, "key")} tested`;
  return `${tests} tests (${keys === 1 ? `1 key under each of its ${tests} salts` : `${keys} keys, each diverse key under each of its salts`})`;
}

// ---------------------------------------------------------------- what the answer means

function normalisationNote(result) {
  const n = result.normalization;
  if (!n || !n.changed) return null;
  const names = { zero_width: "zero-width characters dropped", bidi: "bidi controls dropped", nfkc: "compatibility forms folded",
                  homoglyph: "look-alike letters mapped to Latin", whitespace: "runs of spaces collapsed" };
  const parts = Object.entries(n.changes || {}).filter(([, v]) => typeof v === "number" && v > 0)
    .map(([k, v]) => `${v} ${names[k] || k.replaceAll("_", " ")}`);
  const form = { as_sent: "the text as pasted", normalized_spaces_kept: "the normalised text with its runs of spaces kept" }[n.scored] || "the normalised text";
  return `The text was also scored after normalising it against tokenisation tricks (${parts.join(", ") || "changed"}); the verdict rests on ${form}, which scored best (its p is multiplied by the number of forms tried). Offsets and highlights refer to the text as pasted.`;
}

// What this token's answer leaves out for this text (a tier may withhold the p-value, the spans
// and the per-key table: service/access), said once instead of drawn as if absent.
function withheldNote(result) {
  if (result.tier !== "tenant") return null;
  const missing = [];
  if (typeof result.log10_p_value !== "number") missing.push("the p-value");
  if (!Array.isArray(result.spans)) missing.push("the watermarked stretches");
  if (!Array.isArray(result.per_key)) missing.push("the per-key table");
  if (!missing.length) return null;
  const list = missing.length === 1 ? missing[0] : `${missing.slice(0, -1).join(", ")} and ${missing[missing.length - 1]}`;
  return `This token's answer for this text leaves out ${list} (its access tier, tenant: see Detection access in the documentation); the verdict and the signed report stand without ${missing.length === 1 ? "it" : "them"}.`;
}

function explain(result) {
  const items = [];
  const note = normalisationNote(result);
  if (note) items.push(note);
  const withheld = withheldNote(result);
  if (withheld) items.push(withheld);
  const skipped = result.total_tokens - result.scored_tokens;
  const reasons = {};
  for (const t of (result.evidence && result.evidence.tokens) || []) {
    if (!t.scored) reasons[t.reason] = (reasons[t.reason] || 0) + 1;
  }
  const reasonText = Object.entries(reasons).map(([r, n]) => `${n} ${r.replaceAll("_", " ")}`).join(", ");
  const because = reasonText ? ` (${reasonText})` : "";
  const drawn = drawnSpans(result).length;
  const scope = me && me.admin && !me.tenant ? "any tenant" : `tenant ${(me && me.tenant) || "yours"}`;
  const bounded = result.tier === "tenant";
  const verdict = verdictOf(result);
  const k = result.key;
  if (verdict === "key_revoked" || (result.watermarked && k && k.state === "revoked")) {
    items.push("This key was revoked as compromised: whoever holds it could have produced this text, so the watermark no longer proves where it came from.");
  }
  if (result.watermarked) {
    if (k && k.state === "verify-only") {
      items.push("The key is verify-only: it was the active key earlier and has since been rotated; its text is still detected.");
    }
    items.push(`The chance that text without this watermark scores this high is below the threshold ${thresholdText(result.threshold)}, corrected for ${correctedFor(result)}.`);
    if (skipped > 0) items.push(`${skipped} token${skipped === 1 ? " was" : "s were"} not scored${because}: a repeated context carries no new evidence.`);
    if (result.decided_by === "span") items.push("The whole text is not significant on its own; a stretch of it is (underlined below): part of the text is generated, the rest probably not.");
    if (drawn) items.push(`${drawn} watermarked stretch${drawn === 1 ? " is" : "es are"} underlined in the text below.`);
    return items;
  }
  const match = bestKgramMatch(result);
  if (match) {
    const p = typeof result.log10_p_value === "number" ? ` (${pText(result.log10_p_value, bounded)})` : "";
    const shared = typeof match.log10_shared_p === "number" ?
      `, and the ${match.shared_tokens} shared tokens carry this key's watermark (${pText(match.log10_shared_p, bounded)}), so they were generated, not written independently` : "";
    const bound = typeof match.log10_false_match_bound === "number" ?
      ` A chance collision this large has probability below ${boundText(match.log10_false_match_bound)}${shared}.` : "";
    items.push(`The watermark alone is not significant here${p}, but ${match.matched_kgrams} of the text's ${match.text_kgrams} eight-token sequences match the keyed fingerprints recorded for generation ${match.generation_id} (${Math.round(match.share * 100)} %): the text is an edited copy of it.${bound}`);
    items.push("Shared phrases are what the match measures: a text that quotes a generation word for word matches it too.");
    return items;
  }
  if (!["not_watermarked", "recorded", "key_revoked"].includes(verdict)) {
    // A verdict the page has no words of its own for: the signed report's.
    const words = result.report && result.report.statement && result.report.statement.verdict_text;
    if (words) items.push(`The signed report says: ${words}.`);
  }
  if (result.total_tokens === 0) return ["The text is empty after tokenisation: there is nothing to score."];
  if (result.scored_tokens < 50) {
    items.push(`Too short: only ${result.scored_tokens} token${result.scored_tokens === 1 ? "" : "s"} could be scored. A watermark usually needs 50 or more scored tokens to pass the threshold ${thresholdText(result.threshold)}, so a short watermarked text can be missed.`);
  }
  if (result.total_tokens >= 20 && skipped / result.total_tokens > 0.3) {
    items.push(`Too repetitive: ${skipped} of ${result.total_tokens} tokens repeat an earlier context${because} and are not counted.`);
  }
  if (verdict === "key_revoked") return items;
  items.push(`No key of ${scope} matches: ${keysTested(result)}; the best score was not significant.`);
  if (drawn) items.push(`${drawn} stretch${drawn === 1 ? "" : "es"} of the text nevertheless pass on their own (underlined below): part of it may be generated.`);
  items.push("“Not watermarked” means no evidence of these keys’ watermark, not proof that a person wrote it: another model’s text, or text edited heavily enough, looks the same.");
  return items;
}

// ---------------------------------------------------------------- the ledger

// The key's state at generation and now, each named (a key revoked since reads "revoked now").
function keyStates(m) {
  const at = m.key_state_at_generation ?? m.key_state;
  const now = m.key_state_now;
  if (!at && !now) return "";
  if (!now) return `${at} at generation`;
  return at === now ? `${at} at generation and now` : `${at} at generation, ${now} now`;
}

function recordLink(id) {
  const link = el("a", { href: "#record", "data-id": id, text: id });
  link.addEventListener("click", () => { $("record-id").value = id; busy($("record-submit"), () => lookUp(id)); });
  return link;
}

// Why a k-gram match does not count as a copy (the API's `passes` is false); empty where the
// answer leaves out the numbers that say why (a tenant tier may).
function kgramShortfall(m, threshold, bounded) {
  if (typeof m.log10_false_match_bound === "number" && m.log10_false_match_bound > Math.log10(threshold)) {
    return `so few shared sequences could match by chance (bound ${boundText(m.log10_false_match_bound)}, above the threshold)`;
  }
  if (!("log10_shared_p" in m)) return "";
  if (m.log10_shared_p === null || m.log10_shared_p === undefined) return "its shared tokens were not tested (only the strongest matches are)";
  return `the shared tokens do not carry the watermark (${pText(m.log10_shared_p, bounded)}): phrases written without the key's choices, such as boilerplate, are shared by any text`;
}

// Whose generation a match is: the match's tenant, else the tenant of the key it names among
// the keys tested, else (a tenant's own ledger) the token's tenant.
function ownerOf(result, m) {
  if (m.tenant) return m.tenant;
  const row = (result.per_key || []).find((r) => r.key_id === m.key_id) ||
    (result.key && result.key.key_id === m.key_id ? result.key : null);
  return (row && row.tenant) || (me && me.tenant) || null;
}

// Exact copies first, then edited copies (k-gram matches that pass), then generations that
// share phrases without being copies (issue 34, item 7); each names its tenant.
function renderLedger(result) {
  $("ledger-title").textContent = "Provenance ledger";
  const box = clear($("ledger"));
  const exact = result.ledger_matches || [];
  const kgrams = (result.kgram_matches || []).filter((m) => !exact.some((x) => x.generation_id === m.generation_id));
  const copies = kgrams.filter((m) => m.passes);
  const weak = kgrams.filter((m) => !m.passes);
  for (const m of exact) {
    const entry = m.ledger ? el("div", { class: "hint" }, "ledger entry ", el("code", { text: `#${m.ledger.seq}` }), " hash ",
      el("code", { text: m.ledger.entry_hash.slice(0, 16) + "…", title: m.ledger.entry_hash })) : null;
    const states = keyStates(m) ? ` (${keyStates(m)})` : "";
    box.append(el("div", { class: "match" },
      el("strong", { text: "Exact copy of generation " }), recordLink(m.generation_id),
      el("div", { class: "hint" }, `tenant ${m.tenant}, key v${m.key_version ?? "—"}${states}, ${m.engine} / ${m.model}, ${m.watermarked_tokens} watermarked tokens, ${when(m.created_at)}${m.status ? `, ${m.status.replace("_", " ")}` : ""}`),
      entry));
  }
  const kgramCard = (m, cls, lead, why) => {
    const share = `${m.matched_kgrams} of ${m.text_kgrams} eight-token sequences shared (${Math.round(m.share * 100)} %)`;
    const owner = ownerOf(result, m);
    const states = keyStates(m) ? `; key ${keyStates(m)}` : "";
    return el("div", { class: `match ${cls}` }, el(cls === "kgram-match" ? "strong" : "span", { text: lead }),
      recordLink(m.generation_id), el("div", { class: "hint" }, `${owner ? `tenant ${owner}; ` : ""}${share}${why}${states}`));
  };
  for (const m of copies) {
    const bound = typeof m.log10_false_match_bound === "number" ? `, chance-collision bound ${boundText(m.log10_false_match_bound)}` : "";
    box.append(kgramCard(m, "kgram-match", "Edited copy of generation ", bound));
  }
  if (!exact.length && !copies.length) {
    const none = "No ledger record holds this text or an edited copy of it.";
    box.append(el("p", {}, none, result.watermarked ?
      " The watermark is still evidence: the text may have been edited, trimmed or re-formatted after generation." :
      weak.length ? " These generations share some of its phrases, not enough to call it a copy:" : ""));
  } else if (weak.length) {
    box.append(el("p", {}, "Other generations share some of its phrases, not enough to call it a copy:"));
  }
  for (const m of weak) {
    const why = kgramShortfall(m, result.threshold, result.tier === "tenant");
    box.append(kgramCard(m, "kgram-weak", "Shares phrases with generation ", `: not enough to call it a copy${why ? `: ${why}` : ""}`));
  }
}

// One row per key (its best salt's numbers), however many salts it was tested under.
function renderPerKey(result) {
  const rows = Array.isArray(result.per_key) ? result.per_key : [];
  $("per-key-panel").hidden = !rows.length;
  const body = clear($("per-key").tBodies[0]);
  const bounded = result.tier === "tenant";
  const p = (r) => (typeof r.log10_p_value === "number" ? r.log10_p_value : 0);
  // A tenant's per-key p is withheld above the threshold (a number there guides a forger): a dash.
  const cell = (v) => (bounded && typeof v !== "number" ? document.createTextNode("—") : pValue(v, bounded));
  for (const group of keyGroups(rows).values()) {
    const r = group.reduce((best, row) => (p(row) < p(best) ? row : best));
    const salts = group.length > 1 ? `${group.length}, best ${r.salt}` : r.salt !== undefined && r.salt !== null ? `only ${r.salt}` : "—";
    body.append(el("tr", {},
      el("td", { text: r.tenant ?? "—" }), el("td", {}, el("code", { text: r.key_id ?? r.fingerprint })),
      el("td", { text: r.version ?? "—" }), el("td", {}, el("span", { class: "state state-" + r.state, text: r.state })),
      el("td", { text: salts }), el("td", { text: r.statistic }), el("td", { class: "num", text: r.scored_tokens }),
      el("td", {}, cell(r.log10_p_value)), el("td", {}, cell(r.log10_p_adjusted))));
  }
  $("per-key-summary").textContent = rows.length ? `Every key tested: ${keysTested(result)}` : "Every key tested";
}

// ---------------------------------------------------------------- rendering

// The public tier's answer: the verdict in words, a confidence band, the basis; no scores,
// spans or keys, so the text and the key table are hidden and the ledger panel holds only
// the signed report.
function renderPublicResult(result) {
  const verdict = $("verdict");
  verdict.className = "verdict " + verdictClass(result.verdict, null);
  verdict.removeAttribute("data-signed");
  const title = verdictTitle(result.verdict);
  $("verdict-title").textContent = result.tenant ? `${title} (${result.tenant})` : title;
  const band = result.confidence && result.confidence !== "none" ? `, ${result.confidence} confidence` : "";
  const basis = (result.basis || []).length ? `, resting on the ${result.basis.join(" and the ")}` : "";
  clear($("verdict-detail")).append(`Public check of ${result.tokens} tokens${band}${basis}.`);
  const list = clear($("explain"));
  const words = result.verdict_text || "";
  if (words) list.append(el("li", { text: words.charAt(0).toUpperCase() + words.slice(1) + "." }));
  list.append(el("li", { text: "The public check gives a verdict in words and a confidence band only. With an API token the page shows what that token's access tier allows: the key and the ledger's records, and where the tier gives them the p-value and the watermarked stretches." }));
  $("heat-panel").hidden = true;
  $("per-key-panel").hidden = true;
  $("ledger-title").textContent = "Signed report";
  clear($("ledger"));
  $("check-result").hidden = false;
  verdict.focus();
}

// `withheld`: the server's refusal of the per-token evidence the page asked for (or null).
function renderResult(text, result, withheld) {
  $("heat-panel").hidden = false;
  const words = verdictWords(result);
  const verdict = $("verdict");
  verdict.className = "verdict " + words.cls;
  verdict.removeAttribute("data-signed");
  $("verdict-title").textContent = words.title;
  verdictDetail(result);
  const list = clear($("explain"));
  for (const item of explain(result)) list.append(el("li", { text: item }));
  renderText(text, result, withheld);
  renderLedger(result);
  renderPerKey(result);
  $("check-result").hidden = false;
  verdict.focus();
}
