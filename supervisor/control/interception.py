"""Where control's interception CA lives between restarts.

The agent trusts the CA it was given at attach; a control that restarted with a fresh CA would break every
intercepted connection. So the CA is kept in a directory of control's own (``--interception-ca DIR``: in
Kubernetes the per-sandbox CA Secret, in dev mode a private temporary directory): loaded when present, minted
and written (key 0600) when absent. Without a directory the CA lives in memory for this process only.
"""

from __future__ import annotations

import os
from pathlib import Path

from supervisor.control.l7 import InterceptionCA

CERT_FILE = "interception-ca.pem"
KEY_FILE = "interception-ca-key.pem"


def load_or_create(directory: Path | None, sandbox: str) -> InterceptionCA:
    if directory is None:
        return InterceptionCA.generate(sandbox)
    cert, key = directory / CERT_FILE, directory / KEY_FILE
    if cert.exists() and key.exists():
        return InterceptionCA.from_pem(cert.read_bytes(), key.read_bytes())
    ca = InterceptionCA.generate(sandbox)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(ca.private_key_pem())
    cert.write_text(ca.cert_pem)
    return ca
