"""The ``openshell-sandbox`` entrypoint: the two daemons (``--mode``) and the operator subcommands.

Streams are for payload: a client subcommand writes the remote process's stdout to stdout and its stderr to
stderr; messages from openshell-sandbox itself go to stderr. Exit codes: the remote code, 128+N for a
signal, 125 when openshell-sandbox itself failed, 126/127 when a launch failed, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import trio

from supervisor.cli.clean import age
from supervisor.cli.daemon_args import DAEMON_HELP, _err, _host_port, memory_size
from supervisor.cli.daemon_run import _workdir_problem, run_daemon
from supervisor.protocol.exit_codes import ExitCode, for_signal
from supervisor.protocol.privilege_model import PrivilegeModel


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

    _add_dev_parser(sub)
    _add_client_parsers(sub)

    from supervisor.cli.copy import add_cp_parser

    add_cp_parser(sub, _with_api)

    add_policy_parser(sub)
    add_certs_parser(sub)
    add_logs_parser(sub)
    add_k8s_parser(sub)
    return p


def _with_api(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` with the options that find the sandbox's API (``--api``, ``--cert``)."""
    from supervisor.cli.api_client import add_api_arguments

    add_api_arguments(parser)
    return parser


def _add_dev_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = sub.add_parser("dev", help="run CMD as the agent in a local two-process sandbox")
    _add_dev_control_options(dev)
    _add_dev_sandbox_options(dev)
    _add_dev_run_options(dev)
    _add_dev_terminal_options(dev)


def _add_dev_control_options(dev: argparse.ArgumentParser) -> None:
    """What control is given: the policy, credentials, resolvers, inference routes and upstream network."""
    dev.add_argument("--policy", type=Path, help="policy YAML (default: embedded deny-all)")
    dev.add_argument("--dns-server", action="append", default=[], help="control's resolver ADDR[:PORT]")
    dev.add_argument("--credentials", type=Path, help="credentials file for control (the agent sees placeholders)")
    dev.add_argument("--upstream-ca", type=Path, help="extra CA (PEM) control trusts for upstream TLS")
    dev.add_argument("--inference-routes", type=Path, metavar="FILE",
                     help="control's inference routes: the agent calls https://inference.local/v1/... and control "
                     "forwards to the route's backend with its key (docs/policy.md \"Inference routing\")")  # fmt: skip
    dev.add_argument("--inference-idle-timeout", type=float, metavar="SECONDS",
                     help="control's --inference-idle-timeout (default 120)")  # fmt: skip
    dev.add_argument(
        "--workers",
        default="1",
        metavar="N|auto",
        help="control's --workers: processes serving the agent's connections (default 1)",
    )
    dev.add_argument("--ipv6-egress", choices=["auto", "on", "off"], default="auto",
                     help="control's --ipv6-egress: off answers the agent's AAAA queries with no records")  # fmt: skip
    dev.add_argument("--self-address", action="append", default=[], metavar="ADDR",
                     help="control's --self-address: an address control never dials (repeatable)")  # fmt: skip


