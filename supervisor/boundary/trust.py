"""The CA trust the boundary gives the agent: control's interception CA, alone and appended to the system bundle
(docs/reference/boundary.md §6.5), in files the workload can read but not change.

The env keys pointing at these files are managed (``environment.managed_env``): exec and agent env cannot
override them.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography import x509

SYSTEM_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
)
CA_FILE = "openshell-ca.pem"
BUNDLE_FILE = "ca-bundle.pem"


class TrustError(ValueError):
    """The CA certificate from control is not one."""


def install_trust(directory: Path, ca_pem: str) -> tuple[Path, Path]:
    """Write ``openshell-ca.pem`` and ``ca-bundle.pem`` (system CAs + ours) into ``directory``; returns both paths.

    Files are replaced atomically (write, fsync, rename) and left 0644 in a 0755 directory owned by us.
    """
    try:
        cert = x509.load_pem_x509_certificate(ca_pem.encode())
    except ValueError as exc:
        raise TrustError(f"interception CA is not a PEM certificate: {exc}") from None
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    if not basic.ca:
        raise TrustError("interception CA certificate is not a CA")
    directory.mkdir(parents=True, exist_ok=True, mode=0o755)
    os.chmod(directory, 0o755)
    system = next((Path(p) for p in SYSTEM_BUNDLES if Path(p).is_file()), None)
    system_pem = system.read_text() if system is not None else ""
    ours = ca_pem if ca_pem.endswith("\n") else ca_pem + "\n"
    ca_path, bundle_path = directory / CA_FILE, directory / BUNDLE_FILE
    _write(ca_path, ours)
    _write(bundle_path, (system_pem.rstrip("\n") + "\n" if system_pem else "") + ours)
    return ca_path, bundle_path


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.chmod(tmp, 0o644)
    tmp.rename(path)
