"""The ``openshell-sandbox`` entrypoint: the two daemons (``--mode``) and the operator subcommands.

Streams are for payload: a client subcommand writes the remote process's stdout to stdout and its stderr to
stderr; messages from openshell-sandbox itself go to stderr. Exit codes: the remote code, 128+N for a
signal, 125 when openshell-sandbox itself failed, 126/127 when a launch failed, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import trio

from supervisor.protocol.exit_codes import ExitCode

DAEMON_HELP = """\
daemons:
  openshell-sandbox --mode=boundary --bootstrap DIR [--listen ADDR:PORT] -- AGENT ARGV...
  openshell-sandbox --mode=control --bootstrap DIR --boundary HOST:PORT [--policy FILE] [--api PATH]
                    [--api-listen ADDR:PORT]
  openshell-sandbox --mode=control --bootstrap DIR --topology=proxy-pod --proxy-listen ADDR:PORT
                    --proxy-token-file FILE --binary-identity=relaxed --acknowledge-networkpolicy-enforcement

operator commands (find the running sandbox's API socket by themselves; --api to choose, or
--api https://HOST:PORT --cert DIR for control's --api-listen from outside the pod):
  dev       run CMD as the agent in a local two-process sandbox
  status    show the sandbox's status (readiness, lifecycle, policy)
  logs      show control's recent events; -f follows them (--event KIND, --json)
  exec      run a command in the workload (-i for stdin, -t for a terminal)
  wait      wait for a process handle's result
  signal    send a signal to a process handle
  terminate terminate a process handle and its descendants
  forward   forward a local TCP port to a loopback port inside the workload
  policy    check a policy file, or ask what it decides
  certs     mint the bootstrap bundle for a sandbox
  k8s       render a sandbox's Kubernetes objects (k8s render)
"""


def _err(message: str) -> None:
    print(f"openshell-sandbox: {message}", file=sys.stderr)


# -- daemons ------------------------------------------------------------------------------------------------------


def _host_port(text: str, flag: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535 or not host:
        raise argparse.ArgumentTypeError(f"{flag} must be HOST:PORT, got {text!r}")
    return host, int(port)


def daemon_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="openshell-sandbox",
        description="Supervisor daemons of an AI-agent sandbox.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=DAEMON_HELP,
    )
    p.add_argument("--mode", required=True, choices=["control", "boundary"], help="which daemon to run")
    p.add_argument("--bootstrap", required=True, type=Path, help="this role's bootstrap bundle directory")
    p.add_argument("--log-stream", choices=["stdout", "stderr", "none"], default="stdout", help="where JSON events go")
    p.add_argument("--log-file", type=Path, help="also append the JSON events to this file (created 0600)")
    b = p.add_argument_group("boundary")
    b.add_argument(
        "--listen",
        default="[::]:7443",
        help="address the boundary listens on (default %(default)s: every IPv6 and IPv4 address; IPv4 only where "
        "the pod has no IPv6)",
    )
    b.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    b.add_argument("--privilege-model", default="auto", choices=["auto", "R", "U", "P"], help="see docs")
    b.add_argument(
        "--workdir", help="the agent's working directory, writable by it (required; never / nor under /proc)"
    )
    b.add_argument(
        "--hide-path", action="append", default=[],
        help="R and U: cover this file or directory with an empty 0000 one in the agent's view (repeatable)",
    )  # fmt: skip
    b.add_argument("--tmp-size", default="256m", help="R and U: size of the agent's private /tmp (default %(default)s)")
    b.add_argument(
        "--shm-size", default="64m", help="R and U: size of the agent's private /dev/shm (default %(default)s)"
    )
    b.add_argument("--exit-linger", type=float, default=60.0, help="seconds to wait for control's exit ack")
    b.add_argument(
        "--pids-limit", type=int, default=1024, metavar="N",
        help="at most N workload processes (a cgroup's pids.max under the boundary's own cgroup, v1 or delegated "
        "v2; default %(default)s); where no cgroup is writable, or with 0, status reports limits.pids: unenforced",
    )  # fmt: skip
    b.add_argument("--agent-stdio", choices=["inherit", "pipe"], default="inherit")
    b.add_argument(
        "--tls-dir",
        type=Path,
        default=Path("/run/openshell-boundary/tls"),
        help="the boundary's own directory for the agent's CA files, created at start (default %(default)s); "
        "R and U show it read-only at /run/openshell-boundary/tls, P must name a directory the agent can read",
    )
    c = p.add_argument_group("control")
    c.add_argument("--boundary", help="HOST:PORT of the boundary to dial")
    c.add_argument("--policy", type=Path, help="policy YAML (default: the embedded deny-all policy)")
    c.add_argument("--policy-failure-mode", choices=["fail-closed", "retain-last-valid"], default="fail-closed")
    c.add_argument(
        "--policy-source",
        type=Path,
        help="the operator's original of --policy (dev mode loads a private copy): revisions are watched here "
        "instead, when safe (default: --policy itself)",
    )
    c.add_argument(
        "--agent-writable",
        action="append",
        default=[],
        metavar="PATH",
        help="a path the agent can write (repeatable; dev passes the workdir): a policy file inside one, or "
        "inside /tmp or a read_write path, is loaded once and never hot-reloaded",
    )
    c.add_argument(
        "--no-policy-watch", action="store_true", help="load the policy once; change it with `policy apply` only"
    )
    c.add_argument("--api", type=Path, help="operator API socket path")
    c.add_argument(
        "--api-listen",
        metavar="ADDR:PORT",
        help="also serve the operator API on TCP with mutual TLS, to operator certificates of this sandbox only "
        "(`certs issue --operator`); ADDR * is every address. Failed handshakes are rate limited and every "
        "operator request is logged",
    )
    c.add_argument(
        "--agent-user",
        default="1000:1000",
        help="UID:GID of the agent in model R and in model U under root (never 0); default %(default)s",
    )
    c.add_argument("--dns-server", action="append", default=[], help="resolver ADDR[:PORT] (repeatable)")
    c.add_argument("--capture-mode", choices=["netns", "proxy-env"], default="netns")
    c.add_argument(
        "--credentials", type=Path, help="credentials file (secrets control injects; the agent sees placeholders)"
    )
    c.add_argument(
        "--interception-ca",
        type=Path,
        help="directory keeping the TLS-interception CA across restarts (created with a new CA when empty)",
    )
    c.add_argument("--upstream-ca", type=Path, help="extra CA (PEM) trusted for upstream TLS, besides the system store")
    c.add_argument(
        "--self-address",
        action="append",
        default=[],
        metavar="ADDR",
        help="an address of this control that no interface shows (e.g. its Service IP); never dialled upstream, "
        "like every interface address of its own, whatever the policy says (repeatable)",
    )
    c.add_argument(
        "--ipv6-egress",
        choices=["auto", "on", "off"],
        default="auto",
        help="whether control can reach IPv6 destinations; auto: a route covering global IPv6 exists in its network "
        "namespace (re-checked on change). Without it, AAAA queries are answered with no records (default auto)",
    )
    t = p.add_argument_group("control: the proxy-pod topology (docs/kubernetes.md)")
    t.add_argument(
        "--topology",
        choices=["boundary", "proxy-pod"],
        default="boundary",
        help="boundary (default): dial a boundary that owns the agent. proxy-pod: no boundary; control serves the "
        "workload's HTTP proxy itself on --proxy-listen (needs --binary-identity=relaxed, --proxy-token-file and "
        "--acknowledge-networkpolicy-enforcement)",
    )
    t.add_argument(
        "--proxy-listen",
        metavar="ADDR:PORT",
        help="proxy-pod: where control accepts the proxy clients ('*:PORT': every address, IPv4 and IPv6)",
    )
    t.add_argument(
        "--proxy-token-file",
        type=Path,
        help="proxy-pod: file holding this sandbox's proxy token; clients must send Proxy-Authorization "
        "Basic sandbox:<token> (http://sandbox:<token>@host:port in their proxy variables), else 407",
    )
    t.add_argument(
        "--proxy-clients",
        action="append",
        default=[],
        metavar="CIDR",
        help="proxy-pod: only these source networks are served (repeatable; an extra check behind the NetworkPolicy)",
    )
    t.add_argument("--proxy-max-connections", type=int, default=1024, help="proxy-pod: concurrent connections cap")
    t.add_argument(
        "--proxy-per-client",
        type=int,
        default=1024,
        help="proxy-pod: concurrent connections per source address (default: the total cap, since the paired "
        "workload is one source)",
    )
    t.add_argument(
        "--binary-identity",
        choices=["strict", "relaxed"],
        default="strict",
        help="strict (default): the policy's binaries lists are decided on. relaxed: endpoint-only — identity is "
        "logged but never decided on, binaries lists are ignored (required by --topology=proxy-pod)",
    )
    t.add_argument(
        "--acknowledge-networkpolicy-enforcement",
        action="store_true",
        help="proxy-pod: the cluster enforces NetworkPolicy (the workload's only egress is this proxy); without "
        "it control refuses the topology. Recorded in status and events",
    )
    p.add_argument(
        "--acknowledge-external-fence",
        action="store_true",
        help="the pod's NetworkPolicy is an enforcing fence (required for proxy-env)",
    )
    p.add_argument(
        "--acknowledge-unprobed-fence",
        action="store_true",
        help='proxy-env without --fence-canary: the acknowledgement also says "no probe" (needed by both '
        "daemons; status then shows the fence as acknowledged-unprobed)",
    )
    c.add_argument(
        "--fence-canary",
        metavar="ADDR:PORT",
        help="proxy-env: control listens here (a literal IP of its own) and the boundary must fail to connect to "
        "it from the pod before confirm, and every 30 s after; a connect that succeeds or a connection control "
        "sees refuses confirm (later: enforcement lost). Use an address the pod would reach without its fence",
    )
    c.add_argument(
        "--fence-canary-interval",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how often the canary round repeats after confirm (default %(default)g)",
    )
    p.add_argument("agent_argv", nargs="*", help="boundary: the agent's argv (after --)")
    return p


def _raise_nofile_limit() -> None:
    """Each relayed connection costs a daemon one or two descriptors: use all the hard limit allows."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def run_daemon(argv: list[str]) -> int:
    from supervisor.protocol.certs import BundleError, load_bundle
    from supervisor.protocol.claims import Role

    args = daemon_parser().parse_args(argv)
    _raise_nofile_limit()
    stream = sys.stderr if args.log_stream == "stderr" else sys.stdout
    role = Role(args.mode)
    if role is Role.BOUNDARY:
        return _run_boundary(args, stream)
    try:
        bundle = load_bundle(args.bootstrap, role)
    except BundleError as exc:
        _err(f"--bootstrap: {exc}")
        return ExitCode.SELF_FAILED
    log = _daemon_log(args, "control", bundle.claims.sandbox, stream)
    if log is None:
        return ExitCode.SELF_FAILED
    return _run_control(args, bundle, log)


def _daemon_log(args: argparse.Namespace, component: str, sandbox: str, stream: Any) -> Any:
    """The daemon's JsonLog per ``--log-stream``/``--log-file``; ``None`` (reported) when the file cannot be opened."""
    from supervisor.jsonlog import JsonLog, open_log_file

    file = None
    if args.log_file is not None:
        try:
            file = open_log_file(args.log_file)
        except OSError as exc:
            _err(f"--log-file: cannot open {args.log_file}: {exc.strerror or exc}")
            return None
    return JsonLog(component, stream=stream, sandbox=sandbox, file=file, to_stream=args.log_stream != "none")


def _run_boundary(args: argparse.Namespace, stream: Any) -> int:
    """The launcher is forked first: before any thread exists, and before the bundle's key is in our memory
    (the launcher is a copy of this process and lives next to the workload)."""
    from supervisor.boundary import daemon
    from supervisor.boundary.process import Launcher, LauncherError, detect_privilege_model
    from supervisor.protocol.certs import BundleError, load_bundle
    from supervisor.protocol.claims import Role

    if not args.agent_argv:
        _err("--mode=boundary needs the agent's argv after --")
        return ExitCode.USAGE
    host, port = _host_port(args.listen, "--listen")
    try:
        model, reason = detect_privilege_model(args.privilege_model)
    except LauncherError as exc:
        _err(f"--privilege-model={args.privilege_model}: {exc}")
        return ExitCode.SELF_FAILED
    if (problem := _boundary_dirs_problem(args)) is not None:
        _err(problem)
        return ExitCode.SELF_FAILED
    launcher = Launcher.fork()
    try:
        try:
            bundle = load_bundle(args.bootstrap, Role.BOUNDARY)
        except BundleError as exc:
            _err(f"--bootstrap: {exc}")
            return ExitCode.SELF_FAILED
        if (problem := _workdir_problem(args.workdir)) is not None:
            _err(f"--workdir: {problem}")
            return ExitCode.USAGE
        # The agent's own root holds the workdir at its real path (R, U): its cwd, HOME and Landlock use that.
        real_workdir = os.path.realpath(args.workdir)
        if (problem := _workdir_problem(real_workdir)) is not None:
            _err(f"--workdir: {args.workdir} resolves to {real_workdir}: {problem}")
            return ExitCode.USAGE
        args.workdir = real_workdir
        log = _daemon_log(args, "boundary", bundle.claims.sandbox, stream)  # after the fork: not the launcher's
        if log is None:
            return ExitCode.SELF_FAILED
        cfg = daemon.BoundaryConfig(
            bundle=bundle, agent_argv=tuple(args.agent_argv), listen_host=host, listen_port=port,
            port_file=args.port_file, workdir=args.workdir, agent_stdio=args.agent_stdio, privilege_model=model,
            model_reason=reason, hide_paths=tuple(args.hide_path), exit_linger_s=args.exit_linger,
            acknowledge_external_fence=args.acknowledge_external_fence, tls_dir=args.tls_dir,
            acknowledge_unprobed_fence=args.acknowledge_unprobed_fence,
            tmp_size=args.tmp_size, shm_size=args.shm_size, pids_limit=args.pids_limit,
            test_landlock_off=os.environ.get("OPENSHELL_TEST_LANDLOCK_OFF") == "1", log=log,
        )  # fmt: skip
        return daemon.run(cfg, launcher)
    finally:
        launcher.close()


def _boundary_dirs_problem(args: argparse.Namespace) -> str | None:
    """The trust directory is created now (never idle with one we cannot write); the tmpfs sizes parse."""
    from supervisor.boundary.process.rootfs import RootError, check_size

    try:
        args.tmp_size = check_size(args.tmp_size, "--tmp-size")
        args.shm_size = check_size(args.shm_size, "--shm-size")
    except RootError as exc:
        return str(exc)
    tls_dir = Path(args.tls_dir)
    try:
        tls_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        if not os.access(tls_dir, os.W_OK | os.X_OK):
            raise PermissionError(13, "not writable")
    except OSError as exc:
        return f"--tls-dir: cannot create or write {tls_dir}: {exc.strerror or exc}"
    return None


def _workdir_problem(workdir: str | None) -> str | None:
    """The agent writes its workdir: refused wherever ``read_write`` would refuse it."""
    from supervisor.protocol.writable_paths import writable_problem

    if not workdir:
        return "required (the agent's working directory; it is writable by the agent)"
    if not workdir.startswith("/") or ".." in workdir.split("/"):
        return f"{workdir!r} must be an absolute path without '..'"
    problem = writable_problem(workdir)
    return None if problem is None else f"{workdir!r} {problem} (the agent can write its workdir)"


def _policy_digest(path: Path | None) -> str | None:
    """``sha256:<hex>`` of the policy control starts with, compared in status with the one render recorded."""
    import hashlib
    from importlib import resources

    try:
        default = resources.files("supervisor.control").joinpath("default_policy.yaml")
        data = path.read_bytes() if path else default.read_bytes()
    except OSError:
        return None
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _run_control(args: argparse.Namespace, bundle: Any, log: Any) -> int:
    import ipaddress
    import ssl

    from supervisor.control import daemon
    from supervisor.control.api import runtime_socket_path
    from supervisor.control.credentials import Credentials, CredentialsError
    from supervisor.control.egress import Interception
    from supervisor.control.interception import load_or_create
    from supervisor.control.l7 import upstream_context
    from supervisor.control.local_net import Ipv6Egress, LocalNetwork
    from supervisor.control.policy import PolicyInvalid, PolicyStore, compile_policy, load_policy_file
    from supervisor.control.policy.schema import load_default_policy
    from supervisor.control.policy.watch_safety import agent_writable_paths, decide_watch
    from supervisor.control.upstream import UpstreamConfig, parse_dns_server
    from supervisor.protocol.attach import CaptureMode
    from supervisor.protocol.fence_canary import parse_canary

    proxy = _proxy_topology(args)
    if isinstance(proxy, int):
        return proxy
    if proxy is not None:
        host, port = "", 0
    elif not args.boundary:
        _err("--mode=control needs --boundary HOST:PORT")
        return ExitCode.USAGE
    else:
        host, port = _host_port(args.boundary, "--boundary")
    try:
        api_listen = _host_port(args.api_listen, "--api-listen") if args.api_listen else None
    except argparse.ArgumentTypeError as exc:
        _err(str(exc))
        return ExitCode.USAGE
    try:
        policy = load_policy_file(args.policy) if args.policy else load_default_policy()
    except PolicyInvalid as exc:
        for error in exc.errors:
            _err(str(error))
        return ExitCode.SELF_FAILED
    except OSError as exc:
        _err(f"--policy: cannot read {args.policy}: {exc.strerror}")
        return ExitCode.SELF_FAILED
    source = str(args.policy) if args.policy else "embedded default (deny all)"
    store = PolicyStore(compile_policy(policy), failure_mode=args.policy_failure_mode, source=source)
    read_write = policy.filesystem_policy.read_write if policy.filesystem_policy is not None else ()
    agent_writable = agent_writable_paths(args.agent_writable, read_write)
    watch_file, watch_reason = decide_watch(args.policy_source or args.policy, args.no_policy_watch, agent_writable)
    try:
        uid_text, _, gid_text = args.agent_user.partition(":")
        agent_uid, agent_gid = int(uid_text), int(gid_text or uid_text)
    except ValueError:
        _err(f"--agent-user must be UID:GID, got {args.agent_user!r}")
        return ExitCode.USAGE
    try:
        dns_servers = [parse_dns_server(text) for text in args.dns_server]
    except ValueError as exc:
        _err(f"--dns-server: {exc}")
        return ExitCode.USAGE
    try:
        interception = Interception(
            ca=load_or_create(args.interception_ca, bundle.claims.sandbox),
            credentials=Credentials.load(args.credentials),
            upstream_ssl=upstream_context(extra_ca_file=str(args.upstream_ca) if args.upstream_ca else None),
        )
    except (CredentialsError, OSError, ssl.SSLError, ValueError) as exc:
        _err(f"--credentials/--upstream-ca: {exc}")
        return ExitCode.SELF_FAILED
    try:
        fence_canary = parse_canary(args.fence_canary) if args.fence_canary else None
    except ValueError as exc:
        _err(f"--fence-canary: {exc}")
        return 2
    if not 1.0 <= args.fence_canary_interval <= 3600.0:
        _err(f"--fence-canary-interval: {args.fence_canary_interval:g} is not 1..3600 seconds")
        return 2
    try:
        self_addresses = [ipaddress.ip_address(text) for text in args.self_address]
    except ValueError as exc:
        _err(f"--self-address: {exc}")
        return ExitCode.USAGE
    local_net = LocalNetwork(self_addresses, ipv6_egress=Ipv6Egress(args.ipv6_egress), log=log)
    upstream = UpstreamConfig(
        dns_servers=dns_servers, is_local=local_net.is_local, ipv6_egress=lambda: local_net.ipv6_egress
    )
    cfg = daemon.ControlConfig(
        bundle=bundle, boundary_host=host, boundary_port=port, policy=store, local_net=local_net,
        upstream=upstream, interception=interception,
        api_path=args.api or runtime_socket_path(bundle.claims.sandbox), api_listen=api_listen,
        agent_uid=agent_uid, agent_gid=agent_gid,
        capture_mode=CaptureMode(args.capture_mode), acknowledge_external_fence=args.acknowledge_external_fence,
        fence_canary=fence_canary, acknowledge_unprobed_fence=args.acknowledge_unprobed_fence,
        canary_interval_s=args.fence_canary_interval,
        policy_file=watch_file, policy_watch_reason=watch_reason, agent_writable=agent_writable, log=log,
        policy_digest=_policy_digest(args.policy),
        proxy=proxy, relaxed_identity=args.binary_identity == "relaxed",
        networkpolicy_acknowledged=args.acknowledge_networkpolicy_enforcement,
    )  # fmt: skip
    return daemon.run(cfg)


def _proxy_topology(args: argparse.Namespace) -> Any:
    """The proxy listener's config for ``--topology=proxy-pod`` (None for the boundary topology), or an exit
    code after saying which flag is wrong."""
    from supervisor.control.proxy_listener import ProxyListenConfig, parse_clients

    given = (("--proxy-listen", args.proxy_listen), ("--proxy-token-file", args.proxy_token_file),
             ("--proxy-clients", args.proxy_clients))  # fmt: skip
    proxy_flags = [flag for flag, value in given if value]
    if args.topology != "proxy-pod":
        if proxy_flags:
            _err(f"{', '.join(proxy_flags)} only apply to --topology=proxy-pod")
            return ExitCode.USAGE
        return None
    problems = []
    if args.boundary:
        problems.append("--boundary does not apply: the proxy-pod topology has no boundary")
    if args.binary_identity != "relaxed":
        problems.append("--topology=proxy-pod requires --binary-identity=relaxed (no process to identify behind a "
                        "pod's address: only destinations are decided)")  # fmt: skip
    if not args.acknowledge_networkpolicy_enforcement:
        problems.append("--topology=proxy-pod requires --acknowledge-networkpolicy-enforcement: without an "
                        "enforcing NetworkPolicy the workload could bypass the proxy")  # fmt: skip
    if not args.proxy_listen:
        problems.append("--topology=proxy-pod needs --proxy-listen ADDR:PORT")
    if not args.proxy_token_file:
        problems.append("--topology=proxy-pod needs --proxy-token-file")
    if args.proxy_max_connections < 1 or args.proxy_per_client < 1:
        problems.append("--proxy-max-connections and --proxy-per-client must be at least 1")
    if problems:
        for problem in problems:
            _err(problem)
        return ExitCode.USAGE
    try:
        listen = _host_port(args.proxy_listen, "--proxy-listen")
        clients = parse_clients(args.proxy_clients)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        _err(f"--proxy-listen/--proxy-clients: {exc}")
        return ExitCode.USAGE
    try:
        token = args.proxy_token_file.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        _err(f"--proxy-token-file: cannot read {args.proxy_token_file}: {exc}")
        return ExitCode.SELF_FAILED
    if len(token) < 16 or not token.isascii() or not all(c.isalnum() or c in "-_." for c in token):
        _err(f"--proxy-token-file: {args.proxy_token_file} must hold one token of at least 16 characters "
             "[A-Za-z0-9._-]")  # fmt: skip
        return ExitCode.SELF_FAILED
    return ProxyListenConfig(host=listen[0], port=listen[1], token=token, clients=clients,
                             max_connections=args.proxy_max_connections, per_client=args.proxy_per_client)  # fmt: skip


# -- operator subcommands ----------------------------------------------------------------------------------------


def command_parser() -> argparse.ArgumentParser:
    from supervisor.cli.certs import add_certs_parser
    from supervisor.cli.k8s import add_k8s_parser
    from supervisor.cli.logs import add_logs_parser
    from supervisor.cli.policy import add_policy_parser

    p = argparse.ArgumentParser(
        prog="openshell-sandbox",
        description="Supervisor daemons of an AI-agent sandbox, and the commands that drive them.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=DAEMON_HELP,
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    dev = sub.add_parser("dev", help="run CMD as the agent in a local two-process sandbox")
    dev.add_argument("--policy", type=Path, help="policy YAML (default: embedded deny-all)")
    dev.add_argument("--dns-server", action="append", default=[], help="control's resolver ADDR[:PORT]")
    dev.add_argument("--credentials", type=Path, help="credentials file for control (the agent sees placeholders)")
    dev.add_argument("--upstream-ca", type=Path, help="extra CA (PEM) control trusts for upstream TLS")
    dev.add_argument("--ipv6-egress", choices=["auto", "on", "off"], default="auto",
                     help="control's --ipv6-egress: off answers the agent's AAAA queries with no records")  # fmt: skip
    dev.add_argument("--self-address", action="append", default=[], metavar="ADDR",
                     help="control's --self-address: an address control never dials (repeatable)")  # fmt: skip
    dev.add_argument("--privilege-model", default="auto", choices=["auto", "R", "U", "P"])
    dev.add_argument(
        "--api-listen",
        metavar="ADDR:PORT",
        help="control also serves the operator API on TCP with mutual TLS; dev mints an operator certificate and "
        "prints its directory (for --api https://ADDR:PORT --cert DIR; removed when dev exits)",
    )
    dev.add_argument(
        "--workdir",
        help="the agent's working directory, writable by it (default: $XDG_STATE_HOME/openshell-sandbox/<sandbox>/"
        "work, created for the agent and kept after exit; never / nor under /proc)",
    )
    dev.add_argument(
        "--agent-user",
        help="UID:GID the agent runs as when dev runs as root (default: a dedicated unused id from 61000 up, "
        "printed at start); U and P run without root as your own uid",
    )
    dev.add_argument(
        "--acknowledge-external-fence",
        action="store_true",
        help="use proxy-env capture (model P): no namespace, the agent can bypass the proxy unless something "
        "outside fences it; dev mode has no such fence, so this is for trying model P only",
    )
    dev.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="text (default): a ready line and one line per refused connection on stderr, the JSON events in "
        "$XDG_STATE_HOME/openshell-sandbox/<sandbox>/events.jsonl; json: also stream those events to stderr",
    )
    dev.add_argument(
        "--pids-limit", type=int, metavar="N",
        help="the boundary's --pids-limit: at most N workload processes (default 1024; 0: no limit, reported)",
    )  # fmt: skip
    dev.add_argument(
        "--topology", choices=["boundary", "proxy-pod"], default="boundary",
        help="proxy-pod (root): no boundary; the agent runs in a network namespace whose only route is control's "
        "proxy listener, with the proxy variables (token included) and a CA bundle; no filesystem/process policy, "
        "binary identity or exec (docs/design.md \"The proxy-pod topology\")",
    )  # fmt: skip
    dev.add_argument("-q", "--quiet", action="store_true", help="print nothing of ours on stderr (errors aside)")
    dev.add_argument("argv", nargs="+", metavar="CMD", help="the agent command (after --)")

    def with_api(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        from supervisor.cli.api_client import add_api_arguments

        add_api_arguments(parser)
        return parser

    status = with_api(sub.add_parser("status", help="show the sandbox's status"))
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    with_api(sub.add_parser("readyz", help="exit 0 when the sandbox is ready, 1 with the failing conditions"))

    ex = with_api(sub.add_parser("exec", help="run a command in the workload"))
    ex.add_argument("-i", "--interactive", action="store_true", help="forward stdin")
    ex.add_argument("-t", "--tty", action="store_true", help="allocate a terminal")
    ex.add_argument("--env", action="append", default=[], metavar="K=V", help="environment (repeatable)")
    ex.add_argument("--workdir", help="working directory in the workload")
    ex.add_argument("--timeout", type=float, default=0, help="terminate after this many seconds (0: never)")
    ex.add_argument("argv", nargs="+", metavar="CMD")

    att = with_api(sub.add_parser(
        "attach", help="re-attach to a running exec's output (the buffered tail first, then until it exits)",
    ))  # fmt: skip
    att.add_argument("handle", help="the exec's process handle (status lists them)")

    wait = with_api(sub.add_parser("wait", help="wait for a process handle's result"))
    wait.add_argument("handle", nargs="?", help="process handle (default: the agent)")
    wait.add_argument("--timeout", type=float, help="give up after this many seconds")

    sig = with_api(sub.add_parser("signal", help="send a signal to a process handle"))
    sig.add_argument("signal", help="TERM, INT, HUP, KILL, …")
    sig.add_argument("handle", nargs="?", help="process handle (default: the agent)")
    sig.add_argument("--group", action="store_true", help="signal the handle's process group")

    term = with_api(sub.add_parser("terminate", help="terminate a process handle and its descendants"))
    term.add_argument("handle", nargs="?", help="process handle (default: the agent)")
    term.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")

    fwd = with_api(sub.add_parser("forward", help="forward a local port into the workload's loopback"))
    fwd.add_argument("spec", metavar="[LOCAL_ADDR:]LOCAL_PORT:[REMOTE_HOST:]REMOTE_PORT")

    add_policy_parser(sub)
    add_certs_parser(sub)
    add_logs_parser(sub)
    add_k8s_parser(sub)
    return p


def run_command(argv: list[str]) -> int:
    args = command_parser().parse_args(argv)
    if args.command is None:
        command_parser().print_help(sys.stderr)
        return ExitCode.USAGE
    if args.command == "dev":
        from supervisor.cli.dev import DevOptions, run_dev

        if args.privilege_model == "P" and not args.acknowledge_external_fence:
            _err(
                "dev --privilege-model=P: model P captures nothing itself (proxy-env) and dev mode has no external "
                "fence; pass --acknowledge-external-fence to run it anyway"
            )
            return ExitCode.USAGE
        if args.workdir is not None and (problem := _workdir_problem(args.workdir)) is not None:
            _err(f"dev --workdir: {problem}")
            return ExitCode.USAGE
        opts = DevOptions(
            argv=args.argv, policy=args.policy, dns_servers=tuple(args.dns_server),
            privilege_model=args.privilege_model, workdir=args.workdir, agent_user=args.agent_user,
            acknowledge_external_fence=args.acknowledge_external_fence, credentials=args.credentials,
            upstream_ca=args.upstream_ca, log_format=args.log_format, quiet=args.quiet,
            ipv6_egress=args.ipv6_egress, self_addresses=tuple(args.self_address), api_listen=args.api_listen,
            pids_limit=args.pids_limit, topology=args.topology,
        )  # fmt: skip
        if args.api_listen is not None:
            try:
                _host_port(args.api_listen, "dev --api-listen")
            except argparse.ArgumentTypeError as exc:
                _err(str(exc))
                return ExitCode.USAGE
        return run_dev(opts)
    if args.command == "policy":
        from supervisor.cli.policy import run_policy

        return run_policy(args)
    if args.command == "certs":
        from supervisor.cli.certs import run_certs

        return run_certs(args)
    if args.command == "k8s":
        from supervisor.cli.k8s import run_k8s

        return run_k8s(args)
    from supervisor.cli import client_commands
    from supervisor.cli.api_client import ApiError

    if args.command == "logs":
        from supervisor.cli.logs import run_logs

        try:
            return trio.run(run_logs, args)
        except ApiError as exc:
            _err(str(exc))
            return ExitCode.SELF_FAILED
        except KeyboardInterrupt:
            return 130

    try:
        return trio.run(client_commands.run, args)
    except ApiError as exc:
        kind = exc.body.get("kind")
        _err(f"{kind}: {exc}" if kind else str(exc))
        return ExitCode.SELF_FAILED


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    head = argv[: argv.index("--")] if "--" in argv else argv
    if any(a == "--mode" or a.startswith("--mode=") for a in head):
        return run_daemon(argv)
    return run_command(argv)


if __name__ == "__main__":
    sys.exit(main())
