"""A TCP proxy in front of a Redis that loses replies, hangs, cuts and refuses on demand.

    with FaultProxy(redis_port) as proxy:
        client = connect(proxy.url)
        proxy.drop_replies(0.03)  # 3% of reply chunks vanish, and their connection with them

Each client connection gets a connection of its own to Redis and two pump
threads, one per direction. Faults switch at run time:

  drop_replies(p)   each chunk Redis sends back is, with probability p, not
                    forwarded, and both sides of that connection are closed:
                    Redis ran the command, the client never hears of it (and
                    redis-py sends it again on a new connection)
  freeze / thaw     nothing is forwarded either way; connections hang
  cut               every open connection is closed now
  down / up         connections are closed, and new ones accepted and closed at
                    once, until up()
  down_after_bzpopmin_reply()
                    once: go down right after forwarding a non-empty reply to a
                    BZPOPMIN (a worker woken by a producer loses Redis at once)
  down_instead_of_reply(label)
                    once: the next reply to a request with that label is lost,
                    and the proxy goes down (Redis ran it; then an outage)

The counters (replies_dropped, connections_cut, connections_refused) say
what it did; `summary()` puts them on one line. Lost replies are counted by
the request they answered: the first label in `labels` whose bytes the
request holds (a script's SHA, say), else the name of its first command.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections import Counter

CHUNK_BYTES = 65536
# RESP null replies: what BZPOPMIN answers when its timeout ends (RESP2, RESP3).
_NULL_REPLIES = (b"*-1\r\n", b"_\r\n")


class _Link:
    """One client connection and its connection to Redis."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.closed = False
        self._closing = threading.Lock()  # both pumps and cut() may close it at once
        self.awaiting_bzpopmin = False  # the last bytes the client sent hold a BZPOPMIN
        self.last_request = "?"  # what the client's last chunk asked (see FaultProxy.labels)

    def close(self) -> bool:
        """Close both sides (waking both pumps); False if it was closed already."""
        with self._closing:
            if self.closed:
                return False
            self.closed = True
        for sock in (self.client, self.server):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # the peer closed it first
            sock.close()
        return True


