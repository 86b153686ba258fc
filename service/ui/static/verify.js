// Verifying Hallmark's signed documents (generation receipts, detection reports) in the
// browser, with WebCrypto's Ed25519 and SHA-256: the signing keys at
// /.well-known/hallmark-keys.json are trusted only as the transparency log holds them.
//
// A signature covers `${type}/v${version}\n` + the canonical JSON of the statement (keys
// sorted, no whitespace, UTF-8, numbers exactly as Python writes them). JSON.parse would
// lose how a number was written ("1.0" becomes 1), so the statement is re-read from the
// response's own text with a parser that keeps number literals as written.
"use strict";

class RawNumber { constructor(text) { this.text = text; } }

function parseRaw(text) {
  let i = 0;
  const ws = () => { while (i < text.length && " \t\n\r".includes(text[i])) i++; };
  const value = () => {
    ws();
    const c = text[i];
    if (c === "{") {
      i++; const out = {}; ws();
      if (text[i] === "}") { i++; return out; }
      for (;;) {
        ws(); const key = string(); ws();
        if (text[i++] !== ":") throw new SyntaxError("expected ':'");
        out[key] = value(); ws();
        if (text[i] === ",") { i++; continue; }
        if (text[i++] !== "}") throw new SyntaxError("expected '}'");
        return out;
      }
    }
    if (c === "[") {
      i++; const out = []; ws();
      if (text[i] === "]") { i++; return out; }
      for (;;) {
        out.push(value()); ws();
        if (text[i] === ",") { i++; continue; }
        if (text[i++] !== "]") throw new SyntaxError("expected ']'");
        return out;
      }
    }
    if (c === '"') return string();
    if (text.startsWith("true", i)) { i += 4; return true; }
    if (text.startsWith("false", i)) { i += 5; return false; }
    if (text.startsWith("null", i)) { i += 4; return null; }
    const m = /^-?\d+(\.\d+)?([eE][+-]?\d+)?/.exec(text.slice(i, i + 64));
    if (!m) throw new SyntaxError("unexpected character at " + i);
    i += m[0].length;
    return new RawNumber(m[0]);
  };
  const string = () => {
    const start = i;
    if (text[i++] !== '"') throw new SyntaxError("expected a string");
    while (text[i] !== '"') { if (text[i] === "\\") i++; i++; if (i >= text.length) throw new SyntaxError("open string"); }
    i++;
    return JSON.parse(text.slice(start, i));
  };
  const out = value();
  return out;
}

function canonical(v) {
  if (v instanceof RawNumber) return v.text;
  if (v === null || typeof v === "boolean") return String(v);
  if (typeof v === "string") return JSON.stringify(v);
  if (Array.isArray(v)) return "[" + v.map(canonical).join(",") + "]";
  const keys = Object.keys(v).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  return "{" + keys.map((k) => JSON.stringify(k) + ":" + canonical(v[k])).join(",") + "}";
}

function unb64url(text) {
  const b64 = text.replace(/-/g, "+").replace(/_/g, "/") + "=".repeat((4 - (text.length % 4)) % 4);
  return Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
}

// --- the transparency log: which signing keys to trust, and whether an entry is logged ---
//
// A signing key is trusted only if the key set's checkpoint is signed by the pinned log key
// and the key's latest logged event is included in it (the same checks as ledger/keyset.py);
// its window and revocation are the event's. The log key is pinned in this browser on first
// use (localStorage) and a key set signed by another log key is refused from then on.

const LOG_KEY_PIN = "hallmark.logKey";
let keySet = null;

function b64(text) { return Uint8Array.from(atob(text), (c) => c.charCodeAt(0)); }
function concat(...parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let i = 0;
  for (const p of parts) { out.set(p, i); i += p.length; }
  return out;
}
async function sha256(bytes) { return new Uint8Array(await crypto.subtle.digest("SHA-256", bytes)); }
function same(a, b) { return a.length === b.length && a.every((x, i) => x === b[i]); }
const leafHash = (data) => sha256(concat(new Uint8Array([0]), data));
const nodeHash = (l, r) => sha256(concat(new Uint8Array([1]), l, r));

