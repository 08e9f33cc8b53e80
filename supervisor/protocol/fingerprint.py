"""Certificate fingerprints both daemons compare: ``sha256:<hex>`` of the DER encoding.

Used for the interception CA: the boundary reports the fingerprint of the CA it was given at attach (the one the
agent trusts), control compares it with its own on ``resume`` and says so when they differ.
"""

from __future__ import annotations

import hashlib

from cryptography import x509
from cryptography.hazmat.primitives import serialization

__all__ = ["certificate_fingerprint", "pem_fingerprint"]


def certificate_fingerprint(certificate: x509.Certificate) -> str:
    return "sha256:" + hashlib.sha256(certificate.public_bytes(serialization.Encoding.DER)).hexdigest()


def pem_fingerprint(pem: str | bytes) -> str:
    """The fingerprint of the first certificate in ``pem``; ``ValueError`` if there is none."""
    data = pem.encode("ascii") if isinstance(pem, str) else pem
    return certificate_fingerprint(x509.load_pem_x509_certificate(data))
