"""Destination classifier for the SSRF guard (docs/reference/policy.md §3.5, docs/design.md "Always-blocked stays
blocked").

Pure functions, no I/O. Two jobs:

* ``classify(address)`` names the class of one IP address (loopback, private, metadata, ...) and says whether it
  is *internal* (refused unless the policy names it) and *always blocked* (refused even when it does).
* ``parse_host_literal(host)`` decides whether a host string from a request is an IP literal, a name, or a
  spelling we refuse.

Rules this file enforces:

1. Classification is total: every 4- or 16-byte address gets a class and nothing raises. Space we do not
   know to be globally routed is internal (all IPv6 outside ``2000::/3`` is ``reserved``).
2. IPv4 hidden in IPv6 is classified as the IPv4 inside, for every embedding the kernel or a translator may
   turn into an IPv4 packet: mapped ``::ffff:a.b.c.d``, translated ``::ffff:0:a.b.c.d``, compatible
   ``::a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4 ``2002:AABB:CCDD::/48`` and Teredo ``2001::/32`` (client
   address, stored inverted). ``::`` and ``::1`` are themselves, never "compatible". The NAT64 local-use prefix
   ``64:ff9b:1::/48`` (RFC 8215) is read as a /96 translator prefix only to refuse: an address whose last 32
   bits are always-blocked IPv4 is that address (``nat64-local``); any other stays ``private``, since its
   translator's layout (RFC 6052 /48, /56, /64 or /96) cannot be known here.
3. Always blocked = loopback, link-local, unspecified (``0.0.0.0/8`` and ``::``) and cloud metadata
   addresses, whatever their spelling. Metadata addresses outside link-local space (Alibaba's
   ``100.100.100.200``, OCI's ``192.0.0.192``, AWS's ``fd00:ec2::254``) are always blocked too: no policy
   has a reason to hand the agent the node's instance credentials.
4. A host literal is accepted only in its canonical spelling: dotted-quad IPv4 with decimal octets and no
   leading zeros, or IPv6 (bracketed or not) without a zone id. Every other numeric spelling that a client
   library could turn into an address (``2130706433``, ``0x7f.1``, ``0177.0.0.1``, ``127.1``,
   ``127.0.0.1.``, fullwidth digits) is *refused*, not canonicalised: the policy matches host strings, and
   a second spelling of an address is a second way past it. We follow the WHATWG URL rule for what counts as
   an IPv4 attempt: a host whose last label is a number (decimal or ``0x`` hex) is one, and a name whose
   last label is numeric never goes to DNS. The refusal records what ``inet_aton`` would have dialled, for
   the log.
"""

from __future__ import annotations

import enum
import ipaddress
import unicodedata
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

IPAddress = IPv4Address | IPv6Address

__all__ = [
    "ALWAYS_BLOCKED_CLASSES",
    "AddressClass",
    "BlockedInNetwork",
    "Classification",
    "IPAddress",
    "IPNetwork",
    "Refused",
    "RefusedReason",
    "blocked_in_network",
    "classify",
    "inet_aton_lenient",
    "overlaps_always_blocked",
    "parse_host_literal",
]


class AddressClass(enum.StrEnum):
    """Values are the exact strings used in events and denial reasons."""

    PUBLIC = "public"
    LOOPBACK = "loopback"
    PRIVATE = "private"  # RFC 1918, NAT64 local-use 64:ff9b:1::/48
    CGNAT = "cgnat"  # 100.64.0.0/10
    LINK_LOCAL = "link-local"
    METADATA = "metadata"  # cloud instance-metadata services
    MULTICAST = "multicast"
    UNSPECIFIED = "unspecified"  # 0.0.0.0/8, ::
    RESERVED = "reserved"  # 240/4, broadcast, IETF protocol space, site-local, unassigned IPv6
    ULA = "ula"  # fc00::/7
    DOCUMENTATION = "documentation"  # TEST-NET-1/2/3, 2001:db8::/32, 3fff::/20
    BENCHMARKING = "benchmarking"  # 198.18.0.0/15, 2001:2::/48


