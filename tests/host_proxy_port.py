"""Model P's proxy listener is the host's ``127.0.0.1:3128`` (no network namespace of ours): one model P
sandbox at a time on a machine, so tests that start one hold this lock — across pytest processes too, since two
``make test`` runs side by side share the port."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

_LOCK_PATH = "/run/lock/openshell-sandbox-tests/model-p-proxy-port.lock"


@contextlib.contextmanager
def model_p_proxy_port() -> Iterator[None]:
    os.makedirs(os.path.dirname(_LOCK_PATH), exist_ok=True)
    with open(_LOCK_PATH, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
