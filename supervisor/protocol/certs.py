"""Bootstrap bundles: a per-sandbox CA and one leaf per role, minted and loaded (docs/design.md "Settled details").

Size (over ~500 lines on purpose): minting and loading are the two halves of one bundle format, kept in one place.

Rules this module enforces:

1. One CA per sandbox (ECDSA P-256, CA:TRUE, pathlen 0, keyCertSign). Its key signs the two leaves and is
   then dropped, unless the operator asks for it with ``ca_key_out``: nothing at runtime needs it, because
   renewal is a new pod.
2. Each leaf (ECDSA P-256, digitalSignature, EKU serverAuth + clientAuth) carries the sandbox's claims and
   its role in a non-critical extension under ``CLAIMS_OID``: a DER UTF8String holding the canonical JSON of
   ``encode_claims``. A SPIFFE-style URI SAN repeats the identity for humans and tools.
3. ``issue_bundle`` writes ``<out>/control/`` and ``<out>/boundary/`` (and ``<out>/operator/`` only when asked:
   a bundle without the operator role is unchanged), each holding ``ca.pem``,
   ``cert.pem``, ``key.pem`` (0600) and ``claims.json``, in 0700 directories. It never overwrites a
   non-empty role directory, and builds everything in a temporary directory first so that a failure leaves
   nothing half-written.
4. ``load_bundle`` refuses, with a message naming the file, anything a daemon should not start with: a
   missing file, a key that group or others could read or that another uid owns, the other role's
   certificate, a certificate not issued by the bundle's CA, claims that differ from ``claims.json``, a key
   that does not match its certificate. Validity dates are left to the TLS handshake (which checks them on
   both sides), so that a bundle can be inspected even when expired.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .claims import (
    CLAIMS_OID,
    LINK_ROLES,
    Claims,
    ClaimsError,
    Role,
    claims_json,
    decode_claims,
    encode_claims,
    parse_claims_json,
    spiffe_uri,
)

__all__ = [
    "BUNDLE_FILES",
    "DEFAULT_VALIDITY",
    "NOT_BEFORE_SKEW",
    "POLICY_DIGEST_FILE",
    "VALIDITY_SUBJECTS",
    "Bundle",
    "BundleError",
    "CertificateAuthority",
    "claims_extension_value",
    "claims_from_extension_value",
    "issue_bundle",
    "issue_operator",
    "load_bundle",
    "make_ca",
    "make_leaf",
    "read_peer_certificate",
    "read_policy_digest",
    "write_role_dir",
]

DEFAULT_VALIDITY = datetime.timedelta(days=30)
NOT_BEFORE_SKEW = datetime.timedelta(minutes=5)  # tolerate clocks a little behind the issuer's
# The certificates a bundle can hold, by the names the CLI uses (operator only with issue_bundle(operator=True)).
VALIDITY_SUBJECTS = ("ca", "control", "boundary", "operator")
CA_FILE, CERT_FILE, KEY_FILE, CLAIMS_FILE = "ca.pem", "cert.pem", "key.pem", "claims.json"
BUNDLE_FILES: tuple[str, ...] = (CA_FILE, CERT_FILE, KEY_FILE, CLAIMS_FILE)
# Optional fifth file, written by `k8s render`: "sha256:<hex>" of the policy the sandbox was rendered with, so
# control can say which revision it started from (later revisions are policy generations, never claims).
POLICY_DIGEST_FILE = "policy.sha256"
_MAX_FILE = 1 << 20


class BundleError(Exception):
    """A bootstrap bundle that cannot be written or used; the message names the file and the problem."""


@dataclass(frozen=True)
class Bundle:
    role: Role
    directory: Path
    ca_path: Path
    cert_path: Path
    key_path: Path
    claims: Claims  # the sandbox's expected claims (claims.json; role-independent)
    # Filled by load_bundle; verify_peer re-checks the peer against this CA without re-reading the file.
    ca_certificate: x509.Certificate | None = field(default=None, repr=False, compare=False)
    not_after: datetime.datetime | None = field(default=None, compare=False)


@dataclass(frozen=True)
class CertificateAuthority:
    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate


# --- DER UTF8String wrapper for the claims extension -------------------------------------------------------

_UTF8STRING = 0x0C


def _der_utf8string(data: bytes) -> bytes:
    n = len(data)
    if n < 0x80:
        length = bytes([n])
    else:
        body = n.to_bytes((n.bit_length() + 7) // 8, "big")
        length = bytes([0x80 | len(body)]) + body
    return bytes([_UTF8STRING]) + length + data


def _der_utf8string_content(der: bytes) -> bytes:
    """Strict DER: the UTF8String tag, a minimal definite length, and nothing after the content."""
    if len(der) < 2 or der[0] != _UTF8STRING:
        raise ClaimsError("claims extension is not a DER UTF8String")
    first = der[1]
    if first < 0x80:
        length, start = first, 2
    else:
        count = first & 0x7F
        if count == 0 or count > 4 or len(der) < 2 + count:
            raise ClaimsError("claims extension has a bad DER length")
        length = int.from_bytes(der[2 : 2 + count], "big")
        if length < 0x80 or der[2] == 0:
            raise ClaimsError("claims extension has a non-minimal DER length")
        start = 2 + count
    if len(der) - start != length:
        raise ClaimsError("claims extension length does not match its content")
    return der[start:]


def claims_extension_value(claims: Claims, role: Role) -> bytes:
    """The DER content of the claims extension a leaf carries."""
    return _der_utf8string(encode_claims(claims, role))


def claims_from_extension_value(der: bytes) -> tuple[Claims, Role]:
    """The claims and role of a claims extension's DER content; ``ClaimsError`` if malformed."""
    return decode_claims(_der_utf8string_content(der))


