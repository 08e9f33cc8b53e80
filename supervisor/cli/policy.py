"""``openshell-sandbox policy check|decide|get|apply|suggest``: how operators test a policy before they ship it.

* ``policy check FILE [--json] [--strict]`` — exit 0 and ``ok: N rules, M endpoints``, or exit 1 with every
  error as ``FILE:LINE: PATH: message (expected ...)``. Warnings go to stderr and never change the exit code;
  binary paths that match no file on this machine are warnings, errors with ``--strict``.
* ``policy decide --policy FILE --host H --port N [--binary PATH] [--ancestor PATH]... [--sha256 HEX]
  [--loader-env NAME]... [--binary-identity relaxed] [--method M --path P] [--rpc-method NAME | --mcp-tool NAME |
  --graphql DOC|@FILE] [--json]`` — one readable line (or JSON with result, rule, endpoint, reason and, for the
  agent's own protocols, the operation); exit 0 when allowed (audit included), 1 when denied, 2 for a usage error
  or an invalid policy. ``--rpc-method``, ``--mcp-tool`` and ``--graphql`` build the request body a client would
  POST (to ``--path``, default the endpoint's own path) and decide it as control does on the inspected path.
  ``--generation N`` instead of ``--policy`` decides against the running sandbox's policy in force, asked through
  its API, and is refused when another generation is in force by now.
* ``policy get [--yaml]`` — the running sandbox's generation and status; ``--yaml`` prints the policy in force.
* ``policy apply FILE`` — install FILE as the running sandbox's next generation.
* ``policy suggest`` — the revision that would allow what was denied (``policy_suggest.py``); never applied.

Presentation over ``supervisor.control.policy``; only ``get``, ``apply``, ``suggest`` (live) and ``decide
--generation`` ask a daemon.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlencode

from supervisor.cli.api_client import add_api_arguments
from supervisor.cli.policy_binaries import absent_binaries
from supervisor.cli.policy_suggest import add_suggest_parser, run_suggest
from supervisor.control.policy import (
    BinaryIdentity,
    CompiledPolicy,
    Decision,
    L4Request,
    Policy,
    PolicyError,
    PolicyInvalid,
    body_route,
    compile_policy,
    decide_l4,
    decide_l7,
    load_policy_file,
    load_policy_text,
)
from supervisor.control.policy.egress_fence import EgressFence
from supervisor.control.policy.globs import has_glob_chars
from supervisor.protocol.exit_codes import ExitCode
from supervisor.protocol.json_value import JsonValue

EXIT_ALLOW = 0
EXIT_DENY = 1


def add_policy_parser(subparsers: Any) -> None:
    """Add ``policy`` with its ``check`` and ``decide`` subcommands to an argparse subparsers object."""
    policy = subparsers.add_parser(
        "policy",
        help="check a policy file or ask it for a decision",
        description="Validate a policy file or test a decision against it.",
    )
    policy.set_defaults(handler=run_policy)
    sub = policy.add_subparsers(dest="policy_command", metavar="{check,decide,get,apply,suggest}")
    sub.required = True

    _add_check_parser(sub)
    _add_decide_parser(sub)
    _add_live_parsers(sub)
    add_suggest_parser(sub)


def _add_check_parser(sub: Any) -> None:
    """``check``: validate a file, with the ranges control's NetworkPolicy excludes."""
    check = sub.add_parser(
        "check",
        help="validate a policy file and list every error",
        description="Validate FILE; exit 0 when valid, 1 with every error otherwise.",
    )
    check.add_argument("file", type=Path, metavar="FILE")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.add_argument(
        "--egress-excluded",
        action="append",
        default=[],
        metavar="CIDR",
        help="a range control's NetworkPolicy excludes (repeatable; as k8s render passes control): warn when an "
        "allowed_ips entry lies in one",
    )
    check.add_argument(
        "--egress-admitted",
        action="append",
        default=[],
        metavar="CIDR:PORT[,PORT]",
        help="an explicit allow rendered inside an excluded range (repeatable): no warning for it",
    )
    check.add_argument("--strict", action="store_true",
                       help="binary paths that match no file on this machine are errors, not warnings")  # fmt: skip


