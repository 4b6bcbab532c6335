"""A TCP proxy in the test process, for servers that cannot close their clients' connections on request (NATS has
no ``CLIENT KILL``): clients connect to the proxy, and a test closes every connection through it, or the idle ones,
and gets control back once every client's socket has received the close.

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
        # the client's end of the connection, as /proc/net/tcp names it (local address of the client's socket)
        try:
            self.client_end = _proc_address(*client.getpeername()[:2])
        except OSError:  # gone already: nothing to wait for
            self.client_end = ""

    def close(self) -> None:
        self.closed = True
        for s in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


def _proc_address(host: str, port: int) -> str:
    """``host:port`` as /proc/net/tcp writes an IPv4 address: the address's bytes in host order, hex."""
    return f"{int.from_bytes(socket.inet_aton(host), 'little'):08X}:{port:04X}"


#: TCP states of a socket that has received its peer's FIN or reset (CLOSE_WAIT, LAST_ACK, CLOSE, CLOSING,
#: TIME_WAIT): its owner's next read or write finds the connection closed
_SEEN_CLOSE = {"08", "09", "07", "0B", "06"}


def _wait_seen(pairs: list[_Pair], proxy_port: int, timeout: float = 30.0) -> None:
    """Return once the kernel has shown every client of ``pairs`` its connection's close (or ``timeout``). The
    FIN of a close reaches the client's socket asynchronously (on a busy machine the loopback's packets wait for
    ksoftirqd): a client that sent a command before it arrived would see its command's outcome unknown, and a
    test of idle connections closed by the server would not be testing what it says."""
    ends = {p.client_end for p in pairs}
    far = _proc_address("127.0.0.1", proxy_port)
    deadline = time.monotonic() + timeout
    while ends and time.monotonic() < deadline:
        waiting = set()
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[1] in ends and fields[2] == far and fields[3] not in _SEEN_CLOSE:
                    waiting.add(fields[1])
        ends = waiting
        if ends:
            time.sleep(0.005)


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
        _wait_seen(pairs, self.port)
        return len(pairs)

    def kill_idle(self, idle: float = 0.05) -> int:
        """Close every connection that carried nothing for ``idle`` s; how many."""
        now = time.monotonic()
        with self.lock:
            idle_pairs = [p for p in self.pairs if now - p.last >= idle]
            self.pairs = [p for p in self.pairs if p not in idle_pairs]
        for p in idle_pairs:
            p.close()
        _wait_seen(idle_pairs, self.port)
        return len(idle_pairs)

    def close(self) -> None:
        self._stopped = True
        with contextlib.suppress(OSError):
            self.listener.close()
        self.kill_all()
