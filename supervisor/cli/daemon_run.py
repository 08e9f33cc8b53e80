"""Running a daemon from its parsed command line (``cli/daemon_args.py``): checks that name the flag at fault,
the bootstrap bundle, the event log, then ``control.daemon``/``boundary.daemon``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

from supervisor.cli.daemon_args import _err, _host_port, daemon_parser
from supervisor.protocol.exit_codes import ExitCode


def _raise_nofile_limit() -> None:
    """Each relayed connection costs a daemon one or two descriptors: use all the hard limit allows."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def run_daemon(argv: list[str]) -> int:
    from supervisor.protocol.certs import BundleError, load_bundle
    from supervisor.protocol.claims import Role
    from supervisor.protocol.interpreter import installation_problem

    args = daemon_parser().parse_args(argv)
    if (problem := installation_problem()) is not None:  # docs/design.md "Our own interpreters"
        _err(f"refusing to start: {problem}, and this daemon imports from there (whoever can write it could run "
             f"code as uid {os.geteuid()})")  # fmt: skip
        return ExitCode.SELF_FAILED
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
    from supervisor.jsonlog import JsonLog, LogFormat, open_log_file

    file = None
    if args.log_file is not None:
        try:
            file = open_log_file(args.log_file)
        except OSError as exc:
            _err(f"--log-file: cannot open {args.log_file}: {exc.strerror or exc}")
            return None
    return JsonLog(component, stream=stream, sandbox=sandbox, file=file, to_stream=args.log_stream != "none",
                   log_format=LogFormat(args.log_format))  # fmt: skip


def _run_boundary(args: argparse.Namespace, stream: Any) -> int:
    """The launcher is forked first: before any thread exists, and before the bundle's key is in our memory
    (the launcher is a copy of this process and lives next to the workload)."""
    from supervisor.boundary import daemon
    from supervisor.boundary.config import BoundaryConfig
    from supervisor.boundary.process import Launcher, LauncherError, detect_privilege_model
    from supervisor.protocol.certs import BundleError, load_bundle
    from supervisor.protocol.claims import Role

    if not args.agent_argv:
        _err("--mode=boundary needs the agent's argv after --")
        return ExitCode.USAGE
    try:
        host, port = _host_port(args.listen, "--listen")
        metrics_listen = _host_port(args.metrics_listen, "--metrics-listen") if args.metrics_listen else None
    except argparse.ArgumentTypeError as exc:
        _err(str(exc))
        return ExitCode.USAGE
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
        cfg = BoundaryConfig(
            bundle=bundle, agent_argv=tuple(args.agent_argv), listen_host=host, listen_port=port,
            port_file=args.port_file, workdir=args.workdir, agent_stdio=args.agent_stdio, privilege_model=model,
            agent_tty_size=args.agent_tty_size, agent_term=args.agent_term,
            model_reason=reason, hide_paths=tuple(args.hide_path), exit_linger_s=args.exit_linger,
            acknowledge_external_fence=args.acknowledge_external_fence, tls_dir=args.tls_dir,
            acknowledge_unprobed_fence=args.acknowledge_unprobed_fence,
            tmp_size=args.tmp_size, shm_size=args.shm_size, pids_limit=args.pids_limit, state_file=args.state_file,
            metrics_listen=metrics_listen,
            **({"memory_limit": args.memory_limit} if args.memory_limit is not None else {}),
            test_landlock_off=os.environ.get("OPENSHELL_TEST_LANDLOCK_OFF") == "1", log=log,
        )  # fmt: skip
        return daemon.run(cfg, launcher)
    finally:
        launcher.close()


def _boundary_dirs_problem(args: argparse.Namespace) -> str | None:
    """The trust directory is created now (never idle with one we cannot write); the tmpfs sizes parse."""
    from supervisor.boundary.forkimage.rootfs import RootError, check_size

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


class _Listeners(NamedTuple):
    """Where control listens and what it dials: the proxy listener (proxy-pod) or the boundary's address."""

    proxy: Any
    boundary: tuple[str, int]
    api_listen: tuple[str, int] | None
    metrics_listen: tuple[str, int] | None


class _PolicySetup(NamedTuple):
    """The policy control starts with, and which file it watches for the next revisions (and why)."""

    store: Any
    agent_writable: tuple[str, ...]
    watch_file: Path | None
    watch_reason: str


