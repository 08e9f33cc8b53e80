"""What the agent speaks inside a tunnel, from its first bytes (docs/spec/policy.md §3.7).

``sniff(prefix)`` returns ``None`` while ``prefix`` is still a proper prefix of more than one answer (the
caller waits up to :data:`SNIFF_WAIT_S` for more, then decides with what it has):

* ``16 03 00..04`` — a TLS record carrying a handshake: TLS;
* one of the nine methods below followed by a space — HTTP/1.x;
* the HTTP/2 connection preface — h2c prior knowledge (refused on inspected endpoints);
* anything else — unknown (refused on inspected endpoints).
"""

from __future__ import annotations

import enum

__all__ = ["SNIFF_BYTES", "SNIFF_WAIT_S", "TunnelProtocol", "sniff"]

SNIFF_BYTES = 24  # the HTTP/2 preface length
SNIFF_WAIT_S = 0.1
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_METHODS = tuple(m + b" " for m in (b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"PATCH", b"OPTIONS",
                                    b"CONNECT", b"TRACE"))  # fmt: skip


class TunnelProtocol(enum.StrEnum):
    TLS = "tls"
    HTTP1 = "http/1.1"
    H2C = "h2c"
    UNKNOWN = "unknown"


def sniff(prefix: bytes, *, final: bool = False) -> TunnelProtocol | None:
    """Classify ``prefix``; with ``final`` (no more bytes coming in time) an ambiguous prefix is ``UNKNOWN``."""
    if not prefix:
        return TunnelProtocol.UNKNOWN if final else None
    if prefix[0] == 0x16:
        if len(prefix) >= 2 and prefix[1] != 0x03:
            return TunnelProtocol.UNKNOWN
        if len(prefix) >= 3:
            return TunnelProtocol.TLS if prefix[2] <= 0x04 else TunnelProtocol.UNKNOWN
        return TunnelProtocol.UNKNOWN if final else None
    if any(prefix.startswith(m) for m in _METHODS):
        return TunnelProtocol.HTTP1
    if prefix.startswith(H2_PREFACE):
        return TunnelProtocol.H2C
    candidates = (*_METHODS, H2_PREFACE)
    if not final and any(c.startswith(prefix) for c in candidates):
        return None
    return TunnelProtocol.UNKNOWN
