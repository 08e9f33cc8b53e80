"""The daemons' command line (``openshell-sandbox --mode=control|boundary``): the parser and its help.

Split from ``cli/main.py`` (the operator subcommands); ``cli/daemon_run.py`` turns the parsed arguments into a
running daemon.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from supervisor.protocol.privilege_model import PrivilegeModel


def memory_size(text: str) -> int:
    """``--memory-limit``'s value in bytes (argparse type): a number with an optional binary suffix."""
    from supervisor.boundary.process.memory_cgroup import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _tty_size(text: str) -> tuple[int, int]:
    """``COLSxROWS`` (argparse type): a terminal's size, each 1-65535."""
    cols, sep, rows = text.lower().partition("x")
    if not sep or not cols.isdigit() or not rows.isdigit() or not (0 < int(cols) < 0x10000 and 0 < int(rows) < 0x10000):
        raise argparse.ArgumentTypeError(f"{text!r} is not a terminal size like 80x24")
    return int(cols), int(rows)


DAEMON_HELP = """\
daemons:
  openshell-sandbox --mode=boundary --bootstrap DIR [--listen ADDR:PORT] [--metrics-listen ADDR:PORT] -- AGENT...
  openshell-sandbox --mode=control --bootstrap DIR --boundary HOST:PORT [--policy FILE] [--api PATH]
                    [--api-listen ADDR:PORT] [--metrics-listen ADDR:PORT]
  openshell-sandbox --mode=control --bootstrap DIR --topology=proxy-pod --proxy-listen ADDR:PORT
                    --proxy-token-file FILE --binary-identity=relaxed --acknowledge-networkpolicy-enforcement

operator commands (find the running sandbox's API socket by themselves; --api to choose, or
--api https://HOST:PORT --cert DIR for control's --api-listen from outside the pod):
  dev       run CMD as the agent in a local two-process sandbox
  status    show the sandbox's status (readiness, lifecycle, policy, activity counters)
  logs      show control's recent events; -f follows them (--event KIND, --format human|json|ocsf)
  readyz    exit 0 when the sandbox is ready, 1 with the failing conditions
  exec      run a command in the workload (-i for stdin, -t for a terminal)
  attach    re-attach to a running exec by its handle (after its client died): buffered tail, then exit code
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
    _add_common_options(p)
    _add_boundary_options(p)
    c = p.add_argument_group("control")
    _add_control_policy(c)
    _add_control_service(c)
    _add_proxy_pod_options(p)
    # "control" again: the usage line lists the options in the order they were added
    _add_acknowledgements(p)
    _add_control_fence(c)
    p.add_argument("agent_argv", nargs="*", help="boundary: the agent's argv (after --)")
    return p


def _add_common_options(p: argparse.ArgumentParser) -> None:
    """Both daemons: which one, its bundle, where its events go, its metrics."""
    p.add_argument("--mode", required=True, choices=["control", "boundary"], help="which daemon to run")
    p.add_argument("--bootstrap", required=True, type=Path, help="this role's bootstrap bundle directory")
    p.add_argument("--log-stream", choices=["stdout", "stderr", "none"], default="stdout", help="where JSON events go")
    p.add_argument("--log-file", type=Path, help="also append the JSON events to this file (created 0600)")
    p.add_argument(
        "--log-format", choices=["json", "ocsf"], default="json",
        help="json (default): one flat JSON object per event; ocsf: OCSF 1.7.0 objects, one per line (the --log-file "
        "stays JSON)",
    )  # fmt: skip
    p.add_argument(
        "--metrics-listen", metavar="ADDR:PORT",
        help="serve Prometheus metrics at http://ADDR:PORT/metrics (plain HTTP, no authentication: counts only, "
        "labelled by decision, reason, deny group and rule key; ADDR * is every address). Off by default",
    )  # fmt: skip


def _add_boundary_options(p: argparse.ArgumentParser) -> None:
    """The boundary: where it listens, its privilege model, the agent's view and limits."""
    b = p.add_argument_group("boundary")
    b.add_argument(
        "--listen",
        default="[::]:7443",
        help="address the boundary listens on (default %(default)s: every IPv6 and IPv4 address; IPv4 only where "
        "the pod has no IPv6)",
    )
    b.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    b.add_argument(
        "--privilege-model", default="auto", choices=["auto", *map(str, PrivilegeModel)],
        help="auto (default): the strongest the boundary can have (R root with capabilities, U user namespaces, "
        "P nothing: proxy-env only); R, U or P forces one (docs/design.md \"Privilege models\")",
    )  # fmt: skip
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
    b.add_argument(
        "--state-file", type=Path, metavar="PATH",
        help="write the lifecycle state here at every transition, for a local readiness probe "
        "(openshell-sandbox boundary-ready PATH); in a directory only the boundary can write",
    )  # fmt: skip
    b.add_argument(
        "--exit-linger", type=float, default=60.0, help="seconds to wait for control's exit ack (default %(default)g)"
    )
    b.add_argument(
        "--pids-limit", type=int, default=1024, metavar="N",
        help="at most N workload processes (a cgroup's pids.max under the boundary's own cgroup, v1 or delegated "
        "v2; default %(default)s); where no cgroup is writable, or with 0, status reports limits.pids: unenforced",
    )  # fmt: skip
    b.add_argument(
        "--memory-limit", type=memory_size, metavar="SIZE",
        help="at most SIZE bytes of memory for the workload (256M, 4G; a memory cgroup under the boundary's own, "
        "v1 or delegated v2; the kernel OOM-kills a workload process at the limit, its result says oom-killed). "
        "Default: half of physical memory or 4G, whichever is smaller (a runaway agent leaves the machine half of "
        "itself; few agents need more than 4G); where no cgroup is writable, or with 0, status reports "
        "limits.memory: unenforced",
    )  # fmt: skip
    b.add_argument(
        "--agent-stdio", choices=["inherit", "pipe", "tty"], default="inherit",
        help="inherit (default): the agent writes to the boundary's stdin/stdout/stderr; pipe: the boundary "
        "reads its output and logs it as process.output events; tty: the agent gets a terminal of its own, "
        "served to the one client that attaches to its handle (attach-stream; dev mode's terminal)",
    )  # fmt: skip
    b.add_argument(
        "--agent-tty-size", type=_tty_size, default=(80, 24), metavar="COLSxROWS",
        help="with --agent-stdio=tty: the terminal's size until the client resizes it (default 80x24)",
    )  # fmt: skip
    b.add_argument(
        "--agent-term", default="xterm-256color", metavar="TERM",
        help="with --agent-stdio=tty: the agent's TERM (dev mode passes its caller's; default %(default)s)",
    )  # fmt: skip
    b.add_argument(
        "--tls-dir",
        type=Path,
        default=Path("/run/openshell-boundary/tls"),
        help="the boundary's own directory for the agent's CA files, created at start (default %(default)s); "
        "R and U show it read-only at /run/openshell-boundary/tls, P must name a directory the agent can read",
    )