def _run_control(args: argparse.Namespace, bundle: Any, log: Any) -> int:
    """Control from its flags, checked in the order their errors are reported: the listeners, the policy, the
    agent's ids and resolvers, TLS interception, the inference routes, the fence, the local network."""
    from supervisor.control import daemon
    from supervisor.control.api import runtime_socket_path
    from supervisor.control.config import ControlConfig
    from supervisor.protocol.attach import CaptureMode
    from supervisor.protocol.runtime_dir import RuntimeDirError

    listen = _control_listeners(args)
    if isinstance(listen, int):
        return listen
    policy = _control_policy(args)
    if isinstance(policy, int):
        return policy
    agent = _agent_and_resolvers(args)
    if isinstance(agent, int):
        return agent
    agent_uid, agent_gid, dns_servers = agent
    interception = _interception(args, bundle)
    if isinstance(interception, int):
        return interception
    inference = _inference_routes(args, interception.credentials, policy.agent_writable)
    if isinstance(inference, int):
        return inference
    fence_canary = _fence_canary(args)
    if isinstance(fence_canary, int):
        return fence_canary
    from supervisor.control.workers.count import parse_workers

    try:
        workers = parse_workers(args.workers)
    except ValueError as exc:
        _err(f"--workers: {exc}")
        return 2
    network = _local_network(args, dns_servers, log)
    if isinstance(network, int):
        return network
    local_net, upstream = network
    try:
        api_path = args.api or runtime_socket_path(bundle.claims.sandbox)
    except RuntimeDirError as exc:
        _err(f"--api: {exc}")
        return ExitCode.SELF_FAILED
    cfg = ControlConfig(
        bundle=bundle, boundary_host=listen.boundary[0], boundary_port=listen.boundary[1], policy=policy.store,
        local_net=local_net, upstream=upstream, interception=interception,
        api_path=api_path, api_listen=listen.api_listen, metrics_listen=listen.metrics_listen,
        agent_uid=agent_uid, agent_gid=agent_gid,
        capture_mode=CaptureMode(args.capture_mode), acknowledge_external_fence=args.acknowledge_external_fence,
        fence_canary=fence_canary, acknowledge_unprobed_fence=args.acknowledge_unprobed_fence,
        canary_interval_s=args.fence_canary_interval,
        policy_file=policy.watch_file, policy_watch_reason=policy.watch_reason,
        agent_writable=policy.agent_writable, log=log,
        policy_digest=_policy_digest(args.policy),
        proxy=listen.proxy, relaxed_identity=args.binary_identity == "relaxed",
        networkpolicy_acknowledged=args.acknowledge_networkpolicy_enforcement,
        workload_gone_after_s=args.workload_gone_after, workers=workers,
        **inference,
    )  # fmt: skip
    return daemon.run(cfg)


def _control_listeners(args: argparse.Namespace) -> _Listeners | int:
    """The topology decides what control dials (a boundary, or nothing: it serves the proxy itself)."""
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
        metrics_listen = _host_port(args.metrics_listen, "--metrics-listen") if args.metrics_listen else None
    except argparse.ArgumentTypeError as exc:
        _err(str(exc))
        return ExitCode.USAGE
    return _Listeners(proxy, (host, port), api_listen, metrics_listen)


def _control_policy(args: argparse.Namespace) -> _PolicySetup | int:
    """The policy file (or the embedded default) compiled, and whether its file is safe to watch: not one the
    agent can write."""
    from supervisor.control.policy import PolicyInvalid, PolicyStore, compile_policy, load_policy_file
    from supervisor.control.policy.egress_fence import EgressFence
    from supervisor.control.policy.schema import load_default_policy
    from supervisor.control.policy.watch_safety import agent_writable_paths, decide_watch

    try:
        fence = EgressFence.parse(args.egress_excluded, args.egress_admitted)
    except ValueError as exc:
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
    # the user's own file when dev mode runs us from a private copy of it
    source = str(args.policy_source or args.policy) if args.policy else "embedded default (deny all)"
    store = PolicyStore(
        compile_policy(policy), failure_mode=args.policy_failure_mode, source=source, egress_fence=fence
    )
    read_write = policy.filesystem_policy.read_write if policy.filesystem_policy is not None else ()
    agent_writable = agent_writable_paths(args.agent_writable, read_write)
    watch_file, watch_reason = decide_watch(args.policy_source or args.policy, args.no_policy_watch, agent_writable)
    return _PolicySetup(store, agent_writable, watch_file, watch_reason)


