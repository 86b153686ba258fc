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
    const { payload, raw } = await apiRaw("POST", "/v1/public/detect", { text });
    renderPublicResult(payload);
    showReport(raw, text);
    return;
  }
  let response;
  try {
    response = await apiRaw("POST", "/v1/detect", { text, evidence: true });
  } catch (exc) {
    // Per-token evidence is capped (HALLMARK_MAX_EVIDENCE_TOKENS, 413): check a longer text
    // without it rather than not at all (a text over the detection limit fails again, and says so).
    // A tenant token without the evidence scope gets 403 for evidence: the same, without it.
    if (!(exc instanceof ApiError) || (exc.status !== 413 && exc.status !== 403)) throw exc;
    response = await apiRaw("POST", "/v1/detect", { text });
  }
  const { payload: result, raw } = response;
  renderResult(text, result);
  showReport(raw, text);
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

function verdictWords(result) {
  const k = result.key;
  const scored = `${result.scored_tokens} of ${result.total_tokens} tokens scored`;
  if (result.watermarked && k) {
    const who = k.tenant ? `tenant ${k.tenant}` : "an inline key";
    const version = k.version !== null && k.version !== undefined ? `key v${k.version}` : `key ${k.key_id}`;
    return { cls: k.state === "revoked" ? "revoked" : "yes", title: `Watermarked by ${who}, ${version} (${k.state})`, scored };
  }
  const match = bestKgramMatch(result);
  if (match) return { cls: "yes", title: `Edited copy of generation ${match.generation_id}`, scored };
  return { cls: "no", title: "Not watermarked", scored };
}

// The k-gram match the verdict can rest on (the API marks it `passes` and puts "ledger" in
// `basis` for it), best first.
function bestKgramMatch(result) {
  if (!(result.basis || []).includes("ledger")) return null;
  return (result.kgram_matches || []).find((m) => m.passes) || null;
}

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

function explain(result) {
  const items = [];
  const note = normalisationNote(result);
  if (note) items.push(note);
  const skipped = result.total_tokens - result.scored_tokens;
  const reasons = {};
  for (const t of (result.evidence && result.evidence.tokens) || []) {
    if (!t.scored) reasons[t.reason] = (reasons[t.reason] || 0) + 1;
  }
  const reasonText = Object.entries(reasons).map(([r, n]) => `${n} ${r.replaceAll("_", " ")}`).join(", ");
  const because = reasonText ? ` (${reasonText})` : "";
  if (!result.evidence) {
    items.push("The server gave no per-token scores for this text (it is longer than it scores token by token, or this token lacks the evidence scope), so the heat map is left out; the verdict covers the whole text.");
  }
  const scope = me && me.admin && !me.tenant ? "any tenant" : `tenant ${(me && me.tenant) || "yours"}`;
  if (result.watermarked) {
    const k = result.key;
    if (k && k.state === "revoked") {
      items.push("This key was revoked as compromised: whoever holds it could have produced this text, so the watermark no longer proves where it came from.");
    } else if (k && k.state === "verify-only") {
      items.push("The key is verify-only: it was the active key earlier and has since been rotated; its text is still detected.");
    }
    items.push(`The chance that text without this watermark scores this high is below the threshold ${thresholdText(result.threshold)} (corrected for the ${result.keys_tested} key${result.keys_tested === 1 ? "" : "s"} tested).`);
    if (skipped > 0) items.push(`${skipped} token${skipped === 1 ? " was" : "s were"} not scored${because}: a repeated context carries no new evidence.`);
    if (result.decided_by === "span") items.push("The whole text is not significant on its own; a stretch of it is (underlined below): part of the text is generated, the rest probably not.");
    if (result.spans && result.spans.length) items.push(`${result.spans.length} watermarked stretch${result.spans.length === 1 ? " is" : "es are"} underlined in the text below.`);
    return items;
  }
  const match = bestKgramMatch(result);
  if (match) {
    items.push(`The watermark alone is not significant here (${pText(result.log10_p_value, result.tier === "tenant")}), but ${match.matched_kgrams} of the text's ${match.text_kgrams} eight-token sequences match the keyed fingerprints recorded for generation ${match.generation_id} (${Math.round(match.share * 100)} %): the text is an edited copy of it. A chance collision this large has probability below ${boundText(match.log10_false_match_bound)}, and the ${match.shared_tokens} shared tokens carry this key's watermark (${pText(match.log10_shared_p, result.tier === "tenant")}), so they were generated, not written independently.`);
    items.push("Shared phrases are what the match measures: a text that quotes a generation word for word matches it too.");
    return items;
  }
  if (result.total_tokens === 0) return ["The text is empty after tokenisation: there is nothing to score."];
  if (result.scored_tokens < 50) {
    items.push(`Too short: only ${result.scored_tokens} token${result.scored_tokens === 1 ? "" : "s"} could be scored. A watermark usually needs 50 or more scored tokens to pass the threshold ${thresholdText(result.threshold)}, so a short watermarked text can be missed.`);
  }
  if (result.total_tokens >= 20 && skipped / result.total_tokens > 0.3) {
    items.push(`Too repetitive: ${skipped} of ${result.total_tokens} tokens repeat an earlier context${because} and are not counted.`);
  }
  items.push(`No key of ${scope} matches: ${keysTested(result)}; the best score was not significant.`);
  if (result.spans && result.spans.length) items.push(`${result.spans.length} stretch${result.spans.length === 1 ? "" : "es"} of the text nevertheless pass on their own (underlined below): part of it may be generated.`);
  items.push("“Not watermarked” means no evidence of these keys’ watermark, not proof that a person wrote it: another model’s text, or text edited heavily enough, looks the same.");
  return items;
}

