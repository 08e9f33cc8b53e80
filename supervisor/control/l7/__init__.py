"""HTTP inspection in control: TLS interception with a per-sandbox CA, L7 rules, credential injection.

The entry point is :func:`inspect` (one admitted connection); :class:`InterceptionCA` mints the CA and its
leaves; :func:`upstream_context` builds the verifying client context for the upstream leg. Everything but
``session``, ``upgrade`` and the stream helpers is pure: ``authority``
(domain-fronting defence), ``sniff`` (what the agent speaks), ``rewrite`` (placeholders to secrets),
``websocket`` (the client-frame filter), ``answers`` (refusals) and ``record`` (events and totals). Request heads
are read by the one reader every listener shares, :mod:`supervisor.protocol.request_head`.
"""

from .authority import AuthorityError, AuthoritySource, RequestAuthority, request_authority, same_authority
from .ca import ALPN_HTTP1, InterceptionCA, LeafError
from .record import CloseReason, InspectStats
from .rewrite import REDACTED, CredentialRefusal, Rewritten, redact_path, redact_query, rewrite_request
from .session.entry import inspect
from .session.state import Limits
from .sniff import TunnelProtocol, sniff
from .upstream_tls import UnsafeUpstreamContext, upstream_context

__all__ = [
    "ALPN_HTTP1",
    "REDACTED",
    "AuthorityError",
    "AuthoritySource",
    "CloseReason",
    "CredentialRefusal",
    "InspectStats",
    "InterceptionCA",
    "LeafError",
    "Limits",
    "RequestAuthority",
    "Rewritten",
    "TunnelProtocol",
    "UnsafeUpstreamContext",
    "inspect",
    "redact_path",
    "redact_query",
    "request_authority",
    "rewrite_request",
    "same_authority",
    "sniff",
    "upstream_context",
]
