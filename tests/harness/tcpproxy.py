"""A TCP proxy in the test process, for servers that cannot close their clients' connections on request (NATS has
no ``CLIENT KILL``): clients connect to the proxy, and a test closes every connection through it, or the idle ones.

Each accepted connection is one pair of sockets and two pump threads; closing a pair shuts both sockets down, so
the client sees the connection reset as it would a server's close.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

__all__ = ["TcpProxy"]


class _Pair:
    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.last = time.monotonic()
        self.closed = False

    def close(self) -> None:
        self.closed = True
        for s in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


class TcpProxy:
    """Forward 127.0.0.1:``port`` (a free one) to ``target``; :meth:`kill_all`, :meth:`kill_idle`, :meth:`close`."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port = self.listener.getsockname()[1]
        self.pairs: list[_Pair] = []
        self.lock = threading.Lock()
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True, name="tcpproxy-accept").start()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = _Pair(client, upstream)
            with self.lock:
                self.pairs.append(pair)
            threading.Thread(target=self._pump, args=(pair, client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(pair, upstream, client), daemon=True).start()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                pair.last = time.monotonic()
                dst.sendall(data)
        except OSError:
            pass
        pair.close()
        with self.lock:
            if pair in self.pairs:
                self.pairs.remove(pair)

    def kill_all(self) -> int:
        """Close every connection through the proxy; how many."""
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for p in pairs:
            p.close()
        return len(pairs)

    def kill_idle(self, idle: float = 0.05) -> int:
        """Close every connection that carried nothing for ``idle`` s; how many."""
        now = time.monotonic()
        with self.lock:
            idle_pairs = [p for p in self.pairs if now - p.last >= idle]
            self.pairs = [p for p in self.pairs if p not in idle_pairs]
        for p in idle_pairs:
            p.close()
        return len(idle_pairs)

    def close(self) -> None:
        self._stopped = True
        with contextlib.suppress(OSError):
            self.listener.close()
        self.kill_all()