// "1 key tested (active)", "3 keys tested (2 verify-only, 1 revoked)": the states of the keys
// the result lists, not every state there could be.
// A diverse key is tested under each of its 16 salts (one row per salt): counted once, with
// "under their salts" saying why the detector's count is larger.
function keysTested(result) {
  const n = result.keys_tested;
  const rows = result.per_key || [];
  let states = "";
  let keys = n;
  let salted = "";
  if (n && rows.length === n) {
    const seen = new Map();
    for (const r of rows) seen.set(`${r.tenant}/${r.key_id}/${r.version}`, r.state);
    if (seen.size < n && rows.some((r) => r.salt !== undefined && r.salt !== null)) {
      keys = seen.size;
      salted = `, ${n} with their salts`;
    }
    const counts = {};
    for (const state of seen.values()) counts[state] = (counts[state] || 0) + 1;
    const names = Object.keys(counts);
    states = names.length === 1 ? ` (${keys === 1 ? "" : "all "}${names[0]})` :
      ` (${names.map((name) => `${counts[name]} ${name}`).join(", ")})`;
  }
  return `${keys} key${keys === 1 ? "" : "s"} tested${salted}${states}`;
}

function heatClass(t) {
  if (!t.scored) return "skipped";
  const s = t.score;
  return s < 0.5 ? "h0" : s < 1 ? "h1" : s < 2 ? "h2" : s < 3 ? "h3" : s < 5 ? "h4" : "h5";
}

// What a token's score says, in words: the heat map's tooltip, its keyboard readout, the table.
function tokenNote(t) {
  return t.scored ? `score ${t.score.toFixed(2)}` : `not scored (${(t.reason || "").replaceAll("_", " ")})`;
}

function quoted(piece) { return `“${piece.replace(/\n/g, "↵")}”`; }

let heatRows = [];  // [{t, piece, inSpan}] of the last checked text, for the per-token table