ALWAYS_BLOCKED_CLASSES = frozenset(
    {AddressClass.LOOPBACK, AddressClass.LINK_LOCAL, AddressClass.UNSPECIFIED, AddressClass.METADATA}
)


@dataclass(frozen=True)
class Classification:
    address: IPAddress  # canonical: the embedded IPv4 when there is one, scope id dropped
    cls: AddressClass
    embedded: str | None  # "mapped", "translated", "compatible", "nat64", "nat64-local", "6to4", "teredo"
    always_blocked: bool
    internal: bool


# --- tables (most specific first; the first match wins) -------------------------------------------------------

_METADATA_V4 = frozenset(
    IPv4Address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, OCI
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.170.23",  # AWS EKS pod identity agent
        "100.100.100.200",  # Alibaba Cloud
        "192.0.0.192",  # OCI legacy metadata
    )
)
_METADATA_V6 = frozenset(IPv6Address(a) for a in ("fd00:ec2::254", "fd00:ec2::23"))

_V4_TABLE: tuple[tuple[IPv4Network, AddressClass], ...] = tuple(
    (IPv4Network(net), cls)
    for net, cls in (
        ("0.0.0.0/8", AddressClass.UNSPECIFIED),
        ("127.0.0.0/8", AddressClass.LOOPBACK),
        ("169.254.0.0/16", AddressClass.LINK_LOCAL),
        ("10.0.0.0/8", AddressClass.PRIVATE),
        ("172.16.0.0/12", AddressClass.PRIVATE),
        ("192.168.0.0/16", AddressClass.PRIVATE),
        ("100.64.0.0/10", AddressClass.CGNAT),
        ("192.0.2.0/24", AddressClass.DOCUMENTATION),
        ("198.51.100.0/24", AddressClass.DOCUMENTATION),
        ("203.0.113.0/24", AddressClass.DOCUMENTATION),
        ("198.18.0.0/15", AddressClass.BENCHMARKING),
        ("192.0.0.0/24", AddressClass.RESERVED),  # IETF protocol assignments
        ("192.88.99.0/24", AddressClass.RESERVED),  # deprecated 6to4 relay anycast
        ("224.0.0.0/4", AddressClass.MULTICAST),
        ("240.0.0.0/4", AddressClass.RESERVED),  # includes 255.255.255.255
    )
)

_V6_TABLE: tuple[tuple[IPv6Network, AddressClass], ...] = tuple(
    (IPv6Network(net), cls)
    for net, cls in (
        ("fe80::/10", AddressClass.LINK_LOCAL),
        ("fec0::/10", AddressClass.RESERVED),  # deprecated site-local
        ("fc00::/7", AddressClass.ULA),
        ("ff00::/8", AddressClass.MULTICAST),
        ("64:ff9b:1::/48", AddressClass.PRIVATE),  # NAT64 local-use (RFC 8215)
        ("100::/64", AddressClass.RESERVED),  # discard-only
        ("2001:db8::/32", AddressClass.DOCUMENTATION),
        ("3fff::/20", AddressClass.DOCUMENTATION),
        ("2001:2::/48", AddressClass.BENCHMARKING),
        ("2001:10::/28", AddressClass.RESERVED),  # ORCHID
        ("2001:20::/28", AddressClass.RESERVED),  # ORCHIDv2
    )
)
_V6_GLOBAL_UNICAST = IPv6Network("2000::/3")

_MAPPED = IPv6Network("::ffff:0:0/96")
_TRANSLATED = IPv6Network("::ffff:0:0:0/96")
_COMPATIBLE = IPv6Network("::/96")
_NAT64 = IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = IPv6Network("64:ff9b:1::/48")
_SIX_TO_FOUR = IPv6Network("2002::/16")
_TEREDO = IPv6Network("2001::/32")
_V6_UNSPECIFIED = IPv6Address("::")
_V6_LOOPBACK = IPv6Address("::1")
_LOW32 = 0xFFFFFFFF


