"""The end-to-end fixtures: a fresh live server and its client per test (the server and the
helpers the tests share live in server_harness.py, a module name no other test directory
uses, so the tests import it whichever conftest pytest loaded last)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from server_harness import LiveServer, live_server


@pytest.fixture
def server_client() -> Iterator[tuple[LiveServer, httpx.Client]]:
    """A fresh default server (streaming sessions on, level 2) and a client."""
    with live_server() as pair:
        yield pair


@pytest.fixture
def client(server_client: tuple[LiveServer, httpx.Client]) -> httpx.Client:
    return server_client[1]
