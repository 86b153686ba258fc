// The checked text as Check shows it: the watermarked stretches the API returns underlined,
// and, where the answer carries per-token evidence, each token coloured by its score (the
// heat map, with keyboard reading and a table). Without evidence the text still shows its
// stretches, and the panel says why there is no heat map (issue 34, item 1: the page offered
// a heat-map switch and "1 stretch is underlined below" over plain text). Loaded after app.js.
"use strict";

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

// The spans the text can be underlined with: those with character offsets, in order.
function drawnSpans(result) {
  return (Array.isArray(result.spans) ? result.spans : [])
    .filter((s) => typeof s.char_start === "number" && typeof s.char_end === "number" && s.char_end > s.char_start)
    .sort((a, b) => a.char_start - b.char_start);
}

function spanMark(span) {
  return el("mark", { class: "wm-span", title: `watermarked span, ${span.scored_tokens} tokens scored` });
}

// `withheld`: why the answer has no per-token evidence, in the server's words (its refusal of
// the evidence the page asked for), or null.
function renderText(text, result, withheld) {
  const tokens = ((result.evidence && result.evidence.tokens) || []).filter((t) => t.char_start !== undefined);
  const spans = drawnSpans(result);
  const panel = $("heat-panel");
  panel.classList.toggle("no-evidence", !tokens.length);
  $("heat-title").textContent = tokens.length ? "The text, token by token" :
    spans.length ? "The text, its watermarked stretches underlined" : "The text";
  $("legend").hidden = !tokens.length && !spans.length;
  const note = $("heat-note");
  note.textContent = tokens.length ? "" : evidenceNote(result, withheld);
  note.hidden = !!tokens.length;
  if (tokens.length) renderHeat(text, tokens, spans); else renderSpans(text, spans);
}

// Why there is no heat map, and what would give one: the server's own refusal where the page
// asked for evidence and was refused (the scope, the size), less its advice to API clients.
function evidenceNote(result, withheld) {
  if (withheld) {
    const reason = withheld.replace(/(;|:)? *(send a shorter text or )?leave 'evidence' out\.?$/, "")
      .replace("TOKEN_ID", (me && me.token_id) || "TOKEN_ID");
    return `No per-token scores (the heat map) for this check: ${reason}.`;
  }
  return "No per-token scores (the heat map) for this check: the answer carries none.";
}

function renderSpans(text, spans) {
  const box = clear($("heat"));
  const chars = Array.from(text); // code points, as the API's character offsets count them
  const slice = (a, b) => chars.slice(a, b).join("");
  let cursor = 0;
  for (const span of spans) {
    const start = Math.max(span.char_start, cursor);
    if (span.char_end <= start) continue;
    if (start > cursor) box.append(slice(cursor, start));
    const mark = spanMark(span);
    mark.append(slice(start, span.char_end));
    box.append(mark);
    cursor = span.char_end;
  }
  if (cursor < chars.length) box.append(slice(cursor, chars.length));
  heatRows = [];
  box.tabIndex = 0;  // it may scroll
  $("heat-readout").hidden = true;
  $("heat-readout").textContent = "";
  $("token-details").hidden = true;
}

function renderHeat(text, tokens, spans) {
  const box = clear($("heat"));
  const chars = Array.from(text);
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
      current = which >= 0 ? box.appendChild(spanMark(spans[which])) : box;
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