class FaultProxy:
    """Forwards 127.0.0.1:`port` (a free port) to a Redis at `redis_host`:`redis_port`."""

    def __init__(self, redis_port: int, redis_host: str = "127.0.0.1", labels: dict[str, str] | None = None) -> None:
        self.target = (redis_host, redis_port)
        self.labels = {text.encode(): label for text, label in (labels or {}).items()}
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)  # so the accept loop sees stop() promptly
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._threads: list[threading.Thread] = []
        self._flowing = threading.Event()
        self._flowing.set()
        self._stopped = threading.Event()
        self._down = False
        self._drop_probability = 0.0
        self._down_after_bzpopmin = False
        self._down_instead_of: str | None = None  # the label of down_instead_of_reply()
        self._random = random.Random()
        self.replies_dropped = 0
        self.dropped_by_request: Counter[str] = Counter()  # what the lost replies answered
        self.connections_cut = 0
        self.connections_refused = 0
        self.downs_after_bzpopmin = 0
        self.last_bzpopmin_at = 0.0  # time.monotonic() when a BZPOPMIN last went to Redis
        self._accepting = threading.Thread(target=self._accept_loop, name="fault-proxy-accept", daemon=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def open_connections(self) -> int:
        """Client connections the proxy still forwards (a closed one goes once its pump sees it)."""
        with self._lock:
            return len(self._links)

    def start(self) -> FaultProxy:
        self._accepting.start()
        return self

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults ------------------------------------------------------------

    def drop_replies(self, probability: float) -> None:
        """Lose each reply chunk with this probability (0 turns it off), closing its connection."""
        if not 0 <= probability <= 1:
            raise ValueError(f"a probability is from 0 to 1, not {probability}")
        self._drop_probability = probability

    def freeze(self) -> None:
        """Forward nothing in either direction until thaw(): connections hang."""
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def cut(self) -> int:
        """Close every open connection now; returns how many."""
        with self._lock:
            links = list(self._links)
        cut = sum(link.close() for link in links)
        with self._lock:
            self.connections_cut += cut
        return cut

    def down(self) -> None:
        """Close every connection, and refuse new ones (accept and close at once) until up()."""
        self._down = True
        self.cut()

    def up(self) -> None:
        self._down = False

    def down_after_bzpopmin_reply(self) -> None:
        """Once: go down right after forwarding the next non-empty reply to a BZPOPMIN."""
        self._down_after_bzpopmin = True

    def down_instead_of_reply(self, label: str) -> None:
        """Once: lose the next reply to a request labelled `label`, and go down."""
        self._down_instead_of = label

    def summary(self) -> str:
        by_request = ", ".join(f"{name} {n}" for name, n in self.dropped_by_request.most_common())
        return (f"proxy: {self.replies_dropped} replies dropped ({by_request or 'none'}), "
                f"{self.connections_cut} connections cut, {self.connections_refused} refused")

    # -- running -----------------------------------------------------------

    def stop(self) -> None:
        """Close the listener and every connection, and join every thread."""
        self._stopped.set()
        self._flowing.set()  # frozen pumps must see the stop
        if self._accepting.is_alive():
            self._accepting.join(5)
        self._listener.close()
        with self._lock:
            links = list(self._links)
            threads = list(self._threads)
        for link in links:
            link.close()
        for thread in threads:
            thread.join(5)
        alive = [thread.name for thread in threads if thread.is_alive()]
        if alive or self._accepting.is_alive():
            raise RuntimeError(f"fault proxy threads did not end: {alive}")

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _address = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listener was closed
            if self._down:
                self._refuse(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:  # Redis itself is down: the client sees its connection closed
                self._refuse(client)
                continue
            client.settimeout(None)
            server.settimeout(None)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(client, server)
            pumps = [threading.Thread(target=self._pump_requests, args=(link,), name="fault-proxy-up", daemon=True),
                     threading.Thread(target=self._pump_replies, args=(link,), name="fault-proxy-down", daemon=True)]
            with self._lock:
                self._links.add(link)
                self._threads = [thread for thread in self._threads if thread.is_alive()] + pumps
            for pump in pumps:
                pump.start()

    def _label(self, request: bytes) -> str:
        for text, label in self.labels.items():
            if text in request:
                return label
        return _first_command(request)

    def _refuse(self, client: socket.socket) -> None:
        client.close()
        with self._lock:
            self.connections_refused += 1

    def _receive(self, link: _Link, sock: socket.socket) -> bytes:
        """The next chunk from `sock`, held while frozen; b"" once the link is closed."""
        try:
            data = sock.recv(CHUNK_BYTES)
        except OSError:
            data = b""
        while data and not self._flowing.wait(0.1):
            if link.closed or self._stopped.is_set():
                return b""
        if not data or link.closed:
            self._forget(link)
            return b""
        return data

    def _pump_requests(self, link: _Link) -> None:
        while data := self._receive(link, link.client):
            link.last_request = self._label(data)
            link.awaiting_bzpopmin = b"BZPOPMIN" in data.upper()
            if link.awaiting_bzpopmin:
                self.last_bzpopmin_at = time.monotonic()
            if not self._send(link, link.server, data):
                return

    def _pump_replies(self, link: _Link) -> None:
        while data := self._receive(link, link.server):
            if self._take_reply_hook(link.last_request):
                with self._lock:
                    self.replies_dropped += 1
                    self.dropped_by_request[link.last_request] += 1
                self.down()
                return
            if self._drop_probability and self._random.random() < self._drop_probability:
                with self._lock:
                    self.replies_dropped += 1
                    self.dropped_by_request[link.last_request] += 1
                self._cut(link)
                return
            if not self._send(link, link.client, data):
                return
            if link.awaiting_bzpopmin and not data.startswith(_NULL_REPLIES) and self._take_bzpopmin_hook():
                self.down()
                return

    def _take_reply_hook(self, request: str) -> bool:
        """Whether down_instead_of_reply() is armed for this request's label; disarms it."""
        with self._lock:
            armed = self._down_instead_of is not None and self._down_instead_of == request
            if armed:
                self._down_instead_of = None
        return armed

    def _take_bzpopmin_hook(self) -> bool:
        """Whether the hook of down_after_bzpopmin_reply() is armed; disarms it."""
        with self._lock:
            armed, self._down_after_bzpopmin = self._down_after_bzpopmin, False
            self.downs_after_bzpopmin += armed
        return armed

    def _send(self, link: _Link, sock: socket.socket, data: bytes) -> bool:
        try:
            sock.sendall(data)
            return True
        except OSError:
            self._forget(link)
            return False

    def _cut(self, link: _Link) -> None:
        if link.close():
            with self._lock:
                self.connections_cut += 1
        self._forget(link)

    def _forget(self, link: _Link) -> None:
        link.close()
        with self._lock:
            self._links.discard(link)


def _first_command(data: bytes) -> str:
    """The name of the first command in a chunk of RESP a client sent ("?" if it is not there)."""
    # *<n>\r\n$<len>\r\n<NAME>\r\n...
    parts = data.split(b"\r\n", 3)
    if len(parts) < 3 or not parts[0].startswith(b"*") or not parts[1].startswith(b"$"):
        return "?"
    return parts[2].decode("ascii", "replace").upper()