def _add_decide_parser(sub: Any) -> None:
    """``decide``: one connection, who makes it, and optionally one request, against a file or the running
    generation."""
    decide = sub.add_parser(
        "decide",
        help="decide one connection (and optionally one request)",
        description="Decide a connection against a policy; exit 0 allow, 1 deny, 2 usage or an invalid policy.",
    )
    source = decide.add_mutually_exclusive_group(required=True)
    source.add_argument("--policy", type=Path, metavar="FILE")
    source.add_argument("--generation", type=int, metavar="N",
                        help="the running sandbox's policy generation N (refused once another is in force), asked "
                             "through its API (--api) instead of a file")  # fmt: skip
    decide.add_argument("--host", required=True, help="destination host name or IP address")
    decide.add_argument("--port", type=int, required=True)
    decide.add_argument("--binary", metavar="PATH", help="executable of the calling process")
    decide.add_argument(
        "--ancestor",
        action="append",
        default=[],
        metavar="PATH",
        help="ancestor executable, nearest parent first (repeatable)",
    )
    decide.add_argument("--sha256", metavar="HEX", help="sha256 of the executable (informational here)")
    decide.add_argument("--loader-env", action="append", default=[], metavar="NAME",
                        choices=("LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH"),
                        help="a loader variable the process started with (repeatable): only binary entries with "
                             "allow_loader_env match it")  # fmt: skip
    decide.add_argument("--binary-identity", choices=("strict", "relaxed"), default="strict",
                        help="relaxed: decide as the proxy-pod topology does — destination only, binaries lists "
                             "ignored (default strict)")  # fmt: skip
    decide.add_argument("--method", help="HTTP method, for an L7 decision (needs --path)")
    decide.add_argument("--path", help="HTTP request target, for an L7 decision (needs --method)")
    body = decide.add_mutually_exclusive_group()
    body.add_argument("--rpc-method", metavar="NAME", help="decide a JSON-RPC call of method NAME")
    body.add_argument("--mcp-tool", metavar="NAME", help="decide an MCP tools/call of tool NAME")
    body.add_argument("--graphql", metavar="DOC", help="decide a GraphQL document (or @FILE to read it from FILE)")
    decide.add_argument("--json", action="store_true", help="print one JSON object")
    add_api_arguments(decide)


def _add_live_parsers(sub: Any) -> None:
    """``get`` and ``apply``: the running sandbox's policy, through its API."""
    get = sub.add_parser(
        "get",
        help="show the running sandbox's policy generation and status (--yaml: the policy in force)",
        description="Ask the running sandbox's control which policy generation is in force.",
    )
    get.add_argument("--yaml", action="store_true",
                     help="print the policy in force (normalised: comments and formatting are not kept), a file "
                          "`policy check` and `policy decide --policy` take")  # fmt: skip
    add_api_arguments(get)
    apply = sub.add_parser(
        "apply",
        help="install FILE as the running sandbox's next policy generation",
        description="Validate FILE in control and make it generation N+1; an invalid file is "
        "refused with every error and nothing changes.",
    )
    apply.add_argument("file", type=Path, metavar="FILE")
    add_api_arguments(apply)


