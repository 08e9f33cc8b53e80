"""Refusing a peer after a completed handshake, and reading such a refusal.

With TLS 1.3 the client's handshake completes before the server has checked the client's certificate, and
either side's claim check runs after the handshake: the refused side sees only a closed connection. So the
refusing side speaks just enough HTTP/2 to say why: its connection preface and a GOAWAY whose debug data is
``refused field=<field>``. The field is a name from a fixed vocabulary (a claim name, ``role``,
``certificate``, ``tls``, ``alpn``, ``state``), never a value: the peer is not trusted with our claims. The
refused side's link (``h2link.Link``) reads the field back with :func:`refused_field`.
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.errors
import trio

REFUSAL_CODE = h2.errors.ErrorCodes.INADEQUATE_SECURITY
REFUSAL_PREFIX = "refused field="
REFUSAL_GRACE_S = 1.0
_FIELD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz_")
_DEBUG_LIMIT = 200
_DRAIN_READ = 256 * 1024  # what is read (and dropped) at a time while the peer closes


def refusal_debug_data(field: str | None) -> bytes:
    """The GOAWAY debug data naming ``field``; anything that is not a plain field name becomes ``certificate``."""
    name = field if field and len(field) <= 40 and set(field) <= _FIELD_CHARS else "certificate"
    return (REFUSAL_PREFIX + name).encode("ascii")


def debug_text(data: bytes | None) -> str:
    """A peer's GOAWAY debug data for a log line: printable ASCII only, bounded."""
    if not data:
        return ""
    text = data[:_DEBUG_LIMIT].decode("ascii", "replace")
    return "".join(c if c.isprintable() and c.isascii() else "?" for c in text)


def refused_field(debug: str) -> str | None:
    """The field a refusal's debug text names, or None when it is not a refusal or names no plain field."""
    if not debug.startswith(REFUSAL_PREFIX):
        return None
    name = debug[len(REFUSAL_PREFIX) :]
    return name if name and set(name) <= _FIELD_CHARS else None


async def send_refusal(
    transport: trio.abc.Stream, *, client: bool, field: str | None, grace: float = REFUSAL_GRACE_S
) -> None:
    """Tell the peer why it is refused (a preface and a GOAWAY naming ``field``), then close ``transport``.

    ``client`` is our HTTP/2 role on this link kind. What the peer sends meanwhile is read and dropped for up to
    ``grace`` seconds until it closes: closing with its bytes unread would reset the connection, and a reset
    can overtake the GOAWAY.
    """
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=client))
    conn.initiate_connection()
    conn.close_connection(error_code=REFUSAL_CODE, additional_data=refusal_debug_data(field))
    with trio.move_on_after(grace):
        try:
            await transport.send_all(conn.data_to_send())
            while await transport.receive_some(_DRAIN_READ):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
    await trio.aclose_forcefully(transport)
