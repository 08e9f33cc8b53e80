"""Endpoint overlap check (docs/reference/policy.md §1.11, V36): overlapping endpoints must not disagree.

Two endpoints *overlap* when their port sets intersect and some host matches both selectors (a hostless
endpoint overlaps everything). Overlapping endpoints must agree on connection metadata (``protocol: tcp`` or
not, ``tls`` skip/auto, the ``allowed_ips`` set). When both also contribute request-pipeline metadata (an L7
protocol, ``allowed_ips``, an explicit ``tls`` or a credential binding), their ``path`` selectors overlap and
have the same specificity, they must agree on that metadata too (protocol, enforcement, encoded-slash opt-in,
rewrite flags, credential binding). ``access``/``rules``/``deny_rules`` may differ: they are unioned.

Cost: endpoints are bucketed by port and only pairs whose metadata differs are examined, through a host index,
so a 10,000-rule policy with uniform metadata is checked in linear time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .errors import PolicyError
from .globs import HostGlob, compile_host_glob, path_globs_intersect
from .model import Endpoint, Protocol

MAX_REPORTED = 50


@dataclass(frozen=True)
class Located:
    """An endpoint with where it was written."""

    path: str  # "network_policies.gh.endpoints[0]"
    line: int | None
    endpoint: Endpoint


def _conn_sig(ep: Endpoint) -> tuple[bool, bool, frozenset[str]]:
    return (ep.protocol is Protocol.TCP, ep.tls_skip, frozenset(ep.allowed_ips))


def _contributes(ep: Endpoint) -> bool:
    return ep.extended or ep.credential_binding is not None or ep.credential_signing is not None


def _pipe_sig(ep: Endpoint) -> tuple[object, ...]:
    return (
        ep.protocol,
        ep.enforcement,
        ep.allow_encoded_slash,
        ep.websocket_credential_rewrite,
        ep.request_body_credential_rewrite,
        ep.credential_binding,
        ep.credential_signing,
        ep.signing_service,
        ep.signing_region,
        ep.body_limit if ep.protocol.reads_body else None,
        ep.strict_tool_names if ep.protocol.reads_body else None,
    )


def path_rank(path: str) -> int:
    return sum(1 for c in path if c != "*")


def _paths_overlap(a: str, b: str) -> bool:
    if a in ("", "**") or b in ("", "**"):
        return True
    return path_globs_intersect(a, b)


def _describe_conn(ep: Endpoint) -> str:
    return (
        f"protocol {'tcp' if ep.protocol is Protocol.TCP else 'proxy'}, tls {'skip' if ep.tls_skip else 'auto'}, "
        f"allowed_ips {sorted(ep.allowed_ips) or '[]'}"
    )


def _describe_pipe(ep: Endpoint) -> str:
    parts = [f"protocol {ep.protocol or 'l4'}", f"enforcement {ep.enforcement}"]
    for flag in ("allow_encoded_slash", "websocket_credential_rewrite", "request_body_credential_rewrite"):
        if getattr(ep, flag):
            parts.append(flag)
    if ep.credential_binding:
        parts.append(f"credential_binding {ep.credential_binding}")
    if ep.credential_signing:
        parts.append(f"credential_signing {ep.credential_signing} ({ep.signing_service}, "
                     f"{ep.signing_region or 'region from host'})")  # fmt: skip
    return ", ".join(parts)


class _HostIndex:
    """Finds the entries of one port bucket whose host selector can match a common host with a given one."""

    def __init__(self, entries: list[tuple[int, Located]]) -> None:
        self.exact: dict[str, list[int]] = defaultdict(list)
        self.exact_by_suffix: dict[tuple[str, ...], list[int]] = defaultdict(list)
        self.globs: dict[int, HostGlob] = {}
        self.glob_by_suffix: dict[tuple[str, ...], list[int]] = defaultdict(list)
        self.glob_by_partial: dict[tuple[str, ...], list[int]] = defaultdict(list)
        self.hostless: list[int] = []
        self.hosts = {index: loc.endpoint.host for index, loc in entries}
        for index, loc in entries:
            host = loc.endpoint.host
            if not host:
                self.hostless.append(index)
            elif "*" in host:
                glob = compile_host_glob(host)
                self.globs[index] = glob
                suffix = glob.literal_suffix
                self.glob_by_suffix[suffix].append(index)
                for k in range(len(suffix) + 1):
                    self.glob_by_partial[suffix[len(suffix) - k :]].append(index)
            else:
                self.exact[host].append(index)
                labels = tuple(host.split("."))
                for k in range(len(labels) + 1):
                    self.exact_by_suffix[labels[len(labels) - k :]].append(index)
        self.all = [index for index, _ in entries]

    def candidates(self, loc: Located) -> Iterator[int]:
        host = loc.endpoint.host
        if not host:
            yield from self.all
            return
        yield from self.hostless
        if "*" not in host:
            yield from self.exact.get(host, ())
            labels = tuple(host.split("."))
            for k in range(len(labels) + 1):
                for index in self.glob_by_suffix.get(labels[len(labels) - k :], ()):
                    if self.globs[index].matches(host):
                        yield index
            return
        glob = compile_host_glob(host)
        suffix = glob.literal_suffix
        for index in self.exact_by_suffix.get(suffix, ()):
            if glob.matches(self.hosts[index]):
                yield index
        seen: set[int] = set()
        for k in range(len(suffix) + 1):
            for index in self.glob_by_suffix.get(suffix[len(suffix) - k :], ()):
                seen.add(index)
        seen.update(self.glob_by_partial.get(suffix, ()))
        for index in seen:
            if glob.intersects(self.globs[index]):
                yield index


def check_ambiguity(endpoints: Iterable[Located]) -> list[PolicyError]:
    located = list(endpoints)
    by_port: dict[int, list[int]] = defaultdict(list)
    for i, loc in enumerate(located):
        for port in set(loc.endpoint.ports):
            by_port[port].append(i)

    errors: list[PolicyError] = []
    reported: set[tuple[int, int]] = set()
    suppressed = 0
    for port in sorted(by_port):
        members = by_port[port]
        conn = {_conn_sig(located[i].endpoint) for i in members}
        pipes = {_pipe_sig(located[i].endpoint) for i in members if _contributes(located[i].endpoint)}
        if len(conn) <= 1 and len(pipes) <= 1:
            continue
        index = _HostIndex([(i, located[i]) for i in members])
        for i in members:
            a = located[i]
            for j in index.candidates(a):
                if j <= i or (i, j) in reported:
                    continue
                b = located[j]
                message = _conflict(a.endpoint, b.endpoint)
                if message is None:
                    continue
                reported.add((i, j))
                if len(errors) >= MAX_REPORTED:
                    suppressed += 1
                    continue
                first, second = (a, b) if a.path <= b.path else (b, a)
                errors.append(
                    PolicyError(
                        second.path,
                        f"network endpoint ambiguity: overlaps {first.path} on port {port} but {message}",
                        "overlapping endpoints to agree, or hosts/ports that do not overlap",
                        second.line,
                    )
                )
    if suppressed:
        errors.append(PolicyError("network_policies", f"... and {suppressed} more endpoint ambiguities"))
    return errors


def _conflict(a: Endpoint, b: Endpoint) -> str | None:
    if _conn_sig(a) != _conn_sig(b):
        return f"connection settings differ ({_describe_conn(b)} vs {_describe_conn(a)})"
    if not (_contributes(a) and _contributes(b)):
        return None
    if _pipe_sig(a) == _pipe_sig(b):
        return None
    if path_rank(a.path) != path_rank(b.path) or not _paths_overlap(a.path, b.path):
        return None
    return f"request settings differ ({_describe_pipe(b)} vs {_describe_pipe(a)})"
