"""What the agent speaks inside a tunnel, from its first bytes (docs/reference/policy.md §3.7, docs/design.md
"Sniffing the first bytes").

``sniff(prefix)`` returns ``None`` while ``prefix`` is still a proper prefix of more than one answer (the
caller keeps reading, up to its head timeout):

* a first byte ``0x16`` — TLS, whatever the version bytes say (a record no TLS stack accepts fails the
  handshake and closes the tunnel; it is never relayed raw);
* the HTTP/2 connection preface — h2c prior knowledge (refused);
* any ``TOKEN SP+ target SP+ HTTP/`` line — HTTP/1.x, *whatever the method*: an origin may accept a method
  the spec's list of nine does not name, so every request line is bound to the tunnel's authority. This is
  wider than §3.7 on purpose;
* anything that can be neither — unknown: relayed raw on endpoints without L7 rules, refused on the others.

A prefix still ambiguous after :data:`SNIFF_LIMIT` bytes (a request line that long) is HTTP: the request
parser then refuses it, which is the safe side of the doubt.
"""

from __future__ import annotations

import enum

__all__ = ["H2_PREFACE", "SNIFF_LIMIT", "TunnelProtocol", "sniff"]

SNIFF_LIMIT = 16384
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_TCHAR = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_WS = frozenset(b" \t")
_EOL = frozenset(b"\r\n")
_VERSION = b"HTTP/"


class TunnelProtocol(enum.StrEnum):
    TLS = "tls"
    HTTP1 = "http/1.1"
    H2C = "h2c"
    UNKNOWN = "unknown"


def _request_line(prefix: bytes) -> bool | None:
    """True: a request line (up to ``HTTP/``); False: cannot become one; None: not decided yet."""
    i, n = 0, len(prefix)
    while i < n and prefix[i] in _TCHAR:  # method
        i += 1
    if i == n:
        return None
    if i == 0 or prefix[i] not in _WS:
        return False
    while i < n and prefix[i] in _WS:
        i += 1
    if i == n:
        return None
    if prefix[i] in _EOL:
        return False
    while i < n and prefix[i] not in _WS and prefix[i] not in _EOL:  # target
        i += 1
    if i == n:
        return None
    if prefix[i] in _EOL:
        return False  # HTTP/0.9 has no headers, so no authority to bind: not this tunnel's concern
    while i < n and prefix[i] in _WS:
        i += 1
    version = prefix[i : i + len(_VERSION)].upper()
    if not _VERSION.startswith(version):
        return False
    return True if len(version) == len(_VERSION) else None


def sniff(prefix: bytes, *, final: bool = False) -> TunnelProtocol | None:
    """Classify ``prefix``; with ``final`` (no more bytes are coming) an undecided prefix is ``UNKNOWN``."""
    if not prefix:
        return TunnelProtocol.UNKNOWN if final else None
    if prefix[0] == 0x16:
        return TunnelProtocol.TLS
    if prefix.startswith(H2_PREFACE):
        return TunnelProtocol.H2C
    preface_pending = H2_PREFACE.startswith(prefix)
    line = _request_line(prefix[:SNIFF_LIMIT])
    if line is True and not preface_pending:
        return TunnelProtocol.HTTP1
    if line is False and not preface_pending:
        return TunnelProtocol.UNKNOWN
    if final:
        return TunnelProtocol.HTTP1 if line is True else TunnelProtocol.UNKNOWN
    if len(prefix) >= SNIFF_LIMIT:
        return TunnelProtocol.HTTP1
    return None
