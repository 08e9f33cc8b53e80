"""The routes in force and their hot reload (docs/policy.md "Inference routing").

Rules:

1. A revision is validated whole (``routes.load_routes_text`` and the credentials it names) before it replaces the
   routes in force; an invalid one is refused with its problems and the routes in force stay (they were the
   operator's last valid word: keeping them loosens nothing). ``generation`` goes up by one per change.
2. The file is watched under the policy's ownership rules (``policy.watch_safety.watch_guard``): re-checked before
   each revision is read, and once the agent could change the file the watch stops for good.
3. Each request reads the routes once (:attr:`RoutesStore.current`), so a revision never changes a request half
   way; the next request of a kept-alive connection sees the new routes.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import trio

from supervisor.control.credentials import Credentials
from supervisor.control.inference.routes import InferenceRoutes, RoutesInvalid, load_routes_text
from supervisor.jsonlog import JsonLog
from supervisor.protocol.event_names import EventName
from supervisor.protocol.json_value import JsonValue

__all__ = ["RoutesStore", "load_routes_file", "watch_routes_file"]


def load_routes_file(path: Path, credentials: Credentials, *, source: str | None = None) -> InferenceRoutes:
    """Read, validate and check the credentials of a routes file (rule 1); :class:`RoutesInvalid` otherwise."""
    where = source or str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RoutesInvalid(where, [f"cannot read: {type(exc).__name__}"]) from None
    routes = load_routes_text(text, where)
    problems = routes.check_credentials(credentials)
    if problems:
        raise RoutesInvalid(where, problems)
    return routes


class RoutesStore:
    def __init__(self, routes: InferenceRoutes, credentials: Credentials, log: JsonLog) -> None:
        self.current = routes
        self.credentials = credentials
        self.log = log
        self.generation = 0
        self.last_error: str | None = None
        self.watching: str | None = None  # why the file is watched or not

    def apply(self, routes: InferenceRoutes) -> bool:
        """Rule 1; True when the routes changed."""
        self.last_error = None
        if routes.digest == self.current.digest:
            return False
        self.current = routes
        self.generation += 1
        self.log.emit(EventName.INFERENCE_ROUTES, generation=self.generation, status="loaded", source=routes.source,
                      routes=sorted(r.name for r in routes.routes))  # fmt: skip
        return True

    def refuse(self, exc: RoutesInvalid) -> None:
        self.last_error = str(exc)
        self.log.emit(EventName.INFERENCE_ROUTES, generation=self.generation, status="refused", source=exc.source,
                      errors=list(exc.errors))  # fmt: skip

    def status(self) -> dict[str, JsonValue]:
        return {**self.current.to_json(), "generation": self.generation, "last_error": self.last_error,
                "watch": self.watching}  # fmt: skip


def _signature(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)


def _content_hash(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


async def watch_routes_file(store: RoutesStore, path: Path, *, guard: Callable[[], str | None],
                            interval: float = 1.0, rehash_every: int = 10) -> None:  # fmt: skip
    """Rule 2: poll ``path`` and hand each new revision to ``store`` until ``guard`` refuses the file."""
    seen: tuple[int, int, int, int] | bool | None = False
    settled: str | None = None
    polls = 0
    while True:
        signature = await trio.to_thread.run_sync(_signature, path)
        polls += 1
        if signature != seen or polls % rehash_every == 0:
            seen = signature
            unsafe = await trio.to_thread.run_sync(guard)
            if unsafe is not None:
                store.watching = f"stopped: {unsafe}"
                store.log.emit(EventName.INFERENCE_ROUTES, generation=store.generation, status="watch-stopped",
                               reason=unsafe)  # fmt: skip
                return
            digest = await trio.to_thread.run_sync(_content_hash, path)
            if digest != settled:
                settled = digest
                try:
                    routes = await trio.to_thread.run_sync(load_routes_file, path, store.credentials)
                except RoutesInvalid as exc:
                    store.refuse(exc)
                else:
                    store.apply(routes)
        await trio.sleep(interval)
