"""What the suite's tests share."""

import socket

import pytest


@pytest.fixture
def free_port() -> int:
    """A port free on 127.0.0.1 now, for a test's own rendezvous (MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
