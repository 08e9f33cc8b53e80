"""Policy generations, failure modes and the file watcher (docs/reference/policy.md §3.15, docs/design.md "Settled
details").

Rules:

1. ``policy_generation`` starts at 0 and goes up by one on every change of what decisions see: a new valid
   policy, entering fail-closed quarantine, leaving it. It is never compared with the certificate claims'
   ``generation``. A revision whose normalised content equals the active policy changes nothing.
2. ``apply_text`` (operator API, ``policy apply``) validates first: an invalid candidate raises ``PolicyInvalid``
   with every error and nothing changes, not even the status.
3. A policy *file* that becomes invalid applies the failure mode: ``fail-closed`` (default) quarantines —
   ``current`` is ``None`` and every decision denies with ``policy-quarantined`` — until a valid revision loads;
   ``retain-last-valid`` keeps the last valid policy active and reports ``retained``.
4. Static sections (filesystem, landlock, process) are fixed for the sandbox's life: a revision that changes
   them still loads, with a warning that they apply only to a new sandbox. "Changes" means what the boundary
   would apply differs (``StaticPolicy.effective``): a network-only revision of the default policy warns of
   nothing. Adding the first ``protocol: tcp``
   endpoint to a sandbox started without one is invalid (the capture substrate is installed only at start).
5. Every change is published to subscribers synchronously, after the swap, with an immutable snapshot; a
   connection admitted under generation N is stale once ``generation != N`` (control closes it).

The watcher polls ``stat`` (mtime, size, inode) every ``interval`` and re-hashes the content every
``rehash_every`` polls regardless; parsing and compiling run in a worker thread so a 10,000-rule file never
stalls the event loop. An invalid (or unreadable) revision must be seen on two consecutive polls before the
failure mode applies, so an editor's half-written save does not flap the sandbox into quarantine. A ``guard``
(``watch_safety.watch_guard``: may the agent change this file?) is re-checked before each revision is read; once
it refuses, the watch stops for good and the policy in force stays.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import trio

from supervisor.protocol.attach import StaticPolicy
from supervisor.protocol.json_value import JsonValue

from .compiled import CompiledPolicy, compile_policy
from .decide import BodyRoute, body_route, decide_l4, decide_l7, graphql_ws_route, quarantine_decision
from .decision import Decision, L4Request
from .egress_fence import EgressFence
from .errors import PolicyError, PolicyInvalid, PolicyWarning
from .identity import DigestPins
from .schema import load_policy_text

FailureMode = Literal["fail-closed", "retain-last-valid"]
PolicyStatus = Literal["loaded", "quarantined", "retained"]
FAILURE_MODES: tuple[FailureMode, ...] = ("fail-closed", "retain-last-valid")


@dataclass(frozen=True)
class PolicySnapshot:
    """What one decision must be made against; capture it once per connection."""

    generation: int
    status: PolicyStatus
    policy: CompiledPolicy | None  # None: fail-closed quarantine
    last_valid: CompiledPolicy
    source: str
    errors: tuple[PolicyError, ...] = ()
    warnings: tuple[PolicyWarning, ...] = ()

    def decide_l4(self, req: L4Request, pins: DigestPins | None = None) -> Decision:
        if self.policy is None:
            return quarantine_decision(req, self.errors[0].message if self.errors else "")
        return decide_l4(self.policy, req, pins)

    def decide_l7(self, l4: Decision, method: str, raw_target: str) -> Decision:
        if self.policy is None:
            return quarantine_decision(L4Request(l4.host, l4.port, None))
        return decide_l7(self.policy, l4, method, raw_target)

    def body_route(self, l4: Decision, method: str, raw_target: str) -> BodyRoute | None:
        """Where a request to a JSON-RPC, MCP or GraphQL endpoint goes (``decide.body_route``)."""
        return None if self.policy is None else body_route(self.policy, l4, method, raw_target)

    def graphql_ws_route(self, l4: Decision, raw_target: str) -> BodyRoute | None:
        """The GraphQL rules judging a websocket upgrade's messages (``decide.graphql_ws_route``)."""
        return None if self.policy is None else graphql_ws_route(self.policy, l4, raw_target)