# --- issuing ------------------------------------------------------------------------------------------------


def _utc_now(now: datetime.datetime | None) -> datetime.datetime:
    if now is None:
        return datetime.datetime.now(datetime.UTC)
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return now.astimezone(datetime.UTC)


def _check_validity(validity: datetime.timedelta) -> None:
    if validity <= datetime.timedelta(0):
        raise ValueError("validity must be positive")


def _window(
    now: datetime.datetime | None,
    validity: datetime.timedelta,
    not_before: datetime.datetime | None,
    not_after: datetime.datetime | None,
) -> tuple[datetime.datetime, datetime.datetime]:
    """A certificate's validity: ``now - 5 min`` to ``now + validity`` unless given exactly (then used as is)."""
    _check_validity(validity)
    start = _utc_now(now)
    first = _utc_now(not_before) if not_before is not None else start - NOT_BEFORE_SKEW
    last = _utc_now(not_after) if not_after is not None else start + validity
    if first >= last:
        raise ValueError(f"not-before {first:%Y-%m-%dT%H:%M:%SZ} is not before not-after {last:%Y-%m-%dT%H:%M:%SZ}")
    return first, last


def make_ca(
    *,
    validity: datetime.timedelta = DEFAULT_VALIDITY,
    now: datetime.datetime | None = None,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
) -> CertificateAuthority:
    """A fresh per-sandbox CA, valid from ``now - 5 min`` to ``now + validity`` (or exactly ``not_before`` /
    ``not_after`` when given)."""
    first, last = _window(now, validity, not_before, not_after)
    key = ec.generate_private_key(ec.SECP256R1())
    # A random suffix keeps CA names distinct across sandboxes, which makes chain errors easier to read.
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"openshell-sandbox CA {os.urandom(6).hex()}")])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(first)
        .not_valid_after(last)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertificateAuthority(key=key, certificate=cert)


def _dns_name(claims: Claims, role: Role) -> str | None:
    """``<role>.<sandbox>.<namespace>.openshell.invalid`` when every label is a valid DNS label."""
    labels = [str(role), claims.sandbox, claims.namespace, "openshell", "invalid"]
    for label in labels:
        if not (0 < len(label) <= 63 and label.isascii() and label.replace("-", "").isalnum()):
            return None
        if label[0] == "-" or label[-1] == "-":
            return None
    name = ".".join(labels).lower()
    return name if len(name) <= 253 else None