def _add_dev_sandbox_options(dev: argparse.ArgumentParser) -> None:
    """The boundary's model, the listeners dev opens, the agent's workdir and user."""
    dev.add_argument("--privilege-model", default="auto", choices=["auto", *map(str, PrivilegeModel)],
                     help="the boundary's model: auto (default) the strongest it can have, R (root), U (user "
                     "namespaces) or P (no namespace; needs --acknowledge-external-fence)")  # fmt: skip
    dev.add_argument(
        "--api-listen",
        metavar="ADDR:PORT",
        help="control also serves the operator API on TCP with mutual TLS; dev mints an operator certificate and "
        "prints its directory (for --api https://ADDR:PORT --cert DIR; removed when dev exits)",
    )
    dev.add_argument(
        "--metrics-listen", metavar="ADDR:PORT",
        help="control serves Prometheus metrics at http://ADDR:PORT/metrics (docs/design.md \"Metrics\")",
    )  # fmt: skip
    dev.add_argument(
        "--boundary-metrics-listen", metavar="ADDR:PORT",
        help="the boundary serves its Prometheus metrics (processes, limits, links) at http://ADDR:PORT/metrics",
    )  # fmt: skip
    dev.add_argument(
        "--workdir",
        help="the agent's working directory (`.` is this one), which the agent's uid must be able to write (default: "
        "$XDG_STATE_HOME/openshell-sandbox/<sandbox>/work, created for the agent and kept after exit; never / nor "
        "under /proc)",
    )
    dev.add_argument(
        "--workdir-read-only", action="store_true",
        help="the agent only reads --workdir (your scripts, say): start even though its uid cannot write it",
    )  # fmt: skip
    dev.add_argument(
        "--agent-user",
        help="UID:GID the agent runs as when dev runs as root (default: a dedicated unused id from 61000 up, "
        "printed at start; 1000:1000 with --topology proxy-pod); U and P run without root as your own uid",
    )
    dev.add_argument(
        "--acknowledge-external-fence",
        action="store_true",
        help="use proxy-env capture (model P): no namespace, the agent can bypass the proxy unless something "
        "outside fences it; dev mode has no such fence, so this is for trying model P only",
    )


def _add_dev_run_options(dev: argparse.ArgumentParser) -> None:
    """Where the events go, what the workload may use, and the topology."""
    dev.add_argument(
        "--log-format",
        choices=["text", "json", "ocsf"],
        default="text",
        help="text (default): a ready line and one line per refused connection on stderr, the JSON events in "
        "$XDG_STATE_HOME/openshell-sandbox/<sandbox>/events.jsonl; json: those events on stderr instead of the "
        "human lines (the file is still written); ocsf: the same events as OCSF 1.7.0 objects on stderr (the file "
        "stays JSON)",
    )
    dev.add_argument(
        "--pids-limit", type=int, metavar="N",
        help="the boundary's --pids-limit: at most N workload processes (default 1024; 0: no limit, reported)",
    )  # fmt: skip
    dev.add_argument(
        "--memory-limit", type=memory_size, metavar="SIZE",
        help="the boundary's --memory-limit: at most SIZE of memory for the workload (256M, 4G; default half of "
        "physical memory or 4G, whichever is smaller: a runaway agent leaves the machine half of itself; 0: no "
        "limit, reported); at the limit the kernel kills the agent and dev exits 137 saying so",
    )  # fmt: skip
    dev.add_argument(
        "--topology", choices=["boundary", "proxy-pod"], default="boundary",
        help="proxy-pod (root): no boundary; the agent runs in a network namespace whose only route is control's "
        "proxy listener, with the proxy variables (token included) and a CA bundle; no filesystem/process policy, "
        "binary identity or exec (docs/design.md \"The proxy-pod topology\")",
    )  # fmt: skip
    dev.add_argument(
        "--proxy-max-connections", type=int, metavar="N",
        help="proxy-pod only: at most N concurrent connections through control's proxy listener, over them 503 "
        "too_many_connections (control's --proxy-max-connections and --proxy-per-client, the agent being one "
        "source; default control's, 1024)",
    )  # fmt: skip


def _add_dev_terminal_options(dev: argparse.ArgumentParser) -> None:
    """What dev prints, the agent's terminal, the state it leaves, and the agent's command."""
    dev.add_argument("-q", "--quiet", action="store_true", help="print nothing of ours on stderr (errors aside)")
    dev.add_argument(
        "-t", "--tty", dest="tty", action="store_const", const=True, default=None,
        help="give the agent a terminal of its own, dev's terminal raw and every key the agent's (the default when "
        "stdin and stdout are a terminal); ~. at the start of a line stops the sandbox",
    )  # fmt: skip
    dev.add_argument("-T", "--no-tty", dest="tty", action="store_const", const=False,
                     help="no terminal for the agent: it inherits dev's stdin, stdout and stderr")  # fmt: skip
    dev.add_argument("-i", "--interactive", action="store_true",
                     help="accepted for -it (the agent always has dev's input)")  # fmt: skip
    dev.add_argument(
        "--escape", default="~", metavar="CHAR",
        help="with a terminal: the escape character (default ~; ^X for a control character; none: no escapes). "
        "At the start of a line: CHAR. stops the sandbox, CHAR? lists the escapes, CHARCHAR sends CHAR",
    )  # fmt: skip
    dev.add_argument("--rm", action="store_true",
                     help="remove the sandbox's state directory (its events file and default workdir) when dev "
                     "exits; a --workdir of yours stays")  # fmt: skip
    dev.add_argument("argv", nargs="+", metavar="CMD", help="the agent command (after --)")


