"""The interception CA and its leaves; handshakes run over memory BIOs (no sockets)."""

from __future__ import annotations

import ipaddress
import ssl

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from supervisor.control.l7.ca import InterceptionCA, LeafError

CA = InterceptionCA.generate("unit")


def handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, server_hostname: str) -> ssl.SSLObject:
    """Drive both sides of a TLS handshake in memory; returns the client's SSLObject (raises on failure)."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=server_hostname)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {"c": False, "s": False}
    for _ in range(20):
        for name, side in (("c", client), ("s", server)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return client
    raise AssertionError("handshake did not finish")


def agent_context(ca_pem: str, alpn: list[str] | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca_pem)
    ctx.set_alpn_protocols(alpn or ["h2", "http/1.1"])
    return ctx


def test_ca_certificate_shape() -> None:
    cert = x509.load_pem_x509_certificate(CA.cert_pem.encode())
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert basic.critical and basic.value.ca and basic.value.path_length == 0
    assert usage.key_cert_sign and usage.crl_sign and not usage.digital_signature
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey) and cert.public_key().curve.name == "secp256r1"
    assert "PRIVATE" not in CA.cert_pem and "unit" in cert.subject.rfc4514_string()


def test_dns_leaf_chains_to_the_ca_and_serves_http1_only() -> None:
    client = handshake(CA.leaf_context("API.Example.COM."), agent_context(CA.cert_pem), "api.example.com")
    assert client.selected_alpn_protocol() == "http/1.1"  # the agent offered h2 first
    leaf = x509.load_der_x509_certificate(client.getpeercert(binary_form=True))
    leaf.verify_directly_issued_by(x509.load_pem_x509_certificate(CA.cert_pem.encode()))
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["api.example.com"]
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


@pytest.mark.parametrize(("host", "address"), [("10.1.2.3", "10.1.2.3"), ("[2001:db8::1]", "2001:db8::1")])
def test_ip_leaf_has_an_ip_san(host: str, address: str) -> None:
    cert, _ = CA.issue_certificate(address)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address(address)]
    client = handshake(CA.leaf_context(host), agent_context(CA.cert_pem), address)
    assert client.version() in ("TLSv1.2", "TLSv1.3")


def test_leaf_for_one_host_does_not_pass_for_another() -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(CA.leaf_context("api.example.com"), agent_context(CA.cert_pem), "evil.example.com")


def test_another_sandbox_ca_is_not_trusted() -> None:
    other = InterceptionCA.generate("other")
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(other.leaf_context("api.example.com"), agent_context(CA.cert_pem), "api.example.com")


def test_leaves_are_cached_per_normalised_host_and_evicted_lru() -> None:
    ca = InterceptionCA(CA.certificate, _key(CA), cache_size=2)
    first = ca.leaf_context("a.test")
    assert ca.leaf_context("A.TEST.") is first and ca.issued == 1
    ca.leaf_context("b.test")
    ca.leaf_context("a.test")  # a is now the most recently used
    ca.leaf_context("c.test")  # evicts b
    assert ca.cached_hosts == 2 and ca.issued == 3
    assert ca.leaf_context("a.test") is first
    ca.leaf_context("b.test")
    assert ca.issued == 4


@pytest.mark.parametrize("host", ["", "a b", "a..b", "x/y", "-\x00"])
def test_unnameable_hosts(host: str) -> None:
    with pytest.raises(LeafError):
        CA.leaf_context(host)


def test_long_names_get_no_common_name_but_a_critical_san() -> None:
    host = ".".join(["a" * 30] * 3)
    cert, _ = CA.issue_certificate(host)
    assert cert.subject.rfc4514_string() == ""
    assert cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).critical


def test_round_trip_through_pem() -> None:
    again = InterceptionCA.from_pem(CA.cert_pem, CA.private_key_pem())
    handshake(again.leaf_context("x.test"), agent_context(CA.cert_pem), "x.test")
    with pytest.raises(ValueError):
        InterceptionCA.from_pem(CA.cert_pem, InterceptionCA.generate("z").private_key_pem())
    assert "PRIVATE" not in repr(CA)


def _key(ca: InterceptionCA) -> ec.EllipticCurvePrivateKey:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(ca.private_key_pem(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key