def _v4_class(addr: IPv4Address) -> AddressClass:
    if addr in _METADATA_V4:
        return AddressClass.METADATA
    for net, cls in _V4_TABLE:
        if addr in net:
            return cls
    return AddressClass.PUBLIC


def _v6_class(addr: IPv6Address) -> AddressClass:
    if addr == _V6_UNSPECIFIED:
        return AddressClass.UNSPECIFIED
    if addr == _V6_LOOPBACK:
        return AddressClass.LOOPBACK
    if addr in _METADATA_V6:
        return AddressClass.METADATA
    for net, cls in _V6_TABLE:
        if addr in net:
            return cls
    if addr not in _V6_GLOBAL_UNICAST:
        return AddressClass.RESERVED
    return AddressClass.PUBLIC


def _embedded_v4(addr: IPv6Address) -> tuple[str, IPv4Address] | None:
    """The IPv4 address an IPv6 address carries, with the name of the embedding (rule 2)."""
    if addr in (_V6_UNSPECIFIED, _V6_LOOPBACK):
        return None
    n = int(addr)
    if addr in _MAPPED:
        return "mapped", IPv4Address(n & _LOW32)
    if addr in _TRANSLATED:
        return "translated", IPv4Address(n & _LOW32)
    if addr in _COMPATIBLE:
        return "compatible", IPv4Address(n & _LOW32)
    if addr in _NAT64:
        return "nat64", IPv4Address(n & _LOW32)
    if addr in _SIX_TO_FOUR:
        return "6to4", IPv4Address((n >> 80) & _LOW32)
    if addr in _TEREDO:
        return "teredo", IPv4Address(~n & _LOW32)
    return None


def _result(address: IPAddress, cls: AddressClass, embedded: str | None) -> Classification:
    return Classification(
        address=address,
        cls=cls,
        embedded=embedded,
        always_blocked=cls in ALWAYS_BLOCKED_CLASSES,
        internal=cls is not AddressClass.PUBLIC,
    )


def classify(addr: str | IPAddress) -> Classification:
    """Classify one address. A string must be a canonical literal (``parse_host_literal``), else ValueError."""
    if isinstance(addr, str):
        parsed = parse_host_literal(addr)
        if not isinstance(parsed, IPv4Address | IPv6Address):
            raise ValueError(f"not a canonical IP literal: {addr!r}")
        addr = parsed
    if isinstance(addr, IPv4Address):
        return _result(addr, _v4_class(addr), None)
    addr = IPv6Address(int(addr))  # drop any scope id
    inner = _embedded_v4(addr)
    if inner is not None:
        kind, v4 = inner
        return _result(v4, _v4_class(v4), kind)
    if addr in _NAT64_LOCAL:  # rule 2: only an always-blocked /96 reading counts
        v4 = IPv4Address(int(addr) & _LOW32)
        if (cls := _v4_class(v4)) in ALWAYS_BLOCKED_CLASSES:
            return _result(v4, cls, "nat64-local")
    return _result(addr, _v6_class(addr), None)


# --- networks (``allowed_ips`` entries) ------------------------------------------------------------------------
#
# Validation (``policy check``, control/policy/schema.py) and the dial (control/upstream.py) both ask
# ``blocked_in_network``: one answer, so an entry the policy accepts is never refused on every connection. It is
# exact, not an approximation: an entry is refused iff some address in it is one ``classify`` calls loopback,
# link-local or unspecified, in any spelling rule 2 reads (Teredo's inverted embedding included), and the answer
# names that address. Metadata addresses inside otherwise usable ranges (CGNAT, ULA) refuse only an entry that is
# nothing but that address, so that ``allowed_ips: [100.64.0.0/10]`` stays valid: the per-address check at the
# dial still refuses them.

IPNetwork = IPv4Network | IPv6Network

