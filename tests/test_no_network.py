"""The test harness refuses the network (conftest.py): a lookup or a connection beyond this machine fails and is
remembered, so a library that swallows the error still fails the test that caused it."""
from __future__ import annotations

import socket

import pytest

from tests import conftest


def test_a_lookup_beyond_this_machine_is_refused_and_remembered():
    before = len(conftest.NETWORK_ATTEMPTS)
    with pytest.raises(OSError, match="refused"):
        socket.getaddrinfo("huggingface.co", 443)
    assert conftest.NETWORK_ATTEMPTS[before:] == ["huggingface.co"]
    del conftest.NETWORK_ATTEMPTS[before:]  # planted on purpose: not this test's failure


def test_a_connection_beyond_this_machine_is_refused():
    before = len(conftest.NETWORK_ATTEMPTS)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock, pytest.raises(OSError, match="refused"):
        sock.connect(("192.0.2.1", 443))  # TEST-NET-1: never routed
    assert conftest.NETWORK_ATTEMPTS[before:] == ["192.0.2.1"]
    del conftest.NETWORK_ATTEMPTS[before:]


def test_loopback_still_works():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname(), timeout=5):
            pass
