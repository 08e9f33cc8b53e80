"""``openshell-sandbox dev --topology proxy-pod -- CMD``: the proxy-pod topology on one machine (root only).

What a cluster gives the workload pod, made locally (docs/design.md "The proxy-pod topology"):

- control runs with ``--topology=proxy-pod`` and listens only on the host side of a veth pair;
- the agent runs in a network namespace of its own whose only interface besides ``lo`` is the other end of that
  pair (a /30, no default route), and an nftables output filter in it admits nothing but ``lo`` and control's
  proxy port — the stand-in for the enforcing NetworkPolicy the topology requires, so dev passes
  ``--acknowledge-networkpolicy-enforcement`` on its behalf;
- the agent runs under ``--agent-user`` (default 1000:1000) with no capabilities and ``no_new_privs``, so it
  can change neither the routes nor the filter;
- its environment is the standard proxy variables carrying the sandbox's proxy token and a CA bundle made of the
  system store plus control's interception CA in the variables that replace a tool's store, the CA alone in those
  that add to it: the boundary topology's lists (``CA_REPLACING_KEYS``, ``CA_ADDING_KEYS``).

Nothing else of the sandbox exists here: no filesystem or process policy, no binary identity, no exec.
The exit code is the agent's (128+N for a signal; 125 when the sandbox itself failed); the namespace, the veth
and the temporary directory are removed on the way out.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from supervisor.cli.dev_common import (
    DevOptions,
    _die_with_dev,
    _entry,
    _stop,
    daemon_environment,
    dev_claims,
    installation_refusal,
    start_sandbox,
)
from supervisor.cli.state_dirs import events_path
from supervisor.protocol.certs import issue_bundle
from supervisor.protocol.event_names import EventName
from supervisor.protocol.exit_codes import ExitCode
from supervisor.protocol.process_ops import CA_ADDING_KEYS, CA_REPLACING_KEYS
from supervisor.protocol.proxy_head import proxy_environment, proxy_url
from supervisor.protocol.runtime_dir import RuntimeDirError, ensure_runtime_base

PROXY_PORT = 3128
START_WAIT_S = 30.0
SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem")
KEPT_VARIABLES = ("PATH", "TERM", "LANG", "LC_ALL", "TZ")


class ProxyPodError(Exception):
    pass


def _addresses() -> tuple[str, str]:
    """Control's and the agent's addresses: a random link-local /30 (never routed beyond the pair)."""
    third, fourth = secrets.randbelow(200) + 20, secrets.randbelow(63) * 4
    return f"169.254.{third}.{fourth + 1}", f"169.254.{third}.{fourth + 2}"


def _make_namespace(name: str, host_if: str, control_ip: str, agent_ip: str) -> None:
    from pyroute2 import IPRoute, NetNS, netns

    netns.create(name)
    with IPRoute() as ipr:
        ipr.link("add", ifname=host_if, kind="veth", peer={"ifname": "eth0", "net_ns_fd": name})
        index = ipr.link_lookup(ifname=host_if)[0]
        ipr.addr("add", index=index, address=control_ip, prefixlen=30)
        ipr.link("set", index=index, state="up")
    with NetNS(name) as ns:
        for ifname, address in (("lo", None), ("eth0", agent_ip)):
            index = ns.link_lookup(ifname=ifname)[0]
            if address is not None:
                ns.addr("add", index=index, address=address, prefixlen=30)
            ns.link("set", index=index, state="up")
    rules = (
        "table inet openshell_proxy_pod {\n"
        " chain output { type filter hook output priority 0; policy drop;\n"
        '  oifname "lo" accept\n'
        f"  ip daddr {control_ip} tcp dport {PROXY_PORT} accept\n"
        "  ct state established,related accept\n"
        " }\n"
        "}\n"
    )
    result = subprocess.run(["ip", "netns", "exec", name, "nft", "-f", "-"], input=rules, text=True,
                            capture_output=True)  # fmt: skip
    if result.returncode != 0:
        raise ProxyPodError(f"nft in the agent's namespace failed: {result.stderr.strip()}")


def _remove_namespace(name: str, host_if: str) -> None:
    from pyroute2 import IPRoute, netns

    try:
        with IPRoute() as ipr:
            for index in ipr.link_lookup(ifname=host_if):
                ipr.link("del", index=index)
    except Exception:  # best effort: removing the namespace takes the pair with it
        pass
    try:
        netns.remove(name)
    except OSError:
        pass


def _ca_bundle(tmp: Path, ca_pem: Path) -> tuple[Path, Path]:
    """The system store plus the interception CA (what replaces the store), and the CA alone."""
    system = next((Path(p) for p in SYSTEM_BUNDLES if Path(p).is_file()), None)
    ca = ca_pem.read_text()
    combined = tmp / "ca-bundle.pem"
    combined.write_text((system.read_text() if system is not None else "") + "\n" + ca)
    alone = tmp / "interception-ca.pem"
    alone.write_text(ca)
    for path in (combined, alone):
        path.chmod(0o644)
    return combined, alone


def _agent_env(url: str, combined: Path, alone: Path, home: str) -> dict[str, str]:
    env = {k: os.environ[k] for k in KEPT_VARIABLES if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["HOME"] = home
    env.update(proxy_environment(url))
    env.update(dict.fromkeys(CA_REPLACING_KEYS, str(combined)))
    env.update(dict.fromkeys(CA_ADDING_KEYS, str(alone)))
    return env


def _enter(name: str, uid: int, gid: int) -> Callable[[], None]:
    """The agent child's pre-exec: join the namespace, drop to the agent's ids (every capability with them),
    set no_new_privs, and die with dev."""

    def enter() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
        if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), "setns")
        os.close(fd)
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return enter


def _wait_listening(log: Path, control: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        if log.exists() and f'"event":"{EventName.PROXY_LISTENING}"' in log.read_text():
            return True
        if control.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def control_command(opts: DevOptions, *, tmp: Path, control_ip: str, token_file: Path, api: Path,
                    log_file: Path) -> list[str]:  # fmt: skip
    """Control's command line for this topology: its listener on the host end of the pair, the bundle and the
    interception CA under ``tmp``, and dev's options passed on. ``--proxy-max-connections N`` sets both of
    control's caps: the agent is its only client, one source address, so a lower per-client cap would be the
    effective one."""
    cmd = [
        *_entry(), "--mode=control", f"--bootstrap={tmp / 'bundle' / 'control'}", "--topology=proxy-pod",
        f"--proxy-listen={control_ip}:{PROXY_PORT}", f"--proxy-token-file={token_file}",
        "--binary-identity=relaxed", "--acknowledge-networkpolicy-enforcement",
        f"--api={api}", f"--interception-ca={tmp / 'interception'}",
        f"--log-stream={'stderr' if opts.log_format in ('json', 'ocsf') and not opts.quiet else 'none'}",
        f"--log-format={'ocsf' if opts.log_format == 'ocsf' else 'json'}",
        f"--log-file={log_file}", f"--ipv6-egress={opts.ipv6_egress}", f"--workers={opts.workers}",
        *(f"--self-address={a}" for a in opts.self_addresses),
        *(f"--dns-server={server}" for server in opts.dns_servers),
    ]  # fmt: skip
    if opts.proxy_max_connections is not None:
        cap = opts.proxy_max_connections
        cmd += [f"--proxy-max-connections={cap}", f"--proxy-per-client={cap}"]
    if opts.policy is not None:
        cmd.append(f"--policy={opts.policy}")
    if opts.credentials is not None:
        cmd.append(f"--credentials={opts.credentials}")
    if opts.upstream_ca is not None:
        cmd.append(f"--upstream-ca={opts.upstream_ca}")
    if opts.inference_routes is not None:
        cmd.append(f"--inference-routes={opts.inference_routes}")
    if opts.inference_idle_timeout is not None:
        cmd.append(f"--inference-idle-timeout={opts.inference_idle_timeout:g}")
    return cmd


def run_proxy_pod(opts: DevOptions) -> int:
    if (code := _refusal(opts)) is not None:
        return code
    ids = _agent_ids(opts)
    if isinstance(ids, int):
        return ids
    uid, gid = ids
    try:
        runtime_base = ensure_runtime_base()
    except RuntimeDirError as exc:
        print(f"openshell-sandbox: {exc}", file=sys.stderr)
        return ExitCode.SELF_FAILED
    start = start_sandbox(opts, "openshell-dev-pp-")
    if start is None:
        return ExitCode.SELF_FAILED
    sandbox, tick, say, tmp = start.sandbox, start.tick, start.say, start.tmp
    name, host_if = f"osb-pp-{sandbox[4:]}", f"osbpp{sandbox[4:]}"
    control_ip, agent_ip = _addresses()
    procs: list[subprocess.Popen[bytes]] = []
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    runtime = runtime_base / sandbox
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        issue_bundle(tmp / "bundle", dev_claims(sandbox))
        token = secrets.token_urlsafe(24)
        token_file = tmp / "proxy-token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        try:
            _make_namespace(name, host_if, control_ip, agent_ip)
        except (ProxyPodError, OSError) as exc:
            print(f"openshell-sandbox: {exc}", file=sys.stderr)
            return ExitCode.SELF_FAILED
        runtime.mkdir(parents=True, exist_ok=True, mode=0o700)
        log_file = events_path(sandbox)
        control_cmd = control_command(opts, tmp=tmp, control_ip=control_ip, token_file=token_file,
                                      api=runtime / "api.sock", log_file=log_file)  # fmt: skip
        procs.append(subprocess.Popen(control_cmd, env=daemon_environment(opts), stdin=subprocess.DEVNULL,
                                      preexec_fn=_die_with_dev))  # fmt: skip
        if not _wait_listening(log_file, procs[0]):
            print("openshell-sandbox: control did not start its proxy listener", file=sys.stderr)
            return ExitCode.SELF_FAILED
        combined, alone = _ca_bundle(tmp, tmp / "interception" / "interception-ca.pem")
        workdir = Path(opts.workdir) if opts.workdir else tmp / "work"
        if opts.workdir is None:
            workdir.mkdir(mode=0o700)
            os.chown(workdir, uid, gid)
        env = _agent_env(proxy_url(control_ip, PROXY_PORT, token), combined, alone, str(workdir))
        say(f"openshell-sandbox: proxy-pod topology — the agent's only route is control's proxy at "
            f"{control_ip}:{PROXY_PORT}")  # fmt: skip
        agent = subprocess.Popen(opts.argv, env=env, cwd=workdir, preexec_fn=_enter(name, uid, gid))
        procs.append(agent)
        return _wait_agent(procs, received, tick)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _remove_namespace(name, host_if)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


def _refusal(opts: DevOptions) -> int | None:
    """The exit code when this topology cannot run here or was given a flag of the other (said why), else None."""
    if (refusal := installation_refusal()) is not None:
        print(f"openshell-sandbox: {refusal}", file=sys.stderr)
        return ExitCode.SELF_FAILED
    if os.geteuid() != 0:
        print("openshell-sandbox: dev --topology proxy-pod needs root: it creates the agent's network namespace, "
              "a veth pair and its filter (the boundary topology runs without)", file=sys.stderr)  # fmt: skip
        return ExitCode.SELF_FAILED
    unsupported = [flag for flag, given in (
        ("--api-listen", opts.api_listen is not None), ("--metrics-listen", opts.metrics_listen is not None),
        ("--boundary-metrics-listen", opts.boundary_metrics_listen is not None),
        ("--acknowledge-external-fence", opts.acknowledge_external_fence),
        ("--privilege-model", opts.privilege_model != "auto"), ("--pids-limit", opts.pids_limit is not None),
        ("--memory-limit", opts.memory_limit is not None),
    ) if given]  # fmt: skip
    if unsupported:
        print(f"openshell-sandbox: dev --topology proxy-pod: not for this topology: {', '.join(unsupported)} "
              "(the agent runs without a supervisor here)", file=sys.stderr)  # fmt: skip
        return ExitCode.USAGE
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            print(f"openshell-sandbox: dev --topology proxy-pod needs {tool}", file=sys.stderr)
            return ExitCode.SELF_FAILED
    return None


def _agent_ids(opts: DevOptions) -> tuple[int, int] | int:
    """The agent's uid and gid (never root: it must change neither routes nor filter), or a usage exit code."""
    try:
        uid_text, _, gid_text = (opts.agent_user or "1000:1000").partition(":")
        uid, gid = int(uid_text), int(gid_text or uid_text)
    except ValueError:
        print(f"openshell-sandbox: --agent-user must be UID:GID, got {opts.agent_user!r}", file=sys.stderr)
        return ExitCode.USAGE
    if uid == 0 or gid == 0:
        print("openshell-sandbox: --agent-user must not be root in the proxy-pod topology", file=sys.stderr)
        return ExitCode.USAGE
    return uid, gid


def _wait_agent(procs: list[subprocess.Popen[bytes]], received: list[int], tick: Callable[[], None]) -> int:
    """The agent's exit code (128+N for a signal) once it ends; if control dies first, the agent is stopped and
    the sandbox has failed."""
    control, agent = procs
    while agent.poll() is None:
        tick()
        if control.poll() is not None and not received:
            print(f"openshell-sandbox: control exited ({control.returncode}); stopping the agent",
                  file=sys.stderr)  # fmt: skip
            _stop(agent)
            return ExitCode.SELF_FAILED
        time.sleep(0.05)
    code = agent.returncode
    _stop(control)
    tick()
    return 128 - code if code < 0 else code
