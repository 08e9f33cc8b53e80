"""The /proc/net/tcp{,6} row parser and the identity JSON shape (no sockets, no processes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from supervisor.boundary.capture import _procnet
from supervisor.boundary.capture.identity import Identity, IdentityStage, IdentityUnresolved
from supervisor.protocol.identity import ConnectionIdentity

pytestmark = pytest.mark.skipif(sys.byteorder != "little", reason="fixtures are little-endian /proc dumps")

TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1123 1 0 100 0 0 10 0
   1: 0100007F:E6BB 0764330A:01BB 01 00000000:00000000 00:00000000 00000000  1000        0 744414 1 0 20 4 30 10 -1
   2: short line
"""
TCP6 = """\
 sl local_address remote_address st tx_queue rx_queue tr tm->when retrnsmt uid timeout inode
 0: 0000000000000000FFFF00000100007F:CA8A 0000000000000000FFFF00000764330A:0050 01 0:0 0:0 0 0 0 55 3 0
 1: B80D0120000000000000000001000000:8CEB 00000000000000000000000001000000:912E 06 0:0 0:0 0 0 0 0 3 0
"""


def test_ipv4_rows() -> None:
    rows = _procnet.parse_table(TCP)
    assert len(rows) == 2  # the header and the malformed line are skipped
    listen, established = rows
    assert listen.local == ("0.0.0.0", 2024) and listen.state == _procnet.LISTEN
    assert established.local == ("127.0.0.1", 59067)
    assert established.remote == ("10.51.100.7", 443)
    assert (established.state, established.uid, established.inode) == (_procnet.ESTABLISHED, 1000, 744414)


def test_ipv6_rows_and_mapped_addresses_normalised() -> None:
    mapped, v6 = _procnet.parse_table(TCP6)
    assert mapped.local == ("127.0.0.1", 0xCA8A)  # ::ffff:127.0.0.1 compares equal to 127.0.0.1
    assert mapped.remote == ("10.51.100.7", 80)
    assert v6.local == ("2001:db8::1", 0x8CEB)
    assert v6.remote == ("::1", 0x912E) and v6.state == 6 and v6.inode == 0


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        (("127.0.0.1", 80), ("127.0.0.1", 80)),
        (("::ffff:198.51.100.7", 443, 0, 0), ("198.51.100.7", 443)),
        (("2001:DB8:0::1", 22, 0, 0), ("2001:db8::1", 22)),
        (("fe80::1%eth0", 22, 0, 2), ("fe80::1", 22)),
    ],
)
def test_normalise(endpoint: tuple[object, ...], expected: tuple[str, int]) -> None:
    assert _procnet.normalise(endpoint) == expected


def test_normalise_rejects_non_ip() -> None:
    with pytest.raises(ValueError):
        _procnet.normalise(("/tmp/sock",))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        _procnet.normalise(("example.com", 80))


def test_identity_json_is_the_wire_schema() -> None:
    identity = Identity(
        binary_path="/usr/bin/curl",
        binary_sha256="0" * 64,
        ancestors=("/bin/sh",),
        cmdline_paths=(),
        pid=10,
        start_time=5,
        uid=1000,
        owners=1,
        resolved_in_us=90,
        orphaned=True,
    )
    body = identity.to_wire()
    assert ConnectionIdentity.from_wire(body) == identity
    assert body["ancestors"] == ["/bin/sh"] and body["orphaned"] is True


def test_unresolved_reason_names_the_stage() -> None:
    exc = IdentityUnresolved(IdentityStage.FOREIGN_OWNER, "pid 1 holds it")
    assert exc.reason == "identity-unresolved: foreign-owner"
    assert exc.stage == "foreign-owner" and "pid 1" in str(exc)
    assert {s.value for s in IdentityStage} >= {"inode", "owners", "foreign-owner", "ambiguous", "vanished", "exe"}


def test_find_rows_matches_exactly_in_both_tables(tmp_path: Path) -> None:
    (tmp_path / "tcp").write_text(TCP)
    (tmp_path / "tcp6").write_text(TCP6)
    full = _procnet.read_tables(str(tmp_path))
    for row in full:
        assert _procnet.find_rows(str(tmp_path), row.local, row.remote) == [row]
    # the mapped row of tcp6 is found by its IPv4 spelling
    (mapped,) = _procnet.find_rows(str(tmp_path), ("127.0.0.1", 0xCA8A), ("10.51.100.7", 80))
    assert mapped.inode == 55
    assert _procnet.find_rows(str(tmp_path), ("127.0.0.1", 0xCA8A), ("10.51.100.7", 81)) == []
    assert _procnet.find_rows(str(tmp_path), ("10.51.100.7", 443), ("127.0.0.1", 59067)) == []  # direction
    (tmp_path / "tcp6").unlink()
    assert _procnet.find_rows(str(tmp_path), ("2001:db8::1", 0x8CEB), ("::1", 0x912E)) == []