def _agent_and_resolvers(args: argparse.Namespace) -> tuple[int, int, list[tuple[str, int]]] | int:
    """The agent's uid and gid, and the resolvers control asks."""
    from supervisor.control.upstream import parse_dns_server

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
    return agent_uid, agent_gid, dns_servers


def _interception(args: argparse.Namespace, bundle: Any) -> Any:
    """The interception CA (kept in ``--interception-ca``), the credentials and the upstream trust; an exit code
    when one cannot be loaded."""
    import ssl

    from supervisor.control.credentials import Credentials, CredentialsError
    from supervisor.control.egress import Interception
    from supervisor.control.interception import load_or_create
    from supervisor.control.l7 import upstream_context

    try:
        return Interception(
            ca=load_or_create(args.interception_ca, bundle.claims.sandbox),
            credentials=Credentials.load(args.credentials),
            upstream_ssl=upstream_context(extra_ca_file=str(args.upstream_ca) if args.upstream_ca else None),
        )
    except (CredentialsError, OSError, ssl.SSLError, ValueError) as exc:
        _err(f"--credentials/--upstream-ca: {exc}")
        return ExitCode.SELF_FAILED


def _fence_canary(args: argparse.Namespace) -> tuple[str, int] | int | None:
    """The canary's address (None without one), after the canary's and the workload link's timers are checked."""
    from supervisor.protocol.fence_canary import parse_canary

    try:
        fence_canary = parse_canary(args.fence_canary) if args.fence_canary else None
    except ValueError as exc:
        _err(f"--fence-canary: {exc}")
        return 2
    if not 1.0 <= args.workload_gone_after <= 30 * 86400.0:
        _err(f"--workload-gone-after: {args.workload_gone_after:g} is not 1..2592000 seconds")
        return 2
    if not 1.0 <= args.fence_canary_interval <= 3600.0:
        _err(f"--fence-canary-interval: {args.fence_canary_interval:g} is not 1..3600 seconds")
        return 2
    return fence_canary


def _local_network(args: argparse.Namespace, dns_servers: list[tuple[str, int]], log: Any) -> tuple[Any, Any] | int:
    """Control's own addresses (never dialled) and its IPv6 reach, and the upstream config built on them."""
    import ipaddress

    from supervisor.control.local_net import Ipv6Egress, LocalNetwork
    from supervisor.control.upstream import UpstreamConfig

    try:
        self_addresses = [ipaddress.ip_address(text) for text in args.self_address]
    except ValueError as exc:
        _err(f"--self-address: {exc}")
        return ExitCode.USAGE
    local_net = LocalNetwork(self_addresses, ipv6_egress=Ipv6Egress(args.ipv6_egress), log=log)
    upstream = UpstreamConfig(
        dns_servers=dns_servers, is_local=local_net.is_local, ipv6_egress=lambda: local_net.ipv6_egress
    )
    return local_net, upstream


def _inference_routes(args: argparse.Namespace, credentials: Any, agent_writable: tuple[str, ...]) -> Any:
    """The ``ControlConfig`` fields of ``--inference-routes`` (empty without it), or an exit code after saying why
    the file is refused."""
    from supervisor.control.inference.router import InferenceLimits
    from supervisor.control.inference.routes import RoutesInvalid
    from supervisor.control.inference.store import load_routes_file
    from supervisor.control.policy.watch_safety import decide_watch

    if args.inference_routes is None:
        if args.inference_routes_source is not None:
            _err("--inference-routes-source needs --inference-routes")
            return ExitCode.USAGE
        return {}
    if not 1.0 <= args.inference_idle_timeout <= 3600.0:
        _err(f"--inference-idle-timeout: {args.inference_idle_timeout:g} is not 1..3600 seconds")
        return ExitCode.USAGE
    original = args.inference_routes_source or args.inference_routes
    try:
        routes = load_routes_file(args.inference_routes, credentials, source=str(original))
    except RoutesInvalid as exc:
        for error in exc.errors:
            _err(f"--inference-routes: {exc.source}: {error}")
        return ExitCode.SELF_FAILED
    watch, why = decide_watch(original, args.no_policy_watch, agent_writable)
    why = why.replace("change it with `policy apply`", "a change needs a restart of control")
    return {"inference_routes": routes, "inference_file": watch, "inference_watch_reason": why,
            "inference_limits": InferenceLimits(idle_timeout=args.inference_idle_timeout)}  # fmt: skip


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