// RFC 9162 2.1.3.2: the root an inclusion proof makes of a leaf hash.
async function rootFromInclusion(index, size, leaf, proof) {
  if (!(index >= 0 && index < size)) throw new Error(`leaf ${index} is not in a tree of size ${size}`);
  let fn = index, sn = size - 1, r = leaf;
  for (const p of proof) {
    if (sn === 0) throw new Error("the inclusion proof is too long");
    if (fn % 2 === 1 || fn === sn) {
      r = await nodeHash(p, r);
      if (fn % 2 === 0) while (fn !== 0 && fn % 2 === 0) { fn = Math.floor(fn / 2); sn = Math.floor(sn / 2); }
    } else {
      r = await nodeHash(r, p);
    }
    fn = Math.floor(fn / 2); sn = Math.floor(sn / 2);
  }
  if (sn !== 0) throw new Error("the inclusion proof is too short");
  return r;
}

function parseVkey(vkey) {
  const first = vkey.indexOf("+"), second = vkey.indexOf("+", first + 1);
  if (first < 1 || second < 0) throw new Error("not a log key");
  const raw = b64(vkey.slice(second + 1));
  if (raw.length !== 33 || raw[0] !== 1) throw new Error("not an Ed25519 log key");
  return { name: vkey.slice(0, first), id: vkey.slice(first + 1, second), publicKey: raw.slice(1), vkey };
}

// A C2SP checkpoint signed by `logKey`: {size, root}; throws with the reason otherwise.
async function openCheckpoint(note, logKey) {
  const split = note.lastIndexOf("\n\n");
  if (split < 0) throw new Error("the checkpoint is not a signed note");
  const text = note.slice(0, split + 1);
  const id = Array.from((await sha256(concat(new TextEncoder().encode(logKey.name + "\n"), new Uint8Array([1]), logKey.publicKey))).slice(0, 4), (b) => b.toString(16).padStart(2, "0")).join("");
  const key = await crypto.subtle.importKey("raw", logKey.publicKey, { name: "Ed25519" }, false, ["verify"]);
  let good = false;
  for (const line of note.slice(split + 2).split("\n").filter(Boolean)) {
    const m = /^\u2014 (\S+) (\S+)$/.exec(line);
    if (!m) throw new Error("a checkpoint signature line is malformed");
    const raw = b64(m[2]);
    const lineId = Array.from(raw.slice(0, 4), (b) => b.toString(16).padStart(2, "0")).join("");
    if (m[1] !== logKey.name || lineId !== id) continue;
    if (!(await crypto.subtle.verify({ name: "Ed25519" }, key, raw.slice(4), new TextEncoder().encode(text)))) {
      throw new Error("bad checkpoint signature: altered, or not signed by the log key");
    }
    good = true;
  }
  if (!good) throw new Error("the checkpoint is not signed by the pinned log key");
  const lines = text.split("\n");
  if (lines[0] !== logKey.name) throw new Error("the checkpoint is from another log");
  return { size: Number(lines[1]), root: b64(lines[2]) };
}

function pinnedLogKey(offered) {
  let pinned = null;
  try { pinned = window.localStorage.getItem(LOG_KEY_PIN); } catch (_) { /* storage off: trust per page */ }
  if (pinned && pinned !== offered) {
    throw new Error(`the key set is signed by log key ${offered}, not the one this browser pinned (${pinned}): refused`);
  }
  if (!pinned) { try { window.localStorage.setItem(LOG_KEY_PIN, offered); } catch (_) { /* ignore */ } }
  return parseVkey(offered);
}

// The key set's keys that the pinned log holds: kid -> {publicKey, notBefore, notAfter, revokedAt, reason}.
async function trustedKeys() {
  if (!keySet) {
    const response = await fetch("/.well-known/hallmark-keys.json");
    if (!response.ok) throw new Error(`the public keys could not be fetched (${response.status})`);
    const doc = parseRaw(await response.text());
    if (!doc.log || typeof doc.log.checkpoint !== "string") throw new Error("the key set carries no log checkpoint");
    const logKey = pinnedLogKey(doc.log.vkey);
    const checkpoint = await openCheckpoint(doc.log.checkpoint, logKey);
    const keys = new Map();
    for (const entry of doc.keys || []) {
      try {
        const event = entry.log.event;
        const index = Number(entry.log.leaf_index.text ?? entry.log.leaf_index);
        const leaf = await leafHash(concat(new Uint8Array([2]), new TextEncoder().encode(canonical(event))));
        const root = await rootFromInclusion(index, checkpoint.size, leaf, entry.log.inclusion_proof.map(b64));
        if (!same(root, checkpoint.root) || event.kid !== entry.kid) continue;
        keys.set(event.kid, { alg: event.alg, publicKey: unb64url(event.public_key), notBefore: event.not_before,
                              notAfter: event.not_after, revokedAt: event.revoked_at, reason: entry.revocation_reason });
      } catch (_) { /* a key the log does not hold is left out */ }
    }
    keySet = { logKey, keys };
  }
  return keySet;
}

