"""TLS contexts for the control <-> boundary links, and the post-handshake peer check (docs/design.md "Trust and
direction").

Rules this module enforces:

1. TLS 1.3 only, both directions; client certificates are required; the only trust anchor is the sandbox's
   own CA from the bootstrap bundle (no system store). The server sends no session tickets: links are few
   and long-lived, and every link pays a full handshake with a fresh certificate check.
2. Hostnames are not checked: a peer's identity is its claims, not a DNS name. ``verify_peer`` must be
   called after every handshake, on both sides, before a single byte of application data is trusted.
3. ``verify_peer`` refuses with ``PeerRejected`` naming one field: ``tls`` (not TLS 1.3), ``alpn`` (none
   negotiated, or not the one expected), ``certificate`` (no peer certificate, not issued by this
   sandbox's CA, outside its validity, or no readable claims), ``role``, or the first differing claim.

The standard library already rejects a chain that does not lead to the CA, or a certificate outside its
validity period, during the handshake; ``verify_peer`` checks the issuer and the dates again with
``cryptography`` so that a context built some other way (say ``CERT_NONE`` by mistake) still cannot let a
self-signed certificate with the right claims through.
"""

from __future__ import annotations

import datetime
import functools
import ssl
from collections.abc import Sequence
from typing import Literal, Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from .certs import Bundle, BundleError, read_peer_certificate
from .claims import ClaimMismatch, Claims, ClaimsError, Role, verify_claims
from .errors import ErrorKind, OpError

__all__ = [
    "ALPN_API",
    "ALPN_EGRESS",
    "ALPN_OPS",
    "PeerRejected",
    "TLSConnection",
    "client_context",
    "server_context",
    "verify_peer",
]

ALPN_OPS = "openshell-ops/1"
ALPN_EGRESS = "openshell-egress/1"
ALPN_API = "http/1.1"  # control's TCP operator API: HTTP/1.1 (h11) inside the TLS

FIELD_TLS = "tls"
FIELD_ALPN = "alpn"
FIELD_CERTIFICATE = "certificate"


class PeerRejected(Exception):
    """The peer completed a handshake but is not this sandbox's other half."""

    def __init__(self, field: str | None, reason: str) -> None:
        super().__init__(field, reason)
        self.field = field
        self.reason = reason

    def __str__(self) -> str:
        where = f" [{self.field}]" if self.field else ""
        return f"peer rejected{where}: {self.reason}"

    def to_op_error(self) -> OpError:
        """The ``denied`` error the spec asks for (boundary.md §1.2 step 1)."""
        return OpError(ErrorKind.DENIED, self.reason, field=self.field)


class TLSConnection(Protocol):
    """What ``verify_peer`` reads: satisfied by ``ssl.SSLObject``, ``ssl.SSLSocket`` and ``trio.SSLStream``."""

    def version(self) -> str | None: ...

    def selected_alpn_protocol(self) -> str | None: ...

    def getpeercert(self, binary_form: Literal[True]) -> bytes | None: ...


def _configure(ctx: ssl.SSLContext, bundle: Bundle, alpn: Sequence[str]) -> ssl.SSLContext:
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.maximum_version = ssl.TLSVersion.TLSv1_3
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    try:
        ctx.load_verify_locations(cafile=str(bundle.ca_path))
    except (OSError, ssl.SSLError) as exc:
        raise BundleError(f"{bundle.ca_path}: cannot load as a CA: {exc}") from None
    try:
        ctx.load_cert_chain(certfile=str(bundle.cert_path), keyfile=str(bundle.key_path))
    except (OSError, ssl.SSLError) as exc:
        raise BundleError(f"{bundle.cert_path}, {bundle.key_path}: cannot load as a key pair: {exc}") from None
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    return ctx


