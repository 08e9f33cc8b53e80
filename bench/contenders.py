"""Contenders: what sits between the client and the upstream.

A contender is started once per harness run and measured in every scenario. The interface is small on
purpose, so that the project's own full path can be added as one thin class:

* ``start() -> Address | None`` — bring it up; return the HTTP CONNECT proxy address the client dials,
  or ``None`` to have the client dial the upstream directly. Raise :class:`ContenderUnavailable` with
  a one-line reason to have it reported as skipped (never as a number).
* ``target(upstream) -> Address`` — the host:port the client puts in CONNECT for an upstream listener
  (peers forward anywhere; the sandbox may need a name its control resolves, or a namespaced address).
* ``pids() -> list[int]`` — the processes whose memory counts for this contender (live tree);
  ``pid_groups()`` names parts of them (the sandbox: control, boundary, launcher) for per-daemon numbers.
* ``client()`` — the client driver (``bench.remote``) that measures it, or ``None`` for the harness's
  own, which runs in the harness's namespace; the sandbox answers with the driver that is its agent.
* ``stop()`` — stop everything it started, leaving nothing behind; safe to call twice.

Peers bind to 127.0.0.1 on a port picked here (and one that binds anything beyond loopback is stopped
and reported as skipped), run in the foreground (no daemonising, no pid files
outside the run's temporary directory) and log only errors, so no contender pays for per-connection
logging that another one skips. They reach the upstream on the harness's upstream host (``tests/netns_hosts.py``),
over the veth pair from the harness's namespace, like the direct client does.

The project's own contender lives in ``bench.openshell``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench.origin import TlsMaterial
from bench.procstat import bound_sockets, process_tree, start_time

if TYPE_CHECKING:
    from bench.remote import ClientDriver

Address = tuple[str, int]
HOST = "127.0.0.1"
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


class ContenderUnavailable(Exception):
    """This contender cannot run here; the message is the reason shown in the table."""


@dataclass(frozen=True)
class BenchContext:
    workdir: Path  # a temporary directory owned by this run
    peers_venv: Path  # venv holding proxy.py (may not exist)
    nofile: int  # the soft open-files limit children inherit
    client_copy: Path | None = None  # the 0755 copy of the client driver (bench.remote.client_copy)
    upstream_bulk: Address | None = None  # the upstream's listeners, as every contender reaches them
    upstream_echo: Address | None = None
    upstream_idle: Address | None = None
    upstream_host_reason: str = ""  # why the upstream is on loopback instead of its own host, if it is
    product: Path | None = None  # a directory holding the run's snapshot of ``supervisor/`` (else the checkout)
    daemon_python: str | None = None  # the interpreter the sandbox's daemons run on (bench.interpreter; else ours)
    upstream_https: Address | None = None  # the HTTPS origin of the intercepted scenarios (bench.origin)
    tls: TlsMaterial | None = None  # the run's origin and bump CAs (bench.origin.make_material)


class Contender:
    name = "contender"
    # Which scenario paths it is measured on (``Scenario.path``): "raw" (the CONNECT tunnel rows) and/or
    # "intercepted" (HTTPS to the origin, terminated by the contender where it intercepts).
    paths: tuple[str, ...] = ("raw",)

    def __init__(self, ctx: BenchContext) -> None:
        self.ctx = ctx

    def start(self) -> Address | None:
        raise NotImplementedError

    def target(self, upstream: Address) -> Address:
        return upstream

    def pids(self) -> list[int]:
        return []

    def pid_groups(self) -> dict[str, list[int]]:
        return {self.name: self.pids()}

    def client(self) -> ClientDriver | None:
        return None

    def https_trust(self) -> str | None:
        """The CA file the client verifies HTTPS against through this contender (None: its environment's)."""
        return str(self.ctx.tls.origin_ca) if self.ctx.tls is not None else None

    def stop(self) -> None:
        pass


class Direct(Contender):
    """No proxy: the baseline every ratio is taken against."""

    name = "direct"
    paths = ("raw", "intercepted")  # the baseline of the intercepted rows too: TLS end to end to the origin

    def start(self) -> Address | None:
        return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


class ProcessContender(Contender):
    """A peer proxy run as a foreground child process in its own session."""

    def __init__(self, ctx: BenchContext) -> None:
        super().__init__(ctx)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.dir = ctx.workdir / self.name
        self._tree: dict[int, int] = {}  # pid -> start time, of the processes we started

    def command(self) -> list[str]:
        """Write the config into ``self.dir`` and return the argv (``self.port`` is set)."""
        raise NotImplementedError

    def start(self) -> Address | None:
        self._tree = {}
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        argv = self.command()
        log = (self.dir / "output.log").open("wb")
        with log:
            self.proc = subprocess.Popen(
                argv,
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait_listening()
        exposed = [s for s in bound_sockets(self.pids()) if not s.address.is_loopback]
        if exposed:
            self.stop()
            where = ", ".join(f"{s.protocol} {s.address}:{s.port}" for s in exposed)
            raise ContenderUnavailable(f"refused: it bound beyond loopback ({where})")
        return (HOST, self.port)

    def _wait_listening(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = (self.dir / "output.log").read_text(errors="replace")[-400:]
                raise ContenderUnavailable(f"exited with {self.proc.returncode} at start: {tail.strip()!r}")
            try:
                with socket.create_connection((HOST, self.port), timeout=1.0):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise ContenderUnavailable(f"not listening on {HOST}:{self.port} after {READY_TIMEOUT:.0f} s")

    def pids(self) -> list[int]:
        if self.proc is None or self.proc.poll() is not None:
            return []
        tree = process_tree(self.proc.pid)
        for pid in tree:
            if pid not in self._tree and (started := start_time(pid)) is not None:
                self._tree[pid] = started
        return tree

    def stop(self) -> None:
        if self.proc is None:
            return
        self.pids()  # remember the children we may have to end ourselves
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid, started in self._tree.items():
            # Only a child that is still the very process we saw (same pid, same start time): a pid
            # of ours that ended may already belong to someone else's process.
            if pid != self.proc.pid and start_time(pid) == started:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._tree = {}
        self.proc = None


def _binary(*names: str) -> str:
    for name in names:
        found = shutil.which(name) or next(
            (str(p) for d in ("/usr/sbin", "/usr/bin") if (p := Path(d) / name).exists()), None
        )
        if found:
            return found
    raise ContenderUnavailable(f"{names[0]} is not installed")


class Tinyproxy(ProcessContender):
    name = "tinyproxy"

    def command(self) -> list[str]:
        binary = _binary("tinyproxy")
        conf = self.dir / "tinyproxy.conf"
        # No ConnectPort line: CONNECT is allowed to every port. MaxClients bounds its threads.
        conf.write_text(
            f"Port {self.port}\nListen {HOST}\nTimeout 600\nMaxClients {self.ctx.nofile}\n"
            f"LogLevel Error\nAllow 127.0.0.1\nDisableViaHeader Yes\n"
        )
        return [binary, "-d", "-c", str(conf)]


class Squid(ProcessContender):
    name = "squid"

    def command(self) -> list[str]:
        binary = _binary("squid")
        os.chmod(self.dir, 0o777)  # squid drops to its effective user before writing its logs
        user = ""
        if os.geteuid() == 0:
            try:
                user = f"cache_effective_user {pwd.getpwnam('proxy').pw_name}\n"
            except KeyError:
                user = "cache_effective_user nobody\n"
        conf = self.dir / "squid.conf"
        # A forwarding proxy with no cache and no access log. DNS is pointed at loopback (nothing there)
        # so that squid can never query the machine's resolver; CONNECT targets are address literals.
        conf.write_text(
            self.http_port_config() + "http_access allow localhost\nhttp_access deny all\n"
            "cache deny all\naccess_log none\ncache_store_log none\n"
            f"cache_log {self.dir / 'cache.log'}\npid_filename {self.dir / 'squid.pid'}\n"
            f"coredump_dir {self.dir}\nmax_filedescriptors {self.ctx.nofile}\n"
            "pinger_enable off\ndns_nameservers 127.0.0.1\nshutdown_lifetime 0 seconds\n"
            f"udp_incoming_address {HOST}\nudp_outgoing_address {HOST}\n"
            "via off\nforwarded_for delete\n" + user
        )
        return [binary, "-N", "-f", str(conf)]

    def http_port_config(self) -> str:
        return f"http_port {HOST}:{self.port}\n"


SQUID_CERTGEN = Path("/usr/lib/squid/security_file_certgen")


class SquidBump(Squid):
    """squid with SSL bump (Debian's ``squid-openssl``): every CONNECT is bumped, its leaf minted from the bench's
    bump CA by ``security_file_certgen`` (mimicking the origin's certificate, which it verifies against the
    origin CA), one TLS handshake on each side, as mitmproxy and the sandbox do."""

    name = "squid-bump"
    paths = ("intercepted",)
    _db_root: Path | None = None  # the certgen db's directory, made per start

    def command(self) -> list[str]:
        tls = self.ctx.tls
        if tls is None:
            raise ContenderUnavailable("the harness made no TLS material (no HTTPS origin)")
        argv = super().command()
        version = subprocess.run([argv[0], "-v"], capture_output=True, text=True, check=False).stdout
        if "--with-openssl" not in version:
            raise ContenderUnavailable("squid is built without OpenSSL (Debian: install squid-openssl)")
        if not SQUID_CERTGEN.exists():
            raise ContenderUnavailable(f"{SQUID_CERTGEN} is missing (Debian: squid-openssl)")
        # The certgen helpers run as squid's effective user: their db lives in a directory of its own that they can
        # reach whatever the run's directory is (a 0700 temporary directory, in the harness and in pytest).
        self._db_root = Path(tempfile.mkdtemp(prefix="openshell-bench-ssldb-"))
        self._db_root.chmod(0o755)
        db = self._db_root / "db"
        made = subprocess.run([str(SQUID_CERTGEN), "-c", "-s", str(db), "-M", "16MB"], capture_output=True,
                              text=True, check=False)  # fmt: skip
        if made.returncode != 0:
            raise ContenderUnavailable(f"security_file_certgen -c failed: {made.stderr.strip()[-200:]}")
        if os.geteuid() == 0:
            owner = _squid_user()
            for path in (db, *db.rglob("*")):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        with (self.dir / "squid.conf").open("a") as conf:
            conf.write(bump_config(db, str(tls.origin_ca)))
        return argv

    def http_port_config(self) -> str:
        assert self.ctx.tls is not None
        return squid_bump_port(self.port, str(self.ctx.tls.bump_ca), str(self.ctx.tls.bump_key))

    def https_trust(self) -> str | None:
        return str(self.ctx.tls.bump_ca) if self.ctx.tls is not None else None

    def stop(self) -> None:
        super().stop()
        if self._db_root is not None:
            shutil.rmtree(self._db_root, ignore_errors=True)
            self._db_root = None


def _squid_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("proxy")
    except KeyError:
        return pwd.getpwnam("nobody")


def squid_bump_port(port: int, ca_cert: str, ca_key: str) -> str:
    """squid's listener for SSL bump: leaves minted from the bump CA per host, cached in memory."""
    return (
        f"http_port {HOST}:{port} ssl-bump tls-cert={ca_cert} tls-key={ca_key} "
        "generate-host-certificates=on dynamic_cert_mem_cache_size=16MB\n"
    )


def bump_config(db: Path, origin_ca: str) -> str:
    """Bump every CONNECT after looking at both hellos (``stare``), so the minted leaf mimics the origin's
    certificate (its IP subjectAltName included); verify the origin against the origin CA only."""
    return (
        f"sslcrtd_program {SQUID_CERTGEN} -s {db} -M 16MB\nsslcrtd_children 8 startup=2 idle=1\n"
        "acl step1 at_step SslBump1\nacl step2 at_step SslBump2\n"
        "ssl_bump stare step1\nssl_bump stare step2\nssl_bump bump all\n"
        f"tls_outgoing_options cafile={origin_ca}\n"
    )


class Mitmproxy(ProcessContender):
    """mitmproxy's ``mitmdump`` (pinned, in the peers' venv: ``bench.setup_peers``): every CONNECT intercepted with
    leaves from the bench's bump CA (its ``confdir``), the origin verified against the origin CA, large bodies
    streamed (not buffered whole), nothing logged but errors."""

    name = "mitmproxy"
    paths = ("intercepted",)

    def command(self) -> list[str]:
        tls = self.ctx.tls
        if tls is None:
            raise ContenderUnavailable("the harness made no TLS material (no HTTPS origin)")
        binary = self.ctx.peers_venv / "bin" / "mitmdump"
        if not binary.exists():
            raise ContenderUnavailable(f"mitmproxy is not installed in {self.ctx.peers_venv}")
        confdir = self.dir / "confdir"
        confdir.mkdir(exist_ok=True)
        shutil.copyfile(tls.bump_combined, confdir / "mitmproxy-ca.pem")
        return [str(binary), *mitmproxy_args(self.port, confdir, str(tls.origin_ca))]

    def https_trust(self) -> str | None:
        return str(self.ctx.tls.bump_ca) if self.ctx.tls is not None else None


def mitmproxy_args(port: int, confdir: Path, origin_ca: str) -> list[str]:
    options = {
        "confdir": str(confdir),
        "ssl_verify_upstream_trusted_ca": origin_ca,
        "stream_large_bodies": "1m",  # as a forwarding proxy would: do not hold a download in memory
        "termlog_verbosity": "error",
        "flow_detail": "0",
    }
    argv = ["--listen-host", HOST, "--listen-port", str(port), "--quiet"]
    for key, value in options.items():
        argv += ["--set", f"{key}={value}"]
    return argv


class ProxyPy(ProcessContender):
    name = "proxy.py"

    def command(self) -> list[str]:
        binary = self.ctx.peers_venv / "bin" / "proxy"
        if not binary.exists():
            raise ContenderUnavailable(f"proxy.py is not installed in {self.ctx.peers_venv}")
        return [
            str(binary),
            "--hostname",
            HOST,
            "--port",
            str(self.port),
            "--backlog",
            "4096",
            "--timeout",
            "600",
            "--open-file-limit",
            str(self.ctx.nofile),
            "--log-level",
            "WARNING",
        ]


def _openshell(ctx: BenchContext) -> Contender:
    from bench.openshell import OpenShell  # it builds on this module

    return OpenShell(ctx)


def _openshell_proxy_pod(ctx: BenchContext) -> Contender:
    from bench.openshell import OpenShellProxyPod

    return OpenShellProxyPod(ctx)


def _openshell_workers(ctx: BenchContext) -> Contender:
    from bench.openshell import OpenShellWorkers

    return OpenShellWorkers(ctx)


def _openshell_proxy_pod_workers(ctx: BenchContext) -> Contender:
    from bench.openshell import OpenShellProxyPodWorkers

    return OpenShellProxyPodWorkers(ctx)


def _openshell_accept_identity(ctx: BenchContext) -> Contender:
    from bench.openshell import OpenShellAcceptIdentity

    return OpenShellAcceptIdentity(ctx)


FACTORIES: dict[str, Callable[[BenchContext], Contender]] = {
    "direct": Direct,
    "openshell": _openshell,
    "openshell-proxy-pod": _openshell_proxy_pod,  # the proxy-pod topology: control serves the agent's proxy
    # opt-in: control with --workers=auto, as rendered pods run it (docs/design.md "Worker processes")
    "openshell-workers": _openshell_workers,
    "openshell-proxy-pod-workers": _openshell_proxy_pod_workers,
    "openshell-accept-identity": _openshell_accept_identity,  # opt-in: --contenders ...,openshell-accept-identity
    "tinyproxy": Tinyproxy,
    "squid": Squid,
    "proxy.py": ProxyPy,
    "mitmproxy": Mitmproxy,  # intercepting peers: measured on the intercepted rows only
    "squid-bump": SquidBump,
}
