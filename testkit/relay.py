"""A TCP relay on 127.0.0.1 that counts the bytes it carries each way.

Put between a node and a real origin (one the test cannot instrument, like
`weed mini`), it measures what the origin sent: a warm read that the origin
only authorises must cost it a few hundred bytes, not the object.

Threads, not an event loop: the clients driving such tests (boto3, requests)
block, and the relay must keep carrying bytes while they do.
"""

from __future__ import annotations

import socket
import threading


class CountingRelay:
    """Listens on 127.0.0.1:`port` and forwards each connection to `target_host`:`target_port`.

    `down` counts bytes from the target to the relay's clients (what the
    origin sent), `up` the other way. A byte is counted before it is passed
    on, so once a client has received an answer, the answer is counted.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.up = 0
        self.down = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self.connections += 1
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, "up"), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, "down"), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str) -> None:
        try:
            while chunk := src.recv(65536):
                with self._lock:
                    setattr(self, direction, getattr(self, direction) + len(chunk))
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, []
        self._listener.close()
        for s in sockets:
            try:
                s.close()
            except OSError:
                pass