def _add_client_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The operator commands that talk to a running sandbox's API, and the state-directory cleaner."""
    status = _with_api(sub.add_parser("status", help="show the sandbox's status"))
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    _with_api(sub.add_parser("readyz", help="exit 0 when the sandbox is ready, 1 with the failing conditions"))
    probe = sub.add_parser(
        "boundary-ready",
        help="the workload pod's readiness probe: exit 0 when the boundary's --state-file says ready or running",
    )
    probe.add_argument("state_file", type=Path, metavar="PATH")

    ex = _with_api(sub.add_parser("exec", help="run a command in the workload"))
    ex.add_argument("-i", "--interactive", action="store_true", help="forward stdin")
    ex.add_argument("-t", "--tty", action="store_true", help="allocate a terminal")
    ex.add_argument("--env", action="append", default=[], metavar="K=V", help="environment (repeatable)")
    ex.add_argument("--workdir", help="working directory in the workload")
    ex.add_argument("--timeout", type=float, default=0, help="terminate after this many seconds, exit 124 (0: never)")
    ex.add_argument("-d", "--detach", action="store_true",
                    help="start it and return at once, printing its handle on stderr (for attach, wait, signal, "
                    "terminate; status lists it)")  # fmt: skip
    ex.add_argument("argv", nargs="+", metavar="CMD")

    att = _with_api(sub.add_parser(
        "attach", help="re-attach to a running exec's output (the buffered tail first, then until it exits)",
    ))  # fmt: skip
    att.add_argument("handle", help="the exec's process handle (status --json lists them)")

    wait = _with_api(sub.add_parser("wait", help="wait for a process handle's result"))
    wait.add_argument("handle", nargs="?", help="process handle (default: the agent)")
    wait.add_argument("--timeout", type=float, help="give up after this many seconds (exit 125; it keeps running)")

    sig = _with_api(sub.add_parser("signal", help="send a signal to a process handle"))
    sig.add_argument("signal", help="TERM, INT, HUP, KILL, …")
    sig.add_argument("handle", nargs="?", help="process handle (default: the agent)")
    sig.add_argument("--group", action="store_true", help="signal the handle's process group")

    term = _with_api(sub.add_parser("terminate", help="terminate a process handle and its descendants"))
    term.add_argument("handle", nargs="?", help="process handle (default: the agent)")
    term.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")

    fwd = _with_api(sub.add_parser("forward", help="forward a local port into the workload's loopback"))
    fwd.add_argument("spec", metavar="[LOCAL_ADDR:]LOCAL_PORT:[REMOTE_HOST:]REMOTE_PORT")

    clean = sub.add_parser("clean", help="remove old dev sandboxes' state directories (never a running one's)")
    clean.add_argument("--older-than", default="7d", metavar="AGE", type=age,
                       help="only those untouched for AGE (30m, 12h, 7d; 0: any age; default 7d)")  # fmt: skip
    clean.add_argument("-n", "--dry-run", action="store_true", help="only list what would be removed")


def run_command(argv: list[str]) -> int:
    args = command_parser().parse_args(argv)
    if args.command is None:
        command_parser().print_help(sys.stderr)
        return ExitCode.USAGE
    if args.command == "dev":
        return _run_dev(args)
    if args.command == "clean":
        from supervisor.cli.clean import run_clean

        return run_clean(args.older_than, dry_run=args.dry_run)
    if args.command == "policy":
        from supervisor.cli.policy import run_policy

        return run_policy(args)
    if args.command == "certs":
        from supervisor.cli.certs import run_certs

        return run_certs(args)
    if args.command == "boundary-ready":
        from supervisor.boundary import state_file

        state = state_file.read(args.state_file)
        print(f"boundary: {state or 'no state'}", file=sys.stdout)
        return 0 if state in state_file.READY_STATES else 1
    if args.command == "k8s":
        from supervisor.cli.k8s import run_k8s

        return run_k8s(args)
    return _run_client(args)


