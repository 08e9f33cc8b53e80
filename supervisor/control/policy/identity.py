"""Binary identity as control receives it, and digest pinning (trust on first use) kept in control.

The boundary resolves the process behind every captured connection and reports its kernel-resolved executable
path, the sha256 of the live image, the ancestor chain and (diagnostic only) absolute argv entries. Rules:

1. ``path`` and ``ancestors`` may grant access; ``cmdline_paths`` never do (argv is spoofable, §5 bug 4).
2. Pins are per executable path, for the life of the control process: the first digest seen for a path is
   recorded; a different digest later is a denial (``binary-digest-changed``). Ancestors are matched by path
   only: the boundary does not hash them (the §4.2 identity carries no ancestor digests). No policy field pins
   digests. Once pins are in use, an identity without a digest is denied.
3. Pins only ever grow; the store is bounded so a hostile workload cannot make control grow without limit
   (beyond the bound new paths are refused rather than silently trusted).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from supervisor.protocol.identity import ConnectionIdentity
from supervisor.protocol.json_value import JsonValue

_SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_PINS = 65536


def normalize_digest(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip().lower()
    return value if _SHA256.fullmatch(value) else None


@dataclass(frozen=True, slots=True)
class BinaryIdentity:
    path: str
    sha256: str | None
    ancestors: tuple[str, ...] = ()  # nearest parent first
    cmdline_paths: tuple[str, ...] = ()  # diagnostics only; never grants
    # loader variables set in the process's initial environment (LD_PRELOAD, LD_AUDIT, LD_LIBRARY_PATH naming
    # a workload-writable directory): only binary entries with ``allow_loader_env`` match such a process
    loader_env: tuple[str, ...] = ()

    @classmethod
    def of(cls, connection: ConnectionIdentity | None) -> BinaryIdentity | None:
        """The part of a connection's identity that policy decides on; ``None`` when there is no process behind
        the connection (control's own proxy listener)."""
        if connection is None:
            return None
        return cls(
            path=connection.binary_path,
            sha256=connection.binary_sha256,
            ancestors=connection.ancestors,
            cmdline_paths=connection.cmdline_paths,
            loader_env=connection.loader_env,
        )

    def to_json(self) -> dict[str, JsonValue]:
        body: dict[str, JsonValue] = {"path": self.path, "sha256": self.sha256, "ancestors": list(self.ancestors)}
        if self.cmdline_paths:
            body["cmdline_paths"] = list(self.cmdline_paths)
        if self.loader_env:
            body["loader_env"] = list(self.loader_env)
        return body


@dataclass(frozen=True, slots=True)
class PinViolation:
    path: str
    pinned: str | None
    seen: str | None
    unpinned: str | None = None  # why a path without a pin could not get one, when the store is not simply full

    @property
    def missing(self) -> bool:
        return self.seen is None

    def describe(self) -> str:
        if self.seen is None:
            return f"binary '{self.path}' has no sha256 digest; digest pinning requires one"
        if self.pinned is None:
            return f"binary '{self.path}' cannot be pinned: {self.unpinned or 'the pin store is full'}"
        return (
            f"binary integrity check failed: '{self.path}' hash changed (pinned: {self.pinned}, current: {self.seen})"
        )


class DigestPins:
    """Trust-on-first-use digests per executable path."""

    def __init__(self, *, limit: int = MAX_PINS) -> None:
        self._pins: dict[str, str] = {}
        self._limit = limit

    def __len__(self) -> int:
        return len(self._pins)

    def pinned(self, path: str) -> str | None:
        return self._pins.get(path)

    def verify(self, identity: BinaryIdentity) -> PinViolation | None:
        """Check ``identity`` against the pins, recording a first sighting; the violation, if any."""
        path = identity.path
        digest = normalize_digest(identity.sha256)
        if digest is None:
            return PinViolation(path, self._pins.get(path), None)
        pinned = self._pins.get(path)
        if pinned is None:
            if len(self._pins) >= self._limit:
                return PinViolation(path, None, digest)
            self._pins[path] = digest
        elif pinned != digest:
            return PinViolation(path, pinned, digest)
        return None

    def to_json(self) -> dict[str, str]:
        return dict(self._pins)
