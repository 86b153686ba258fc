"""A TCP proxy that can stop forwarding without closing anything: what a database behind a
network that drops packets looks like to its client. Connections stay open and new ones are
accepted, but no byte gets through either way (the proxy's kernel still acknowledges them,
so TCP on the client's side sees nothing wrong: only the answers never come)."""

from __future__ import annotations

import selectors
import socket
import threading


class Blackhole:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.forwarding = True
        self._pairs: dict[socket.socket, socket.socket] = {}
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="blackhole-accept").start()
        threading.Thread(target=self._pump, daemon=True, name="blackhole-pump").start()

    def drop(self) -> None:
        """Stop forwarding: every byte from now on is read and thrown away."""
        self.forwarding = False

    def restore(self) -> None:
        """Forward again. The connections that lost bytes are out of step with the server:
        they are closed (a real network's would time out); new ones work."""
        with self._lock:
            pairs = list(self._pairs.items())
            self._pairs.clear()
        for a, _ in pairs:
            self._close(a)
        self.forwarding = True

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        self.restore()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = None
            if self.forwarding:
                try:
                    server = socket.create_connection(self.target, timeout=5)
                except OSError:
                    client.close()
                    continue
            with self._lock:
                self._pairs[client] = server
                if server is not None:
                    self._pairs[server] = client
                self._selector.register(client, selectors.EVENT_READ)
                if server is not None:
                    self._selector.register(server, selectors.EVENT_READ)

    def _pump(self) -> None:
        while not self._closed:
            try:
                events = self._selector.select(0.05)
            except (OSError, ValueError):
                continue
            for key, _ in events:
                sock = key.fileobj
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                with self._lock:
                    peer = self._pairs.get(sock)
                if not data:
                    self._close(sock)
                    continue
                if self.forwarding and peer is not None:
                    try:
                        peer.sendall(data)
                    except OSError:
                        self._close(sock)

    def _close(self, sock: socket.socket) -> None:
        with self._lock:
            peer = self._pairs.pop(sock, None)
            if peer is not None:
                self._pairs.pop(peer, None)
        for s in (sock, peer):
            if s is None:
                continue
            try:
                self._selector.unregister(s)
            except (KeyError, ValueError):
                pass
            try:
                s.close()
            except OSError:
                pass
