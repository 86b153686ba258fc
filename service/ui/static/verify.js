// Verifying Hallmark's signed documents (generation receipts, detection reports) in the
// browser, with WebCrypto's Ed25519 and the public keys at /.well-known/hallmark-keys.json.
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

let keySet = null;

async function publicKeys() {
  if (!keySet) {
    const response = await fetch("/.well-known/hallmark-keys.json");
    if (!response.ok) throw new Error(`the public keys could not be fetched (${response.status})`);
    keySet = (await response.json()).keys || [];
  }
  return keySet;
}

async function sha256hex(text) {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text));
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

// { ok: true|false|null, message }: null when this browser cannot check (no WebCrypto Ed25519).
async function verifySigned(rawDocument, { text, expectedType } = {}) {
  if (!window.crypto || !crypto.subtle) return { ok: null, message: "this browser cannot check signatures here (WebCrypto needs https or localhost)" };
  const statement = rawDocument && rawDocument.statement;
  const signature = rawDocument && rawDocument.signature;
  if (!statement || !signature) return { ok: false, message: "not a signed Hallmark document" };
  const type = statement.type;
  const version = statement.version instanceof RawNumber ? statement.version.text : String(statement.version);
  if (expectedType && type !== expectedType) return { ok: false, message: `a ${type}, not a ${expectedType}` };
  if (signature.alg !== "Ed25519") return { ok: false, message: `unsupported algorithm ${signature.alg}` };
  let entry;
  try { entry = (await publicKeys()).find((k) => k.kid === signature.kid); } catch (exc) { return { ok: null, message: exc.message }; }
  if (!entry) return { ok: false, message: `unknown signing key ${signature.kid}` };
  let key;
  try {
    key = await crypto.subtle.importKey("raw", unb64url(entry.public_key), { name: "Ed25519" }, false, ["verify"]);
  } catch (_) {
    return { ok: null, message: "this browser has no Ed25519 in WebCrypto; verify with `hallmark receipt verify`" };
  }
  const data = new TextEncoder().encode(`${type}/v${version}\n` + canonical(statement));
  const good = await crypto.subtle.verify({ name: "Ed25519" }, key, unb64url(signature.sig), data);
  if (!good) return { ok: false, message: `bad signature: altered, or not signed by ${signature.kid}` };
  if (text !== undefined && statement.output_sha256 !== undefined && (await sha256hex(text)) !== statement.output_sha256) {
    return { ok: false, message: "the signature verifies, but this text is not the one the receipt attests" };
  }
  return { ok: true, message: `signature verifies (Ed25519, key ${signature.kid}${entry.state === "retired" ? ", retired" : ""})` };
}

window.HallmarkVerify = { parseRaw, canonical, verifySigned };