_BLOCKED_V4 = (IPv4Network("0.0.0.0/8"), IPv4Network("127.0.0.0/8"), IPv4Network("169.254.0.0/16"))
_BLOCKED_V6 = (IPv6Network("::/128"), IPv6Network("::1/128"), IPv6Network("fe80::/10"))
# Where IPv4 sits in an IPv6 address (rule 2): the prefix, the bit offset of the 32 embedded bits, inverted or not.
_EMBEDDINGS: tuple[tuple[IPv6Network, int, bool], ...] = (
    (_MAPPED, 0, False),
    (_TRANSLATED, 0, False),
    (_COMPATIBLE, 0, False),
    (_NAT64, 0, False),
    (_NAT64_LOCAL, 0, False),  # its /96 reading (rule 2)
    (_SIX_TO_FOUR, 80, False),
    (_TEREDO, 0, True),
)


@dataclass(frozen=True)
class BlockedInNetwork:
    """An always-blocked address inside a network, as the network spells it, and how ``classify`` sees it."""

    address: IPAddress
    classification: Classification

    def describe(self) -> str:
        c = self.classification
        if c.embedded is None:
            return f"{c.cls} address {self.address}"
        return f"{c.cls} address {self.address} ({c.address} in {c.embedded} form)"


def _blocked_v4_in(net: IPv4Network) -> IPv4Address | None:
    for blocked in _BLOCKED_V4:
        if net.overlaps(blocked):  # two prefixes overlap only by nesting: the later start is in both
            return max(net.network_address, blocked.network_address)
    return None


def _blocked_v6_in(net: IPv6Network) -> IPv6Address | None:
    for blocked in _BLOCKED_V6:
        if net.overlaps(blocked):
            return max(net.network_address, blocked.network_address)
    for prefix, shift, inverted in _EMBEDDINGS:
        if not net.overlaps(prefix):
            continue
        inner = net if net.prefixlen >= prefix.prefixlen else prefix  # the part of ``net`` in this embedding
        fixed = min(32, max(0, inner.prefixlen - (96 - shift)))  # leading bits of the IPv4 that ``inner`` fixes
        field = (int(inner.network_address) >> shift) & _LOW32
        top = (_LOW32 << (32 - fixed)) & _LOW32
        v4 = _blocked_v4_in(IPv4Network((((~field if inverted else field) & top), fixed)))
        if v4 is None:
            continue
        bits = (~int(v4) if inverted else int(v4)) & _LOW32
        return IPv6Address((int(inner.network_address) & ~(_LOW32 << shift)) | (bits << shift))
    return None


def blocked_in_network(net: IPNetwork) -> BlockedInNetwork | None:
    """An always-blocked address of ``net`` that makes it unusable as an ``allowed_ips`` entry, or None."""
    if net.num_addresses == 1:
        whole = classify(net.network_address)
        return BlockedInNetwork(net.network_address, whole) if whole.always_blocked else None
    found = _blocked_v4_in(net) if isinstance(net, IPv4Network) else _blocked_v6_in(net)
    return BlockedInNetwork(found, classify(found)) if found is not None else None


def overlaps_always_blocked(net: IPNetwork) -> bool:
    """Whether an ``allowed_ips`` entry reaches into always-blocked space (spec §3.5: such entries are invalid)."""
    return blocked_in_network(net) is not None


# --- host literals ---------------------------------------------------------------------------------------------


class RefusedReason(enum.StrEnum):
    NON_CANONICAL_IPV4 = "non-canonical-ipv4"  # numeric spelling other than a.b.c.d (rule 4)
    INVALID_IPV4 = "invalid-ipv4"  # looks numeric, is no address at all (1.2.3.256, 0x7g)
    INVALID_IPV6 = "invalid-ipv6"
    IPV6_ZONE_ID = "ipv6-zone-id"
    BRACKETED_NON_IPV6 = "bracketed-non-ipv6"
    CONTROL_OR_SPACE = "control-or-space"
    EMPTY = "empty"


@dataclass(frozen=True)
class Refused:
    host: str
    reason: RefusedReason
    would_dial: IPv4Address | None = None  # what a lenient client (inet_aton, WHATWG) makes of it