function renderHeat(text, result) {
  const box = clear($("heat"));
  const chars = Array.from(text); // code points, as the API's character offsets count them
  const tokens = ((result.evidence && result.evidence.tokens) || []).filter((t) => t.char_start !== undefined);
  const spans = (result.spans || []).filter((s) => s.char_start !== undefined && s.char_start !== null);
  const spanOf = (t) => spans.findIndex((s) => t.char_start >= s.char_start && t.char_end <= s.char_end);
  let cursor = 0;
  let current = box;
  let currentSpan = -1;
  const slice = (a, b) => chars.slice(a, b).join("");
  heatRows = [];
  for (const t of tokens) {
    const start = Math.max(t.char_start, cursor);
    const end = t.char_end;
    const which = spanOf(t);
    if (which !== currentSpan) {
      current = which >= 0 ? box.appendChild(el("mark", { class: "wm-span", title: `watermarked span, ${spans[which].scored_tokens} tokens scored` })) : box;
      currentSpan = which;
    }
    if (start > cursor) current.append(slice(cursor, start));
    if (end <= start) continue; // a token inside a character already shown (byte-level pieces)
    const piece = slice(start, end);
    // The title is the tooltip on hover and, when the token has focus, its accessible
    // description (its name is its text): what a screen reader reads after the token.
    current.append(el("span", { class: "tok " + heatClass(t), title: `${quoted(piece)} token ${t.index}: ${tokenNote(t)}`,
                                "data-score": t.scored ? t.score : null, "data-index": t.index,
                                "data-row": heatRows.length, tabindex: "-1" }, piece));
    heatRows.push({ t, piece, inSpan: which >= 0 });
    cursor = end;
  }
  if (cursor < chars.length) box.append(slice(cursor, chars.length));
  const first = box.querySelector(".tok");
  // One tab stop: the first token (then the last one visited), or the box itself when it has
  // no tokens (it may still scroll).
  if (first) { first.tabIndex = 0; box.removeAttribute("tabindex"); } else box.tabIndex = 0;
  $("heat-readout").hidden = !first;
  $("heat-readout").textContent = first ? "Tab into the text, then use ← and → (Home, End) to read each token's score here." : "";
  $("token-details").hidden = !first;
  if ($("token-details").open) renderTokenTable();
}

function showToken(span) {
  const row = heatRows[Number(span.dataset.row)];
  if (row) $("heat-readout").textContent = `Token ${row.t.index}, ${quoted(row.piece)}: ${tokenNote(row.t)}${row.inSpan ? ", in a watermarked span" : ""}.`;
}

// Roving focus over the tokens (one tab stop; ←/→ move, Home/End jump), the score shown
// below the text for keyboard users as well as on hover.
function onHeatKey(event) {
  const from = event.target.closest && event.target.closest(".tok");
  if (!from) return;
  const all = Array.from($("heat").querySelectorAll(".tok"));
  const at = all.indexOf(from);
  const to = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: all.length - 1 }[event.key];
  if (to === undefined || to < 0 || to >= all.length) return;
  event.preventDefault();
  from.tabIndex = -1;
  all[to].tabIndex = 0;
  all[to].focus();
}

function renderTokenTable() {
  const body = clear($("token-table").tBodies[0]);
  for (const { t, piece, inSpan } of heatRows) {
    body.append(el("tr", {},
      el("td", { class: "num", text: t.index }), el("td", {}, el("code", { class: "piece", text: quoted(piece) })),
      el("td", { class: "num", text: t.scored ? t.score.toFixed(2) : "—" }),
      el("td", { text: [t.scored ? "" : tokenNote(t), inSpan ? "in a watermarked span" : ""].filter(Boolean).join("; ") })));
  }
}

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

// Why a k-gram match does not count as a copy (the API's `passes` is false).
function kgramShortfall(m, threshold, bounded) {
  if (m.log10_false_match_bound > Math.log10(threshold)) {
    return `so few shared sequences could match by chance (bound ${boundText(m.log10_false_match_bound)}, above the threshold)`;
  }
  if (m.log10_shared_p === null || m.log10_shared_p === undefined) return "its shared tokens were not tested (only the strongest matches are)";
  return `the shared tokens do not carry the watermark (${pText(m.log10_shared_p, bounded)}): phrases written without the key's choices, such as boilerplate, are shared by any text`;
}