def server_context(bundle: Bundle, alpn: Sequence[str] = (ALPN_OPS, ALPN_EGRESS)) -> ssl.SSLContext:
    """The boundary's listening side: TLS 1.3, client certificate from this sandbox's CA required."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.num_tickets = 0
    ctx.options |= ssl.OP_NO_TICKET
    return _configure(ctx, bundle, alpn)


def client_context(bundle: Bundle, alpn: Sequence[str]) -> ssl.SSLContext:
    """Control's dialling side: TLS 1.3, server certificate from this sandbox's CA, no hostname check."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False  # identity is the claims, checked by verify_peer
    return _configure(ctx, bundle, alpn)


def _ca_certificate(bundle: Bundle) -> x509.Certificate:
    if bundle.ca_certificate is not None:
        return bundle.ca_certificate
    try:
        return x509.load_pem_x509_certificate(bundle.ca_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise PeerRejected(FIELD_CERTIFICATE, f"cannot read the sandbox CA {bundle.ca_path}: {exc}") from None


@functools.lru_cache(maxsize=256)
def _checked_peer(ca: x509.Certificate, der: bytes) -> tuple[Claims, Role, datetime.datetime, datetime.datetime]:
    """Issuer signature and claims of ``der`` under ``ca``: a pure function of the two DER encodings.

    Cached (a link re-dial presents the same certificate), which saves the ECDSA verification and the
    claims parse, about 180 us, on every handshake after the first. Failures raise and are not cached;
    the validity dates are returned so that the caller checks them against the clock every time.
    """
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError as exc:
        raise PeerRejected(FIELD_CERTIFICATE, f"peer certificate is not valid DER: {exc}") from None
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise PeerRejected(FIELD_CERTIFICATE, "peer certificate is not issued by this sandbox's CA") from None
    try:
        claims, role = read_peer_certificate(der)
    except ClaimsError as exc:
        raise PeerRejected(FIELD_CERTIFICATE, f"peer certificate claims: {exc}") from None
    return claims, role, cert.not_valid_before_utc, cert.not_valid_after_utc


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _check_dates(not_before: datetime.datetime, not_after: datetime.datetime) -> None:
    if not not_before <= _utc_now() <= not_after:
        raise PeerRejected(
            FIELD_CERTIFICATE,
            f"peer certificate is valid only from {not_before:%Y-%m-%dT%H:%M:%SZ} to {not_after:%Y-%m-%dT%H:%M:%SZ}",
        )


def verify_peer(
    ssl_object: ssl.SSLObject | ssl.SSLSocket | TLSConnection,
    bundle: Bundle,
    *,
    expected_alpn: str | None = None,
    expected_role: Role | None = None,
) -> Claims:
    """Check a completed handshake against ``bundle``; return the peer's claims or raise ``PeerRejected``.

    The peer must hold ``expected_role``, by default the link peer of the bundle's role (``Role.other``): a link
    never accepts an operator certificate, and control's TCP API asks for ``Role.OPERATOR`` explicitly."""
    version = ssl_object.version()
    if version != "TLSv1.3":
        raise PeerRejected(FIELD_TLS, f"negotiated {version or 'no TLS version'}, TLSv1.3 required")
    alpn = ssl_object.selected_alpn_protocol()
    if alpn is None:
        raise PeerRejected(FIELD_ALPN, "no ALPN protocol negotiated")
    if expected_alpn is not None and alpn != expected_alpn:
        raise PeerRejected(FIELD_ALPN, f"negotiated ALPN {alpn!r}, expected {expected_alpn!r}")
    der = ssl_object.getpeercert(True)
    if not der:
        raise PeerRejected(FIELD_CERTIFICATE, "peer presented no certificate")
    claims, role, not_before, not_after = _checked_peer(_ca_certificate(bundle), bytes(der))
    _check_dates(not_before, not_after)
    if expected_role is None:
        expected_role = bundle.role.other()
    try:
        verify_claims(claims, role, bundle.claims, expected_role)
    except ClaimMismatch as exc:
        raise PeerRejected(exc.field, str(exc)) from None
    return claims