Subscriber = Callable[[PolicySnapshot], None]


class PolicyStore:
    def __init__(
        self,
        initial: CompiledPolicy,
        *,
        failure_mode: FailureMode = "fail-closed",
        source: str,
        binary_aliases: Mapping[str, Iterable[str]] | None = None,
        egress_fence: EgressFence | None = None,
    ) -> None:
        if failure_mode not in FAILURE_MODES:
            raise ValueError(f"unknown policy failure mode {failure_mode!r}")
        self.failure_mode: FailureMode = failure_mode
        self._aliases = binary_aliases
        # The ranges control's NetworkPolicy excludes (--egress-excluded): a revision allowing one is warned about.
        self._fence = egress_fence or EgressFence()
        self._static = _effective_static(initial)
        self._started_with_tcp = initial.has_tcp
        warnings = (*initial.policy.warnings, *self._fence.warnings(initial.policy, source))
        self._snapshot = PolicySnapshot(0, "loaded", initial, initial, source, warnings=warnings)
        self._subscribers: list[Subscriber] = []
        self._changed = trio.Event()

    # --- reading ----------------------------------------------------------------------------------------

    def snapshot(self) -> PolicySnapshot:
        return self._snapshot

    @property
    def generation(self) -> int:
        return self._snapshot.generation

    @property
    def status(self) -> PolicyStatus:
        return self._snapshot.status

    @property
    def current(self) -> CompiledPolicy | None:
        return self._snapshot.policy

    @property
    def last_error(self) -> list[PolicyError] | None:
        return list(self._snapshot.errors) if self._snapshot.errors else None

    @property
    def ready(self) -> bool:
        """For ``/readyz``: a valid policy is in force (``retained`` counts, with its errors reported)."""
        return self._snapshot.policy is not None

    def is_current(self, generation: int) -> bool:
        return generation == self._snapshot.generation

    def status_json(self, *, content: bool = False) -> dict[str, JsonValue]:
        """The generation in force and its status; with ``content`` also the normalised policy itself
        (``policy``: what ``policy get --yaml`` prints, ``None`` in quarantine, where nothing is in force)."""
        snap = self._snapshot
        active = snap.policy
        body: dict[str, JsonValue] = {
            "generation": snap.generation,
            "status": snap.status,
            "hash": active.digest if active is not None else None,
            "source": snap.source,
            "failure_mode": self.failure_mode,
            "rules": active.rule_count if active is not None else 0,
            "endpoints": active.endpoint_count if active is not None else 0,
        }
        if snap.status != "loaded":
            body["last_valid_hash"] = snap.last_valid.digest
        if snap.errors:
            body["errors"] = [err.to_json() for err in snap.errors]
        if snap.warnings:
            body["warnings"] = [w.to_json() for w in snap.warnings]
        if content:
            body["policy"] = active.policy.to_json() if active is not None else None
        return body

    # --- subscribing --------------------------------------------------------------------------------------

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(snapshot)`` after every change; returns a function that unsubscribes."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    async def wait_for_change(self, since: int) -> PolicySnapshot:
        """Return as soon as the generation differs from ``since`` (immediately if it already does)."""
        while self._snapshot.generation == since:
            await self._changed.wait()
        return self._snapshot

    # --- candidates -----------------------------------------------------------------------------------

    def prepare(self, text: str, source: str) -> CompiledPolicy:
        """Parse, validate and compile a candidate without touching the store (safe in a worker thread)."""
        policy = load_policy_text(text, source)
        if policy.has_tcp_endpoints() and not self._started_with_tcp:
            raise PolicyInvalid(
                [
                    PolicyError(
                        "network_policies",
                        "cannot add the first protocol: tcp endpoint by reload; transparent capture "
                        "is set up only when the sandbox starts",
                        "a new sandbox for protocol: tcp",
                        None,
                        source,
                    )
                ]
            )
        return compile_policy(policy, binary_aliases=self._aliases)

    def apply_text(self, text: str, source: str) -> int:
        """Operator apply: validate first; on error raise ``PolicyInvalid`` and change nothing."""
        return self.activate(self.prepare(text, source), source)

    async def apply_text_async(self, text: str, source: str) -> int:
        """``apply_text`` with parsing and compiling in a worker thread (a 10,000-rule policy takes seconds)."""
        compiled = await trio.to_thread.run_sync(self.prepare, text, source)
        return self.activate(compiled, source)

    def activate(self, compiled: CompiledPolicy, source: str) -> int:
        """Make a valid, compiled candidate current (unless it equals the active policy)."""
        if compiled.has_tcp and not self._started_with_tcp:
            raise PolicyInvalid(
                [
                    PolicyError(
                        "network_policies", "cannot add the first protocol: tcp endpoint by reload", None, None, source
                    )
                ]
            )
        snap = self._snapshot
        warnings = [*compiled.policy.warnings, *self._fence.warnings(compiled.policy, source)]
        if _effective_static(compiled) != self._static:
            warnings.append(
                PolicyWarning(
                    "",
                    "static sections (filesystem_policy, landlock, process) changed; "
                    "they take effect only in a new sandbox",
                    None,
                    source,
                )
            )
        active = snap.policy
        if active is not None and active.digest == compiled.digest:
            if snap.status != "loaded":  # a retained sandbox got its valid file back: same policy, healthy again
                self._publish(
                    PolicySnapshot(snap.generation, "loaded", active, active, source, warnings=tuple(warnings))
                )
            return snap.generation
        self._publish(
            PolicySnapshot(snap.generation + 1, "loaded", compiled, compiled, source, warnings=tuple(warnings))
        )
        return self._snapshot.generation

    def reject_disk(self, errors: list[PolicyError], source: str) -> int:
        """An invalid revision on disk: apply the failure mode."""
        snap = self._snapshot
        if self.failure_mode == "retain-last-valid":
            self._publish(
                PolicySnapshot(
                    snap.generation, "retained", snap.last_valid, snap.last_valid, source, tuple(errors), snap.warnings
                )
            )
        elif snap.status == "quarantined":
            self._publish(PolicySnapshot(snap.generation, "quarantined", None, snap.last_valid, source, tuple(errors)))
        else:
            self._publish(
                PolicySnapshot(snap.generation + 1, "quarantined", None, snap.last_valid, source, tuple(errors))
            )
        return self._snapshot.generation

    def disk_revision(self, text: str, source: str) -> int:
        """A revision read from disk: valid → new generation; invalid → failure mode."""
        try:
            compiled = self.prepare(text, source)
        except PolicyInvalid as exc:
            return self.reject_disk(exc.errors, source)
        return self.activate(compiled, source)

    def file_changed(self, path: Path) -> int:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            return self.reject_disk(
                [PolicyError("", f"cannot read policy file: {exc}", None, None, str(path))], str(path)
            )
        return self.disk_revision(text, str(path))

    def mirror(self, snapshot: PolicySnapshot) -> None:
        """Make ``snapshot`` current as it is: a control worker's copy of the primary's store (control/workers)."""
        self._publish(snapshot)

    def _publish(self, snapshot: PolicySnapshot) -> None:
        changed_generation = snapshot.generation != self._snapshot.generation
        self._snapshot = snapshot
        if changed_generation:
            event, self._changed = self._changed, trio.Event()
            event.set()
        failures: list[BaseException] = []
        for callback in list(self._subscribers):
            try:
                callback(snapshot)
            except Exception as exc:  # one broken subscriber must not hide the change from the others
                failures.append(exc)
        if failures:
            raise failures[0]


