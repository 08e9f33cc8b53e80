"""Validation of process-operation requests: exec, signal, wait, terminate, forward
(docs/reference/boundary.md §2.3–§3).

Rules this module enforces:

1. Every request body is a JSON object with known keys only; anything else is ``invalid`` naming the field.
2. argv: 1..1024 strings, each ≤ 32 KiB of UTF-8, no NUL, argv[0] non-empty. It is executed directly, never
   through a shell.
3. env: keys match ``^[A-Za-z_][A-Za-z0-9_]*$`` (so ``=`` and NUL can never appear in a key), values are
   strings ≤ 32 KiB with no NUL. Managed keys (proxy and CA trust, spec §6.5) and every ``OPENSHELL_*`` key are
   refused: the boundary sets those and a request must not override them.
4. cwd: absolute, ≤ 4096 bytes, no NUL or newline.
5. Signals by name from a closed allow-list; no numbers, no real-time signals, no signal 0.
6. Handles are ``p_`` + 16 lowercase hex digits; a PID is never accepted.
7. Forward targets (§3): one pair of brackets stripped; ``localhost`` (ASCII, any case, exactly) means
   ``127.0.0.1``; anything else must be an IP literal (no DNS, no zone id, no shorthand like ``127.1``) →
   else ``invalid``. IPv4-mapped IPv6 is reduced to IPv4, then the address must be loopback and the port must
   not be one of the boundary's own → else ``denied``.

Everything here is pure: parsed dataclasses out, :class:`OpError` raised. Each request's ``from_wire`` is its
parser and its ``to_wire`` the object control sends; ``wait`` and ``terminate`` answer an ``ExitResult``
(exit_result.py), ``signal`` a :class:`SignalReply`.
"""

from __future__ import annotations

import enum
import ipaddress
import math
import re
import signal as _signal
import socket
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.json_value import JsonValue

__all__ = [
    "ALLOWED_SIGNALS",
    "CA_ADDING_KEYS",
    "CA_REPLACING_KEYS",
    "MANAGED_ENV_KEYS",
    "ExecRequest",
    "ForwardTarget",
    "SignalReply",
    "SignalRequest",
    "SignalScope",
    "TerminateRequest",
    "WaitRequest",
    "is_forward_probe",
    "is_managed_env_key",
    "parse_exec_request",
    "parse_forward_request",
    "parse_signal_request",
    "parse_terminate_request",
    "parse_wait_request",
    "refuse_reserved_port",
    "signal_number",
    "validate_env",
    "validate_forward_target",
    "validate_handle",
]

MAX_ARGS: Final = 1024
MAX_ARG_BYTES: Final = 32 * 1024
MAX_ENV_ENTRIES: Final = 1024
MAX_CWD_BYTES: Final = 4096
MAX_TIMEOUT_S: Final = 7 * 24 * 3600.0
MAX_GRACE_S: Final = 3600.0
DEFAULT_GRACE_S: Final = 5.0

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HANDLE = re.compile(r"p_[0-9a-f]{16}")

# CA trust (docs/policy.md "Tools in the agent"). These replace a tool's trust store, so they name the system
# bundle plus the interception CA: OpenSSL and everything on it (curl, git, Go, Rust's native-tls and
# rustls-native-certs, Ruby, httpx), requests, pip, npm (``npm_config_cafile`` wins over every npmrc's ``cafile=``).
CA_REPLACING_KEYS: Final = (
    "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT", "npm_config_cafile",
)  # fmt: skip
# These add to the tool's built-in roots, so they name the interception CA alone: node, deno.
CA_ADDING_KEYS: Final = ("NODE_EXTRA_CA_CERTS", "DENO_CERT")

# spec §6.5: set by the boundary for proxying and CA trust; a request may never override them.
MANAGED_ENV_KEYS: Final = frozenset(
    {
        "ALL_PROXY", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "all_proxy", "grpc_proxy",
        "NO_PROXY", "no_proxy", "NODE_USE_ENV_PROXY", *CA_ADDING_KEYS, *CA_REPLACING_KEYS,
    }
)  # fmt: skip
MANAGED_ENV_PREFIX: Final = "OPENSHELL_"


class SignalScope(enum.StrEnum):
    PROCESS = "process"
    GROUP = "group"


