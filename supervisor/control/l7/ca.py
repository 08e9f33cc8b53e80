"""The per-sandbox interception CA: minted by control, its key never leaves control (docs/reference/policy.md §3.7).

Rules:

1. One CA per control process (per sandbox): ECDSA P-256, self-signed, ``CA:TRUE, pathlen:0``, key usage
   ``keyCertSign`` + ``cRLSign``. Only its certificate (:attr:`InterceptionCA.cert_pem`) is handed out — to
   the boundary at ``attach``, which installs it for the agent (``openshell-ca.pem`` and the combined bundle).
2. A leaf per destination host, issued on first use and cached (LRU, :data:`LEAF_CACHE_SIZE` hosts): SAN is
   the host as a DNS name or, for an address literal, as an IP address; CN the host when it fits; EKU
   ``serverAuth``; chain = leaf + CA. It is the CONNECT host that names the leaf; the client's SNI is ignored.
3. The server context offers ALPN ``http/1.1`` only (clients fall back from HTTP/2) and TLS 1.2+, and refuses
   renegotiation.
4. Key material is loaded into ``ssl`` through an anonymous memory file (``memfd``): no key ever touches a
   filesystem, which matters because control runs with a read-only root.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
from collections import OrderedDict
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from supervisor.control.policy import normalize_request_host

__all__ = ["ALPN_HTTP1", "LEAF_CACHE_SIZE", "InterceptionCA", "LeafError"]

LEAF_CACHE_SIZE = 256
ALPN_HTTP1 = "http/1.1"
CA_VALIDITY = datetime.timedelta(days=365)
LEAF_VALIDITY = datetime.timedelta(days=30)
BACKDATE = datetime.timedelta(minutes=5)
RENEW_BEFORE = datetime.timedelta(days=1)


class LeafError(ValueError):
    """The host cannot be named in a certificate (empty, malformed)."""


@dataclass(frozen=True)
class _Leaf:
    context: ssl.SSLContext
    not_after: datetime.datetime


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())  # fmt: skip


def _load_chain(ctx: ssl.SSLContext, chain_pem: bytes, key_pem: bytes) -> None:
    """Rule 4: ``load_cert_chain`` wants paths; give it memory files (a 0600 temp file where memfd is missing)."""
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None and os.path.isdir("/proc/self/fd"):
        cert_fd = memfd("openshell-leaf-cert", os.MFD_CLOEXEC)
        key_fd = memfd("openshell-leaf-key", os.MFD_CLOEXEC)
        try:
            os.write(cert_fd, chain_pem)
            os.write(key_fd, key_pem)
            ctx.load_cert_chain(f"/proc/self/fd/{cert_fd}", f"/proc/self/fd/{key_fd}")
        finally:
            os.close(cert_fd)
            os.close(key_fd)
        return
    with tempfile.TemporaryDirectory(prefix="openshell-leaf-") as tmp:  # pragma: no cover - non-Linux
        cert_path, key_path = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        for path, data in ((cert_path, chain_pem), (key_path, key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        ctx.load_cert_chain(cert_path, key_path)


class InterceptionCA:
    def __init__(self, certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey,
                 *, cache_size: int = LEAF_CACHE_SIZE) -> None:  # fmt: skip
        self.certificate = certificate
        self._key = key
        self._cache: OrderedDict[str, _Leaf] = OrderedDict()
        self._cache_size = cache_size
        self._ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        self.cert_pem: str = certificate.public_bytes(serialization.Encoding.PEM).decode("ascii")
        self.issued = 0  # leaves minted so far (cache misses)

    def __repr__(self) -> str:
        return f"InterceptionCA({self.certificate.subject.rfc4514_string()!r})"

    @classmethod
    def generate(cls, sandbox: str, *, validity: datetime.timedelta = CA_VALIDITY) -> InterceptionCA:
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        name = x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "OpenShell"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"OpenShell Sandbox CA {sandbox}"[:64]),
        ])  # fmt: skip
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + validity)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    @classmethod
    def from_pem(cls, cert_pem: bytes | str, key_pem: bytes | str) -> InterceptionCA:
        """Reload a CA kept by the operator (so a restarted control keeps the one the agent already trusts)."""
        cert = x509.load_pem_x509_certificate(cert_pem.encode() if isinstance(cert_pem, str) else cert_pem)
        key = serialization.load_pem_private_key(key_pem.encode() if isinstance(key_pem, str) else key_pem, None)
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
            raise ValueError("the key is not the CA certificate's EC key")
        return cls(cert, key)

    def private_key_pem(self) -> bytes:
        """For the operator's own persistence only; never sent anywhere by control."""
        return _pem_key(self._key)

    # --- leaves ----------------------------------------------------------------------------------------------
    def leaf_context(self, host: str) -> ssl.SSLContext:
        """The server context presenting a leaf for ``host`` (rule 2), from the cache when fresh."""
        name = normalize_request_host(host)
        if name is None:
            raise LeafError(f"cannot issue a certificate for {host!r}")
        leaf = self._cache.get(name)
        if leaf is not None and leaf.not_after - RENEW_BEFORE > _now():
            self._cache.move_to_end(name)
            return leaf.context
        leaf = self._issue(name)
        self._cache[name] = leaf
        self._cache.move_to_end(name)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return leaf.context

    @property
    def cached_hosts(self) -> int:
        return len(self._cache)

    def issue_certificate(self, host: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """Mint a leaf for an already normalised ``host`` (exposed for tests and tools)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            address = None
        san: x509.GeneralName = x509.IPAddress(address) if address is not None else x509.DNSName(host)
        subject = [x509.NameAttribute(NameOID.COMMON_NAME, host)] if len(host) <= 64 else []
        not_after = min(now + LEAF_VALIDITY, self.certificate.not_valid_after_utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(subject))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName([san]), critical=not subject)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(self._ski), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        return cert, key

    def _issue(self, host: str) -> _Leaf:
        cert, key = self.issue_certificate(host)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.options |= ssl.OP_NO_RENEGOTIATION  # a TLS 1.2 agent cannot renegotiate (memory_tls.py rule 1)
        ctx.set_alpn_protocols([ALPN_HTTP1])
        chain = cert.public_bytes(serialization.Encoding.PEM) + self.cert_pem.encode("ascii")
        _load_chain(ctx, chain, _pem_key(key))
        self.issued += 1
        return _Leaf(ctx, cert.not_valid_after_utc)
