"""``openshell-sandbox certs issue``: mint a sandbox's bootstrap bundle (docs/design.md "Bootstrap bundle per role").

Exit codes: 0 written; 2 usage (a flag is missing or its value is not a valid claim or duration); 1 anything
else (the bundle exists, a file cannot be written). Every error message names the flag or the file.
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from pathlib import Path

from ..protocol.certs import DEFAULT_VALIDITY, VALIDITY_SUBJECTS, BundleError, issue_bundle, issue_operator
from ..protocol.claims import CLAIM_FIELDS, Claims, ClaimsError, Role
from ..protocol.exit_codes import ExitCode

__all__ = ["add_certs_parser", "parse_bound", "parse_validity", "resolve_bounds", "run_certs"]

EXIT_FAILED = 1

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_VALIDITY = re.compile(r"([0-9]{1,9})([dhms])")

_ISSUE_DESCRIPTION = """\
Mint the bootstrap material of one sandbox: a fresh per-sandbox CA, a control leaf and a boundary leaf
(ECDSA P-256), each carrying the sandbox's claims and its role. Writes

  OUT/control/   ca.pem cert.pem key.pem claims.json   (mount into the control pod only)
  OUT/boundary/  ca.pem cert.pem key.pem claims.json   (mount into the workload pod only)