# Dots that IDNA mapping (UTS 46, WHATWG) turns into "." before a host is parsed.
_IDNA_DOTS = str.maketrans({"\u3002": ".", "\uff0e": ".", "\uff61": "."})


def _looks_numeric(label: str) -> bool:
    """WHATWG "ends in a number": all decimal digits, or 0x/0X followed by hex digits."""
    if label.isascii() and label.isdigit():
        return True
    if label[:2] in ("0x", "0X"):
        return all(c in "0123456789abcdefABCDEF" for c in label[2:])
    return False


def _canonical_v4(host: str) -> IPv4Address | None:
    parts = host.split(".")
    if len(parts) != 4:
        return None
    for p in parts:
        if not (p.isascii() and p.isdigit()) or len(p) > 3 or (len(p) > 1 and p[0] == "0") or int(p) > 255:
            return None
    return IPv4Address(host)


def _aton_part(part: str) -> int | None:
    if part[:2] in ("0x", "0X"):
        digits, base = part[2:], 16  # a bare "0x" is no number for glibc (WHATWG reads 0; refused either way)
    elif len(part) > 1 and part[0] == "0":
        digits, base = part[1:], 8
    else:
        digits, base = part, 10
    try:
        return int(digits, base) if digits != "" and digits.isascii() and digits.isalnum() else None
    except ValueError:
        return None


def inet_aton_lenient(host: str) -> IPv4Address | None:
    """The address a lenient resolver (glibc ``inet_aton``, WHATWG URL) would read, or None.

    One to four parts, each decimal, octal (leading 0) or hex (0x); the last part fills the remaining bytes.
    One trailing dot is ignored, as URL parsers do.
    """
    if host.endswith("."):
        host = host[:-1]
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or any(p == "" for p in parts):
        return None
    values = [_aton_part(p) for p in parts]
    if any(v is None for v in values):
        return None
    nums = [v for v in values if v is not None]
    if any(v > 255 for v in nums[:-1]) or nums[-1] >= 256 ** (5 - len(nums)):
        return None
    total = 0
    for v in nums[:-1]:
        total = total * 256 + v
    total = (total << (8 * (5 - len(nums)))) | nums[-1]
    return IPv4Address(total)


def parse_host_literal(host: str) -> IPAddress | Refused | None:
    """An IP address for a canonical literal, ``Refused`` for any other numeric spelling, None for a name.

    "Name" only means "not an IP attempt": whether it is a valid DNS name is the policy engine's question.
    """
    if host == "":
        return Refused(host, RefusedReason.EMPTY)
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in host):
        return Refused(host, RefusedReason.CONTROL_OR_SPACE)
    if host.startswith("[") or host.endswith("]"):
        inner = host[1:-1] if host.startswith("[") and host.endswith("]") else ""
        v6 = _parse_v6(host, inner)
        if isinstance(v6, Refused) and v6.reason is RefusedReason.INVALID_IPV6:
            return Refused(host, RefusedReason.BRACKETED_NON_IPV6)
        return v6
    if ":" in host:
        return _parse_v6(host, host)
    # What the host would be after IDNA mapping: fullwidth digits and ideographic dots become ASCII.
    mapped = unicodedata.normalize("NFKC", host.translate(_IDNA_DOTS)) if not host.isascii() else host
    bare = mapped[:-1] if mapped.endswith(".") else mapped
    last = bare.rsplit(".", 1)[-1]
    if last == "" or not _looks_numeric(last):
        return None
    if mapped == host:
        exact = _canonical_v4(host)
        if exact is not None:
            return exact
    would = inet_aton_lenient(mapped)
    reason = RefusedReason.NON_CANONICAL_IPV4 if would is not None else RefusedReason.INVALID_IPV4
    return Refused(host, reason, would)


def _parse_v6(host: str, text: str) -> IPv6Address | Refused:
    if "%" in text:
        return Refused(host, RefusedReason.IPV6_ZONE_ID)
    try:
        return IPv6Address(text)
    except ipaddress.AddressValueError:
        return Refused(host, RefusedReason.INVALID_IPV6)
