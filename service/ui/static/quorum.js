// A receipt's witnessed proof (c2sp.org/tlog-proof@v1) checked in the browser against a
// witness policy (c2sp.org/tlog-policy), as ledger/log/policy.py and ledger/log/proof.py do for
// `hallmark receipt verify --policy`: the checkpoint signed by a log the policy lists, the
// policy's quorum of good witness cosignatures, and the receipt's leaf included in it.
//
// Only Ed25519 cosignatures (c2sp.org/tlog-cosignature v1.0.1, type 0x04) can be checked here:
// browsers' WebCrypto has no ML-DSA, so ML-DSA-44 cosignatures (type 0x06) are not counted,
// and the page says so rather than take them on trust. Uses verify.js's helpers (b64, sha256,
// concat, same, leafHash, rootFromInclusion, parseVkey, openCheckpoint).
"use strict";

const POLICY_PIN = "hallmark.witnessPolicy";
const ED25519_COSIGNATURE = 4, MLDSA44_COSIGNATURE = 6;
const hex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");

async function parseWitnessKey(vkey) {
  const parts = vkey.split("+");
  if (parts.length < 3 || !parts[0]) throw new Error("not a witness key (name+hex key id+base64 key)");
  const raw = b64(parts.slice(2).join("+"));
  const size = { [ED25519_COSIGNATURE]: 32, [MLDSA44_COSIGNATURE]: 1312 }[raw[0]];
  if (!size || raw.length !== size + 1) throw new Error("not a cosignature key (type 0x04 Ed25519 or 0x06 ML-DSA-44)");
  const id = hex((await sha256(concat(new TextEncoder().encode(parts[0] + "\n"), raw))).slice(0, 4));
  if (id !== parts[1]) throw new Error("the witness key's id does not match its name and key");
  return { name: parts[0], id, kind: raw[0], publicKey: raw.slice(1) };
}

// The policy file's text -> {logs: [vkey...], witnesses: name -> key, groups: name -> {k, members}, quorum}.
async function parsePolicy(text) {
  const policy = { logs: [], witnesses: new Map(), groups: new Map(), quorum: null };
  const names = new Set(["none"]);
  const fresh = (name) => { if (names.has(name)) throw new Error(`the name ${name} is defined twice`); names.add(name); };
  const lines = text.split("\n");
  for (let n = 0; n < lines.length; n++) {
    const words = lines[n].trim().split(/[ \t]+/);
    if (!words[0] || words[0].startsWith("#")) continue;
    const [keyword, ...args] = words;
    try {
      if (keyword === "log" && args.length >= 1 && args.length <= 2) policy.logs.push(parseVkey(args[0]));
      else if (keyword === "witness" && args.length >= 2 && args.length <= 3) {
        fresh(args[0]);
        policy.witnesses.set(args[0], { ...(await parseWitnessKey(args[1])), policyName: args[0] });
      } else if (keyword === "group" && args.length >= 3) {
        const [name, rule, ...members] = args;
        fresh(name);
        for (const m of members) if (!policy.witnesses.has(m) && !policy.groups.has(m)) throw new Error(`group member ${m} is not defined above`);
        const k = rule === "all" ? members.length : rule === "any" ? 1 : /^[1-9][0-9]*$/.test(rule) ? Number(rule) : NaN;
        if (!(k <= members.length) || new Set(members).size !== members.length) throw new Error("a group's threshold is all, any or 1 to its number of members, each member once");
        policy.groups.set(name, { k, members });
      } else if (keyword === "quorum" && args.length === 1) {
        if (policy.quorum !== null) throw new Error("a policy has exactly one quorum line");
        if (args[0] !== "none" && !policy.witnesses.has(args[0]) && !policy.groups.has(args[0])) throw new Error(`the quorum ${args[0]} is not defined above`);
        policy.quorum = args[0];
      } else throw new Error(`unknown or malformed line (log, witness, group, quorum)`);
    } catch (exc) { throw new Error(`policy line ${n + 1}: ${exc.message}`); }
  }
  if (policy.quorum === null) throw new Error("a policy has exactly one quorum line");
  if (!policy.logs.length) throw new Error("the policy lists no log");
  return policy;
}

function satisfied(policy, cosigned, name = policy.quorum) {
  if (name === "none") return true;
  if (policy.witnesses.has(name)) return cosigned.has(name);
  const group = policy.groups.get(name);
  return group.members.filter((m) => satisfied(policy, cosigned, m)).length >= group.k;
}

// The policy's Ed25519 witnesses with a good cosignature on `note` (Set of names), and its
// ML-DSA-44 witnesses whose cosignature line is present but cannot be checked here.
async function cosigners(note, policy) {
  const split = note.lastIndexOf("\n\n");
  const text = new TextEncoder().encode(note.slice(0, split + 1));
  const good = new Set(), unchecked = new Set();
  for (const line of note.slice(split + 2).split("\n").filter(Boolean)) {
    const m = /^\u2014 (\S+) (\S+)$/.exec(line);
    if (!m) continue;
    let raw;
    try { raw = b64(m[2]); } catch (_) { continue; }
    for (const w of policy.witnesses.values()) {
      if (w.name !== m[1] || hex(raw.slice(0, 4)) !== w.id) continue;
      if (w.kind === MLDSA44_COSIGNATURE) { unchecked.add(w.policyName); continue; }
      if (raw.length !== 4 + 8 + 64) continue;
      const time = new DataView(raw.buffer, raw.byteOffset + 4, 8).getBigUint64(0);
      const message = concat(new TextEncoder().encode(`cosignature/v1\ntime ${time}\n`), text);
      const key = await crypto.subtle.importKey("raw", w.publicKey, { name: "Ed25519" }, false, ["verify"]);
      if (await crypto.subtle.verify({ name: "Ed25519" }, key, raw.slice(12), message)) good.add(w.policyName);
    }
  }
  return { good, unchecked };
}