def make_leaf(
    ca: CertificateAuthority,
    claims: Claims,
    role: Role,
    *,
    validity: datetime.timedelta = DEFAULT_VALIDITY,
    now: datetime.datetime | None = None,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A leaf for ``role`` carrying ``claims``, signed by ``ca``; validity as for :func:`make_ca`."""
    first, last = _window(now, validity, not_before, not_after)
    role = Role(role)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(spiffe_uri(claims, role))]
    dns = _dns_name(claims, role)
    if dns is not None:
        sans.append(x509.DNSName(dns))
    ca_ski = ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"openshell-sandbox {role}")]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(first)
        .not_valid_after(last)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .add_extension(
            x509.UnrecognizedExtension(CLAIMS_OID, claims_extension_value(claims, role)),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    return key, cert


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create ``path`` exclusively with exactly ``mode`` (umask-independent) and flush it to disk."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def write_role_dir(
    directory: Path,
    ca_certificate: x509.Certificate,
    key: ec.EllipticCurvePrivateKey,
    certificate: x509.Certificate,
    claims: Claims,
) -> None:
    """Create ``directory`` (0700) holding one role's four bundle files. ``directory`` must not exist."""
    os.mkdir(directory, 0o700)
    os.chmod(directory, 0o700)
    _write_new(directory / CA_FILE, _cert_pem(ca_certificate), 0o644)
    _write_new(directory / CERT_FILE, _cert_pem(certificate), 0o644)
    _write_new(directory / KEY_FILE, _key_pem(key), 0o600)
    _write_new(directory / CLAIMS_FILE, claims_json(claims) + b"\n", 0o644)


def _refuse_existing(target: Path) -> None:
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise BundleError(f"{target}: exists and is not a directory; refusing to overwrite it")
    if target.is_dir() and any(target.iterdir()):
        raise BundleError(f"{target}: exists and is not empty; refusing to overwrite a bundle")


def issue_bundle(
    out_dir: Path,
    claims: Claims,
    *,
    validity: datetime.timedelta = DEFAULT_VALIDITY,
    ca_key_out: Path | None = None,
    now: datetime.datetime | None = None,
    not_before: Mapping[str, datetime.datetime] | None = None,
    not_after: Mapping[str, datetime.datetime] | None = None,
    operator: bool = False,
) -> None:
    """Mint a per-sandbox CA and both leaves; write ``out_dir/control`` and ``out_dir/boundary`` (and
    ``out_dir/operator`` with ``operator``: a certificate for control's TCP operator API).

    ``now`` is the issuing clock (tests pass one). ``not_before`` / ``not_after`` set one certificate's bound
    exactly, keyed by ``ca``, ``control``, ``boundary`` or ``operator`` (``certs issue --not-before ROLE=TIME``);
    every bound not given is the default window around ``now``. Nothing is written when a window is empty.
    """
    subjects = VALIDITY_SUBJECTS if operator else tuple(n for n in VALIDITY_SUBJECTS if n != str(Role.OPERATOR))
    unknown = sorted({*(not_before or {}), *(not_after or {})} - set(subjects))
    if unknown:
        raise ValueError(f"no certificate named {unknown[0]!r} is issued (one of {', '.join(subjects)})")
    windows: dict[str, tuple[datetime.datetime, datetime.datetime]] = {}
    for name in subjects:
        first = (not_before or {}).get(name)
        last = (not_after or {}).get(name)
        windows[name] = _window(now, validity, first, last)
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise BundleError(f"{out_dir}: cannot create the output directory: {exc.strerror or exc}") from None
    roles = (*LINK_ROLES, Role.OPERATOR) if operator else LINK_ROLES
    targets = {role: out_dir / str(role) for role in roles}
    for target in targets.values():
        _refuse_existing(target)
    if ca_key_out is not None:
        ca_key_out = Path(ca_key_out)
        if ca_key_out.exists() or ca_key_out.is_symlink():
            raise BundleError(f"{ca_key_out}: exists; refusing to overwrite a CA key")
        if not ca_key_out.parent.is_dir():
            raise BundleError(f"{ca_key_out.parent}: no such directory for the CA key")

    ca = make_ca(not_before=windows["ca"][0], not_after=windows["ca"][1])
    placed: list[Path] = []
    try:
        staging = Path(tempfile.mkdtemp(prefix=".certs-issue-", dir=out_dir))
    except OSError as exc:
        raise BundleError(f"{out_dir}: cannot write here: {exc.strerror or exc}") from None
    try:
        for role in targets:
            key, cert = make_leaf(ca, claims, role, not_before=windows[role][0], not_after=windows[role][1])
            write_role_dir(staging / str(role), ca.certificate, key, cert, claims)
        if ca_key_out is not None:
            _place_ca_key(ca.key, ca_key_out)
            placed.append(ca_key_out)
        for role, target in targets.items():
            # rename(2) onto an empty directory replaces it; onto a non-empty one it fails (ENOTEMPTY),
            # which closes the race with the check above.
            os.rename(staging / str(role), target)
            placed.append(target)
    except BaseException as exc:
        for path in reversed(placed):
            with contextlib.suppress(OSError):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        if isinstance(exc, OSError):
            where = exc.filename or out_dir
            raise BundleError(f"{where}: cannot write the bundle: {exc.strerror or exc}") from None
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def issue_operator(
    out_dir: Path,
    bundle_dir: Path,
    ca_key_path: Path,
    *,
    validity: datetime.timedelta = DEFAULT_VALIDITY,
    now: datetime.datetime | None = None,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
) -> None:
    """A later operator certificate: the CA certificate and claims from an issued role directory
    (``bundle_dir``, e.g. ``OUT/control``), signed with the CA key kept by ``certs issue --ca-key-out``;
    written to ``out_dir`` (must not exist or be empty). ``BundleError`` names the file at fault."""
    bundle_dir, ca_key_path, out_dir = Path(bundle_dir), Path(ca_key_path), Path(out_dir)
    ca_cert = _load_cert(bundle_dir / CA_FILE)
    try:
        claims = parse_claims_json(_read(bundle_dir / CLAIMS_FILE))
    except ClaimsError as exc:
        raise BundleError(f"{bundle_dir / CLAIMS_FILE}: {exc}") from None
    try:
        key = serialization.load_pem_private_key(_read_private_key(ca_key_path), password=None)
    except (ValueError, TypeError) as exc:
        raise BundleError(f"{ca_key_path}: not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise BundleError(f"{ca_key_path}: not an ECDSA key")
    pub = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*pub) != ca_cert.public_key().public_bytes(*pub):
        raise BundleError(f"{ca_key_path}: is not the key of the CA in {bundle_dir / CA_FILE}")
    _refuse_existing(out_dir)
    leaf_key, cert = make_leaf(
        CertificateAuthority(key=key, certificate=ca_cert), claims, Role.OPERATOR,
        validity=validity, now=now, not_before=not_before, not_after=not_after,
    )  # fmt: skip
    if out_dir.is_dir():
        out_dir.rmdir()  # empty (checked above): write_role_dir creates it 0700 itself
    try:
        write_role_dir(out_dir, ca_cert, leaf_key, cert, claims)
    except OSError as exc:
        shutil.rmtree(out_dir, ignore_errors=True)
        where = exc.filename or out_dir
        raise BundleError(f"{where}: cannot write the operator bundle: {exc.strerror or exc}") from None


def _place_ca_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    """Write the CA key beside ``path`` and link it into place: never a partial file, never an overwrite."""
    fd, tmp_name = tempfile.mkstemp(prefix=".ca-key-", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        tmp.unlink()
        _write_new(tmp, _key_pem(key), 0o600)
        os.link(tmp, path)  # fails with EEXIST instead of replacing
    except FileExistsError:
        raise BundleError(f"{path}: exists; refusing to overwrite a CA key") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def read_policy_digest(directory: Path) -> str | None:
    """The bundle's recorded policy digest (``sha256:<64 hex>``), ``None`` when absent; ``BundleError`` if
    malformed."""
    path = Path(directory) / POLICY_DIGEST_FILE
    if not path.exists():
        return None
    text = _read(path).decode("ascii", "replace").strip()
    algo, _, hexdigest = text.partition(":")
    if algo != "sha256" or len(hexdigest) != 64 or any(c not in "0123456789abcdef" for c in hexdigest):
        raise BundleError(f"{path}: not 'sha256:<64 lowercase hex digits>'")
    return text


# --- loading ------------------------------------------------------------------------------------------------


def _read(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_FILE + 1)
    except FileNotFoundError:
        raise BundleError(f"{path}: missing") from None
    except OSError as exc:
        raise BundleError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > _MAX_FILE:
        raise BundleError(f"{path}: larger than {_MAX_FILE} bytes")
    return data


def _read_private_key(path: Path) -> bytes:
    """Read the key through one descriptor and check that same file's owner and mode (no TOCTOU)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise BundleError(f"{path}: missing") from None
    except OSError as exc:
        raise BundleError(f"{path}: cannot read: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BundleError(f"{path}: not a regular file")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise BundleError(
                f"{path}: mode {mode:04o} lets group or others access the private key; it must be 0600 or 0400"
            )
        if st.st_uid != os.geteuid():
            raise BundleError(f"{path}: owned by uid {st.st_uid}, not by this process's uid {os.geteuid()}")
        data = f.read(_MAX_FILE + 1)
    if len(data) > _MAX_FILE:
        raise BundleError(f"{path}: larger than {_MAX_FILE} bytes")
    return data


def _load_cert(path: Path) -> x509.Certificate:
    data = _read(path)
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise BundleError(f"{path}: not a PEM certificate: {exc}") from None
    if len(certs) != 1:
        raise BundleError(f"{path}: holds {len(certs)} certificates, expected exactly one")
    return certs[0]


def _claims_from_cert(cert: x509.Certificate) -> tuple[Claims, Role]:
    try:
        ext = cert.extensions.get_extension_for_oid(CLAIMS_OID)
    except x509.ExtensionNotFound:
        raise ClaimsError("certificate has no claims extension") from None
    except (ValueError, x509.DuplicateExtension) as exc:
        raise ClaimsError(f"certificate extensions are malformed: {exc}") from None
    value = ext.value
    if not isinstance(value, x509.UnrecognizedExtension):
        raise ClaimsError("claims extension has an unexpected type")
    return claims_from_extension_value(value.value)


def read_peer_certificate(der: bytes) -> tuple[Claims, Role]:
    """The claims and role a DER certificate carries; ``ClaimsError`` if absent or malformed."""
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError as exc:
        raise ClaimsError(f"peer certificate is not valid DER: {exc}") from None
    return _claims_from_cert(cert)


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        bc = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except (x509.ExtensionNotFound, ValueError, x509.DuplicateExtension):
        return False
    return bc.ca


def load_bundle(directory: Path, role: Role) -> Bundle:
    """Load and check one role's bootstrap directory; ``BundleError`` names the file that is wrong."""
    directory = Path(directory)
    role = Role(role)
    if not directory.is_dir():
        raise BundleError(f"{directory}: not a directory")
    paths = {name: directory / name for name in BUNDLE_FILES}
    for name, path in paths.items():
        if not path.exists():
            raise BundleError(f"{path}: missing ({name} is one of the bundle's {len(BUNDLE_FILES)} files)")

    key_path, cert_path, ca_path = paths[KEY_FILE], paths[CERT_FILE], paths[CA_FILE]
    key_pem = _read_private_key(key_path)
    cert = _load_cert(cert_path)
    ca = _load_cert(ca_path)

    try:
        cert_claims, cert_role = _claims_from_cert(cert)
    except ClaimsError as exc:
        raise BundleError(f"{cert_path}: {exc}") from None
    if cert_role != role:
        raise BundleError(f"{cert_path}: this directory holds the {cert_role} role's key, not the {role} role's")

    if not _is_ca(ca):
        raise BundleError(f"{ca_path}: not a CA certificate (basicConstraints CA:TRUE missing)")
    try:
        ca.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise BundleError(f"{ca_path}: not a self-signed CA certificate") from None
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise BundleError(f"{cert_path}: not issued by the CA in {ca_path}") from None

    try:
        expected = parse_claims_json(_read(paths[CLAIMS_FILE]))
    except ClaimsError as exc:
        raise BundleError(f"{paths[CLAIMS_FILE]}: {exc}") from None
    if cert_claims != expected:
        differing = next(n for n in expected.to_dict() if getattr(expected, n) != getattr(cert_claims, n))
        raise BundleError(f"{cert_path}: claim {differing!r} in the certificate differs from {paths[CLAIMS_FILE]}")

    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise BundleError(f"{key_path}: not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise BundleError(f"{key_path}: not an ECDSA key")
    pub = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*pub) != cert.public_key().public_bytes(*pub):
        raise BundleError(f"{key_path}: does not match the certificate in {cert_path}")

    return Bundle(
        role=role,
        directory=directory,
        ca_path=ca_path,
        cert_path=cert_path,
        key_path=key_path,
        claims=expected,
        ca_certificate=ca,
        not_after=cert.not_valid_after_utc,
    )