const WINDOW_GRACE_MS = 60_000; // as ledger/receipts.py: gateways keep a key a few seconds after rotation
const STATEMENT_TIME = { "hallmark.receipt": "finished_at", "hallmark.detection_report": "created_at" };

// null when `key` may have signed `statement`; otherwise the reason it may not.
function keyWindowProblem(statement, kid, key) {
  // A receipt the log shows predates the compromise stays valid (ledger/receipts.py check_window); the page
  // does not check that binding and refuses every statement of a revoked key: stricter, never looser.
  if (key.revokedAt) return `signed by revoked key ${kid} (compromised at ${key.revokedAt}${key.reason ? ": " + key.reason : ""}); this page trusts nothing it signed (\`hallmark receipt verify\` keeps the receipts the log shows predate the compromise)`;
  const field = STATEMENT_TIME[statement.type] || "created_at";
  const when = Date.parse(statement[field]);
  if (Number.isNaN(when)) return `the statement has no valid ${field}`;
  if (key.notBefore && when < Date.parse(key.notBefore) - WINDOW_GRACE_MS) return `signed by ${kid} before its window opened (${key.notBefore})`;
  if (key.notAfter && when >= Date.parse(key.notAfter) + WINDOW_GRACE_MS) return `signed by ${kid} after it was retired (${key.notAfter})`;
  return null;
}

// null when the receipt's entry is in the log (its leaf included in the receipt's checkpoint).
async function receiptLogProblem(document, logKey) {
  const log = document.log, ledger = document.statement.ledger || {};
  if (!log || typeof log.checkpoint !== "string") return "the receipt carries no transparency-log proof";
  try {
    const checkpoint = await openCheckpoint(log.checkpoint, logKey);
    const hex = (h) => Uint8Array.from(h.match(/../g).map((x) => parseInt(x, 16)));
    const leaf = await leafHash(concat(new Uint8Array([1]), hex(ledger.entry_hash), hex(ledger.kgrams_sha256)));
    const index = Number(ledger.leaf_index instanceof RawNumber ? ledger.leaf_index.text : ledger.leaf_index);
    const root = await rootFromInclusion(index, checkpoint.size, leaf, log.inclusion_proof.map(b64));
    return same(root, checkpoint.root) ? null : "the receipt's entry is not in the log (its inclusion proof fails)";
  } catch (exc) {
    return `the receipt's log proof: ${exc.message}`;
  }
}

