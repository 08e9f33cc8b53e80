"""``openshell-sandbox k8s render``: one sandbox's Kubernetes objects for ``kubectl apply -f -``.

Streams: the objects go to stdout (or ``--out``); Secrets never do — they go to ``--secrets-dir DIR`` as a 0600
``secrets.yaml``, or, with ``--redact-secrets``, redacted beside the objects. Exit codes: 0 written; 2 bad
input (the message names the flag); 1 anything else (a file cannot be written).
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from ..k8s.names import delete_commands
from ..k8s.quantity import Resources
from ..k8s.spec import (
    DEFAULT_CONTROL_RESOURCES,
    DEFAULT_ENTRYPOINT,
    DEFAULT_WORKLOAD_RESOURCES,
    Affinity,
    Model,
    RenderError,
    RenderSpec,
    Topology,
    parse_cidr,
    parse_dns_peer,
    parse_owner,
)
from ..protocol.certs import DEFAULT_VALIDITY, BundleError
from ..protocol.exit_codes import ExitCode
from .certs import parse_validity

if TYPE_CHECKING:
    from ..k8s.render import Rendered

SECRETS_FILE = "secrets.yaml"  # supervisor.k8s.secrets.SECRETS_FILE, without importing it for --help

__all__ = ["add_k8s_parser", "run_k8s"]

EXIT_FAILED = 1

_DESCRIPTION = """\
Render one sandbox's companion set: the policy ConfigMap, the two NetworkPolicies, the boundary Service, the
control Deployment and the workload Pod, as multi-document YAML for `kubectl apply -f -`. Every name embeds a
hash of the sandbox UID; the bootstrap bundles are minted with exactly the claims those names imply
(policy_resource is ConfigMap/<its name>) and record the policy's digest.

Secrets (bootstrap bundle per role, the interception CA, credentials) never go to stdout: --secrets-dir DIR
writes them to DIR/secrets.yaml (0600). Apply them first:
  openshell-sandbox k8s render ... --secrets-dir DIR --out FILE -- AGENT...
  kubectl apply -f DIR/secrets.yaml && kubectl apply -f FILE
Render again with the same keys (immutable Secrets re-apply unchanged) with --reuse-secrets DIR.

