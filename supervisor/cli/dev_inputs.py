"""Dev mode's files, checked before anything starts: ``--policy``, ``--credentials``, ``--upstream-ca``.

Control validates them too, but by then it reads dev's private copies (``supervisor/cli/dev_confinement.py``)
and its errors would name those. Checked here, each error is said once, against the path the user typed, in
``policy check``'s words, and dev exits 2 (a usage error) with nothing started.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from supervisor.control.credentials import Credentials, CredentialsError
from supervisor.control.policy import PolicyInvalid, load_policy_file


def input_errors(policy: Path | None, credentials: Path | None, upstream_ca: Path | None) -> list[str]:
    """Every line to print about the files dev was given; empty when they are all usable."""
    lines: list[str] = []
    if policy is not None:
        try:
            load_policy_file(policy)
        except PolicyInvalid as exc:
            lines += [str(error) for error in exc.errors]
            plural = "s" if len(exc.errors) != 1 else ""
            lines.append(f"{policy}: {len(exc.errors)} error{plural} (openshell-sandbox policy check {policy})")
    if credentials is not None:
        try:
            Credentials.load(credentials)  # secret_env is read from our environment, which control inherits
        except CredentialsError as exc:
            lines.append(f"openshell-sandbox: --credentials: {exc}")
    if upstream_ca is not None:
        try:
            ssl.create_default_context().load_verify_locations(cafile=str(upstream_ca))
        except (OSError, ssl.SSLError, ValueError) as exc:
            lines.append(f"openshell-sandbox: --upstream-ca: {upstream_ca}: {getattr(exc, 'strerror', None) or exc}")
    return lines