def _add_control_policy(c: argparse._ArgumentGroup) -> None:
    """The boundary control dials and the policy it decides with."""
    c.add_argument("--boundary", help="HOST:PORT of the boundary to dial")
    c.add_argument("--policy", type=Path, help="policy YAML (default: the embedded deny-all policy)")
    c.add_argument(
        "--policy-failure-mode", choices=["fail-closed", "retain-last-valid"], default="fail-closed",
        help="a policy file that turns invalid: fail-closed (default) denies all new egress until a valid "
        "revision loads; retain-last-valid keeps deciding with the last valid one",
    )  # fmt: skip
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


def _add_control_service(c: argparse._ArgumentGroup) -> None:
    """Control's API, the agent's ids and capture, TLS, inference and the upstream network."""
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
    c.add_argument(
        "--capture-mode", choices=["netns", "proxy-env"], default="netns",
        help="netns (default): the agent's own network namespace, only lo, every connection captured; "
        "proxy-env: only the proxy variables (model P), needs --acknowledge-external-fence on both daemons",
    )  # fmt: skip
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
        "--inference-routes", type=Path, metavar="FILE",
        help="inference routes (YAML): control serves inference.local with them, injecting each route's credential "
        "from --credentials (docs/policy.md \"Inference routing\"); hot-reloaded under the policy's rules",
    )  # fmt: skip
    c.add_argument(
        "--inference-routes-source", type=Path, metavar="FILE",
        help="the operator's original of --inference-routes (dev mode loads a private copy): watched instead",
    )  # fmt: skip
    c.add_argument(
        "--inference-idle-timeout", type=float, default=120.0, metavar="SECONDS",
        help="cut an inference response when the backend sends nothing for this long (default %(default)s)",
    )  # fmt: skip
    c.add_argument(
        "--self-address",
        action="append",
        default=[],
        metavar="ADDR",
        help="an address of this control that no interface shows (e.g. its Service IP); never dialled upstream, "
        "like every interface address of its own, whatever the policy says (repeatable)",
    )
    c.add_argument(
        "--workers",
        default="1",
        metavar="N|auto",
        help="control processes serving the agent's connections, this one included: each serves whole connections "
        "(its own egress links, or its share of the proxy listener); this one keeps the API, the policy, the "
        "binary pins and DNS. auto: the CPUs control may use, capped by its cgroup's CPU limit (default 1)",
    )
    c.add_argument(
        "--ipv6-egress",
        choices=["auto", "on", "off"],
        default="auto",
        help="whether control can reach IPv6 destinations; auto: a route covering global IPv6 exists in its network "
        "namespace (re-checked on change). Without it, AAAA queries are answered with no records (default auto)",
    )