# spec §2.4: the closed set, by name.
ALLOWED_SIGNALS: Final = {
    name: _signal.Signals[f"SIG{name}"]
    for name in ("HUP", "INT", "QUIT", "KILL", "TERM", "USR1", "USR2", "CONT", "STOP", "TSTP", "WINCH")
}


@dataclass(frozen=True)
class ExecRequest:
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    tty: bool = False
    cols: int = 80
    rows: int = 24
    stdin: Literal["pipe", "null"] = "pipe"
    timeout_s: float = 0.0
    grace_s: float = DEFAULT_GRACE_S

    @property
    def env_map(self) -> dict[str, str]:
        return dict(self.env)

    def to_wire(self) -> dict[str, JsonValue]:
        wire: dict[str, JsonValue] = {"argv": list(self.argv), "env": dict(self.env)}
        if self.cwd is not None:
            wire["cwd"] = self.cwd
        wire.update({"tty": self.tty, "cols": self.cols, "rows": self.rows, "stdin": self.stdin,
                     "timeout_s": self.timeout_s, "grace_s": self.grace_s})  # fmt: skip
        return wire

    @classmethod
    def from_wire(cls, obj: object) -> ExecRequest:
        return parse_exec_request(obj)


@dataclass(frozen=True)
class SignalRequest:
    handle: str
    signal: str  # a key of ALLOWED_SIGNALS
    scope: SignalScope = SignalScope.PROCESS

    def to_wire(self) -> dict[str, JsonValue]:
        return {"handle": self.handle, "signal": self.signal, "scope": str(self.scope)}

    @classmethod
    def from_wire(cls, obj: object) -> SignalRequest:
        return parse_signal_request(obj)


@dataclass(frozen=True)
class SignalReply:
    """``/v1/signal``'s answer: the signal went to the process (or its group)."""

    handle: str
    signal: str
    delivered: bool = True

    def to_wire(self) -> dict[str, JsonValue]:
        return {"handle": self.handle, "signal": self.signal, "delivered": self.delivered}

    @classmethod
    def from_wire(cls, obj: object) -> SignalReply:
        raw = _reply(obj, "signal")
        handle, signal, delivered = raw.get("handle"), raw.get("signal"), raw.get("delivered", True)
        if not isinstance(handle, str):
            raise _invalid("signal reply: must be a string", "handle")
        if not isinstance(signal, str):
            raise _invalid("signal reply: must be a string", "signal")
        return cls(handle, signal, _bool(delivered, "delivered"))


@dataclass(frozen=True)
class WaitRequest:
    handle: str
    timeout_s: float | None = None

    def to_wire(self) -> dict[str, JsonValue]:
        return {"handle": self.handle} | ({} if self.timeout_s is None else {"timeout_s": self.timeout_s})

    @classmethod
    def from_wire(cls, obj: object) -> WaitRequest:
        return parse_wait_request(obj)


@dataclass(frozen=True)
class TerminateRequest:
    handle: str
    grace_s: float = DEFAULT_GRACE_S

    def to_wire(self) -> dict[str, JsonValue]:
        return {"handle": self.handle, "grace_s": self.grace_s}

    @classmethod
    def from_wire(cls, obj: object) -> TerminateRequest:
        return parse_terminate_request(obj)


@dataclass(frozen=True)
class ForwardTarget:
    host: str  # the normalised literal that will be dialled
    port: int
    family: socket.AddressFamily


def _invalid(reason: str, field: str | None = None) -> OpError:
    return OpError(ErrorKind.INVALID, reason, field=field)


# -- field checkers -------------------------------------------------------------------------------------------


def _reply(obj: object, op: str) -> Mapping[str, object]:
    if not isinstance(obj, Mapping):
        raise _invalid(f"the {op} reply must be a JSON object")
    return obj


def _object(body: object, allowed: Collection[str]) -> dict[str, JsonValue]:
    if not isinstance(body, dict):
        raise _invalid("request body must be a JSON object")
    for key in body:
        if key not in allowed:
            raise _invalid("unknown field", field=str(key))
    return body


def _text(value: object, field: str, *, limit: int, allow_empty: bool = True) -> str:
    if not isinstance(value, str):
        raise _invalid("must be a string", field)
    if "\x00" in value:
        raise _invalid("must not contain NUL", field)
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise _invalid("must be valid UTF-8 (lone surrogate)", field) from None
    if size > limit:
        raise _invalid(f"longer than {limit} bytes", field)
    if not allow_empty and not value:
        raise _invalid("must not be empty", field)
    return value


