"""What control answers to a DNS query from the agent's stub, before any resolving (docs/design.md "DNS and
transparent capture"). Pure: a query in, a plan out; ``egress.EgressService.answer`` carries it out.

The table, first match wins:

=============================================  ======================  =====================================
query                                          answer                  why
=============================================  ======================  =====================================
not exactly one question                       FORMERR                 nothing to answer
opcode other than QUERY                        NOTIMP                  RFC 1035 §4.1.1
inference.local, A, routes served              the synthetic address   control's inference router (never
                                                                       resolved; docs/policy.md "Inference
                                                                       routing")
inference.local, AAAA, routes served           NOERROR, no answers     the router has an IPv4 address only
inference.local, other type, routes served     NOTIMP
inference.local without routes, or any name   REFUSED                 never resolved or forwarded: the
below it                                                               name is control's own
a name no policy endpoint could allow          REFUSED                 never resolved, never forwarded: DNS
                                                                       cannot carry data out (any type)
class other than IN                            REFUSED
A                                              resolve                 vetted addresses, maybe none
AAAA, control has IPv6 egress                  resolve
AAAA, no IPv6 egress                           NOERROR, no answers     (NODATA) an address control cannot
                                                                       reach would only stall the agent's
                                                                       client before it falls back to IPv4
any other type (TXT, MX, HTTPS, ANY, …)        NOTIMP                  the name is eligible, the type is
                                                                       not served: "not implemented" says
                                                                       so, where REFUSED would read as a
                                                                       policy refusal of the name
=============================================  ======================  =====================================
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype

from supervisor.control.policy.schema_endpoint import INFERENCE_HOST

__all__ = ["INFERENCE_HOST", "DnsAction", "DnsPlan", "plan_answer", "read_query", "reply"]


class DnsAction(enum.StrEnum):
    """Values are the ``decision`` strings of ``dns`` events."""

    RESOLVE = "answered"
    SYNTHETIC = "answered-inference"
    REFUSED = "refused"
    NOTIMP = "not-implemented"
    NODATA = "no-data"
    FORMERR = "malformed"


@dataclass(frozen=True)
class DnsPlan:
    action: DnsAction
    reason: str
    name: str | None = None
    qtype: str | None = None

    @property
    def rcode(self) -> dns.rcode.Rcode:
        return _RCODES[self.action]


_RCODES = {
    DnsAction.RESOLVE: dns.rcode.NOERROR,
    DnsAction.SYNTHETIC: dns.rcode.NOERROR,
    DnsAction.NODATA: dns.rcode.NOERROR,
    DnsAction.REFUSED: dns.rcode.REFUSED,
    DnsAction.NOTIMP: dns.rcode.NOTIMP,
    DnsAction.FORMERR: dns.rcode.FORMERR,
}


def read_query(wire: bytes) -> dns.message.Message | None:
    """The query ``wire`` holds, or ``None`` for what is answered with a header-only FORMERR: bytes dnspython
    cannot read, and a response (QR set), which has no answer (``reply`` could not build one)."""
    try:
        query = dns.message.from_wire(wire)
    except Exception:  # dnspython raises many kinds for garbage; any of them is FORMERR
        return None
    if query.flags & dns.flags.QR:
        return None
    return query


def plan_answer(
    query: dns.message.Message, *, eligible: Callable[[str], bool], ipv6_egress: bool, inference: bool = False
) -> DnsPlan:
    """The table above. ``eligible`` takes the normalised name (lower case, no trailing dot); ``inference``: this
    control serves ``inference.local``."""
    if len(query.question) != 1:
        return DnsPlan(DnsAction.FORMERR, "not-one-question")
    question = query.question[0]
    name = question.name.to_text(omit_final_dot=True).lower()
    qtype = dns.rdatatype.to_text(question.rdtype)
    if query.opcode() != dns.opcode.QUERY:
        return DnsPlan(DnsAction.NOTIMP, "opcode", name, qtype)
    if name == INFERENCE_HOST and inference and question.rdclass == dns.rdataclass.IN:
        if question.rdtype == dns.rdatatype.A:
            return DnsPlan(DnsAction.SYNTHETIC, "inference", name, qtype)
        if question.rdtype == dns.rdatatype.AAAA:
            return DnsPlan(DnsAction.NODATA, "inference-ipv4-only", name, qtype)
        return DnsPlan(DnsAction.NOTIMP, "qtype-not-served", name, qtype)
    if name == INFERENCE_HOST or name.endswith("." + INFERENCE_HOST):
        return DnsPlan(DnsAction.REFUSED, "inference-name", name, qtype)
    if not eligible(name):
        return DnsPlan(DnsAction.REFUSED, "no-endpoint-for-name", name, qtype)
    if question.rdclass != dns.rdataclass.IN:
        return DnsPlan(DnsAction.REFUSED, "qclass", name, qtype)
    if question.rdtype == dns.rdatatype.A:
        return DnsPlan(DnsAction.RESOLVE, "eligible", name, qtype)
    if question.rdtype == dns.rdatatype.AAAA:
        if ipv6_egress:
            return DnsPlan(DnsAction.RESOLVE, "eligible", name, qtype)
        return DnsPlan(DnsAction.NODATA, "no-ipv6-egress", name, qtype)
    return DnsPlan(DnsAction.NOTIMP, "qtype-not-served", name, qtype)


def reply(query: dns.message.Message, rcode: dns.rcode.Rcode) -> dns.message.Message:
    """An empty response to ``query`` with ``rcode`` (RA set: control recurses for the names it serves)."""
    response = dns.message.make_response(query)
    response.flags |= dns.flags.RA
    response.set_rcode(rcode)
    return response
