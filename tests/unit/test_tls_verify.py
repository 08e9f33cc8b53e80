"""verify_peer and the link's TLS contexts without a handshake (supervisor/protocol/tls.py): each refusal, with the
field and reason the peer is told, and what each context sets on top of the library's defaults."""

from __future__ import annotations

import dataclasses
import datetime
import ssl
from pathlib import Path

import pytest

from supervisor.protocol import tls
from supervisor.protocol.certs import Bundle, BundleError
from supervisor.protocol.errors import ErrorKind
from supervisor.protocol.tls import PeerRejected, client_context, server_context, verify_peer
from tests.certs_fixtures import issue_pair


@dataclasses.dataclass
class Handshake:
    """What verify_peer reads of a completed handshake."""

    tls_version: str | None = "TLSv1.3"
    alpn: str | None = tls.ALPN_OPS
    der: bytes | None = b""

    def version(self) -> str | None:
        return self.tls_version

    def selected_alpn_protocol(self) -> str | None:
        return self.alpn

    def getpeercert(self, binary_form: bool) -> bytes | None:
        return self.der


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Bundle, Bundle]:
    return issue_pair(tmp_path_factory.mktemp("pair"))


REFUSED = [
    (Handshake(tls_version="TLSv1.2"), "tls", "negotiated TLSv1.2, TLSv1.3 required"),
    (Handshake(tls_version=None), "tls", "negotiated no TLS version, TLSv1.3 required"),
    (Handshake(alpn=None), "alpn", "no ALPN protocol negotiated"),
    (Handshake(der=None), "certificate", "peer presented no certificate"),
    (Handshake(der=b""), "certificate", "peer presented no certificate"),
]


@pytest.mark.parametrize(("handshake", "field", "reason"), REFUSED)
def test_each_refusal_names_its_field_and_reason(
    pair: tuple[Bundle, Bundle], handshake: Handshake, field: str, reason: str
) -> None:
    with pytest.raises(PeerRejected) as info:
        verify_peer(handshake, pair[0])
    rejected = info.value
    assert (rejected.field, rejected.reason, rejected.args) == (field, reason, (field, reason))
    assert str(rejected) == f"peer rejected [{field}]: {reason}"
    op = rejected.to_op_error()
    assert (op.kind, op.reason, op.field) == (ErrorKind.DENIED, reason, field)


def test_a_rejection_without_a_field_says_so_plainly() -> None:
    assert str(PeerRejected(None, "why")) == "peer rejected: why"


def test_an_unreadable_ca_is_a_refusal_naming_it(pair: tuple[Bundle, Bundle], tmp_path: Path) -> None:
    bundle = dataclasses.replace(pair[0], ca_certificate=None, ca_path=tmp_path / "missing.pem")
    with pytest.raises(PeerRejected) as info:
        verify_peer(Handshake(der=b"x"), bundle)
    assert info.value.field == "certificate"
    assert info.value.reason.startswith(f"cannot read the sandbox CA {tmp_path / 'missing.pem'}: ")


def test_the_validity_window_includes_both_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    end = start + datetime.timedelta(days=1)
    for now in (start, end):
        monkeypatch.setattr(tls, "_utc_now", lambda now=now: now)
        tls._check_dates(start, end)
    monkeypatch.setattr(tls, "_utc_now", lambda: end + datetime.timedelta(seconds=1))
    with pytest.raises(PeerRejected) as info:
        tls._check_dates(start, end)
    assert (info.value.field, info.value.reason) == (
        "certificate", "peer certificate is valid only from 2026-01-01T00:00:00Z to 2026-01-02T00:00:00Z"
    )  # fmt: skip


def test_the_contexts_add_to_the_librarys_defaults(pair: tuple[Bundle, Bundle]) -> None:
    server, client = server_context(pair[1]), client_context(pair[0], [tls.ALPN_OPS])
    defaults = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    assert server.verify_flags == defaults.verify_flags | ssl.VERIFY_X509_STRICT
    assert client.verify_flags == defaults.verify_flags | ssl.VERIFY_X509_STRICT
    assert server.num_tickets == 0 and server.options == defaults.options | ssl.OP_NO_TICKET
    assert client.protocol == ssl.PROTOCOL_TLS_CLIENT and not client.check_hostname
    assert client.verify_mode == server.verify_mode == ssl.CERT_REQUIRED


def test_a_bundle_that_does_not_load_names_its_files(pair: tuple[Bundle, Bundle], tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(BundleError, match=rf"^{junk}: cannot load as a CA: "):
        client_context(dataclasses.replace(pair[0], ca_path=junk), [tls.ALPN_OPS])
    bad = dataclasses.replace(pair[0], cert_path=junk)
    with pytest.raises(BundleError, match=rf"^{junk}, {pair[0].key_path}: cannot load as a key pair: "):
        client_context(bad, [tls.ALPN_OPS])