def _bool(value: object, field: str) -> bool:
    if not isinstance(value, bool):
        raise _invalid("must be true or false", field)
    return value


def _int(value: object, field: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid("must be an integer", field)
    if not lo <= value <= hi:
        raise _invalid(f"must be in {lo}..{hi}", field)
    return value


def _seconds(value: object, field: str, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _invalid("must be a number of seconds", field)
    number = float(value)
    if not math.isfinite(number) or not 0 <= number <= hi:
        raise _invalid(f"must be between 0 and {hi:g} seconds", field)
    return number


def validate_handle(value: object, field: str = "handle") -> str:
    if not isinstance(value, str) or not _HANDLE.fullmatch(value):
        raise _invalid("not a process handle", field)
    return value


def is_managed_env_key(key: str) -> bool:
    return key in MANAGED_ENV_KEYS or key.startswith(MANAGED_ENV_PREFIX)


def validate_env(value: object, field: str = "env") -> tuple[tuple[str, str], ...]:
    """Check a request's environment; keys keep their order."""
    if not isinstance(value, dict):
        raise _invalid("must be an object of string values", field)
    if len(value) > MAX_ENV_ENTRIES:
        raise _invalid(f"more than {MAX_ENV_ENTRIES} entries", field)
    out: list[tuple[str, str]] = []
    for key, item in value.items():
        where = f"{field}.{key!s:.64}"
        if not isinstance(key, str) or not _ENV_KEY.fullmatch(key):
            raise _invalid("environment key must match ^[A-Za-z_][A-Za-z0-9_]*$", where)
        if is_managed_env_key(key):
            raise _invalid("environment key is managed by the boundary and cannot be set", where)
        out.append((key, _text(item, where, limit=MAX_ARG_BYTES)))
    return tuple(out)


def _argv(value: object, field: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise _invalid("must be a non-empty array of strings", field)
    if len(value) > MAX_ARGS:
        raise _invalid(f"more than {MAX_ARGS} arguments", field)
    args = tuple(_text(arg, f"{field}[{i}]", limit=MAX_ARG_BYTES) for i, arg in enumerate(value))
    if not args[0]:
        raise _invalid("program must not be empty", f"{field}[0]")
    return args


def _cwd(value: object, field: str) -> str:
    path = _text(value, field, limit=MAX_CWD_BYTES, allow_empty=False)
    if not path.startswith("/"):
        raise _invalid("must be an absolute path", field)
    if "\n" in path or "\r" in path:
        raise _invalid("must not contain a newline", field)
    return path


# -- requests -------------------------------------------------------------------------------------------------

# Upstream OpenShell's field names (spec §7.2) are accepted as aliases of ours.
_EXEC_ALIASES: Final = {"command": "argv", "workdir": "cwd", "environment": "env", "timeout_seconds": "timeout_s"}
_EXEC_FIELDS: Final = {"argv", "env", "cwd", "tty", "cols", "rows", "stdin", "timeout_s", "grace_s"}


def parse_exec_request(body: object) -> ExecRequest:
    raw = _object(body, _EXEC_FIELDS | _EXEC_ALIASES.keys())
    fields: dict[str, JsonValue] = {}
    for key, value in raw.items():
        name = _EXEC_ALIASES.get(key, key)
        if name in fields:
            raise _invalid(f"given twice (as {name!r} and an alias)", key)
        fields[name] = value
    if "argv" not in fields:
        raise _invalid("required", "argv")
    stdin = _stdin(fields.get("stdin", "pipe"))
    return ExecRequest(
        argv=_argv(fields["argv"], "argv"),
        env=validate_env(fields.get("env", {})),
        cwd=_cwd(fields["cwd"], "cwd") if fields.get("cwd") is not None else None,
        tty=_bool(fields.get("tty", False), "tty"),
        cols=_int(fields.get("cols", 80), "cols", 1, 0xFFFF),
        rows=_int(fields.get("rows", 24), "rows", 1, 0xFFFF),
        stdin=stdin,
        timeout_s=_seconds(fields.get("timeout_s", 0), "timeout_s", MAX_TIMEOUT_S),
        grace_s=_seconds(fields.get("grace_s", DEFAULT_GRACE_S), "grace_s", MAX_GRACE_S),
    )


def _stdin(value: JsonValue) -> Literal["pipe", "null"]:
    """``true`` and ``false`` are the booleans' spellings of ``pipe`` and ``null``."""
    if value is True or value == "pipe":
        return "pipe"
    if value is False or value == "null":
        return "null"
    raise _invalid('must be "pipe" or "null"', "stdin")


def signal_number(name: object, field: str = "signal") -> _signal.Signals:
    """The allowed signal called ``name`` (``TERM`` or ``SIGTERM``); numbers and others are invalid."""
    if not isinstance(name, str):
        raise _invalid("must be a signal name such as TERM", field)
    key = name[3:] if name.startswith("SIG") else name
    try:
        return ALLOWED_SIGNALS[key]
    except KeyError:
        allowed = ", ".join(ALLOWED_SIGNALS)
        raise _invalid(f"signal not allowed (one of {allowed})", field) from None


def parse_signal_request(body: object) -> SignalRequest:
    raw = _object(body, {"handle", "signal", "scope"})
    if "signal" not in raw:
        raise _invalid("required", "signal")
    sig = signal_number(raw["signal"])
    scope_name = raw.get("scope", "process")
    try:
        if not isinstance(scope_name, str):
            raise ValueError(scope_name)
        scope = SignalScope(scope_name)
    except ValueError:
        raise _invalid('must be "process" or "group"', "scope") from None
    return SignalRequest(validate_handle(raw.get("handle")), sig.name[3:], scope)


def parse_wait_request(body: object) -> WaitRequest:
    raw = _object(body, {"handle", "timeout_s"})
    timeout = raw.get("timeout_s")
    return WaitRequest(
        validate_handle(raw.get("handle")),
        None if timeout is None else _seconds(timeout, "timeout_s", MAX_TIMEOUT_S),
    )


def parse_terminate_request(body: object) -> TerminateRequest:
    raw = _object(body, {"handle", "grace_s"})
    return TerminateRequest(
        validate_handle(raw.get("handle")),
        _seconds(raw.get("grace_s", DEFAULT_GRACE_S), "grace_s", MAX_GRACE_S),
    )


def refuse_reserved_port(port: int, reserved_ports: Collection[int]) -> None:
    """spec §3: a forward never reaches one of the boundary's own ports."""
    if port in reserved_ports:
        raise OpError(ErrorKind.DENIED, f"port {port} belongs to the boundary", field="port")


def validate_forward_target(host: object, port: object, reserved_ports: Collection[int] = ()) -> ForwardTarget:
    """spec §3 steps 1–4; the returned host is a literal, never a name."""
    port = _int(port, "port", 1, 65535)
    if not isinstance(host, str) or not host:
        raise _invalid("must be an IP literal or localhost", "host")
    literal = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if literal.lower() == "localhost" and literal.isascii():
        literal = "127.0.0.1"
    # ipaddress accepts IPv6 zone ids ("::1%lo"); a zone selects an interface, which a forward never may.
    if not literal.isascii() or "%" in literal:
        raise _invalid("must be an IP literal or localhost", "host")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(literal)
    except ValueError:
        raise _invalid("must be an IP literal or localhost (no names are resolved)", "host") from None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if not address.is_loopback:
        raise OpError(ErrorKind.DENIED, f"forward target {address} is not a loopback address", field="host")
    refuse_reserved_port(port, reserved_ports)
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    return ForwardTarget(str(address), port, family)


def parse_forward_request(body: object, reserved_ports: Collection[int] = ()) -> ForwardTarget:
    """``{host, port, probe?}``; ``probe: true`` asks only whether the target would be accepted (see
    :func:`is_forward_probe`)."""
    raw = _object(body, {"host", "port", "probe"})
    if not isinstance(raw.get("probe", False), bool):
        raise _invalid("must be a boolean", "probe")
    return validate_forward_target(raw.get("host", "127.0.0.1"), raw.get("port"), reserved_ports)


def is_forward_probe(body: object) -> bool:
    """A forward request that is only a probe: validated and accepted, never connected, so the target (a user's
    server) sees nothing of it."""
    return isinstance(body, dict) and body.get("probe") is True


def env_items(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """Validate a mapping given in code (e.g. the agent's env from the command line)."""
    return validate_env(dict(env))