With --operator, also

  OUT/operator/  ca.pem cert.pem key.pem claims.json   (for a person or tool: control's TCP API, --api-listen)

The operator certificate is accepted only by control's operator API over TCP (--api-listen), never on a link.
Without --operator the bundle is exactly the two directories above; a later operator certificate needs the CA
key (--ca-key-out now, then `certs operator`).

key.pem is mode 0600 and the directories 0700. The CA key is discarded unless --ca-key-out is given: nothing
at runtime needs it, and renewal is a new pod. An existing non-empty OUT/control or OUT/boundary is never
overwritten. Every claim must match exactly on both sides or the link is refused, naming the claim.
"""

_CLAIM_HELP = {
    "namespace": "Kubernetes namespace of the sandbox",
    "sandbox": "sandbox name",
    "sandbox_uid": "sandbox object UID (a recreated sandbox with the same name gets a new one)",
    "control_deployment": "name of this sandbox's control Deployment",
    "network_policy": "name of the workload pod's NetworkPolicy (the fence observed before release)",
    "image": "admitted workload image, ideally by digest (registry/agent@sha256:...)",
    "generation": "Sandbox spec generation, an integer >= 0",
    "policy_resource": "policy object governing the sandbox, e.g. ConfigMap/NAME@UID",
}

_CLAIM_METAVAR = {
    "namespace": "NS",
    "sandbox": "NAME",
    "sandbox_uid": "UID",
    "control_deployment": "DEPLOYMENT",
    "network_policy": "NP",
    "image": "IMG",
    "generation": "N",
    "policy_resource": "RESOURCE",
}


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def parse_validity(text: str) -> datetime.timedelta:
    """``30d``, ``12h``, ``90m`` or ``3600s``; positive."""
    match = _VALIDITY.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30d, 12h, 90m or 3600s")
    seconds = int(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be longer than zero")
    if seconds > 100 * 366 * 86400:
        raise argparse.ArgumentTypeError(f"{text!r} is longer than a hundred years")
    return datetime.timedelta(seconds=seconds)


_OFFSET = re.compile(r"([+-])([0-9]{1,9})([dhms])")
When = datetime.datetime | datetime.timedelta  # an absolute time, or an offset from the moment of issuing


def parse_bound(text: str) -> tuple[tuple[str, ...], When]:
    """``[ROLE=]TIME`` for ``--not-before``/``--not-after``: ROLE is ca, control, boundary or operator (none: every
    certificate issued);
    TIME is ``now``, an offset from now (``+90s``, ``-5m``, ``+2h``, ``-1d``) or an RFC 3339 UTC time
    (``2026-12-01T15:00:00Z``)."""
    role, sep, when = text.partition("=")
    if not sep:
        role, when = "", text
    if role and role not in VALIDITY_SUBJECTS:
        raise argparse.ArgumentTypeError(f"{role!r} is not one of {', '.join(VALIDITY_SUBJECTS)}")
    subjects = (role,) if role else VALIDITY_SUBJECTS
    when = when.strip()
    if when == "now":
        return subjects, datetime.timedelta(0)
    match = _OFFSET.fullmatch(when)
    if match is not None:
        offset = datetime.timedelta(seconds=int(match.group(2)) * _UNITS[match.group(3)])
        return subjects, -offset if match.group(1) == "-" else offset
    try:
        moment = datetime.datetime.fromisoformat(when.replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.utcoffset() != datetime.timedelta(0):
        raise argparse.ArgumentTypeError(
            f"{when!r} is not now, an offset like +90s or -5m, or a UTC time like 2026-12-01T15:00:00Z"
        )
    return subjects, moment


def resolve_bounds(
    bounds: list[tuple[tuple[str, ...], When]] | None, now: datetime.datetime
) -> dict[str, datetime.datetime]:
    """The exact times per certificate; a later flag for the same certificate wins."""
    out: dict[str, datetime.datetime] = {}
    for subjects, when in bounds or ():
        moment = now + when if isinstance(when, datetime.timedelta) else when
        for subject in subjects:
            out[subject] = moment
    return out


def _generation(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def add_certs_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``certs`` (with its sub-command ``issue``) to a parent parser's sub-commands."""
    certs = subparsers.add_parser(
        "certs",
        help="mint the per-sandbox CA and leaf certificates",
        description="Manage a sandbox's bootstrap certificates.",
    )
    certs.set_defaults(func=run_certs)
    actions = certs.add_subparsers(dest="certs_command", metavar="COMMAND", required=True)
    _add_issue_parser(actions)
    _add_operator_parser(actions)


def _add_issue_parser(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``certs issue``: the claims, the validity (or exact bounds, for testing skew), and what else to write."""
    issue = actions.add_parser(
        "issue",
        help="write OUT/control and OUT/boundary bootstrap bundles",
        description=_ISSUE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    issue.add_argument("--out", required=True, type=Path, metavar="DIR", help="output directory (created 0700)")
    claims = issue.add_argument_group("claims (all required; compared exactly by both daemons)")
    for field in CLAIM_FIELDS:
        claims.add_argument(
            _flag(field),
            dest=field,
            required=True,
            type=_generation if field == "generation" else str,
            metavar=_CLAIM_METAVAR[field],
            help=_CLAIM_HELP[field],
        )
    issue.add_argument(
        "--validity",
        type=parse_validity,
        default=DEFAULT_VALIDITY,
        metavar="DURATION",
        help="lifetime of the CA and both leaves: 30d, 12h, 90m or 3600s (default 30d); "
        "not-before is 5 minutes before now",
    )
    issue.add_argument(
        "--not-before",
        action="append",
        type=parse_bound,
        metavar="[ROLE=]TIME",
        help="start of validity, exactly, for one certificate (ROLE: ca, control, boundary or operator; none: "
        "every one issued); TIME: now, an offset like -5m or +30s, or a UTC time like 2026-12-01T15:00:00Z. "
        "Repeatable. For testing clock skew: a not-yet-valid leaf is refused by its peer until then",
    )
    issue.add_argument(
        "--not-after",
        action="append",
        type=parse_bound,
        metavar="[ROLE=]TIME",
        help="end of validity, exactly, for one certificate (same forms as --not-before; overrides --validity for "
        "it). Repeatable; e.g. --not-after control=-1m mints an already expired control leaf",
    )
    issue.add_argument(
        "--ca-key-out",
        type=Path,
        metavar="PATH",
        help="also write the CA private key here (0600; refuses to overwrite). Keep it out of every pod; "
        "`certs operator` needs it to mint a later operator certificate",
    )
    issue.add_argument(
        "--operator",
        action="store_true",
        help="also write OUT/operator: a certificate for control's TCP operator API (--api-listen), bound to the "
        "same claims; refused on both link ports",
    )


def _add_operator_parser(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``certs operator``: a later operator certificate, from an issued bundle and its kept CA key."""
    operator = actions.add_parser(
        "operator",
        help="mint a later operator certificate with a kept CA key",
        description="Mint an operator certificate for an issued sandbox: the CA certificate and claims are read "
        "from one of its role directories (--bundle, e.g. OUT/control), the CA key from --ca-key (kept by "
        "`certs issue --ca-key-out`). Writes ca.pem cert.pem key.pem claims.json into --out (created 0700).",
    )
    operator.add_argument("--out", required=True, type=Path, metavar="DIR", help="output directory (new or empty)")
    operator.add_argument("--bundle", required=True, type=Path, metavar="DIR", help="an issued role directory")
    operator.add_argument("--ca-key", required=True, type=Path, metavar="PATH", help="the sandbox CA's key (0600)")
    operator.add_argument(
        "--validity", type=parse_validity, default=DEFAULT_VALIDITY, metavar="DURATION", help="lifetime (default 30d)"
    )
    operator.add_argument("--not-before", type=_operator_bound, metavar="TIME", help="start of validity, exactly")
    operator.add_argument(
        "--not-after", type=_operator_bound, metavar="TIME", help="end of validity, exactly (e.g. -1m: expired)"
    )


def _operator_bound(text: str) -> When:
    subjects, when = parse_bound(text if "=" in text else f"operator={text}")
    if subjects != ("operator",):
        raise argparse.ArgumentTypeError(f"{text!r}: only the operator certificate is minted here")
    return when


def _claims_from_args(args: argparse.Namespace) -> Claims:
    return Claims(**{field: getattr(args, field) for field in CLAIM_FIELDS})


def run_certs(args: argparse.Namespace) -> int:
    """Run a parsed ``certs`` command; returns the process exit code."""
    if getattr(args, "certs_command", None) == "operator":
        return _run_operator(args)
    if getattr(args, "certs_command", None) != "issue":
        print(f"certs: unknown command {getattr(args, 'certs_command', None)!r}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        claims = _claims_from_args(args)
    except ClaimsError as exc:
        flag = _flag(exc.field) if exc.field else "claims"
        print(f"certs issue: {flag}: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    validity: datetime.timedelta = args.validity
    now = datetime.datetime.now(datetime.UTC)
    named = [subjects for subjects, _ in (args.not_before or []) + (args.not_after or []) if len(subjects) == 1]
    if not args.operator and ("operator",) in named:
        print("certs issue: --not-before/--not-after: operator=...: no operator certificate without --operator",
              file=sys.stderr)  # fmt: skip
        return ExitCode.USAGE
    not_before = resolve_bounds(args.not_before, now)
    not_after = resolve_bounds(args.not_after, now)
    if not args.operator:
        not_before.pop("operator", None)
        not_after.pop("operator", None)
    try:
        issue_bundle(
            args.out, claims, validity=validity, ca_key_out=args.ca_key_out, now=now,
            not_before=not_before, not_after=not_after, operator=args.operator,
        )  # fmt: skip
    except ValueError as exc:  # an empty validity window: nothing was written
        print(f"certs issue: --not-before/--not-after: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except BundleError as exc:
        print(f"certs issue: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:
        print(f"certs issue: {exc.filename or args.out}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    until = not_after.get("control", now + validity).strftime("%Y-%m-%dT%H:%M:%SZ")
    ca_key = f"CA key in {args.ca_key_out}" if args.ca_key_out else "CA key discarded"
    wrote = (
        f"{args.out / 'control'}, {args.out / 'boundary'} and {args.out / 'operator'}"
        if args.operator
        else (f"{args.out / 'control'} and {args.out / 'boundary'}")
    )
    print(
        f"certs issue: wrote {wrote} for "
        f"{claims.namespace}/{claims.sandbox} generation {claims.generation}, valid until {until}, {ca_key}",
        file=sys.stderr,
    )
    return ExitCode.OK


def _run_operator(args: argparse.Namespace) -> int:
    now = datetime.datetime.now(datetime.UTC)

    def moment(when: When | None) -> datetime.datetime | None:
        if when is None:
            return None
        return now + when if isinstance(when, datetime.timedelta) else when

    try:
        issue_operator(
            args.out, args.bundle, args.ca_key, validity=args.validity, now=now,
            not_before=moment(args.not_before), not_after=moment(args.not_after),
        )  # fmt: skip
    except ValueError as exc:
        print(f"certs operator: --not-before/--not-after: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except BundleError as exc:
        print(f"certs operator: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"certs operator: wrote {args.out} ({Role.OPERATOR} certificate for control's TCP API)", file=sys.stderr)
    return ExitCode.OK