--topology proxy-pod: no boundary. The workload Pod runs the agent's own image and argv directly (--proxy-uid,
no capabilities, Pod Security restricted) with the proxy variables pointing at control's headless proxy Service
(http://sandbox:<token>@<service>:<port>, the token from a Secret) and a CA bundle an init container builds from
the image's own system bundle plus the interception CA. Its NetworkPolicy allows egress only to control's proxy
port and the cluster DNS (--dns-peer). The cluster must enforce NetworkPolicy: that is the only fence.
"""


def add_k8s_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    k8s = subparsers.add_parser(
        "k8s", help="render a sandbox's Kubernetes objects", description="Kubernetes objects of a sandbox."
    )
    k8s.set_defaults(func=run_k8s)
    actions = k8s.add_subparsers(dest="k8s_command", metavar="COMMAND", required=True)
    r = actions.add_parser(
        "render",
        help="write one sandbox's objects as YAML (Secrets to --secrets-dir only)",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_sandbox_arguments(r)
    what = r.add_argument_group("the pods")
    _add_workload_arguments(what)
    _add_listener_arguments(what)
    _add_proxy_pod_arguments(r)
    _add_cluster_arguments(r)
    # "the pods" again: the usage line lists the options in the order they were added
    what.add_argument(
        "--validity",
        type=parse_validity,
        default=DEFAULT_VALIDITY,
        metavar="DURATION",
        help="lifetime of the bootstrap bundles (default 30d): it must cover the sandbox's life",
    )
    _add_output_arguments(r)
    r.add_argument("agent_argv", nargs="*", metavar="AGENT", help="the agent's argv, after --")


def _add_sandbox_arguments(r: argparse.ArgumentParser) -> None:
    """Which sandbox: its namespace, name, UID and owner."""
    who = r.add_argument_group("the sandbox")
    who.add_argument("--namespace", required=True, metavar="NS", help="namespace of every object")
    who.add_argument("--sandbox", required=True, metavar="NAME", help="sandbox name (a DNS label)")
    who.add_argument(
        "--sandbox-uid", metavar="UID", help="the sandbox's UID (default: the --owner's UID); hashed into every name"
    )
    who.add_argument(
        "--owner",
        metavar="APIVERSION/KIND/NAME/UID",
        help="controlling ownerReference on every object, e.g. agents.example/v1/Sandbox/review-bot/7c0e…",
    )
    who.add_argument(
        "--owner-namespace",
        metavar="NS",
        help="the owner's namespace if it is namespaced; refused unless it is --namespace",
    )
    who.add_argument("--generation", type=int, default=1, metavar="N", help="Sandbox spec generation (default 1)")


def _add_workload_arguments(what: argparse._ArgumentGroup) -> None:
    """The images, the privilege model and topology, the files control is given, the agent's user and workdir."""
    what.add_argument(
        "--image", required=True, metavar="IMG@sha256:DIGEST", help="workload image, by digest: the `image` claim"
    )
    what.add_argument(
        "--allow-mutable-image",
        action="store_true",
        help="accept an --image that is a tag (a warning says what the `image` claim then no longer proves)",
    )
    what.add_argument(
        "--entrypoint",
        default=DEFAULT_ENTRYPOINT,
        metavar="PATH",
        help="where the workload image keeps openshell-sandbox (the container's command; default %(default)s)",
    )
    what.add_argument("--control-image", required=True, metavar="IMG", help="the openshell-sandbox image for control")
    what.add_argument(
        "--privilege-model",
        choices=[str(m) for m in Model],
        help="the boundary's privilege model (default R; the proxy-pod topology has none)",
    )
    what.add_argument(
        "--topology",
        choices=[str(t) for t in Topology],
        default="boundary",
        help="boundary (default): the boundary is the workload's PID 1. proxy-pod: the agent's image runs alone and "
        "control serves its proxy; needs a cluster that enforces NetworkPolicy (docs/kubernetes.md)",
    )
    what.add_argument("--policy", type=Path, metavar="FILE", help="policy YAML (default: the embedded deny-all)")
    what.add_argument("--credentials", type=Path, metavar="FILE", help="credentials file: a Secret for control only")
    what.add_argument("--inference-routes", type=Path, metavar="FILE",
                      help="inference routes (docs/policy.md 'Inference routing'): in control's ConfigMap beside the "
                      "policy; the credentials they name must be in --credentials")  # fmt: skip
    what.add_argument("--agent-user", default="1000:1000", metavar="UID:GID", help="the agent's uid:gid in model R")
    what.add_argument("--workdir", default="/sandbox", metavar="PATH", help="the agent's workdir, an emptyDir")
    what.add_argument(
        "--seccomp-localhost",
        metavar="PROFILE",
        help="model U: the workload's Localhost seccomp profile (e.g. containerd, whose RuntimeDefault denies the "
        "unshare the boundary needs); default RuntimeDefault",
    )


def _add_listener_arguments(what: argparse._ArgumentGroup) -> None:
    """The pods' ports and who may reach them, the runtime class and the placement."""
    what.add_argument("--boundary-port", type=int, default=7443, metavar="PORT", help="default %(default)s")
    what.add_argument(
        "--api-listen",
        action="store_true",
        help="control also serves the operator API on --api-port with mutual TLS (operator certificates only: "
        "--operator-cert-out) and its NetworkPolicy admits that port; without it control has no ingress at all",
    )
    what.add_argument(
        "--operator-namespace",
        metavar="NS",
        help="with --api-listen: the only namespace whose pods may reach the API port (default: any source; the "
        "operator certificate is what admits a client)",
    )
    what.add_argument("--api-port", type=int, default=7444, metavar="PORT", help="control's TCP API port")
    what.add_argument(
        "--metrics-port", type=int, metavar="PORT",
        help="control serves Prometheus metrics on this port (a containerPort named metrics); needs "
        "--metrics-namespace",
    )  # fmt: skip
    what.add_argument(
        "--metrics-namespace", metavar="NS",
        help="with --metrics-port: the namespace of the Prometheus that scrapes it, the only pods admitted to the port",
    )  # fmt: skip
    what.add_argument(
        "--runtime-class", metavar="NAME", help="the workload pod's RuntimeClass (e.g. a sandboxed runtime)"
    )
    what.add_argument(
        "--affinity",
        choices=[str(a) for a in Affinity],
        default="disabled",
        help="schedule the workload pod on control's node: preferred or required (default disabled)",
    )


def _add_proxy_pod_arguments(r: argparse.ArgumentParser) -> None:
    """The agent's own image behind control's proxy: its port, the agent's ids, its root."""
    proxy = r.add_argument_group("the proxy-pod topology (--topology proxy-pod)")
    proxy.add_argument("--proxy-port", type=int, metavar="PORT", help="control's proxy port (default 3128)")
    proxy.add_argument(
        "--proxy-uid",
        metavar="UID[:GID]",
        help="the agent's uid (and gid; default the uid) in its own image, non-zero (default 1000)",
    )
    proxy.add_argument(
        "--read-only-root",
        action="store_true",
        help="the agent's root filesystem is read-only (where the image allows it; /tmp and --workdir are emptyDirs)",
    )


def _add_output_arguments(r: argparse.ArgumentParser) -> None:
    """Where the objects, the Secrets and an operator certificate go; or only the delete commands."""
    out = r.add_argument_group("output")
    out.add_argument("--out", type=Path, metavar="PATH", help="write the objects here (a directory: PATH/NAME.yaml)")
    out.add_argument(
        "--secrets-dir", "--secrets-out", dest="secrets_dir", type=Path, metavar="DIR",
        help=f"write the Secrets to DIR/{SECRETS_FILE} (0600, directory 0700)",
    )  # fmt: skip
    out.add_argument(
        "--reuse-secrets", type=Path, metavar="DIR", help=f"take the keys from DIR/{SECRETS_FILE} of an earlier render"
    )
    out.add_argument(
        "--operator-cert-out",
        type=Path,
        metavar="DIR",
        help="also mint an operator certificate of this sandbox into DIR (new or empty; key 0600), for "
        "`--api https://HOST:PORT --cert DIR`; not with --reuse-secrets (the CA key is not kept)",
    )
    out.add_argument(
        "--print-delete",
        action="store_true",
        help="print the kubectl commands that remove this sandbox (by its id label) and nothing else",
    )
    out.add_argument(
        "--redact-secrets",
        action="store_true",
        help="print the Secrets redacted with the objects instead (documentation); nothing is minted",
    )


def _add_cluster_arguments(r: argparse.ArgumentParser) -> None:
    """The knobs every chart has, and what only the operator knows about the cluster."""
    res = r.add_argument_group("resources")
    res.add_argument(
        "--resources",
        action="append",
        default=[],
        metavar="ROLE=cpu=Q,memory=Q,limit-memory=Q",
        help="requests and memory limit of workload or control (repeatable; any subset; defaults workload "
        "cpu=250m,memory=512Mi,limit-memory=2Gi, control cpu=100m,memory=128Mi,limit-memory=512Mi). The workload "
        "container's limit holds --memory-limit plus 256Mi for the boundary",
    )
    res.add_argument(
        "--memory-limit",
        metavar="SIZE",
        help="the workload's memory limit (the boundary's --memory-limit, a cgroup inside the container; default "
        "the workload container's limit less 256Mi); the container's limit is raised to it plus 256Mi",
    )
    res.add_argument(
        "--workspace-size",
        default="10Gi",
        metavar="SIZE",
        help="the workspace emptyDir's sizeLimit (default %(default)s); the workload container's ephemeral-storage "
        "limit is this plus 1Gi",
    )
    cluster = r.add_argument_group("the cluster (what only you know)")
    cluster.add_argument(
        "--cluster-cidr",
        action="append",
        metavar="CIDR|none",
        help="a pod or node CIDR of the cluster (repeatable): control's egress excludes it, with the metadata "
        "addresses. Required; `none` renders control's egress excluding the metadata addresses only",
    )
    cluster.add_argument(
        "--service-cidr", action="append", default=[], metavar="CIDR", help="a Service CIDR to exclude (repeatable)"
    )
    cluster.add_argument(
        "--dns-peer",
        action="append",
        metavar="NS/KEY=VALUE[,KEY=VALUE][:PORT]",
        help="the cluster DNS pods, by namespace, labels and their own port (repeatable; default "
        "kube-system/k8s-app=kube-dns:53): control resolves there, and so does the proxy-pod workload",
    )
    cluster.add_argument(
        "--networkpolicy-enforced",
        action="store_true",
        help="you state that this cluster's CNI enforces NetworkPolicy, egress and ingress, in this namespace. "
        "Required by model P and the proxy-pod topology, whose only fence it is; recorded as an annotation",
    )
    cluster.add_argument(
        "--unprobed-fence",
        action="store_true",
        help="model P: no canary (control's pod address, which the workload's fence must stop): the fence is "
        "stated, never observed",
    )
    cluster.add_argument("--canary-port", type=int, default=7445, metavar="PORT", help="model P's canary port")
    cluster.add_argument(
        "--assigned-uids",
        action="store_true",
        help="the cluster assigns each pod's uid, gid and fsGroup (OpenShift restricted-v2): non-root pods get none "
        "of their own",
    )
    cluster.add_argument(
        "--block-owner-deletion",
        action="store_true",
        help="with --owner: blockOwnerDeletion on every ownerReference (needs the right to set finalizers on it)",
    )


def _read_text(path: Path, flag: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RenderError(flag, f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None


def _spec(args: argparse.Namespace) -> tuple[RenderSpec, bytes | None]:
    from ..k8s.render import check_policy, check_routes

    owner = parse_owner(args.owner) if args.owner else None
    uid = args.sandbox_uid or (owner.uid if owner else None)
    if uid is None:
        raise RenderError("--sandbox-uid", "required (or --owner, whose UID is the default)")
    if args.policy is not None:
        policy_text = _read_text(args.policy, "--policy")
        check_policy(policy_text, str(args.policy))
    else:
        policy_text = resources.files("supervisor.control").joinpath("default_policy.yaml").read_text("utf-8")
    credentials = None
    loaded = None
    if args.credentials is not None:
        from supervisor.control.credentials import Credentials, CredentialsError

        try:
            credentials = args.credentials.read_bytes()
            loaded = Credentials.load(args.credentials, environ={})
        except OSError as exc:
            raise RenderError("--credentials", f"cannot read {args.credentials}: {exc.strerror or exc}") from None
        except CredentialsError as exc:
            raise RenderError("--credentials", str(exc)) from None
    routes_text = None
    if args.inference_routes is not None:
        routes_text = _read_text(args.inference_routes, "--inference-routes")
        check_routes(routes_text, str(args.inference_routes), loaded)
    if args.agent_argv[:1] == ["--"]:
        args.agent_argv = args.agent_argv[1:]
    role_resources = _resources(args.resources)
    spec = RenderSpec(
        namespace=args.namespace, sandbox=args.sandbox, sandbox_uid=uid, image=args.image,
        control_image=args.control_image, agent_argv=tuple(args.agent_argv), policy_text=policy_text,
        model=Model(args.privilege_model or Model.R), topology=Topology(args.topology), generation=args.generation,
        owner=owner, owner_namespace=args.owner_namespace, operator_namespace=args.operator_namespace,
        api_port=args.api_port, api_listen=args.api_listen, boundary_port=args.boundary_port,
        metrics_port=args.metrics_port, metrics_namespace=args.metrics_namespace,
        agent_user=args.agent_user,
        workdir=args.workdir, has_credentials=credentials is not None, inference_routes_text=routes_text,
        seccomp_localhost=args.seccomp_localhost,
        runtime_class=args.runtime_class, affinity=Affinity(args.affinity), proxy_port=args.proxy_port,
        proxy_user=args.proxy_uid, read_only_root=args.read_only_root,
        dns_peers=tuple(parse_dns_peer(p) for p in args.dns_peer) if args.dns_peer is not None else None,
        workload_resources=role_resources.get("workload"), control_resources=role_resources.get("control",
        DEFAULT_CONTROL_RESOURCES), memory_limit=_size(args.memory_limit, "--memory-limit"),
        workspace_size=_size(args.workspace_size, "--workspace-size") or 0,
        allow_mutable_image=args.allow_mutable_image, entrypoint=args.entrypoint,
        block_owner_deletion=args.block_owner_deletion, cluster_cidrs=_cluster_cidrs(args.cluster_cidr),
        service_cidrs=tuple(parse_cidr(c, "--service-cidr") for c in args.service_cidr),
        networkpolicy_enforced=args.networkpolicy_enforced, unprobed_fence=args.unprobed_fence,
        canary_port=args.canary_port, assigned_uids=args.assigned_uids,
    )  # fmt: skip
    if spec.topology is Topology.PROXY_POD and args.privilege_model is not None:
        raise RenderError("--privilege-model", "the proxy-pod workload runs no boundary, hence no privilege model")
    return spec, credentials


def _size(text: str | None, flag: str) -> int | None:
    from ..k8s.quantity import parse_bytes

    try:
        return None if text is None else parse_bytes(text, flag)
    except ValueError as exc:
        raise RenderError(flag, str(exc).removeprefix(f"{flag}: ")) from None


def _resources(items: list[str]) -> dict[str, Resources]:
    defaults = {"workload": DEFAULT_WORKLOAD_RESOURCES, "control": DEFAULT_CONTROL_RESOURCES}
    out: dict[str, Resources] = {}
    for item in items:
        role, eq, rest = item.partition("=")
        if not eq or role not in defaults:
            raise RenderError("--resources", f"{item!r} is not workload=… or control=…")
        try:
            out[role] = out.get(role, defaults[role]).with_text(rest, "--resources")
        except ValueError as exc:
            raise RenderError("--resources", str(exc).removeprefix("--resources: ")) from None
    return out


def _cluster_cidrs(items: list[str] | None) -> tuple[str, ...] | None:
    if items is None:
        return None
    if items == ["none"]:
        return ()
    if "none" in items:
        raise RenderError("--cluster-cidr", "none cannot be combined with a CIDR")
    return tuple(parse_cidr(c, "--cluster-cidr") for c in items)


def _print_delete(args: argparse.Namespace) -> int:
    from ..k8s.names import is_dns_label, is_label_value

    owner = parse_owner(args.owner) if args.owner else None
    uid = args.sandbox_uid or (owner.uid if owner else None)
    if uid is None:
        raise RenderError("--sandbox-uid", "required (or --owner, whose UID is the default)")
    if not is_dns_label(args.namespace):
        raise RenderError("--namespace", f"{args.namespace!r} is not a DNS label")
    if not is_label_value(uid):
        raise RenderError("--sandbox-uid", f"{uid!r} is not a Kubernetes UID (a label value)")
    print(" && \\\n  ".join(delete_commands(args.namespace, uid)))
    return ExitCode.OK


def _summary(spec: RenderSpec, rendered: Rendered) -> None:
    """What the operator should know about this render, on stderr (the objects may be on stdout)."""
    if spec.allow_mutable_image:
        print(f"k8s render: warning: --image {spec.image} is a tag: the `image` claim names a reference that can "
              "move, so it no longer proves which image was admitted", file=sys.stderr)  # fmt: skip
    for cidr, ports in rendered.internal_allows:
        print(f"k8s render: control's egress admits {cidr} on {','.join(map(str, ports))} inside an excluded range "
              "(allowed_ips of the policy or the routes)", file=sys.stderr)  # fmt: skip
    print("k8s render: to remove this sandbox: " + " && ".join(delete_commands(spec.namespace, spec.sandbox_uid)),
          file=sys.stderr)  # fmt: skip


def _render(args: argparse.Namespace) -> int:
    from ..k8s.names import SandboxNames
    from ..k8s.render import claims_for, render, to_yaml
    from ..k8s.secrets import (
        check_material,
        check_operator_dir,
        issue_material,
        load_material,
        write_operator_dir,
        write_secrets_file,
    )

    if args.print_delete:
        return _print_delete(args)
    if args.redact_secrets and (args.secrets_dir or args.reuse_secrets):
        raise RenderError("--redact-secrets", "cannot be combined with --secrets-dir or --reuse-secrets")
    if not args.redact_secrets and args.secrets_dir is None:
        raise RenderError("--secrets-dir", "required: Secrets are never written to stdout (or pass --redact-secrets)")
    if args.operator_cert_out is not None:
        if args.redact_secrets or args.reuse_secrets:
            raise RenderError("--operator-cert-out", "needs freshly minted keys (not --redact-secrets/--reuse-secrets)")
        if not args.api_listen:
            raise RenderError("--operator-cert-out", "needs --api-listen (the certificate is for control's TCP API)")
        check_operator_dir(args.operator_cert_out)
    spec, credentials = _spec(args)
    names = SandboxNames.of(spec.sandbox, spec.sandbox_uid)
    proxy_pod = spec.topology is Topology.PROXY_POD
    if args.redact_secrets:
        rendered = render(spec, None)
        text = to_yaml([*rendered.objects, *rendered.secrets])
    else:
        claims = claims_for(spec, names)
        if args.reuse_secrets is not None:
            material = load_material(args.reuse_secrets, names, proxy_pod=proxy_pod)
            check_material(material, claims, spec.policy_digest, args.reuse_secrets / SECRETS_FILE)
            if credentials is not None and material.credentials not in (None, credentials):
                raise RenderError("--credentials", "differs from the reused credentials Secret (immutable)")
            if credentials is None and material.credentials is not None:
                raise RenderError("--credentials", "the reused Secrets hold credentials: pass the same file")
            if credentials is not None and material.credentials is None:
                raise RenderError("--credentials", "the reused Secrets hold no credentials Secret")
        else:
            material = issue_material(claims, spec.policy_digest, validity=args.validity, credentials=credentials,
                                      operator=args.operator_cert_out is not None, proxy_pod=proxy_pod)  # fmt: skip
        rendered = render(spec, material)
        text = to_yaml(rendered.objects)
        same = args.reuse_secrets is not None and (args.reuse_secrets.resolve() == args.secrets_dir.resolve())
        path = write_secrets_file(args.secrets_dir, to_yaml(rendered.secrets), replace=same)
        print(f"k8s render: wrote {len(rendered.secrets)} Secrets to {path} (0600)", file=sys.stderr)
        if args.operator_cert_out is not None and material.operator is not None:
            write_operator_dir(args.operator_cert_out, material.operator)
            print(f"k8s render: wrote the operator certificate to {args.operator_cert_out} "
                  f"(--api https://HOST:{spec.api_port} --cert {args.operator_cert_out})", file=sys.stderr)  # fmt: skip
    _summary(spec, rendered)
    if args.out is None or str(args.out) == "-":
        sys.stdout.write(text)
    else:
        target = args.out / f"{spec.sandbox}.yaml" if args.out.is_dir() else args.out
        try:
            target.write_text(text, encoding="utf-8")
        except OSError as exc:
            print(f"k8s render: --out: cannot write {target}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_FAILED
    return ExitCode.OK


def run_k8s(args: argparse.Namespace) -> int:
    if getattr(args, "k8s_command", None) != "render":
        print(f"k8s: unknown command {getattr(args, 'k8s_command', None)!r}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        return _render(args)
    except RenderError as exc:
        print(f"k8s render: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except BundleError as exc:
        print(f"k8s render: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:
        print(f"k8s render: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
