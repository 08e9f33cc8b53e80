"""The connection identity: who called ``connect()``, as the boundary resolved it (docs/reference/boundary.md §4.2).

One shape on both sides. The boundary builds it (``boundary/capture/identity.py``), the egress hand-off carries
it as compact JSON in ``openshell-identity`` (``protocol/egress.py``), and control reads it back and projects the
part policy decides on (``control/policy/identity.py`` ``BinaryIdentity.of``).

Rules this module enforces:

1. The JSON object is the contract between peers of different versions: :meth:`ConnectionIdentity.to_wire`
   writes every field, :meth:`ConnectionIdentity.from_wire` accepts exactly the §4.2 fields (``orphaned`` and
   ``loader_env`` may be absent: older boundaries did not send them) and refuses unknown ones, so both sides
   agree on what was decided.
2. Validation names the field at fault; ``bool`` is never accepted where an integer is meant.
3. Integers are non-negative, there is at least one owner, the path is absolute, the digest is 64 lower-case hex
   digits or ``null`` (a binary too large to hash).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from supervisor.protocol.json_value import JsonValue

__all__ = ["ConnectionIdentity", "IdentityError"]

_SHA256_RE = re.compile(r"[0-9a-f]{64}")


class IdentityError(ValueError):
    """An identity object that does not follow §4.2; the message names the field."""


@dataclass(frozen=True, slots=True)
class ConnectionIdentity:
    binary_path: str  # kernel-resolved executable of the process that called connect()
    binary_sha256: str | None  # of the live image; None when larger than the boundary hashes
    ancestors: tuple[str, ...]  # exe paths, nearest parent first, up to the agent
    cmdline_paths: tuple[str, ...]  # absolute argv entries: diagnostics only, never grant
    pid: int
    start_time: int  # with pid: which process instance
    uid: int
    owners: int  # processes holding the socket (all agreed on the identity)
    resolved_in_us: int
    orphaned: bool = False  # the ancestor chain left the workload before the agent (a reparented orphan)
    # loader variables in the process's initial environment that void a binary-scoped match unless the binary
    # entry opts in (docs/design.md "Identity"; docs/reference/policy.md binaries ``allow_loader_env``)
    loader_env: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, JsonValue]:
        """The §4.2 JSON object (every field, so a strict older peer still finds all it requires)."""
        return {
            "binary_path": self.binary_path,
            "binary_sha256": self.binary_sha256,
            "ancestors": list(self.ancestors),
            "cmdline_paths": list(self.cmdline_paths),
            "pid": self.pid,
            "start_time": self.start_time,
            "uid": self.uid,
            "owners": self.owners,
            "resolved_in_us": self.resolved_in_us,
            "orphaned": self.orphaned,
            "loader_env": list(self.loader_env),
        }

    @classmethod
    def from_wire(cls, obj: object) -> ConnectionIdentity:
        """Check a decoded JSON value against §4.2 and build the identity; :class:`IdentityError` otherwise."""
        if not isinstance(obj, Mapping):
            raise IdentityError("identity must be a JSON object")
        unknown = set(obj) - set(_SCHEMA)
        if unknown:
            raise IdentityError(f"unknown identity fields: {sorted(unknown)}")
        for name, (types, required) in _SCHEMA.items():
            if name not in obj:
                if required:
                    raise IdentityError(f"identity lacks {name}")
                continue
            value = obj[name]
            # bool is an int in Python; an int field must not accept true/false
            if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
                raise IdentityError(f"identity field {name} has the wrong type")
            if isinstance(value, list) and not all(isinstance(item, str) for item in value):
                raise IdentityError(f"identity field {name} must be a list of strings")
            if isinstance(value, int) and not isinstance(value, bool) and value < 0:
                raise IdentityError(f"identity field {name} must not be negative")
        sha256 = obj["binary_sha256"]
        if sha256 is not None and not _SHA256_RE.fullmatch(sha256):
            raise IdentityError("binary_sha256 must be 64 lower-case hex digits or null")
        if not obj["binary_path"].startswith("/"):
            raise IdentityError("binary_path must be absolute")
        if obj["owners"] < 1:
            raise IdentityError("identity must have at least one owner")
        return cls(
            binary_path=obj["binary_path"],
            binary_sha256=sha256,
            ancestors=tuple(obj["ancestors"]),
            cmdline_paths=tuple(obj["cmdline_paths"]),
            pid=obj["pid"],
            start_time=obj["start_time"],
            uid=obj["uid"],
            owners=obj["owners"],
            resolved_in_us=obj["resolved_in_us"],
            orphaned=obj.get("orphaned", False),
            loader_env=tuple(obj.get("loader_env", ())),
        )


# field → (accepted JSON types, required); the schema of docs/reference/boundary.md §4.2
_SCHEMA: Mapping[str, tuple[tuple[type, ...], bool]] = {
    "binary_path": ((str,), True),
    "binary_sha256": ((str, type(None)), True),
    "ancestors": ((list,), True),
    "cmdline_paths": ((list,), True),
    "pid": ((int,), True),
    "start_time": ((int,), True),
    "uid": ((int,), True),
    "owners": ((int,), True),
    "resolved_in_us": ((int,), True),
    "orphaned": ((bool,), False),
    "loader_env": ((list,), False),
}
