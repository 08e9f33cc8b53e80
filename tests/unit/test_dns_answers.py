"""What control answers before resolving (docs/design.md "DNS and transparent capture"): REFUSED for names no
endpoint allows (whatever the type), NOTIMP for an eligible name with a type control does not serve, NOERROR
without records for AAAA when control has no IPv6 egress. One table of cases over ``dns_answers.plan_answer``."""

from __future__ import annotations

import dns.message
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import pytest

from supervisor.control.dns_answers import DnsAction, plan_answer, reply

ELIGIBLE = {"api.test", "dual.test"}


def _query(
    name: str, rdtype: str, *, rdclass: str = "IN", opcode: dns.opcode.Opcode = dns.opcode.QUERY
) -> dns.message.Message:
    query = dns.message.make_query(name, dns.rdatatype.from_text(rdtype), dns.rdataclass.from_text(rdclass))
    query.set_opcode(opcode)
    return query


CASES = [
    # name, type, IPv6 egress, action, rcode
    ("api.test", "A", False, DnsAction.RESOLVE, dns.rcode.NOERROR),
    ("API.Test.", "A", False, DnsAction.RESOLVE, dns.rcode.NOERROR),
    ("api.test", "AAAA", True, DnsAction.RESOLVE, dns.rcode.NOERROR),
    ("api.test", "AAAA", False, DnsAction.NODATA, dns.rcode.NOERROR),
    ("api.test", "TXT", True, DnsAction.NOTIMP, dns.rcode.NOTIMP),
    ("api.test", "MX", False, DnsAction.NOTIMP, dns.rcode.NOTIMP),
    ("api.test", "HTTPS", True, DnsAction.NOTIMP, dns.rcode.NOTIMP),
    ("api.test", "ANY", True, DnsAction.NOTIMP, dns.rcode.NOTIMP),
    ("api.test", "PTR", True, DnsAction.NOTIMP, dns.rcode.NOTIMP),
    # a name no endpoint allows: REFUSED whatever the type (the exfiltration channel stays shut)
    ("c2VjcmV0.exfil.test", "A", True, DnsAction.REFUSED, dns.rcode.REFUSED),
    ("c2VjcmV0.exfil.test", "AAAA", False, DnsAction.REFUSED, dns.rcode.REFUSED),
    ("c2VjcmV0.exfil.test", "TXT", True, DnsAction.REFUSED, dns.rcode.REFUSED),
    ("sub.api.test", "A", True, DnsAction.REFUSED, dns.rcode.REFUSED),
]


@pytest.mark.parametrize(("name", "rdtype", "ipv6", "action", "rcode"), CASES)
def test_plan(name: str, rdtype: str, ipv6: bool, action: DnsAction, rcode: dns.rcode.Rcode) -> None:
    asked: list[str] = []

    def eligible(n: str) -> bool:
        asked.append(n)
        return n in ELIGIBLE

    plan = plan_answer(_query(name, rdtype), eligible=eligible, ipv6_egress=ipv6)
    assert (plan.action, plan.rcode) == (action, rcode), plan
    assert asked == [name.lower().rstrip(".")]  # the name is judged normalised, before the type
    assert plan.qtype == rdtype


def test_chaos_class_is_refused_even_for_an_eligible_name() -> None:
    plan = plan_answer(_query("api.test", "TXT", rdclass="CH"), eligible=ELIGIBLE.__contains__, ipv6_egress=True)
    assert plan.action is DnsAction.REFUSED and plan.reason == "qclass"


def test_other_opcodes_are_not_implemented() -> None:
    plan = plan_answer(_query("api.test", "A", opcode=dns.opcode.NOTIFY), eligible=ELIGIBLE.__contains__,
                       ipv6_egress=True)  # fmt: skip
    assert plan.rcode == dns.rcode.NOTIMP


def test_not_one_question_is_formerr() -> None:
    query = _query("api.test", "A")
    query.question.append(_query("dual.test", "A").question[0])
    assert plan_answer(query, eligible=ELIGIBLE.__contains__, ipv6_egress=True).rcode == dns.rcode.FORMERR


@pytest.mark.parametrize("rcode", [dns.rcode.NOERROR, dns.rcode.NOTIMP, dns.rcode.REFUSED])
def test_reply_is_an_empty_response_to_the_query(rcode: dns.rcode.Rcode) -> None:
    query = _query("api.test", "AAAA")
    response = dns.message.from_wire(reply(query, rcode).to_wire())
    assert query.is_response(response)
    assert response.rcode() == rcode and not response.answer and not response.authority
