"""The environment and launch spec of the agent and of exec'd processes (docs/reference/boundary.md §2.2, §2.3, §6.5).

Rules:

1. The environment starts **empty**: nothing of the boundary's own environment ever reaches a workload
   process (no ``OPENSHELL_*`` control variables, tokens, TLS paths).
2. Order, later entries winning: ``PATH``, ``HOME``, ``USER``, ``SHELL``, ``TERM`` (``xterm-256color`` with a
   PTY, else ``dumb``), ``OPENSHELL_SANDBOX=1``; then the request's env (already validated: managed and
   ``OPENSHELL_*`` keys refused); then provider placeholders from control; then the **managed** keys (proxy
   and CA trust), which always win.
3. argv is passed through untouched (no shell); cwd defaults to the sandbox workdir and is entered by the
   child only after it dropped to the workload uid.
"""

from __future__ import annotations

import functools
import pwd
from collections.abc import Mapping
from typing import Final

from supervisor.boundary.forkimage.child import DEFAULT_PATH, SpawnSpec
from supervisor.boundary.forkimage.landlock import LandlockSpec
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.process_ops import (
    CA_ADDING_KEYS,
    CA_REPLACING_KEYS,
    MANAGED_ENV_KEYS,
    ExecRequest,
    is_managed_env_key,
    validate_env,
)

__all__ = [
    "CA_BUNDLE_PATH",
    "CA_CERT_PATH",
    "PROXY_URL",
    "build_environment",
    "build_process_spec",
    "managed_env",
]

PROXY_URL: Final = "http://127.0.0.1:3128"
CA_CERT_PATH: Final = "/run/openshell-boundary/tls/openshell-ca.pem"
CA_BUNDLE_PATH: Final = "/run/openshell-boundary/tls/ca-bundle.pem"
NO_PROXY: Final = "127.0.0.1,localhost,::1"


def managed_env(
    proxy_url: str = PROXY_URL, *, ca_cert: str | None = CA_CERT_PATH, ca_bundle: str | None = CA_BUNDLE_PATH
) -> dict[str, str]:
    """The §6.5 keys: proxy everywhere (lower and upper case), CA trust when a CA is installed: the variables that
    replace a tool's store get the combined bundle, those that add to it the CA alone (docs/policy.md "Tools in
    the agent")."""
    env = {
        key: proxy_url
        for key in ("ALL_PROXY", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "http_proxy", "https_proxy", "grpc_proxy")
    }
    env.update({"NO_PROXY": NO_PROXY, "no_proxy": NO_PROXY, "NODE_USE_ENV_PROXY": "1"})
    if ca_cert is not None:
        env.update(dict.fromkeys(CA_ADDING_KEYS, ca_cert))
    if ca_bundle is not None:
        env.update(dict.fromkeys(CA_REPLACING_KEYS, ca_bundle))
    assert set(env) <= MANAGED_ENV_KEYS
    return env


@functools.lru_cache(maxsize=8)
def account(uid: int) -> tuple[str, str] | None:
    """``(name, home)`` of ``uid``'s account, or ``None``. Looked up once per uid: every exec needs it, and for
    an account that does not exist (dev mode's dedicated agent uid) each lookup walks every NSS source."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return None
    return entry.pw_name, entry.pw_dir


def _account(uid: int, user: str | None, home: str | None, fallback_home: str) -> tuple[str, str]:
    if user is not None and home is not None:
        return user, home
    found_user, found_home = account(uid) or ("sandbox", fallback_home)
    return user if user is not None else found_user, home if home is not None else found_home


def build_environment(
    *,
    user_env: Mapping[str, str],
    managed: Mapping[str, str],
    user: str,
    home: str,
    tty: bool,
    path: str = DEFAULT_PATH,
    provider_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Rule 2. ``user_env`` is validated again here, so a caller that skipped the parser cannot slip a key in."""
    checked = validate_env(dict(user_env))
    for key in managed:
        if not is_managed_env_key(key):
            raise ValueError(f"{key} is not a managed key")
    env: dict[str, str] = {
        "PATH": path,
        "HOME": home,
        "USER": user,
        "SHELL": "/bin/bash",
        "TERM": "xterm-256color" if tty else "dumb",
        "OPENSHELL_SANDBOX": "1",
    }
    env.update(checked)
    env.update(validate_env(dict(provider_env or {}), field="provider_env"))
    env.update(managed)
    return env


def build_process_spec(
    req: ExecRequest,
    *,
    agent_uid: int,
    agent_gid: int,
    managed_env: Mapping[str, str],
    default_cwd: str,
    landlock: LandlockSpec | None,
    groups: tuple[int, ...] = (),
    user: str | None = None,
    home: str | None = None,
    path: str = DEFAULT_PATH,
    provider_env: Mapping[str, str] | None = None,
    seccomp: bool = True,
) -> SpawnSpec:
    """The launcher spec for a validated exec (or agent) request, run as the workload uid/gid."""
    if agent_uid < 0 or agent_gid < 0:
        raise OpError(ErrorKind.INVALID, "workload uid/gid must be set")
    cwd = req.cwd or default_cwd
    name, home_dir = _account(agent_uid, user, home, default_cwd)
    env = build_environment(
        user_env=req.env_map, managed=managed_env, user=name, home=home_dir, tty=req.tty, path=path,
        provider_env=provider_env,
    )  # fmt: skip
    return SpawnSpec(
        argv=req.argv,
        env=env,
        cwd=cwd,
        uid=agent_uid,
        gid=agent_gid,
        groups=groups,
        tty=req.tty,
        cols=req.cols,
        rows=req.rows,
        stdin=req.stdin,
        landlock=landlock,
        seccomp=seccomp,
    )