const ML_DSA_NOTE = "ML-DSA-44 cosignatures cannot be checked in the browser and are not counted here; `hallmark receipt verify --policy` checks them";

// { ok, message } for a receipt's log.tlog_proof under `policy` (parsePolicy's). ok null: the
// quorum is met only if ML-DSA-44 cosignatures this page cannot check are counted.
async function checkTlogProof(receipt, policy) {
  const text = receipt.log && receipt.log.tlog_proof;
  if (typeof text !== "string") return { ok: false, message: "the receipt carries no tlog-proof" };
  const split = text.indexOf("\n\n");
  const head = text.slice(0, split).split("\n"), note = text.slice(split + 2);
  if (split < 0 || head[0] !== "c2sp.org/tlog-proof@v1") return { ok: false, message: "not a c2sp.org/tlog-proof@v1 proof" };
  let at = head[1] && head[1].startsWith("extra ") ? 2 : 1;
  const index = /^index (0|[1-9][0-9]*)$/.exec(head[at] || "");
  const ledger = receipt.statement.ledger || {};
  if (!index || String(ledger.leaf_index && ledger.leaf_index.text || ledger.leaf_index) !== index[1]) {
    return { ok: false, message: "the tlog-proof is not for the receipt's leaf" };
  }
  let checkpoint = null;
  for (const log of policy.logs) {
    try { checkpoint = await openCheckpoint(note, log); break; } catch (_) { /* the next listed log */ }
  }
  if (!checkpoint) return { ok: false, message: "the tlog-proof's checkpoint is not signed by a log the policy lists" };
  const { good, unchecked } = await cosigners(note, policy);
  const mlDsa = [...policy.witnesses.values()].some((w) => w.kind === MLDSA44_COSIGNATURE);
  const names = [...good].sort().join(", ") || "no one";
  if (!satisfied(policy, good)) {
    const withUnchecked = satisfied(policy, new Set([...good, ...unchecked]));
    return { ok: withUnchecked ? null : false,
             message: `the checkpoint (size ${checkpoint.size}) lacks the policy's witness quorum ${policy.quorum} as far as this page can check (good Ed25519 cosignatures from: ${names})` + (mlDsa ? `; ${ML_DSA_NOTE}` : "") };
  }
  const hexBytes = (h) => Uint8Array.from(h.match(/../g).map((x) => parseInt(x, 16)));
  const leaf = await leafHash(concat(new Uint8Array([1]), hexBytes(ledger.entry_hash), hexBytes(ledger.kgrams_sha256)));
  try {
    const root = await rootFromInclusion(Number(index[1]), checkpoint.size, leaf, head.slice(at + 1).map(b64));
    if (!same(root, checkpoint.root)) return { ok: false, message: "the receipt's entry is not in the witnessed checkpoint" };
  } catch (exc) { return { ok: false, message: `the tlog-proof: ${exc.message}` }; }
  return { ok: true, message: `witnessed at size ${checkpoint.size} by ${names} (quorum ${policy.quorum} met)` + (mlDsa ? `; ${ML_DSA_NOTE}` : "") };
}

// The signature (verify.js) and then the witnessed proof: one {ok, message}.
async function verifyWitnessed(rawDocument, policyText, options = {}) {
  let policy;
  try { policy = await parsePolicy(policyText); } catch (exc) { return { ok: false, message: `the witness policy: ${exc.message}` }; }
  const signed = await verifySigned(rawDocument, { expectedType: "hallmark.receipt", ...options });
  if (signed.ok !== true) return signed;
  const witnessed = await checkTlogProof(rawDocument, policy);
  return { ok: witnessed.ok, message: `${signed.message}; ${witnessed.message}` };
}

window.HallmarkQuorum = { parsePolicy, checkTlogProof, verifyWitnessed, POLICY_PIN };

// The Record tab: check the looked-up generation's receipt, fetched again (its proof then is
// against the latest witnessed checkpoint), against the policy pasted here (kept in this browser).
document.addEventListener("DOMContentLoaded", () => {
  const area = document.getElementById("record-policy"), button = document.getElementById("record-check-receipt");
  if (!area || !button) return;
  try { area.value = window.localStorage.getItem(POLICY_PIN) || ""; } catch (_) { /* storage off */ }
  button.addEventListener("click", () => busy(button, async () => {
    try { window.localStorage.setItem(POLICY_PIN, area.value); } catch (_) { /* storage off */ }
    const id = document.getElementById("record-title").textContent;
    const { raw } = await apiRaw("GET", `/v1/generations/${encodeURIComponent(id)}/receipt`);
    showSigned(document.getElementById("record-receipt-status"), `{"receipt":${raw}}`, "receipt",
               (doc) => verifyWitnessed(doc, area.value), "Receipt, witnessed");
  }));
});