async function sha256hexOf(bytes) {
  const digest = await crypto.subtle.digest("SHA-256", bytes);
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

async function sha256hex(text) { return sha256hexOf(new TextEncoder().encode(text)); }

// A signing key's id is "sk_" + 16 hex digits of SHA-256 of its raw public key (ledger/receipts.py):
// a key set entry whose id is not its key's is no key at all (the CLI ignores it too).
async function keyIdOf(raw) { return "sk_" + (await sha256hexOf(raw)).slice(0, 16); }

// hex SHA-256 of token ids, each as 4 bytes big-endian (ledger/chain.py hash_token_ids).
async function tokenIdsSha256(ids) {
  const bytes = new Uint8Array(ids.length * 4);
  const view = new DataView(bytes.buffer);
  ids.forEach((id, i) => view.setUint32(i * 4, Number(id instanceof RawNumber ? id.text : id)));
  return sha256hexOf(bytes);
}

// { ok: true|false|null, message }: null when this browser cannot check (no WebCrypto Ed25519).
// `keys`: a key set's "keys" array to use instead of the server's published one.
async function verifySigned(rawDocument, { text, expectedType, keys } = {}) {
  if (!window.crypto || !crypto.subtle) return { ok: null, message: "this browser cannot check signatures here (WebCrypto needs https or localhost)" };
  const statement = rawDocument && rawDocument.statement;
  const signature = rawDocument && rawDocument.signature;
  if (!statement || !signature) return { ok: false, message: "not a signed Hallmark document" };
  const type = statement.type;
  const version = statement.version instanceof RawNumber ? statement.version.text : String(statement.version);
  if (expectedType && type !== expectedType) return { ok: false, message: `a ${type}, not a ${expectedType}` };
  // A composite key (ledger/sigalg.py) needs its ML-DSA-44 signature checked too, and WebCrypto has
  // no ML-DSA: the page says it cannot check rather than vouch for half of it.
  if (signature.alg === "Ed25519+ML-DSA-44") {
    return { ok: null, message: "signed with Ed25519 + ML-DSA-44: this page cannot check ML-DSA-44 signatures (browsers have no ML-DSA); verify it with `hallmark receipt verify` (or `hallmark report verify`), which requires both" };
  }
  if (signature.alg !== "Ed25519") return { ok: false, message: `unsupported algorithm ${signature.alg}` };
  // `keys`: a key set's "keys" array the caller vouches for (as ledger.receipts.public_keys: no log,
  // no window); otherwise the server's key set, trusted only as the pinned log holds it.
  let entry, raw, trusted = null;
  if (keys) {
    entry = keys.find((k) => k.kid === signature.kid);
    if (!entry) return { ok: false, message: `unknown signing key ${signature.kid}` };
    try { raw = unb64url(entry.public_key); } catch (_) { raw = null; }
    if (!raw || raw.length !== 32 || entry.alg !== "Ed25519" || (await keyIdOf(raw)) !== entry.kid) {
      return { ok: false, message: `unknown signing key ${signature.kid}: the published entry is not that key (its id is not the hash of its public key)` };
    }
  } else {
    try { trusted = await trustedKeys(); } catch (exc) { return { ok: false, message: exc.message }; }
    entry = trusted.keys.get(signature.kid);
    if (!entry) return { ok: false, message: `unknown signing key ${signature.kid}: the log's key set does not contain it` };
    raw = entry.publicKey;
    // The key's logged algorithm decides what must verify (ledger/sigalg.py): a composite key's
    // document relabelled "Ed25519", its ML-DSA-44 signature dropped, is refused here too.
    if (entry.alg !== "Ed25519") return { ok: false, message: `signed as Ed25519, but key ${signature.kid} is ${entry.alg}, which requires both an Ed25519 and an ML-DSA-44 signature` };
  }
  let key;
  try {
    key = await crypto.subtle.importKey("raw", raw, { name: "Ed25519" }, false, ["verify"]);
  } catch (_) {
    return { ok: null, message: "this browser has no Ed25519 in WebCrypto; verify with `hallmark receipt verify`" };
  }
  const data = new TextEncoder().encode(`${type}/v${version}\n` + canonical(statement));
  const good = await crypto.subtle.verify({ name: "Ed25519" }, key, unb64url(signature.sig), data);
  if (!good) return { ok: false, message: `bad signature: altered, or not signed by ${signature.kid}` };
  if (trusted) {
    const windowProblem = keyWindowProblem(statement, signature.kid, entry);
    if (windowProblem) return { ok: false, message: windowProblem };
    if (type === "hallmark.receipt") {
      const logProblem = await receiptLogProblem(rawDocument, trusted.logKey);
      if (logProblem) return { ok: false, message: logProblem };
    }
  }
  if (text !== undefined && statement.output_sha256 !== undefined && (await sha256hex(text)) !== statement.output_sha256) {
    return { ok: false, message: "the signature verifies, but this text is not the one the receipt attests" };
  }
  const logged = trusted && type === "hallmark.receipt" ? ", entry in the log" : "";
  const retired = trusted ? entry.notAfter : entry.state === "retired";
  return { ok: true, message: `signature verifies (Ed25519, key ${signature.kid}${retired ? ", retired" : ""}${logged})` };
}

// ---------------------------------------------------------------- detection reports
// The checks of ledger/reports.py verify_report (and `hallmark report verify`), and one the page
// adds: that the result shown is the result signed.

const REPORT_TYPE = "hallmark.detection_report";
const REPORT_VERDICTS = ["watermarked", "not_watermarked", "passes_lenient_threshold", "not_tested", "key_revoked"];
const REPORT_SCOPES = ["tenant", "all_tenants", "public", "provider"];  // provider: the key count withheld
const LENIENT_ABOVE = 1e-3;
const REPORT_OMITS = ["report", "evidence", "per_key"];  // service/provenance.py REPORT_OMITS

const num = (v) => (v instanceof RawNumber ? Number(v.text) : v);
const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v) && !(v instanceof RawNumber);

