"""The control connection between the server driver and the gate in SGLang's scheduler
process: JSON lines over a Unix socket, both ways. Standard library only (both ends import it).
"""

from __future__ import annotations

import json
import select
import socket


class Control:
    """One end of the connection (``connect``: the gate's; ``Control(sock)``: the driver's)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = sock.makefile("r", encoding="utf-8")

    @classmethod
    def connect(cls, path: str) -> Control:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        return cls(sock)

    def say(self, **answer) -> None:
        self.sock.sendall((json.dumps(answer) + "\n").encode())

    def read(self) -> dict | None:
        line = self.reader.readline()
        return json.loads(line) if line else None

    def waiting(self, seconds: float) -> bool:
        return bool(select.select([self.sock], [], [], seconds)[0])
