#!/usr/bin/env python3
"""Reproducer: Scheduler dies with AssertionError in streaming_session.py:take: session_id='s4' already has a slot

Start SGLang's server as launch.sh beside this file says, then run:

    python repro.py --port 30000            # the Python standard library only

It sends a finding's requests over SGLang's own HTTP API (``/generate`` with ``input_ids``,
``/open_session``, ``/close_session``, ``/abort_request``, ``/flush_cache``; a client that hangs
up is a closed connection), each on its own connection, round by round
as kvspec's run sent them: a round's requests are sent together (as concurrent clients would),
after the requests the earlier rounds had finished by then have answered. Timing on a real
server is the server's own, so the whole sequence is tried up to ``--tries`` times with fresh
ids until it observes the failure: the server going down (a connection refused or dropped,
``/health`` unreachable), an HTTP 5xx, or an answer that breaks what the comments below say.
Exit 1: observed (what, printed); exit 0: not observed in the tries.
"""

import argparse
import http.client
import json
import socket
import sys
import threading
import time

EXPECTED = "each request is answered (200, or a 4xx naming the problem); the server keeps serving"
# each round: "after" — rids whose answers come first; "calls" — [path, body] sent together
ROUNDS = json.loads(r"""[
 {
  "after": [],
  "calls": [
   [
    "/open_session",
    {
     "capacity_of_str_len": 100000,
     "session_id": "s4",
     "streaming": true,
     "timeout": 2.0
    }
   ],
   [
    "/generate",
    {
     "rid": "r14\u001f",
     "input_ids": [
      76
     ],
     "sampling_params": {
      "max_new_tokens": 1,
      "temperature": 0.0,
      "ignore_eos": true
     },
     "session_params": {
      "id": "s4"
     }
    }
   ],
   [
    "/generate",
    {
     "rid": "r15\u001f",
     "input_ids": [
      228
     ],
     "sampling_params": {
      "max_new_tokens": 1,
      "temperature": 0.0,
      "ignore_eos": true
     },
     "session_params": {
      "id": "s4"
     }
    }
   ]
  ]
 }
]""")
HANG_UP_WAIT = 2.0  # seconds SGLang takes to notice a client that hung up (it polls)
END = "\x1f"  # every rid ends with it: SGLang aborts by rid prefix, so r1 never matches r10


class Observed(Exception):
    """What the client saw go wrong."""


def renamed(body: dict, tag: str) -> dict:
    """A body with its rids and session ids made unique to this try."""
    out = json.loads(json.dumps(body))
    if "rid" in out:
        out["rid"] = out["rid"].removesuffix(END) + tag + END
    if "session_id" in out:
        out["session_id"] += tag
    params = out.get("session_params")
    if params:
        params["id"] += tag
        if params.get("rid"):
            params["rid"] = params["rid"].removesuffix(END) + tag + END
    return out


class Call(threading.Thread):
    """One HTTP call on its own connection and thread (``hang_up``: the client goes away)."""

    def __init__(self, address: tuple[str, int], path: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.path, self.body = path, body
        self.conn = http.client.HTTPConnection(*address, timeout=120)
        self.status, self.text, self.error, self.hung_up = None, "", None, False

    def run(self) -> None:
        try:
            headers = {"Content-Type": "application/json"}
            self.conn.request("POST", self.path, body=json.dumps(self.body), headers=headers)
            answer = self.conn.getresponse()
            self.status, self.text = answer.status, answer.read().decode(errors="replace")
        except (OSError, http.client.HTTPException) as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def hang_up(self) -> None:
        self.hung_up = True
        if self.conn.sock is not None:
            self.conn.sock.shutdown(socket.SHUT_RDWR)

    def check(self) -> None:
        if self.error is not None and not self.hung_up:
            raise Observed(f"{self.path} {self.body.get('rid', '')!r}: {self.error}")
        if self.status is not None and self.status >= 500:
            raise Observed(f"{self.path}: HTTP {self.status} {self.text[:300]}")


def alive(address: tuple[str, int]) -> bool:
    try:
        conn = http.client.HTTPConnection(*address, timeout=30)
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False


def one_try(address: tuple[str, int], tag: str) -> None:
    """Every round once, then the try's sessions closed (the next try starts from a server
    holding nothing of this one); raises Observed when something went wrong."""
    calls: dict[str, Call] = {}
    for round_ in ROUNDS:
        for rid in round_["after"]:
            calls[rid + tag].join(120)
            calls[rid + tag].check()
        for path, body in round_["calls"]:
            call = send(address, path, body, tag, calls)
            if call is not None and path == "/generate":
                calls[body["rid"].removesuffix(END) + tag] = call
        time.sleep(0.01)
    for call in calls.values():
        call.join(120)
    for call in calls.values():
        call.check()
    for sid in {b["session_id"] for r in ROUNDS for p, b in r["calls"] if p == "/open_session"}:
        Call(address, "/close_session", {"session_id": sid + tag}).run()
    if not alive(address):
        raise Observed("the server does not answer /health")


def send(address, path: str, body: dict, tag: str, calls: dict) -> Call | None:
    """One call of a round, started (a sleep, a hang-up: done here; None)."""
    if path == "sleep":
        time.sleep(body["seconds"])
        return None
    if path == "hang_up":
        calls[body["rid"] + tag].hang_up()
        time.sleep(HANG_UP_WAIT)
        return None
    call = Call(address, path, renamed(body, tag))
    call.start()
    if path == "/open_session":  # a client opens its session before using it
        call.join(120)
        call.check()
    return call


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--tries", type=int, default=20)
    args = parser.parse_args()
    address = (args.host, args.port)
    if not alive(address):
        print(f"no server answers http://{args.host}:{args.port}/health: start it (launch.sh)")
        return 2
    for attempt in range(args.tries):
        try:
            one_try(address, f".t{attempt}")
        except Observed as seen:
            down = "" if alive(address) else "; the server is down"
            print(f"OBSERVED on try {attempt + 1}: {seen}{down}")
            print(f"a correct server: {EXPECTED}")
            return 1
    print(f"not observed in {args.tries} tries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