def run_policy(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    command = getattr(args, "policy_command", None)
    if command == "check":
        return _check(args, out, err)
    if command == "decide":
        return _decide(args, out, err)
    if command in ("get", "apply"):
        return _remote(args, out, err)
    if command == "suggest":
        return run_suggest(args, out, err)
    print("policy: expected a subcommand: check, decide, get, apply or suggest", file=err)
    return ExitCode.USAGE


def _check(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    path: Path = args.file
    try:
        fence = EgressFence.parse(args.egress_excluded, args.egress_admitted)
    except ValueError as exc:
        print(f"policy check: {exc}", file=err)
        return ExitCode.USAGE
    try:
        policy = load_policy_file(path)
    except PolicyInvalid as exc:
        if args.json:
            _dump(out, {"ok": False, "file": str(path), "errors": list(exc.to_json())})  # a list of JSON values
        else:
            for error in exc.errors:
                print(error, file=out)
            count = len(exc.errors)
            print(f"{path}: {count} error{'s' if count != 1 else ''}", file=err)
        return 1
    absent = absent_binaries(policy, path)
    if getattr(args, "strict", False) and absent:
        errors = [PolicyError(w.path, w.message, None, w.line, w.source) for w in absent]
        if args.json:
            _dump(out, {"ok": False, "file": str(path), "errors": [e.to_json() for e in errors]})
        else:
            for error in errors:
                print(error, file=out)
            print(f"{path}: {len(errors)} error{'s' if len(errors) != 1 else ''} (--strict)", file=err)
        return 1
    warnings = [*policy.warnings, *fence.warnings(policy, str(path)), *absent]
    if args.json:
        _dump(
            out,
            {
                "ok": True,
                "file": str(path),
                "rules": policy.rule_count,
                "endpoints": policy.endpoint_count,
                "hash": policy.digest,
                "warnings": [w.to_json() for w in warnings],
            },
        )
    else:
        for warning in warnings:
            print(warning, file=err)
        print(f"ok: {policy.rule_count} rules, {policy.endpoint_count} endpoints", file=out)
    return 0


def _decide(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    rpc = args.rpc_method is not None or args.mcp_tool is not None or args.graphql is not None
    if (args.method is None) != (args.path is None) and not rpc:
        print("policy decide: --method and --path go together", file=err)
        return ExitCode.USAGE
    if not 1 <= args.port <= 65535:
        print(f"policy decide: --port {args.port} is outside 1..65535", file=err)
        return ExitCode.USAGE
    if args.generation is not None:
        in_force = _policy_in_force(args, err, generation=args.generation)
        if isinstance(in_force, int):
            return ExitCode.USAGE if in_force == 1 else in_force
        policy = in_force
    else:
        try:
            policy = load_policy_file(args.policy)
        except PolicyInvalid as exc:
            for error in exc.errors:
                print(error, file=err)
            print(f"policy decide: {args.policy} is not a valid policy (run: policy check {args.policy})", file=err)
            return ExitCode.USAGE
    compiled = compile_policy(policy)
    identity = None
    if args.binary:
        identity = BinaryIdentity(args.binary, args.sha256, tuple(args.ancestor),
                                  loader_env=tuple(sorted(set(args.loader_env))))  # fmt: skip
    relaxed = args.binary_identity == "relaxed"
    if relaxed and any(rule.binaries for rule in policy.network_policies):
        print("policy decide: binary identity is relaxed: the policy's binaries lists are ignored", file=err)
    decision = decide_l4(compiled, L4Request(args.host, args.port, identity, relaxed=relaxed))
    if rpc and decision.allowed:
        decided = _decide_body(args, compiled, decision, err)
        if decided is None:
            return ExitCode.USAGE
        decision = decided
    elif args.method is not None and decision.allowed:
        decision = decide_l7(compiled, decision, args.method, args.path)
    if args.json:
        body = decision.to_json()
        body["policy"] = str(args.policy) if args.policy is not None else f"generation {args.generation}"
        body["hash"] = compiled.digest
        _dump(out, body)
    else:
        print(decision.describe(), file=out)
    return EXIT_ALLOW if decision.allowed else EXIT_DENY


def _decide_body(args: argparse.Namespace, policy: CompiledPolicy, l4: Decision, err: TextIO) -> Decision | None:
    """``--rpc-method``, ``--mcp-tool``, ``--graphql``: the body a client would send, decided as control does."""
    from supervisor.control.l7.body import BodyRequest
    from supervisor.control.l7.body_decide import evaluate

    path = args.path
    if path is None:  # the endpoint's own path, when it names one literally
        paths = [c.endpoint.path for c in policy.endpoints_for(l4.host, l4.port) if c.endpoint.protocol.reads_body]
        path = next((p for p in paths if p and not has_glob_chars(p)), "/")
    method = (args.method or "POST").upper()
    route = body_route(policy, l4, method, path)
    if route is None:
        print(f"policy decide: {method} {path} on {l4.host}:{l4.port} reaches no graphql, json-rpc or mcp "
              "endpoint (try --path)", file=err)  # fmt: skip
        return None
    ctype = "application/json"
    if args.graphql is not None:
        document = args.graphql
        if document.startswith("@"):
            try:
                document = Path(document[1:]).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                print(f"policy decide: cannot read {document[1:]}: {exc}", file=err)
                return None
        body: dict[str, JsonValue] = {"query": document}
    elif args.mcp_tool is not None:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": args.mcp_tool, "arguments": {}}}
    else:
        body = {"jsonrpc": "2.0", "id": 1, "method": args.rpc_method}
    if method in ("GET", "DELETE"):  # GraphQL over GET: the document in the query string
        query = urlencode({"query": body["query"]}) if args.graphql is not None else None
        return evaluate(route, BodyRequest(method, query, None, False, b""))
    return evaluate(route, BodyRequest(method, None, ctype, False, json.dumps(body).encode()))


def _dump(out: TextIO, body: JsonValue) -> None:
    out.write(json.dumps(body, indent=2, sort_keys=False) + "\n")


def _policy_in_force(args: argparse.Namespace, err: TextIO, *, generation: int | None) -> Policy | int:
    """The running sandbox's policy in force (through its API), or the exit code after saying why not: 1 when it
    is not ``generation`` or nothing is in force (quarantine), 125 when the API cannot be asked."""
    import trio

    from supervisor.cli.api_client import ApiError, find_api, request_json

    try:
        status, body = trio.run(request_json, find_api(args.api, args.cert), "GET", "/v1/policy?content=1")
    except ApiError as exc:
        print(f"policy: {exc}", file=err)
        return ExitCode.SELF_FAILED
    if status != 200:
        print(f"policy: {body.get('reason') or f'HTTP {status}'}", file=err)
        return ExitCode.SELF_FAILED
    now = body.get("generation")
    if generation is not None and now != generation:
        print(f"policy: generation {generation} is not the one in force (generation {now} is)", file=err)
        return 1
    content = body.get("policy")
    if not isinstance(content, dict):
        print(f"policy: nothing is in force: generation {now} is {body.get('status')} (every connection is denied)",
              file=err)  # fmt: skip
        return 1
    import yaml

    try:
        return load_policy_text(yaml.safe_dump(content, sort_keys=False), f"generation {now} from {body.get('source')}")
    except PolicyInvalid as exc:  # control's own normalised form: it loads, or control and we disagree
        print(f"policy: control's generation {now} does not load here: {exc}", file=err)
        return ExitCode.SELF_FAILED


def _remote(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``policy get`` / ``policy apply``: the running sandbox's control, through its operator API."""
    import trio

    from supervisor.cli.api_client import ApiError, find_api, request_json

    if args.policy_command == "get" and args.yaml:
        policy = _policy_in_force(args, err, generation=None)
        if isinstance(policy, int):
            return policy
        import yaml

        print(f"# {policy.source}, the policy in force (normalised)", file=out)
        out.write(yaml.safe_dump(policy.to_json(), sort_keys=False, allow_unicode=True))
        return 0
    try:
        api = find_api(args.api, args.cert)
        if args.policy_command == "get":
            status, body = trio.run(request_json, api, "GET", "/v1/policy")
        else:
            try:
                text = args.file.read_bytes()
            except OSError as exc:
                print(f"{args.file}: cannot read: {exc.strerror}", file=err)
                return ExitCode.USAGE
            status, body = trio.run(request_json, api, "PUT", "/v1/policy", text)
    except ApiError as exc:
        print(f"policy: {exc}", file=err)
        return ExitCode.SELF_FAILED
    if status != 200:
        for error in body.get("errors", []):
            where = f"{args.file}:{error.get('line')}: " if error.get("line") else ""
            print(f"{where}{error.get('path')}: {error.get('message')}", file=err)
        print(f"policy: {body.get('reason') or f'HTTP {status}'}; nothing changed", file=err)
        return 1
    for warning in body.get("warnings") or []:  # e.g. an allowed_ips range control's NetworkPolicy excludes
        print(f"policy: warning: {warning.get('path')}: {warning.get('message')}", file=err)
    print(json.dumps(body, indent=2, sort_keys=True), file=out)
    return 0