function renderLedger(result) {
  const box = clear($("ledger"));
  const matches = result.ledger_matches || [];
  const kgrams = (result.kgram_matches || []).filter((m) => !matches.some((x) => x.generation_id === m.generation_id));
  for (const m of kgrams) {
    const share = `${m.matched_kgrams} of ${m.text_kgrams} eight-token sequences shared (${Math.round(m.share * 100)} %)`;
    const states = keyStates(m) ? `; key ${keyStates(m)}` : "";
    // Only a match the API says passes is a copy; any other is its share and why it is not enough.
    box.append(m.passes ?
      el("div", { class: "match kgram-match" },
        el("strong", { text: "Edited copy of generation " }), recordLink(m.generation_id),
        el("div", { class: "hint" }, `${share}, chance-collision bound ${boundText(m.log10_false_match_bound)}${states}`)) :
      el("div", { class: "match kgram-weak" },
        el("span", { text: "Shares phrases with generation " }), recordLink(m.generation_id),
        el("div", { class: "hint" }, `${share}: not enough to call it a copy: ${kgramShortfall(m, result.threshold, result.tier === "tenant")}${states}`)));
  }
  if (!matches.length && kgrams.some((m) => m.passes)) return;
  if (!matches.length) {
    box.append(el("p", {}, "No ledger record holds exactly this text. ",
      result.watermarked ? "The watermark is still evidence: the text may have been edited, trimmed or re-formatted after generation." :
        "Only exact copies of a generation's output are found in the ledger."));
    return;
  }
  for (const m of matches) {
    const entry = m.ledger ? el("div", { class: "hint" }, "ledger entry ", el("code", { text: `#${m.ledger.seq}` }), " hash ",
      el("code", { text: m.ledger.entry_hash.slice(0, 16) + "…", title: m.ledger.entry_hash })) : null;
    const states = keyStates(m) ? ` (${keyStates(m)})` : "";
    box.append(el("div", { class: "match" },
      el("strong", { text: "Exact copy of generation " }), recordLink(m.generation_id),
      el("div", { class: "hint" }, `tenant ${m.tenant}, key v${m.key_version ?? "—"}${states}, ${m.engine} / ${m.model}, ${m.watermarked_tokens} watermarked tokens, ${when(m.created_at)}${m.status ? `, ${m.status.replace("_", " ")}` : ""}`),
      entry));
  }
}

function renderPerKey(result) {
  const body = clear($("per-key").tBodies[0]);
  const bounded = result.tier === "tenant";
  for (const r of result.per_key || []) {
    body.append(el("tr", {},
      el("td", { text: r.tenant ?? "—" }), el("td", {}, el("code", { text: r.key_id ?? r.fingerprint })),
      el("td", { text: r.version ?? "—" }), el("td", {}, el("span", { class: "state state-" + r.state, text: r.state })),
      el("td", { text: r.statistic }), el("td", { class: "num", text: r.scored_tokens }),
      el("td", {}, pValue(r.log10_p_value, bounded)), el("td", {}, pValue(r.log10_p_adjusted, bounded))));
  }
}

// The public tier's answer: the verdict in words, a confidence band, the basis; no scores,
// spans or keys, so the heat map and the key table are hidden.
function renderPublicResult(result) {
  const verdict = $("verdict");
  const yes = result.verdict === "watermarked" || result.verdict === "recorded";
  verdict.className = "verdict " + (yes ? "yes" : "no");
  verdict.removeAttribute("data-signed");
  const title = { watermarked: "Watermarked", recorded: "Recorded as generated", not_watermarked: "Not watermarked",
                  too_short: "Too short to say" }[result.verdict] || result.verdict;
  $("verdict-title").textContent = result.tenant ? `${title} (${result.tenant})` : title;
  const detail = clear($("verdict-detail"));
  detail.append(`Public check: ${result.confidence} confidence, ${result.tokens} tokens` +
                (result.basis.length ? `, resting on the ${result.basis.join(" and the ")}` : "") + ".");
  const list = clear($("explain"));
  list.append(el("li", { text: result.verdict_text.charAt(0).toUpperCase() + result.verdict_text.slice(1) + "." }));
  list.append(el("li", { text: "The public check gives a verdict and a confidence band only. With an API token the page shows the p-value, the watermarked stretches and the key." }));
  $("heat-panel").hidden = true;
  $("per-key-panel").hidden = true;
  clear($("ledger"));
  $("check-result").hidden = false;
  verdict.focus();
}

function renderResult(text, result) {
  $("heat-panel").hidden = false;
  $("per-key-panel").hidden = false;
  const words = verdictWords(result);
  const verdict = $("verdict");
  verdict.className = "verdict " + words.cls;
  verdict.removeAttribute("data-signed");
  $("verdict-title").textContent = words.title;
  const detail = clear($("verdict-detail"));
  detail.append(pValue(result.log10_p_value, result.tier === "tenant"), `, ${words.scored} (threshold `, thresholdNode(result.threshold), ").");
  const list = clear($("explain"));
  for (const item of explain(result)) list.append(el("li", { text: item }));
  renderHeat(text, result);
  renderLedger(result);
  renderPerKey(result);
  $("check-result").hidden = false;
  verdict.focus();
}
