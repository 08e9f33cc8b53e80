"""The project's own contender: agent → boundary → mTLS HTTP/2 egress link → control → upstream, in dev mode.

How it is put together, and why each piece is there:

* **The client is the agent.** The boundary serves only workload processes (it identifies the binary behind
  every connection), and its proxy listener lives in the agent's network namespace. So the sandbox is
  started with ``PY -m supervisor.cli dev --policy P --dns-server D -- /usr/bin/python3 -I -B
  <copy>/bench/driver.py``: the agent *is* the bench's client driver, reading requests on the stdin that dev
  mode hands it and answering on its stdout. It runs the same client code, under the same interpreter and from
  the same world-readable copy as the driver that measures direct and the peers; it speaks CONNECT to
  ``127.0.0.1:3128``, the boundary's proxy listener (what ``HTTP_PROXY`` names in the agent's environment).
* **The upstream is not on loopback.** Control refuses loopback upstreams whatever the policy says, so the
  harness puts the one upstream every contender reaches on a host in a network namespace it creates
  (``tests/netns_hosts.py``). The policy allows exactly that address (``allowed_ips: [ADDR/32]``, host by IP literal),
  on exactly the upstream's ports, for exactly the driver's interpreter. The endpoint is ``tls: skip``: the
  scenarios measure the raw path (a relay, nothing terminated or sniffed), as the rows of docs/performance.md
  name it; without it every endpoint is TLS-terminated and the bench's non-TLS echo would measure the first-bytes
  sniff of the terminated path instead (``bench/bench_l7.py`` measures that path).
* **The product as it ships.** ``PY`` (``ctx.daemon_python``) is the Makefile's ``.venv/bin/python``, built
  from Debian's ``/usr/bin/python3`` like the image's, unless ``--daemon-python`` names another
  (``bench.interpreter``); dev mode starts both daemons on the interpreter it runs on.
* **No name is resolved**, and should control ever try, ``--dns-server`` points it at :class:`RefusingDns`
  on 127.0.0.1, which refuses every query and counts them: the machine's resolver is never asked.
* **Memory** is control's and the boundary's: ``pids()`` lists the processes of dev mode's tree that run
  ``supervisor.cli --mode=control|boundary`` (the boundary daemon and the launcher forks it keeps in the
  agent's namespaces), never dev mode's own parent process or the agent.
* **One product per run.** Dev mode runs from the harness's snapshot of ``supervisor/`` (``ctx.product``),
  taken when the run began: the sandbox is restarted every round, and a checkout that changes meanwhile
  must not put two versions of the product into one column.
* ``stop()`` closes the agent's stdin (the driver exits, the agent's exit ends the sandbox, dev mode exits),
  then falls back to SIGTERM and SIGKILL, by pid and start time, for anything of ours that lingers.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from bench.contenders import Address, BenchContext, Contender, ContenderUnavailable
from bench.procstat import process_tree, start_time
from bench.remote import SYSTEM_PYTHON, ClientDriver, DriverError, driver_argv

REPO = Path(__file__).resolve().parent.parent
PROXY: Address = ("127.0.0.1", 3128)  # the boundary's proxy listener, inside the agent's namespace
READY_TIMEOUT = 60.0
PING_TIMEOUT = 20.0
STOP_TIMEOUT = 20.0


def render_policy(address: str, ports: list[int], binary: str, https_port: int | None = None) -> str:
    """The bench's policy: the upstream host's address and ports, for the driver's interpreter only, raw
    (``tls: skip``: relayed, never terminated); and, given ``https_port`` (the HTTPS origin of the intercepted rows),
    that port intercepted: ``protocol: rest`` with a rule allowing every GET, so that control terminates
    the agent's TLS with a leaf from its interception CA, parses and judges every request, and verifies the origin
    against ``dev --upstream-ca`` (as ``bench/bench_l7.py``'s "intercepted" mode)."""
    port_list = ", ".join(str(p) for p in sorted(set(ports)))
    intercepted = (
        (
            f"      - host: {address}\n"
            f"        port: {https_port}\n"
            f'        allowed_ips: ["{address}/32"]\n'
            "        protocol: rest\n"
            "        enforcement: enforce\n"
            "        rules:\n"
            '          - allow: {method: GET, path: "/**"}\n'
        )
        if https_port is not None
        else ""
    )
    return (
        "version: 1\n"
        "network_policies:\n"
        "  bench-upstream:\n"
        "    name: the benchmark's upstream host\n"
        "    endpoints:\n"
        f"      - host: {address}\n"
        f"        ports: [{port_list}]\n"
        f'        allowed_ips: ["{address}/32"]\n'
        "        tls: skip\n" + intercepted + "    binaries:\n"
        f"      - path: {binary}\n"
    )


class RefusingDns:
    """A UDP DNS 'server' on 127.0.0.1 that refuses every query (control is never meant to ask one)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.address: Address = self.sock.getsockname()
        self.queries = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                wire, peer = self.sock.recvfrom(65535)
            except OSError:
                return
            if len(wire) < 12:
                continue
            self.queries += 1
            # Same id and question, QR set, opcode kept, RD copied, RA set, RCODE 5 (REFUSED).
            flags = bytes([0x80 | (wire[2] & 0x79), 0x80 | 0x05])
            with contextlib.suppress(OSError):
                self.sock.sendto(wire[:2] + flags + wire[4:6] + b"\x00" * 6 + wire[12:], peer)

    def close(self) -> None:
        self.sock.close()


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


class OpenShell(Contender):
    name = "openshell"
    paths = ("raw", "intercepted")
    extra_env: dict[str, str] = {}
    dev_args: tuple[str, ...] = ()  # dev mode's flags that make this contender (e.g. the topology)

    def __init__(self, ctx: BenchContext) -> None:
        super().__init__(ctx)
        self.dir = ctx.workdir / self.name
        self.proc: subprocess.Popen[bytes] | None = None
        self.driver: ClientDriver | None = None
        self.dns: RefusingDns | None = None
        self.dns_queries = 0  # over every start, for the run's notes
        self.runtime: Path | None = None
        self._seen: dict[int, int] = {}  # pid -> start time of every process of ours we saw
        self.refusals: Counter[str] = Counter()  # egress.refused reasons in dev mode's events, over every start
        self.proxy: Address = PROXY  # what the agent dials: its proxy variables' address

    # -- the interface ---------------------------------------------------------------------------------------
    def start(self) -> Address | None:
        ctx = self.ctx
        if ctx.upstream_host_reason:
            raise ContenderUnavailable(ctx.upstream_host_reason)
        listeners = [a for a in (ctx.upstream_bulk, ctx.upstream_echo, ctx.upstream_idle) if a is not None]
        if ctx.client_copy is None or ctx.upstream_echo is None or len(listeners) != 3:
            raise ContenderUnavailable("the harness gave no client copy or upstream")
        if not SYSTEM_PYTHON.exists():
            raise ContenderUnavailable(f"{SYSTEM_PYTHON} is needed for the agent (another uid cannot read ours)")
        self.dir.mkdir(parents=True, exist_ok=True)
        policy = self.dir / "policy.yaml"
        binary = os.path.realpath(SYSTEM_PYTHON)  # what the boundary reports: the bytes behind /proc/PID/exe
        https = ctx.upstream_https[1] if ctx.upstream_https is not None and ctx.tls is not None else None
        policy.write_text(render_policy(ctx.upstream_echo[0], [port for _, port in listeners], binary, https))
        self.dns = RefusingDns()
        argv = [
            ctx.daemon_python or sys.executable, "-m", "supervisor.cli", "dev", *self.dev_args, "--log-format=json",
            f"--policy={policy}",
            f"--dns-server={self.dns.address[0]}:{self.dns.address[1]}",
            *([f"--upstream-ca={ctx.tls.origin_ca}"] if https is not None and ctx.tls is not None else []),
            # the agent gets a fresh root with only granted paths and a private /tmp: the driver's copy is its
            # workdir (root's, 0755: the agent runs it and cannot change it; the harness removes it)
            f"--workdir={ctx.client_copy}", "--workdir-read-only", "--", *driver_argv(ctx.client_copy),
        ]  # fmt: skip
        # The API socket's path must stay short (a Unix socket path has 107 bytes): a runtime dir of our own.
        self.runtime = Path(tempfile.mkdtemp(prefix="osbr-", dir="/tmp"))
        root = ctx.product or REPO
        env = {
            **os.environ,
            **self.extra_env,
            "XDG_RUNTIME_DIR": str(self.runtime),
            "XDG_STATE_HOME": str(self.runtime / "state"),  # dev keeps its log and workdir there: gone with it
            "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
        }
        self._seen = {}
        with (self.dir / "dev.log").open("wb") as log:
            self.proc = subprocess.Popen(argv, cwd=root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log, start_new_session=True)  # fmt: skip
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.driver = ClientDriver(self.proc.stdin, self.proc.stdout)
            self.pids()
            if self.driver.facts.get("uid") == os.geteuid() and os.geteuid() == 0:
                raise ContenderUnavailable("the agent runs as root: not the sandbox the bench means to measure")
            self.proxy = self._proxy_address()
            self._ping()
        except (DriverError, ContenderUnavailable) as exc:
            reason = str(exc) if isinstance(exc, ContenderUnavailable) else f"dev mode did not come up: {exc}"
            self.stop()
            raise ContenderUnavailable(f"{reason}; dev mode said: {self._log_tail()}") from None
        return self.proxy

    def _proxy_address(self) -> Address:
        return PROXY

    def _ping(self) -> None:
        """Wait until one exchange crosses the whole path (control dials its egress links after start)."""
        assert self.driver is not None and self.ctx.upstream_echo is not None
        deadline = time.monotonic() + PING_TIMEOUT
        while True:
            done = self.driver.setup_sequential(self.proxy, self.ctx.upstream_echo, 1, timeout=5.0, budget=5.0)
            if done.latencies:
                return
            if time.monotonic() > deadline:
                why = ", ".join(done.error_kinds) or "no answer"
                raise ContenderUnavailable(f"no exchange crossed the sandbox within {PING_TIMEOUT:.0f} s ({why})")
            time.sleep(0.2)

    def _log_tail(self) -> str:
        """The end of dev mode's stderr: a traceback's last lines if there is one, else the last events."""
        try:
            lines = (self.dir / "dev.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        plain = [line.strip(" |+") for line in lines if not line.startswith("{")]
        return " | ".join(line[:300] for line in (plain or lines)[-3:]) or "(nothing)"

    def client(self) -> ClientDriver | None:
        return self.driver

    def https_trust(self) -> str | None:
        return None  # the agent trusts the sandbox's interception CA through SSL_CERT_FILE, as any agent does

    def pid_groups(self) -> dict[str, list[int]]:
        """control, the boundary daemon, and the launcher processes it forked (idle: shared pages, mostly)."""
        groups: dict[str, list[int]] = {"control": [], "boundary": [], "launcher": []}
        if self.proc is None or self.proc.poll() is not None:
            return groups
        for pid in process_tree(self.proc.pid):
            args = _cmdline(pid)
            if "--mode=control" in args:
                role = "control"
            elif "--mode=boundary" in args:
                role = "boundary" if _parent(pid) == self.proc.pid else "launcher"
            else:
                continue  # dev mode itself, the agent and anything the agent started
            groups[role].append(pid)
            if pid not in self._seen and (started := start_time(pid)) is not None:
                self._seen[pid] = started
        return groups

    def pids(self) -> list[int]:
        return [pid for group in self.pid_groups().values() for pid in group]

    def _count_refusals(self) -> None:
        """Add the reasons of the ``egress.refused`` events this start logged (why a connection got a 403)."""
        with contextlib.suppress(OSError), (self.dir / "dev.log").open(encoding="utf-8", errors="replace") as log:
            for line in log:
                if '"egress.refused"' not in line:
                    continue
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    self.refusals[str(event.get("reason", "?"))] += 1

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(Exception):
                self.pids()  # remember what we may have to end ourselves
            if self.driver is not None:
                self.driver.close(timeout=0)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGTERM)  # dev mode ends the agent and both daemons
                try:
                    self.proc.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            for pid, started in self._seen.items():
                if start_time(pid) == started:  # still the very process we saw: a daemon dev mode left behind
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self._count_refusals()
        self.proc = None
        self.driver = None
        self._seen = {}
        if self.runtime is not None:
            shutil.rmtree(self.runtime, ignore_errors=True)
            self.runtime = None
        if self.dns is not None:
            self.dns_queries += self.dns.queries
            self.dns.close()
            self.dns = None


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[1])


class OpenShellAcceptIdentity(OpenShell):
    """The same product with identity resolved at accept only (no connect-notify filter in the workload): the
    same-run baseline for what recording identity at ``connect()`` costs (docs/design.md "Identity")."""

    name = "openshell-accept-identity"
    extra_env = {"OPENSHELL_BENCH_NO_CONNECT_NOTIFY": "1"}


class OpenShellWorkers(OpenShell):
    """The boundary topology with control on every core it may use, as a rendered pod runs it
    (``--workers=auto``; docs/design.md "Worker processes")."""

    name = "openshell-workers"
    dev_args = ("--workers=auto",)


class OpenShellProxyPod(OpenShell):
    """The proxy-pod topology (docs/kubernetes.md "Choosing a topology"): control serves the agent's proxy itself,
    no boundary and no link. ``dev --topology proxy-pod`` puts the driver (the agent) in a network namespace whose
    only route is control's listener on a link-local address, with ``http://sandbox:<token>@ADDR:3128`` in its
    proxy variables: the driver dials that address and sends the token as ``Proxy-Authorization``, as curl
    would. Binary identity is relaxed there, so the policy's ``binaries`` list is not decided on. Control's
    connection cap (1024 by default) is raised above the largest idle scenario (10,000 held), so that row
    measures memory, not the cap."""

    name = "openshell-proxy-pod"
    dev_args = ("--topology=proxy-pod", "--proxy-max-connections=20000")

    def _proxy_address(self) -> Address:
        assert self.driver is not None
        address = self.driver.facts.get("proxy_env")
        if not address or not self.driver.facts.get("proxy_authorization"):
            raise ContenderUnavailable(f"the agent was given no proxy with a token (facts: {self.driver.facts})")
        return str(address[0]), int(address[1])


class OpenShellProxyPodWorkers(OpenShellProxyPod):
    """The proxy-pod topology with ``--workers=auto``: every control process listens on the proxy port."""

    name = "openshell-proxy-pod-workers"
    dev_args = (*OpenShellProxyPod.dev_args, "--workers=auto")