def _run_dev(args: argparse.Namespace) -> int:
    """dev's checks that argparse cannot make (each a usage error naming its flag), then the sandbox."""
    from supervisor.cli.dev import run_dev
    from supervisor.cli.dev_common import DevOptions
    from supervisor.cli.dev_terminal import parse_escape

    if args.privilege_model == PrivilegeModel.P and not args.acknowledge_external_fence:
        _err(
            "dev --privilege-model=P: model P captures nothing itself (proxy-env) and dev mode has no external "
            "fence; pass --acknowledge-external-fence to run it anyway"
        )
        return ExitCode.USAGE
    if args.workdir is not None:
        args.workdir = os.path.abspath(args.workdir)  # `--workdir .`: this directory, named as the agent sees it
    if args.workdir is not None and (problem := _workdir_problem(args.workdir)) is not None:
        _err(f"dev --workdir: {problem}")
        return ExitCode.USAGE
    try:
        escape = parse_escape(args.escape)
    except ValueError as exc:
        _err(f"dev {exc}")
        return ExitCode.USAGE
    from supervisor.cli.dev_inputs import input_errors

    if problems := input_errors(args.policy, args.credentials, args.upstream_ca):
        print("\n".join(problems), file=sys.stderr)
        return ExitCode.USAGE
    if args.proxy_max_connections is not None:
        if args.topology != "proxy-pod":
            _err("dev --proxy-max-connections: only with --topology proxy-pod (the boundary topology has no "
                 "proxy listener of control's)")  # fmt: skip
            return ExitCode.USAGE
        if args.proxy_max_connections < 1:
            _err(f"dev --proxy-max-connections: must be at least 1, got {args.proxy_max_connections}")
            return ExitCode.USAGE
    opts = DevOptions(
        argv=args.argv, policy=args.policy, dns_servers=tuple(args.dns_server),
        privilege_model=args.privilege_model, workdir=args.workdir, agent_user=args.agent_user,
        workdir_read_only=args.workdir_read_only,
        acknowledge_external_fence=args.acknowledge_external_fence, credentials=args.credentials,
        upstream_ca=args.upstream_ca, log_format=args.log_format, quiet=args.quiet,
        inference_routes=args.inference_routes, inference_idle_timeout=args.inference_idle_timeout,
        ipv6_egress=args.ipv6_egress, self_addresses=tuple(args.self_address), api_listen=args.api_listen,
        workers=args.workers,
        pids_limit=args.pids_limit, topology=args.topology, proxy_max_connections=args.proxy_max_connections,
        memory_limit=args.memory_limit, tty=args.tty, escape=escape, remove_state=args.rm,
        metrics_listen=args.metrics_listen, boundary_metrics_listen=args.boundary_metrics_listen,
    )  # fmt: skip
    for flag, value in (("--api-listen", args.api_listen), ("--metrics-listen", args.metrics_listen),
                        ("--boundary-metrics-listen", args.boundary_metrics_listen)):  # fmt: skip
        try:
            if value is not None:
                _host_port(value, f"dev {flag}")
        except argparse.ArgumentTypeError as exc:
            _err(str(exc))
            return ExitCode.USAGE
    return run_dev(opts)


def _run_client(args: argparse.Namespace) -> int:
    """The commands that talk to the sandbox's API: an API error is our failure, said in one line."""
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
    try:
        code = run_command(argv)
        sys.stdout.flush()  # a pipe's buffered output is written here, inside this handler, not at exit
        return code
    except BrokenPipeError:
        # the reader went away (`status --json | head`): not our failure, and no traceback; stdout is pointed at
        # /dev/null so the interpreter's final flush does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return for_signal(signal.SIGPIPE)


if __name__ == "__main__":
    sys.exit(main())
