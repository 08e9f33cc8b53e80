"""The Secrets of one sandbox: minted, reused, redacted — never printed.

Rules this module enforces:

1. The bootstrap bundles are minted by ``issue_bundle`` (the same code as ``certs issue``) from the claims the
   rendered objects imply, so claims and names cannot disagree. Each role's Secret also records the digest of
   the rendered policy (``policy.sha256``).
2. ``--reuse-secrets`` renders again with the same keys, so immutable Secrets re-apply unchanged. The reused
   bundles must load (``load_bundle``: key matches certificate, one CA, claims agree) and their claims and policy
   digest must equal what this render implies; otherwise the error names the first claim that differs.
3. Secret material is only ever written to a 0600 file in a 0700 directory, atomically, and never over an
   existing file unless it is the very file being reused. Redacted Secrets keep the non-secret keys
   (``claims.json``, ``policy.sha256``) readable and replace every other value with a description.
4. The proxy-pod topology has no boundary, hence no boundary bundle; it has a proxy token (read by control as
   ``--proxy-token-file`` and by the workload through ``secretKeyRef``) and a Secret holding the interception CA's
   certificate alone, the only part of the CA the workload ever mounts.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import os
import re
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from supervisor.control.interception import CERT_FILE as CA_CERT_FILE
from supervisor.control.interception import KEY_FILE as CA_KEY_FILE
from supervisor.control.l7 import InterceptionCA
from supervisor.protocol.certs import (
    BUNDLE_FILES,
    DEFAULT_VALIDITY,
    POLICY_DIGEST_FILE,
    BundleError,
    issue_bundle,
    load_bundle,
)
from supervisor.protocol.claims import CLAIM_FIELDS, Claims, ClaimsError, Role, claims_json, parse_claims_json
from supervisor.protocol.json_value import JsonValue

from .names import SandboxNames
from .objects import CREDENTIALS_FILE, PROXY_CA_FILE, PROXY_TOKEN_KEY, ROLE_CONTROL, ROLE_WORKLOAD, metadata
from .spec import RenderError, RenderSpec, Topology

__all__ = [
    "SECRETS_FILE",
    "SecretMaterial",
    "check_material",
    "check_operator_dir",
    "issue_material",
    "load_material",
    "redacted_secrets",
    "secret_objects",
    "write_operator_dir",
    "write_secrets_file",
]

SECRETS_FILE = "secrets.yaml"
_REUSE = "--reuse-secrets"
Doc = dict[str, JsonValue]

_DESCRIPTIONS = {
    "ca.pem": "the per-sandbox CA certificate",
    "cert.pem": "the leaf certificate of this role, carrying the claims",
    "key.pem": "the private key of this role",
    CA_CERT_FILE: "the TLS-interception CA certificate",
    CA_KEY_FILE: "the TLS-interception CA private key",
    CREDENTIALS_FILE: "the credentials file (--credentials)",
    PROXY_TOKEN_KEY: "the per-sandbox proxy token (the workload's proxy userinfo, control's --proxy-token-file)",
}
_TOKEN = re.compile(rb"[A-Za-z0-9._-]{16,}")


@dataclass(frozen=True)
class SecretMaterial:
    """File name → content for each Secret. ``credentials`` is ``None`` when the sandbox has none; ``boundary``
    is empty and ``proxy_token`` set in the proxy-pod topology."""

    boundary: dict[str, bytes]
    control: dict[str, bytes]
    interception_ca: dict[str, bytes]
    credentials: bytes | None = None
    # The operator bundle (``k8s render --operator-cert-out``): written to a directory, never a Secret.
    operator: dict[str, bytes] | None = None
    proxy_token: bytes | None = None


def issue_material(
    claims: Claims,
    policy_digest: str,
    *,
    validity: datetime.timedelta = DEFAULT_VALIDITY,
    credentials: bytes | None = None,
    now: datetime.datetime | None = None,
    operator: bool = False,
    proxy_pod: bool = False,
) -> SecretMaterial:
    """Mint both bundles (``issue_bundle``; with ``operator`` the operator's too) and a fresh interception CA;
    nothing is left on disk. ``proxy_pod``: no boundary bundle is kept, a fresh proxy token is minted."""
    staging = Path(tempfile.mkdtemp(prefix="openshell-render-"))
    wanted = (Role.BOUNDARY, Role.CONTROL, Role.OPERATOR) if operator else (Role.BOUNDARY, Role.CONTROL)
    try:
        issue_bundle(staging / "out", claims, validity=validity, now=now, operator=operator)
        roles = {
            role: {name: (staging / "out" / str(role) / name).read_bytes() for name in BUNDLE_FILES} for role in wanted
        }
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    digest = policy_digest.encode("ascii") + b"\n"
    ca = InterceptionCA.generate(claims.sandbox)
    return SecretMaterial(
        boundary={} if proxy_pod else {**roles[Role.BOUNDARY], POLICY_DIGEST_FILE: digest},
        control={**roles[Role.CONTROL], POLICY_DIGEST_FILE: digest},
        interception_ca={CA_CERT_FILE: ca.cert_pem.encode("ascii"), CA_KEY_FILE: ca.private_key_pem()},
        credentials=credentials,
        operator=roles.get(Role.OPERATOR),
        # 256 bits, URL-safe: it is the userinfo of the workload's proxy URL
        proxy_token=secrets.token_urlsafe(32).encode("ascii") if proxy_pod else None,
    )


def _secret(spec: RenderSpec, name: str, role: str, data: dict[str, bytes]) -> Doc:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(spec, name, role),
        "type": "Opaque",
        "immutable": True,  # renewal is new Secrets and new pods
        "data": {key: base64.b64encode(value).decode("ascii") for key, value in sorted(data.items())},
    }


def secret_objects(spec: RenderSpec, names: SandboxNames, material: SecretMaterial) -> list[Doc]:
    proxy_pod = spec.topology is Topology.PROXY_POD
    if proxy_pod != (material.proxy_token is not None) or proxy_pod == bool(material.boundary):
        raise RenderError("--topology", f"the Secret material is not that of the {spec.topology} topology")
    docs = [] if proxy_pod else [_secret(spec, names.boundary_bootstrap_secret, ROLE_WORKLOAD, material.boundary)]
    docs += [
        _secret(spec, names.control_bootstrap_secret, ROLE_CONTROL, material.control),
        _secret(spec, names.interception_ca_secret, ROLE_CONTROL, material.interception_ca),
    ]
    if material.credentials is not None:
        docs.append(_secret(spec, names.credentials_secret, ROLE_CONTROL, {CREDENTIALS_FILE: material.credentials}))
    if material.proxy_token is not None:
        docs.append(_secret(spec, names.proxy_token_secret, ROLE_WORKLOAD, {PROXY_TOKEN_KEY: material.proxy_token}))
        certificate = {PROXY_CA_FILE: material.interception_ca[CA_CERT_FILE]}
        docs.append(_secret(spec, names.proxy_ca_secret, ROLE_WORKLOAD, certificate))
    return docs


def redacted_secrets(spec: RenderSpec, names: SandboxNames, claims: Claims) -> list[Doc]:
    """The Secrets' shape for documentation: claims and digest as they will be, every other value described."""

    def shown(name: str, role: str, keys: tuple[str, ...], bundle: bool) -> Doc:
        doc = _secret(spec, name, role, {})
        del doc["data"]
        values: dict[str, str] = {key: f"<redacted: {_DESCRIPTIONS[key]}>" for key in keys}
        if bundle:
            values["claims.json"] = claims_json(claims).decode("utf-8") + "\n"
            values[POLICY_DIGEST_FILE] = spec.policy_digest + "\n"
        doc["stringData"] = dict(sorted(values.items()))
        return doc

    bundle_keys = tuple(k for k in BUNDLE_FILES if k != "claims.json")
    proxy_pod = spec.topology is Topology.PROXY_POD
    docs = [] if proxy_pod else [shown(names.boundary_bootstrap_secret, ROLE_WORKLOAD, bundle_keys, True)]
    docs += [
        shown(names.control_bootstrap_secret, ROLE_CONTROL, bundle_keys, True),
        shown(names.interception_ca_secret, ROLE_CONTROL, (CA_CERT_FILE, CA_KEY_FILE), False),
    ]
    if spec.has_credentials:
        docs.append(shown(names.credentials_secret, ROLE_CONTROL, (CREDENTIALS_FILE,), False))
    if proxy_pod:
        docs.append(shown(names.proxy_token_secret, ROLE_WORKLOAD, (PROXY_TOKEN_KEY,), False))
        ca = shown(names.proxy_ca_secret, ROLE_WORKLOAD, (), False)
        ca["stringData"] = {PROXY_CA_FILE: f"<redacted: {_DESCRIPTIONS[CA_CERT_FILE]} (of {CA_CERT_FILE}), no key>"}
        docs.append(ca)
    return docs


# -- reuse ------------------------------------------------------------------------------------------------------


def _decode(path: Path, doc: Doc) -> dict[str, bytes]:
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None  # load_material read it: always an object here
    data = doc.get("data")
    if not isinstance(data, dict):
        raise RenderError(_REUSE, f"{path}: Secret {name}: no data")
    out: dict[str, bytes] = {}
    for key, value in data.items():
        try:
            out[str(key)] = base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            raise RenderError(_REUSE, f"{path}: Secret {name}: data.{key} is not base64") from None
    return out


def load_material(directory: Path, names: SandboxNames, *, proxy_pod: bool = False) -> SecretMaterial:
    """Read ``DIR/secrets.yaml`` as written by an earlier render of the same sandbox (same UID → same names) and
    the same topology."""
    path = Path(directory) / SECRETS_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RenderError(_REUSE, f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError:
        raise RenderError(_REUSE, f"{path}: not YAML") from None  # never echo the text: it holds keys
    by_name: dict[str, Doc] = {}
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "Secret":
            by_name[str(doc.get("metadata", {}).get("name"))] = doc

    def need(name: str) -> dict[str, bytes]:
        if name not in by_name:
            raise RenderError(
                _REUSE, f"{path}: no Secret {name} (a different sandbox UID, or not a render's secrets file)"
            )
        return _decode(path, by_name[name])

    credentials = None
    if names.credentials_secret in by_name:
        credentials = need(names.credentials_secret).get(CREDENTIALS_FILE)
        if credentials is None:
            raise RenderError(_REUSE, f"{path}: Secret {names.credentials_secret} has no {CREDENTIALS_FILE}")
    proxy_token = None
    if proxy_pod:
        proxy_token = need(names.proxy_token_secret).get(PROXY_TOKEN_KEY)
        if proxy_token is None or not _TOKEN.fullmatch(proxy_token):
            raise RenderError(_REUSE, f"{path}: Secret {names.proxy_token_secret}: {PROXY_TOKEN_KEY} is not a token")
    return SecretMaterial(
        boundary={} if proxy_pod else need(names.boundary_bootstrap_secret),
        control=need(names.control_bootstrap_secret),
        interception_ca=need(names.interception_ca_secret),
        credentials=credentials,
        proxy_token=proxy_token,
    )


def check_material(material: SecretMaterial, claims: Claims, policy_digest: str, where: Path) -> None:
    """Rule 2: the reused bundles load, share one CA, and carry exactly this render's claims and digest."""
    staging = Path(tempfile.mkdtemp(prefix="openshell-render-check-"))
    try:
        cas = set()
        for role, files in ((Role.BOUNDARY, material.boundary), (Role.CONTROL, material.control)):
            if role is Role.BOUNDARY and not files and material.proxy_token is not None:
                continue  # the proxy-pod topology: no boundary
            directory = staging / str(role)
            directory.mkdir(mode=0o700)
            for name, content in files.items():
                if "/" in name or name.startswith("."):
                    raise RenderError(_REUSE, f"{where}: {role} bundle holds a bad key {name!r}")
                fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(content)
            try:
                bundle = load_bundle(directory, role)
            except BundleError as exc:
                shown = str(exc).replace(str(directory), f"{role} bundle")
                raise RenderError(_REUSE, f"{where}: {shown}") from None
            cas.add(files.get("ca.pem"))
            try:
                reused = parse_claims_json(files["claims.json"])
            except ClaimsError as exc:
                raise RenderError(_REUSE, f"{where}: {role} claims.json: {exc}") from None
            for field in CLAIM_FIELDS:
                want, got = getattr(claims, field), getattr(reused, field)
                if want != got:
                    raise RenderError(
                        _REUSE,
                        f"{where}: claim {field!r} of the reused {role} bundle is {got!r}, this render needs "
                        f"{want!r}; immutable Secrets cannot change: render without {_REUSE} for new ones",
                    )
            recorded = files.get(POLICY_DIGEST_FILE, b"").decode("ascii", "replace").strip()
            if recorded != policy_digest:
                raise RenderError(
                    _REUSE,
                    f"{where}: the reused {role} bundle records policy {recorded or 'nothing'}, this policy is "
                    f"{policy_digest}; change a running sandbox's policy as a revision (edit the ConfigMap or "
                    "`policy apply`), or render new Secrets",
                )
            assert bundle.claims == reused
        if len(cas) != 1:
            raise RenderError(_REUSE, f"{where}: the boundary and control bundles have different CAs")
        try:
            InterceptionCA.from_pem(material.interception_ca[CA_CERT_FILE], material.interception_ca[CA_KEY_FILE])
        except (KeyError, ValueError):
            raise RenderError(
                _REUSE, f"{where}: the interception CA Secret is incomplete or its key does not match"
            ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_secrets_file(directory: Path, text: str, *, replace: bool) -> Path:
    """Write ``DIR/secrets.yaml`` (0600, directory 0700) atomically; never over an existing file unless
    ``replace`` (the file being reused)."""
    directory = Path(directory)
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise RenderError("--secrets-dir", f"{directory}: cannot create: {exc.strerror or exc}") from None
    target = directory / SECRETS_FILE
    if (target.exists() or target.is_symlink()) and not replace:
        raise RenderError(
            "--secrets-dir",
            f"{target} exists; pass --reuse-secrets {directory} to render with the same keys, or choose another "
            "directory (applied immutable Secrets cannot be replaced)",
        )
    try:
        fd, tmp = tempfile.mkstemp(prefix=".secrets-", dir=directory)
    except OSError as exc:
        raise RenderError("--secrets-dir", f"{directory}: cannot write: {exc.strerror or exc}") from None
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def check_operator_dir(directory: Path) -> None:
    """``--operator-cert-out`` must be new or empty: an operator bundle is never overwritten."""
    directory = Path(directory)
    if directory.is_symlink() or (directory.exists() and not directory.is_dir()):
        raise RenderError("--operator-cert-out", f"{directory}: exists and is not a directory")
    if directory.is_dir() and any(directory.iterdir()):
        raise RenderError("--operator-cert-out", f"{directory}: exists and is not empty")
    if not directory.parent.is_dir():
        raise RenderError("--operator-cert-out", f"{directory.parent}: no such directory")


def write_operator_dir(directory: Path, files: dict[str, bytes]) -> None:
    """The operator bundle for ``--api https://… --cert DIR``: a 0700 directory, key.pem 0600, the rest 0644."""
    check_operator_dir(directory)
    directory = Path(directory)
    if directory.is_dir():
        directory.rmdir()
    os.mkdir(directory, 0o700)
    os.chmod(directory, 0o700)
    try:
        for name, content in files.items():
            mode = 0o600 if name == "key.pem" else 0o644
            fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as out:
                out.write(content)
    except OSError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        raise RenderError("--operator-cert-out", f"{directory}: cannot write: {exc.strerror or exc}") from None