def _add_proxy_pod_options(p: argparse.ArgumentParser) -> None:
    """Control without a boundary: it serves the workload pod's proxy itself."""
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
    t.add_argument(
        "--proxy-max-connections",
        type=int,
        default=1024,
        help="proxy-pod: concurrent connections cap (default %(default)s; with --workers, each process takes its "
        "share, rounded up)",
    )
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


def _add_acknowledgements(p: argparse.ArgumentParser) -> None:
    """What both daemons must be told about a fence they cannot see (model P)."""
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


def _add_control_fence(c: argparse._ArgumentGroup) -> None:
    """Control's side of the fence around the workload: the canary, the ranges its NetworkPolicy excludes, and
    how long the workload's link may be missing."""
    c.add_argument(
        "--fence-canary",
        metavar="ADDR:PORT",
        help="proxy-env: control listens here (a literal IP of its own) and the boundary must fail to connect to "
        "it from the pod before confirm, and every --fence-canary-interval after; a connect that succeeds or a "
        "connection control sees refuses confirm (later: enforcement lost). Use an address the pod would reach "
        "without its fence",
    )
    c.add_argument(
        "--egress-excluded",
        action="append",
        default=[],
        metavar="CIDR",
        help="a range control's NetworkPolicy excludes from its egress (repeatable; k8s render writes them): a "
        "policy whose allowed_ips reaches into one is warned about at load",
    )
    c.add_argument(
        "--egress-admitted",
        action="append",
        default=[],
        metavar="CIDR:PORT[,PORT]",
        help="an explicit allow of control's NetworkPolicy inside an excluded range (repeatable; k8s render writes "
        "one per allowed_ips range of the policy it rendered): no warning for it",
    )
    c.add_argument(
        "--workload-gone-after",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="without a link to the boundary for this long (since start or the last link), readyz says the "
        "workload is gone, with the time, and status what to delete (default %(default)g)",
    )
    c.add_argument(
        "--fence-canary-interval",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how often the canary round repeats after confirm (default %(default)g)",
    )
