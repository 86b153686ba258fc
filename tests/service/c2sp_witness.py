"""A tlog-witness written from the C2SP texts alone (tlog-witness v1.0.0, tlog-cosignature
v1.0.1 / v1.1.0-rc.1, signed-note, RFC 6962 consistency proofs), sharing no code with the
gateway: it imports nothing from this repository. Tests run it against the gateway's log,
and make it misbehave on purpose (``mode``): down, slow, 409 forever, a bad cosignature,
cosigning anything (a fork included).

It also verifies cosignatures the way an independent client would (:func:`verify_cosignature`).
"""

from __future__ import annotations

import base64
import hashlib
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.hazmat.primitives.asymmetric import mldsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

EMPTY = hashlib.sha256(b"").digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _consistent(m: int, n: int, old_root: bytes, new_root: bytes, proof: list[bytes]) -> bool:
    """RFC 9162 section 2.1.4.2, transcribed."""
    if m == n:
        return not proof and old_root == new_root
    if m == 0:
        return not proof
    if not proof:
        return False
    if m & (m - 1) == 0:
        proof = [old_root] + proof
    fn, sn = m - 1, n - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = proof[0]
    for c in proof[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = _node(c, fr), _node(c, sr)
            while fn and not fn & 1:
                fn >>= 1
                sn >>= 1
        else:
            sr = _node(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and fr == old_root and sr == new_root


def _vkey_id(name: str, kind: int, public: bytes) -> bytes:
    return hashlib.sha256(name.encode() + b"\n" + bytes([kind]) + public).digest()[:4]


def _message(kind: int, name: str, body: str, timestamp: int) -> bytes:
    if kind == 0x04:
        return b"cosignature/v1\ntime %d\n" % timestamp + body.encode()
    origin, size, root = body.split("\n")[:3]
    return (b"subtree/v1\n\x00" + bytes([len(name.encode())]) + name.encode() + struct.pack(">Q", timestamp)
            + bytes([len(origin.encode())]) + origin.encode() + struct.pack(">QQ", 0, int(size)) + base64.b64decode(root))


def verify_cosignature(vkey: str, note: str) -> int | None:
    """The timestamp of ``vkey``'s good cosignature on ``note``, or None."""
    name, key_id, blob = vkey.split("+", 2)
    raw = base64.b64decode(blob)
    kind, public = raw[0], raw[1:]
    body, _, sigs = note.rpartition("\n\n")
    body += "\n"
    for line in sigs.splitlines():
        if not line.startswith(f"\u2014 {name} "):
            continue
        sig = base64.b64decode(line.split(" ")[2])
        if sig[:4].hex() != key_id:
            continue
        (stamp,) = struct.unpack(">Q", sig[4:12])
        try:
            if kind == 0x04:
                Ed25519PublicKey.from_public_bytes(public).verify(sig[12:], _message(kind, name, body, stamp))
            else:
                mldsa.MLDSA44PublicKey.from_public_bytes(public).verify(sig[12:], _message(kind, name, body, stamp))
            return stamp
        except Exception:  # noqa: BLE001 - any failure is "not a good cosignature"
            return None
    return None


class Witness:
    """One witness: a name, a key (Ed25519 or ML-DSA-44), the logs it trusts, its state."""

    def __init__(self, name: str, algorithm: str = "ed25519", mode: str = "honest") -> None:
        self.name, self.mode = name, mode
        self.kind = 0x04 if algorithm == "ed25519" else 0x06
        self.key = Ed25519PrivateKey.generate() if self.kind == 0x04 else mldsa.MLDSA44PrivateKey.generate()
        self.logs: dict[str, tuple[bytes, bytes]] = {}  # origin -> (key id, Ed25519 public key)
        self.state: dict[str, tuple[int, bytes]] = {}  # origin -> (size, root)
        self.requests = 0
        self.delay = 0.0
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    @property
    def public(self) -> bytes:
        if self.kind == 0x04:
            from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
            return self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return self.key.public_key().public_bytes_raw()

    @property
    def vkey(self) -> str:
        return (f"{self.name}+{_vkey_id(self.name, self.kind, self.public).hex()}+"
                f"{base64.b64encode(bytes([self.kind]) + self.public).decode()}")

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def trust(self, log_vkey: str) -> None:
        name, key_id, blob = log_vkey.split("+", 2)
        raw = base64.b64decode(blob)
        assert raw[0] == 0x01
        self.logs[name] = (bytes.fromhex(key_id), raw[1:])

    def add_checkpoint(self, body: bytes) -> tuple[int, str, bytes]:
        """(status, content type, body) for one add-checkpoint request."""
        self.requests += 1
        if self.delay:
            time.sleep(self.delay)
        head, sep, note = body.decode().partition("\n\n")
        lines = head.split("\n")
        if not sep or not lines[0].startswith("old "):
            return 400, "text/plain", b"malformed\n"
        old = int(lines[0][4:])
        proof = [base64.b64decode(x) for x in lines[1:]]
        text, _, sigs = note.rpartition("\n\n")
        text += "\n"
        origin, size, root = text.split("\n")[0], int(text.split("\n")[1]), base64.b64decode(text.split("\n")[2])
        if origin not in self.logs:
            return 404, "text/plain", b"unknown origin\n"
        key_id, public = self.logs[origin]
        signed = False
        for line in sigs.splitlines():
            _, name, blob = line.split(" ")
            sig = base64.b64decode(blob)
            if name == origin and sig[:4] == key_id:
                try:
                    Ed25519PublicKey.from_public_bytes(public).verify(sig[4:], text.encode())
                    signed = True
                except Exception:  # noqa: BLE001
                    return 403, "text/plain", b"bad log signature\n"
        if not signed:
            return 403, "text/plain", b"no signature by a trusted log key\n"
        with self.lock:
            last_size, last_root = self.state.get(origin, (0, EMPTY))
            if self.mode == "conflict":  # 409 forever, whatever old size it is sent
                return 409, "text/x.tlog.size", b"%d\n" % last_size
            if self.mode == "ahead":  # claims a size above the log's: the log went back, or forked
                return 409, "text/x.tlog.size", b"%d\n" % (size + 1_000_000)
            if self.mode != "fork":  # a fork-cosigning witness checks nothing
                if old > size:
                    return 400, "text/plain", b"old above size\n"
                if old != last_size:
                    return 409, "text/x.tlog.size", b"%d\n" % last_size
                if old == 0 and proof:
                    return 422, "text/plain", b"proof from 0\n"
                if old and not _consistent(old, size, last_root, root, proof):
                    return 422, "text/plain", b"inconsistent\n"
            self.state[origin] = (size, root)
        stamp = int(time.time())
        signature = self.key.sign(_message(self.kind, self.name, text, stamp))
        if self.mode == "bad-signature":
            signature = bytes([signature[0] ^ 1]) + signature[1:]
        blob = base64.b64encode(_vkey_id(self.name, self.kind, self.public) + struct.pack(">Q", stamp) + signature)
        return 200, "text/plain", b"\xe2\x80\x94 " + self.name.encode() + b" " + blob + b"\n"

    def start(self) -> "Witness":
        witness = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                if witness.mode == "down":  # a kept-alive connection outlives the listener: drop it too
                    self.close_connection = True
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/add-checkpoint":
                    status, kind, out = 404, "text/plain", b"not found\n"
                else:
                    status, kind, out = witness.add_checkpoint(body)
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.mode = "down"
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
