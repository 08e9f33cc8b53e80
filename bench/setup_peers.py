"""Bringing the peer proxies (and py-spy) onto the machine, so one command works from a clean clone.

Rules:
1. Debian's packages through apt-get, non-interactive, only when the binary is missing. Services must
   not start on install (a stock squid would listen on every address): where the image has no
   ``policy-rc.d`` we put a refusing one in place for the install and remove it afterwards.
2. PyPI packages into a venv under ``bench/.venv-peers`` (git-ignored), never into the project's env.
3. A failure is a reason, returned to the caller and shown as a skipped contender, never an abort.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

PEERS_VENV = Path(__file__).resolve().parent / ".venv-peers"
PROXY_PY_REQUIREMENT = "proxy.py==2.4.10"
# The newest mitmproxy whose Requires-Python (>=3.10) admits the peers' venv interpreter (Debian bookworm's 3.11):
# 11.1 and later require 3.12.
MITMPROXY_REQUIREMENT = "mitmproxy==11.0.2"
SQUID_CERTGEN = Path("/usr/lib/squid/security_file_certgen")
POLICY_RC = Path("/usr/sbin/policy-rc.d")
APT_TIMEOUT = 600


def _run(argv: list[str], timeout: float = APT_TIMEOUT, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}, check=False)


def _have(binary: str) -> bool:
    return shutil.which(binary) is not None or any(Path(d, binary).exists() for d in ("/usr/sbin", "/usr/bin"))


def _apt_package_for_tinyproxy() -> str:
    """bookworm splits the binary into ``tinyproxy-bin``; older releases ship only ``tinyproxy``."""
    out = _run(["apt-cache", "policy", "tinyproxy-bin"], timeout=60).stdout
    return "tinyproxy-bin" if "Candidate:" in out and "Candidate: (none)" not in out else "tinyproxy"


def _apt_package_for_squid() -> str:
    """``squid-openssl`` where the release has it (it can bump TLS and conflicts with ``squid``), else ``squid``."""
    out = _run(["apt-cache", "policy", "squid-openssl"], timeout=60).stdout
    return "squid-openssl" if "Candidate:" in out and "Candidate: (none)" not in out else "squid"


def ensure_debian_peers() -> dict[str, str]:
    """Install what is missing of tinyproxy and squid (as squid-openssl where the release has it); return
    {binary: reason} for what is still missing."""
    missing = [b for b in ("tinyproxy", "squid") if not _have(b)]
    if not missing:
        return {}
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return {b: "not installed, and apt-get needs root" for b in missing}
    placed_policy = False
    if not POLICY_RC.exists():
        POLICY_RC.write_text("#!/bin/sh\n# placed by bench/setup_peers.py during an install\nexit 101\n")
        POLICY_RC.chmod(0o755)
        placed_policy = True
    try:
        print(f"bench: installing {', '.join(missing)} with apt-get", file=sys.stderr, flush=True)
        _run(["apt-get", "update", "-q"])
        packages = [_apt_package_for_tinyproxy() if b == "tinyproxy" else _apt_package_for_squid() for b in missing]
        result = _run(
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
            DEBIAN_FRONTEND="noninteractive",
        )
    finally:
        if placed_policy:
            POLICY_RC.unlink()
    tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or [""]
    return {b: f"apt-get install failed: {tail[0]}" for b in missing if not _have(b)}


def squid_has_openssl() -> bool:
    """Whether the installed squid can bump TLS: Debian's ``squid-openssl`` build (plain ``squid`` is GnuTLS)."""
    try:
        out = _run(["squid", "-v"], timeout=30).stdout
    except OSError:
        return False
    return "--with-openssl" in out and SQUID_CERTGEN.exists()


def ensure_squid_openssl() -> str | None:
    """Replace Debian's ``squid`` by ``squid-openssl`` (they conflict; the binary is the same path, so both squid
    roles run it); return a reason when squid cannot bump TLS afterwards."""
    if squid_has_openssl():
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "squid is not built with OpenSSL (Debian: squid-openssl), and apt-get needs root"
    placed_policy = False
    if not POLICY_RC.exists():
        POLICY_RC.write_text("#!/bin/sh\n# placed by bench/setup_peers.py during an install\nexit 101\n")
        POLICY_RC.chmod(0o755)
        placed_policy = True
    try:
        print("bench: installing squid-openssl with apt-get (it replaces squid)", file=sys.stderr, flush=True)
        result = _run(
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", "squid-openssl"],
            DEBIAN_FRONTEND="noninteractive",
        )
    finally:
        if placed_policy:
            POLICY_RC.unlink()
    if squid_has_openssl():
        return None
    tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or [""]
    return f"apt-get install squid-openssl failed: {tail[0]}"


def ensure_venv_package(requirement: str, binary: str, venv: Path = PEERS_VENV) -> str | None:
    """Make ``venv/bin/binary`` exist by pip-installing ``requirement``; return a reason on failure."""
    if (venv / "bin" / binary).exists():
        return None
    if not (venv / "bin" / "python").exists():
        made = _run([sys.executable, "-m", "venv", str(venv)], timeout=120)
        if made.returncode != 0:
            return f"venv creation failed: {made.stderr.strip()[-200:]}"
    print(f"bench: pip install {requirement} into {venv}", file=sys.stderr, flush=True)
    installed = _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", requirement])
    if installed.returncode != 0 or not (venv / "bin" / binary).exists():
        return f"pip install {requirement} failed: {installed.stderr.strip()[-200:]}"
    return None


def versions(venv: Path = PEERS_VENV) -> dict[str, str]:
    """Versions of the peers as they report them (for the results file)."""
    probes = {
        "tinyproxy": ["tinyproxy", "-v"],
        "squid": ["squid", "-v"],
        "proxy.py": [str(venv / "bin" / "proxy"), "--version"],
        "mitmproxy": [str(venv / "bin" / "mitmdump"), "--version"],
    }
    found: dict[str, str] = {}
    for name, argv in probes.items():
        try:
            out = _run(argv, timeout=30)
        except OSError:
            continue
        lines = (out.stdout or out.stderr).strip().splitlines()
        if out.returncode == 0 and lines:
            found[name] = lines[0].strip()
    return found
