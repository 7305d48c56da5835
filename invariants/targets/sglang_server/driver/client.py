"""The trace's ops as real HTTP calls to the server (SGLang's native API), each on its own
connection and thread, as concurrent clients make them: ``/generate`` (input ids, greedy
sampling, ``session_params``), ``/open_session``, ``/close_session``, ``/abort_request``,
``/flush_cache``. A call can be disconnected while it waits (the client goes away).

Keeps: a call never blocks the driver — it runs on its own thread and is read when done; its
outcome is the HTTP status and body, or the connection's error (``RemoteDisconnected``: the
server went down under it). Standard library only; the reproducers' script says the same
calls with ``requests``.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading

END = "\x1f"  # reader.END: the trace's rids end with it (an abort's prefix match spares r10)
TIMEOUT = 600.0  # a call outlives any trace step; the driver times its own waits


class Call:
    """One HTTP call on its own connection and thread."""

    def __init__(self, port: int, path: str, body: dict) -> None:
        self.path, self.body = path, body
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        self.status: int | None = None
        self.text = ""
        self.error: str | None = None
        self.disconnected = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        headers = {"Content-Type": "application/json"}
        try:
            self.conn.request("POST", self.path, body=json.dumps(self.body), headers=headers)
            response = self.conn.getresponse()
            self.status, self.text = response.status, response.read().decode(errors="replace")
        except (OSError, http.client.HTTPException) as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def done(self) -> bool:
        return not self.thread.is_alive()

    def wait(self, seconds: float) -> bool:
        self.thread.join(seconds)
        return self.done()

    def json(self) -> dict:
        try:
            found = json.loads(self.text)
        except ValueError:
            return {}
        return found if isinstance(found, dict) else {"answer": found}

    def disconnect(self) -> None:
        """The client goes away: its socket is shut down under the waiting call."""
        self.disconnected = True
        if self.conn.sock is not None:
            try:
                self.conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def generate_body(op: dict) -> dict:
    """A submit op as ``/generate``'s body (the rid marked as the trace's)."""
    sampling = {
        "max_new_tokens": op["max_new_tokens"],
        "temperature": 0.0,
        "ignore_eos": op["ignore_eos"],
    }
    if op.get("min_new_tokens"):
        sampling["min_new_tokens"] = op["min_new_tokens"]
    body = {"rid": op["rid"] + END, "input_ids": op["input_ids"], "sampling_params": sampling}
    session = op.get("session")
    if session:
        body["session_params"] = dict(
            session, **({"rid": session["rid"] + END} if session.get("rid") else {})
        )
    return body


def op_request(op: dict) -> tuple[str, dict, list[str]]:
    """An op's HTTP path and body, and the input key the scheduler's receive will show for it."""
    kind = op["op"]
    if kind == "submit":
        return "/generate", generate_body(op), ["TokenizedGenerateReqInput", op["rid"]]
    sid = op.get("session_id", "")
    if kind == "open_session":
        body = {
            "capacity_of_str_len": 100_000,
            "session_id": sid,
            "streaming": op.get("streaming", False),
        }
        if op.get("timeout"):
            body["timeout"] = op["timeout"]
        return "/open_session", body, ["OpenSessionReqInput", sid]
    if kind == "close_session":
        return "/close_session", {"session_id": sid}, ["CloseSessionReqInput", sid]
    if kind == "abort":
        return "/abort_request", {"rid": op["rid"] + END}, ["AbortReq", op["rid"]]
    if kind == "flush_cache":
        return "/flush_cache", {}, ["FlushCacheReqInput", ""]
    raise ValueError(f"op {kind!r}: no HTTP call")


def op_call(port: int, op: dict) -> tuple[Call, list[str]]:
    """An op's HTTP call, started, and the input key to wait for."""
    path, body, key = op_request(op)
    return Call(port, path, body), key
