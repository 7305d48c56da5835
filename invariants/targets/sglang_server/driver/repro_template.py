#!/usr/bin/env python3
"""Reproducer: TITLE

Start SGLang's server as launch.sh beside this file says, then run:

    python repro.py --port 30000            # needs only `requests`

It sends a finding's requests over SGLang's own HTTP API (``/generate`` with ``input_ids``,
``/open_session``, ``/close_session``, ``/abort_request``, ``/flush_cache``), round by round
as kvspec's run sent them: a round's requests are sent together (as concurrent clients would),
after the requests the earlier rounds had finished by then have answered. Timing on a real
server is the server's own, so the whole sequence is tried up to ``--tries`` times with fresh
ids until it observes the failure: the server going down (a connection refused or dropped,
``/health`` unreachable), an HTTP 5xx, or an answer that breaks what the comments below say.
Exit 1: observed (what, printed); exit 0: not observed in the tries.
"""

import argparse
import json
import sys
import threading
import time

import requests

EXPECTED = "EXPECTED_TEXT"
# each round: "after" — rids whose answers come first; "calls" — [path, body] sent together
ROUNDS = json.loads(r"""ROUNDS_JSON""")
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
    def __init__(self, url: str, path: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.url, self.path, self.body = url, path, body
        self.status, self.text, self.error = None, "", None

    def run(self) -> None:
        try:
            answer = requests.post(self.url + self.path, json=self.body, timeout=120)
            self.status, self.text = answer.status_code, answer.text
        except requests.RequestException as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def check(self) -> None:
        if self.error is not None:
            raise Observed(f"{self.path} {self.body.get('rid', '')!r}: {self.error}")
        if self.status is not None and self.status >= 500:
            raise Observed(f"{self.path}: HTTP {self.status} {self.text[:300]}")


def alive(url: str) -> bool:
    try:
        return requests.get(url + "/health", timeout=30).status_code == 200
    except requests.RequestException:
        return False


def one_try(url: str, tag: str) -> None:
    """Every round once; raises Observed when something went wrong."""
    calls: dict[str, Call] = {}
    for round_ in ROUNDS:
        for rid in round_["after"]:
            calls[rid + tag].join(120)
            calls[rid + tag].check()
        for path, body in round_["calls"]:
            if path == "sleep":
                time.sleep(body["seconds"])
                continue
            call = Call(url, path, renamed(body, tag))
            call.start()
            if path == "/open_session":  # a client opens its session before using it
                call.join(120)
                call.check()
            if "rid" in body and path == "/generate":
                calls[body["rid"].removesuffix(END) + tag] = call
        time.sleep(0.01)
    for call in calls.values():
        call.join(120)
    for call in calls.values():
        call.check()
    if not alive(url):
        raise Observed("the server does not answer /health")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--tries", type=int, default=20)
    args = parser.parse_args()
    url = f"http://{args.host}:{args.port}"
    if not alive(url):
        print(f"no server answers {url}/health: start it first (launch.sh)")
        return 2
    for attempt in range(args.tries):
        try:
            one_try(url, f".t{attempt}")
        except Observed as seen:
            down = "" if alive(url) else "; the server is down"
            print(f"OBSERVED on try {attempt + 1}: {seen}{down}")
            print(f"a correct server: {EXPECTED}")
            return 1
    print(f"not observed in {args.tries} tries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