// Why a version 2 statement breaks the format, or null.
async function reportFormatProblem(st) {
  for (const name of ["subject", "detector", "settings", "scope", "result"]) {
    if (!isObject(st[name])) return `the report has no '${name}' object`;
  }
  const version = String(st.detector.version);
  const digest = await sha256hex(canonical(st.settings));
  if (st.detector.config_sha256 !== digest || st.detector.id !== `${version}+${digest.slice(0, 16)}`) {
    return "the detector id is not the hash of the settings the report states";
  }
  const threshold = num(st.settings.threshold);
  if (typeof threshold !== "number" || !(threshold > 0 && threshold < 1)) return "the report states no threshold in (0, 1)";
  if (!REPORT_VERDICTS.includes(st.verdict)) return `unknown verdict ${st.verdict}`;
  if (st.verdict === "watermarked" && threshold > LENIENT_ABOVE) return `a 'watermarked' verdict at threshold ${threshold}, above ${LENIENT_ABOVE}`;
  if (!Array.isArray(st.basis) || st.basis.includes("watermark") !== (st.verdict === "watermarked")) return "the report's basis does not match its verdict";
  if (!REPORT_SCOPES.includes(st.scope.keys_of) || (st.scope.keys_of !== "provider" && !Number.isInteger(num(st.scope.keys)))) return "the report does not say whose keys were tested and how many";
  if (typeof st.verdict_text !== "string" || typeof st.created_at !== "string") return "the report has no verdict_text or created_at";
  return null;
}

// Verify a detection report (`rawDocument` from parseRaw) and that it is about what the page
// shows: `text` (the text as sent), `tokenIds`, and `shown` (the whole response from parseRaw:
// its result, less REPORT_OMITS, must be the signed result). { ok, message, statement }.
async function verifyReport(rawDocument, { text, tokenIds, shown, keys } = {}) {
  const signed = await verifySigned(rawDocument, { expectedType: REPORT_TYPE, keys });
  if (signed.ok !== true) return signed;
  const st = rawDocument.statement;
  const version = num(st.version);
  const bad = (message) => ({ ok: false, message, statement: st });
  let subject;
  if (version === 1) {
    subject = { text_sha256: st.text_sha256, token_ids_sha256: st.token_ids_sha256 };
  } else if (version === 2) {
    const problem = await reportFormatProblem(st);
    if (problem) return bad(problem);
    subject = st.subject;
  } else {
    return bad(`unsupported report version ${version}`);
  }
  if (text !== undefined && text !== null) {
    if (subject.text_sha256 === null || subject.text_sha256 === undefined) return bad("the report is about token ids, not a text");
    if ((await sha256hex(text)) !== subject.text_sha256) return bad("the signature verifies, but the report is not about this text (its SHA-256 differs)");
  }
  if (tokenIds && (await tokenIdsSha256(tokenIds)) !== subject.token_ids_sha256) {
    return bad("the signature verifies, but the report is not about these token ids");
  }
  if (shown && version === 2) {
    const result = Object.fromEntries(Object.entries(shown).filter(([k]) => !REPORT_OMITS.includes(k)));
    if (canonical(result) !== canonical(st.result)) return bad("the result shown is not the result the server signed");
  }
  const what = version === 1 ? "a version 1 report (it does not say which keys were tested)" : st.verdict_text;
  return { ok: true, message: `${what}; ${signed.message}`, statement: st };
}

window.HallmarkVerify = { parseRaw, canonical, verifySigned, verifyReport, tokenIdsSha256 };