def _effective_static(compiled: CompiledPolicy) -> StaticPolicy:
    """The static sections as the boundary applies them (rule 4 compares these, not their spelling)."""
    return StaticPolicy.from_wire(compiled.policy.static_json()).effective()


# --- the watcher -------------------------------------------------------------------------------------------


def _signature(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)


def _read(path: Path) -> tuple[str | None, str, list[PolicyError]]:
    """(text, content hash, errors); unreadable files hash to a marker that names the error."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return (
            None,
            f"unreadable:{exc.errno}",
            [PolicyError("", f"cannot read policy file: {exc}", None, None, str(path))],
        )
    digest = hashlib.sha256(data).hexdigest()
    try:
        return data.decode("utf-8"), digest, []
    except UnicodeDecodeError as exc:
        return None, digest, [PolicyError("", f"policy file is not UTF-8: {exc}", None, None, str(path))]


def _evaluate(
    store: PolicyStore, text: str | None, errors: list[PolicyError], source: str
) -> CompiledPolicy | list[PolicyError]:
    if text is None:
        return errors
    try:
        return store.prepare(text, source)
    except PolicyInvalid as exc:
        return exc.errors


class PolicyFileWatcher:
    """One poll at a time, so tests (and the daemon's loop) drive it deterministically."""

    def __init__(
        self, path: Path, store: PolicyStore, *, rehash_every: int = 10, guard: Callable[[], str | None] | None = None
    ) -> None:
        self.path = Path(path)
        self.store = store
        self.rehash_every = max(1, rehash_every)
        self.guard = guard  # re-checked before each revision is read: why the file is no longer safe, or None
        self.unsafe: str | None = None  # set once the guard refused; the watcher then stops for good
        self._signature: tuple[int, int, int, int] | bool | None = False  # False: never looked
        self._settled: str | None = None  # hash of the content last handed to the store
        self._pending_invalid: str | None = None
        self._polls = 0

    async def poll(self) -> bool:
        """Look once; return True when a revision was handed to the store."""
        if self.unsafe is not None:
            return False
        source = str(self.path)
        signature = await trio.to_thread.run_sync(_signature, self.path)
        self._polls += 1
        due = self._polls % self.rehash_every == 0
        if signature == self._signature and not due and self._pending_invalid is None:
            return False
        self._signature = signature
        if self.guard is not None:
            self.unsafe = await trio.to_thread.run_sync(self.guard)
            if self.unsafe is not None:
                return False
        text, content_hash, errors = await trio.to_thread.run_sync(_read, self.path)
        if content_hash == self._settled:
            self._pending_invalid = None
            return False
        result = await trio.to_thread.run_sync(_evaluate, self.store, text, errors, source)
        if isinstance(result, CompiledPolicy):
            self._pending_invalid = None
            self._settled = content_hash
            try:
                self.store.activate(result, source)
            except PolicyInvalid as exc:  # the tcp rule is checked again at activation
                self.store.reject_disk(exc.errors, source)
            return True
        if self._pending_invalid != content_hash:
            self._pending_invalid = content_hash  # seen once: maybe a save in progress; confirm next poll
            return False
        self._pending_invalid = None
        self._settled = content_hash
        self.store.reject_disk(result, source)
        return True


async def watch_policy_file(
    path: Path,
    store: PolicyStore,
    *,
    interval: float = 1.0,
    rehash_every: int = 10,
    guard: Callable[[], str | None] | None = None,
    on_unsafe: Callable[[str], None] | None = None,
) -> None:
    """Poll ``path`` and feed revisions to ``store`` until ``guard`` finds it unsafe (then ``on_unsafe`` says
    why and the watch ends: the policy in force stays). Run it in the daemon's nursery."""
    watcher = PolicyFileWatcher(path, store, rehash_every=rehash_every, guard=guard)
    while True:
        await watcher.poll()
        if watcher.unsafe is not None:
            if on_unsafe is not None:
                on_unsafe(watcher.unsafe)
            return
        await trio.sleep(interval)
