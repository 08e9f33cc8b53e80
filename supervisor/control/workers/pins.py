"""A worker's view of the primary's TOFU pins: a cache that never records a first sighting on its own.

A pin never changes once recorded (``policy/identity.py`` rule 3), so a cached pin answers exactly as the
primary would. A worker asks the primary for a path's pin before it decides the path's first connection (the
primary records it if it is new: the first writer wins, whichever process it served). A path the cache still does
not know (the primary did not answer) is refused, never pinned here."""

from __future__ import annotations

from supervisor.control.policy.identity import MAX_PINS, BinaryIdentity, DigestPins, PinViolation, normalize_digest

UNREACHABLE = "control's primary process did not answer for its pin"


class OwnedPins(DigestPins):
    def __init__(self) -> None:
        super().__init__()
        self._full: set[str] = set()  # paths the primary could not pin (its store is full)

    def knows(self, identity: BinaryIdentity) -> bool:
        """Whether deciding ``identity`` needs no question to the primary."""
        return identity.path in self._pins or identity.path in self._full or normalize_digest(identity.sha256) is None

    def verify(self, identity: BinaryIdentity) -> PinViolation | None:
        path = identity.path
        digest = normalize_digest(identity.sha256)
        pinned = self._pins.get(path)
        if digest is None:
            return PinViolation(path, pinned, None)
        if pinned is None:
            return PinViolation(path, None, digest, None if path in self._full else UNREACHABLE)
        return None if pinned == digest else PinViolation(path, pinned, digest)

    def learn(self, path: str, pinned: str | None) -> None:
        """What the primary answered for ``path``: its pin, or ``None`` when its store is full."""
        if pinned is not None:
            self._pins[path] = pinned
            return
        if len(self._full) >= MAX_PINS:  # asked again later rather than grown without bound
            self._full.clear()
        self._full.add(path)
