"""TLS toward the real upstream after interception: always verified, never downgraded (docs/reference/policy.md §3.7).

The agent's TLS ends at control; control opens its own TLS to the destination with SNI = the CONNECT host and
verifies the certificate against the system trust store plus any extra CAs the operator configured. A failure
is answered ``502 upstream_tls_failed`` with the verifier's reason; there is no fallback to an unverified or
plaintext connection. HTTP/1.1 is the only ALPN offered, since the inspector speaks HTTP/1.1 on both sides.
"""

from __future__ import annotations

import ssl

from supervisor.control.l7.ca import ALPN_HTTP1

__all__ = ["UnsafeUpstreamContext", "check_upstream_context", "upstream_context"]


class UnsafeUpstreamContext(ValueError):
    """A context that would not verify the upstream was passed in; refusing it is a programming-error guard."""


def upstream_context(*, extra_ca_pem: str | None = None, extra_ca_file: str | None = None,
                     system_trust: bool = True) -> ssl.SSLContext:  # fmt: skip
    """System trust store (unless ``system_trust`` is False, for tests) plus extra CAs; HTTP/1.1 only."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH) if system_trust else ssl.SSLContext(
        ssl.PROTOCOL_TLS_CLIENT)  # fmt: skip
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    if extra_ca_pem:
        ctx.load_verify_locations(cadata=extra_ca_pem)
    if extra_ca_file:
        ctx.load_verify_locations(cafile=extra_ca_file)
    ctx.set_alpn_protocols([ALPN_HTTP1])
    return ctx


def check_upstream_context(ctx: ssl.SSLContext) -> None:
    if ctx.verify_mode != ssl.CERT_REQUIRED or not ctx.check_hostname:
        raise UnsafeUpstreamContext("the upstream TLS context must verify certificates and host names")
