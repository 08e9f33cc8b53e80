"""``credential_signing`` end to end in dev mode (model R, as root): boto3 in the agent, holding only the placeholder
key pair its environment gives it, against moto's S3 server on a test host with IAM authentication switched on.

Moto checks every request's SigV4 signature against the secret of the IAM user's access key (its
``/moto-api/reset-auth`` turns the check on once the operator has made the user, its key and the bucket), so a
request it answers is one control signed with the real key. The agent runs boto3 with its default config
(``PutObject`` as aws-chunked with a checksum trailer) and with ``request_checksum_calculation="when_required"``
(a plain body): ``PutObject``, ``GetObject``, ``ListObjectsV2``. A request signed with another key id is refused by
control and nothing reaches moto. The real key pair is in dev's environment only; the agent finds it in none of
its variables, the environment or command line of any process it sees, the files it can read, or the answers.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme

from tests.netns_hosts import DnsServer, NetnsHost, open_test_host, require_netns

CLI = [sys.executable, "-m", "supervisor.cli"]
SDKS = Path(os.environ.get("OPENSHELL_INFERENCE_SDKS", "/opt/openshell-inference-sdks"))
PORT = 8443
BUCKET = "agent-bucket"
ID_PLACEHOLDER = "openshell:resolve:env:AWS_ACCESS_KEY_ID"
SECRET_PLACEHOLDER = "openshell:resolve:env:AWS_SECRET_ACCESS_KEY"

POLICY = """\
version: 1
network_policies:
  s3:
    endpoints:
      - host: s3.test
        port: {port}
        credential_signing: sigv4
        signing_service: s3
        signing_region: us-east-1
        allowed_ips: ["{address}/32"]
    binaries: [{{path: /usr/bin/python3*}}]
"""

# the operator's side, run with the SDKs' interpreter before the agent starts: the IAM user, its key, the bucket,
# then IAM authentication on; a request signed with a wrong secret is then refused by moto (it really checks)
SETUP = """\
import json, sys
import boto3, botocore.config, botocore.exceptions, requests
url, ca = sys.argv[1], sys.argv[2]
cfg = botocore.config.Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
anon = dict(endpoint_url=url, region_name="us-east-1", verify=ca, aws_access_key_id="AKIASETUP00000000000",
            aws_secret_access_key="setup", config=cfg)
iam = boto3.client("iam", **anon)
iam.create_user(UserName="operator")
iam.put_user_policy(UserName="operator", PolicyName="s3", PolicyDocument=json.dumps({"Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
key = iam.create_access_key(UserName="operator")["AccessKey"]
boto3.client("s3", **anon).create_bucket(Bucket=sys.argv[3])
requests.post(url + "/moto-api/reset-auth", data=b"0", verify=ca).raise_for_status()
wrong = dict(anon, aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"][::-1])
try:
    boto3.client("s3", **wrong).list_objects_v2(Bucket=sys.argv[3])
    checked = "accepted"
except botocore.exceptions.ClientError as exc:
    checked = exc.response["Error"]["Code"]
print(json.dumps({"id": key["AccessKeyId"], "secret": key["SecretAccessKey"], "checked": checked}))
"""

# the operator reads the bucket with the real key after the agent ran
LIST = """\
import json, sys
import boto3, botocore.config
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1", verify=sys.argv[2],
                  aws_access_key_id=sys.argv[4], aws_secret_access_key=os.environ["REAL_SECRET"],
                  config=botocore.config.Config(s3={"addressing_style": "path"}))
out = {o["Key"]: s3.get_object(Bucket=sys.argv[3], Key=o["Key"])["Body"].read().decode()
       for o in s3.list_objects_v2(Bucket=sys.argv[3]).get("Contents", [])}
print(json.dumps(out))
""".replace("import json, sys", "import json, os, sys")

AGENT = """\
import json, os, sys
sys.path.insert(0, {site!r})
import boto3, botocore.config, botocore.exceptions
out = {{"env": {{k: v for k, v in os.environ.items() if k.startswith("AWS_")}}}}
url = "https://s3.test:{port}"
for name, extra in (("default", {{}}), ("when_required", {{"request_checksum_calculation": "when_required"}})):
    cfg = botocore.config.Config(s3={{"addressing_style": "path"}}, retries={{"max_attempts": 1}}, **extra)
    s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1", config=cfg)
    body = (name + " object bytes ") * 4000
    s3.put_object(Bucket={bucket!r}, Key=name + "/obj", Body=body.encode())
    got = s3.get_object(Bucket={bucket!r}, Key=name + "/obj")
    listed = s3.list_objects_v2(Bucket={bucket!r}, Prefix=name + "/")
    out[name] = {{"same": got["Body"].read().decode() == body, "listed": [o["Key"] for o in listed["Contents"]],
                  "answers": json.dumps([got["ResponseMetadata"], listed], default=str)}}
other = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="AKIAAGENTCHOSE000001",
                     aws_secret_access_key="agent-chosen-secret", config=botocore.config.Config(
                         s3={{"addressing_style": "path"}}, retries={{"max_attempts": 1}}))
raw = []
other.meta.events.register("before-parse.s3.PutObject", lambda response_dict, **_: raw.append(response_dict["body"]))
try:
    other.put_object(Bucket={bucket!r}, Key="other-key/obj", Body=b"must not arrive")
    out["other"] = "stored"
except botocore.exceptions.ClientError as exc:
    out["other"] = [exc.response["ResponseMetadata"]["HTTPStatusCode"], json.loads(raw[-1])]
# the agent looks for the real key wherever it can read (given reversed, so its own command line never holds it)
needles = [n[::-1] for n in {needles!r}]
found = []
def look(path, data):
    for n in needles:
        if n.encode() in data:
            found.append(path)
for pid in os.listdir("/proc"):
    for part in ("environ", "cmdline"):
        try:
            look(f"/proc/{{pid}}/{{part}}", open(f"/proc/{{pid}}/{{part}}", "rb").read())
        except OSError:
            pass
scanned = 0
for root in ("/tmp", "/run", "/var/tmp", "/etc", "/root", "/home", os.getcwd(), *{roots!r}):
    for top, dirs, files in os.walk(root):
        for f in files:
            path = os.path.join(top, f)
            try:
                if os.path.isfile(path) and os.path.getsize(path) < 4 << 20:
                    look(path, open(path, "rb").read())
                    scanned += 1
            except OSError:
                pass
out["found"], out["scanned"] = found, scanned
print("RESULT " + json.dumps(out))
"""


@dataclass
class S3World:
    host: NetnsHost
    dns: DnsServer
    moto_log: Path
    policy: Path
    credentials: Path
    ca_file: Path
    runtime: str
    root: Path
    key_id: str
    secret: str

    def dev(self, command: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
        env = {**os.environ, "XDG_RUNTIME_DIR": self.runtime, "REAL_AWS_ACCESS_KEY_ID": self.key_id,
               "REAL_AWS_SECRET_ACCESS_KEY": self.secret}  # fmt: skip
        result = subprocess.run(
            [*CLI, "dev", "--log-format=json", f"--policy={self.policy}",
             f"--dns-server={self.dns.address[0]}:{self.dns.address[1]}", f"--credentials={self.credentials}",
             f"--upstream-ca={self.ca_file}", "--", "sh", "-c", command],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
        events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
        return result, events

    def operator_objects(self) -> dict[str, str]:
        argv = [str(SDKS / "bin" / "python"), "-c", LIST, f"https://{self.host.address}:{PORT}", str(self.ca_file),
                BUCKET, self.key_id]  # fmt: skip
        env = {**os.environ, "REAL_SECRET": self.secret}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=True)
        objects: dict[str, str] = json.loads(done.stdout)
        return objects


def _site() -> str:
    found = sorted(SDKS.glob("lib/python3*/site-packages"))
    if not found or not (found[0] / "boto3").is_dir() or not (found[0] / "moto").is_dir():
        pytest.skip(f"boto3 and moto are not installed in {SDKS} (scripts/install-inference-sdks.sh)")
    return str(found[0])


def _wait_listening(address: str, moto: subprocess.Popen[Any], log: Path) -> None:
    deadline = time.monotonic() + 120  # moto imports every service's backend first
    while time.monotonic() < deadline:
        if moto.poll() is not None:
            raise AssertionError(f"moto's server exited: {log.read_text()[-2000:]}")
        try:
            socket.create_connection((address, PORT), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError("moto's server did not come up")


@pytest.fixture(scope="module")
def world() -> Iterator[S3World]:
    require_netns()
    if os.geteuid() != 0:
        pytest.skip("dev mode runs the boundary in model R here (root)")
    _site()
    root = Path(tempfile.mkdtemp(prefix="osb-s3-"))
    runtime = tempfile.mkdtemp(prefix="osr-", dir="/tmp")
    try:
        ca = trustme.CA()
        with open_test_host() as host:
            leaf = ca.issue_cert("s3.test", host.address)
            cert, key, ca_file = root / "cert.pem", root / "key.pem", root / "ca.pem"
            leaf.private_key_and_cert_chain_pem.write_to_path(str(key))
            for blob in leaf.cert_chain_pems:
                blob.write_to_path(str(cert), append=True)
            ca.cert_pem.write_to_path(str(ca_file))
            moto_log = root / "moto.log"
            with open(moto_log, "w") as log:
                moto = host.popen(
                    [str(SDKS / "bin" / "python"), "-m", "moto.server", "-H", host.address, "-p", str(PORT),
                     "-s", "-c", str(cert), "-k", str(key)],
                    stdout=log, stderr=log, env={**os.environ, "S3_IGNORE_SUBDOMAIN_BUCKETNAME": "true"},
                )  # fmt: skip
            _wait_listening(host.address, moto, moto_log)
            setup = subprocess.run([str(SDKS / "bin" / "python"), "-c", SETUP, f"https://{host.address}:{PORT}",
                                    str(ca_file), BUCKET], capture_output=True, text=True, timeout=120)  # fmt: skip
            assert setup.returncode == 0, setup.stderr[-3000:]
            real = json.loads(setup.stdout)
            assert real["checked"] == "SignatureDoesNotMatch", "moto must check signatures for this test to mean much"
            with DnsServer({"s3.test": [host.address]}) as dns:
                policy, credentials = root / "policy.yaml", root / "credentials.yaml"
                policy.write_text(POLICY.format(port=PORT, address=host.address))
                credentials.write_text(
                    "AWS:\n  access_key_id_env: REAL_AWS_ACCESS_KEY_ID\n"
                    "  secret_access_key_env: REAL_AWS_SECRET_ACCESS_KEY\n"
                    f'  hosts: ["s3.test:{PORT}"]\n'
                )
                subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
                yield S3World(host, dns, moto_log, policy, credentials, ca_file, runtime, root, real["id"],
                              real["secret"])  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


def test_boto3_with_the_placeholder_pair_reaches_moto_signed_with_the_real_key(world: S3World) -> None:
    script = AGENT.format(site=_site(), port=PORT, bucket=BUCKET, needles=[world.secret[::-1], world.key_id[::-1]],
                          roots=[str(world.root), world.runtime])  # fmt: skip
    result, events = world.dev(f"/usr/bin/python3 -c {shlex.quote(script)}")
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    noise = "\n".join(line for line in result.stderr.splitlines() if not line.startswith("{"))
    assert result.returncode == 0 and lines, (result.stdout[-2000:], noise[-4000:], world.moto_log.read_text()[-2000:])
    out = json.loads(lines[0][len("RESULT ") :])

    # the agent holds placeholders only
    assert out["env"]["AWS_ACCESS_KEY_ID"] == ID_PLACEHOLDER
    assert out["env"]["AWS_SECRET_ACCESS_KEY"] == SECRET_PLACEHOLDER
    # every call answered by moto, which checks each signature against the real secret key
    for name in ("default", "when_required"):
        assert out[name]["same"] and out[name]["listed"] == [f"{name}/obj"], out[name]
    stored = world.operator_objects()
    assert stored.keys() == {"default/obj", "when_required/obj"}
    assert stored["default/obj"] == "default object bytes " * 4000  # the aws-chunked body arrived decoded, whole
    # the payload forms control signed: aws-chunked with its trailer (boto3's default) and a plain body
    puts = [e for e in events if e.get("event") == "http" and e.get("method") == "PUT"]
    forms = {e["path"].split("/")[2]: e.get("signed") for e in puts if e.get("path", "").count("/") >= 3}
    assert forms.get("default") == "STREAMING-UNSIGNED-PAYLOAD-TRAILER", puts
    assert forms.get("when_required") in ("hashed", "UNSIGNED-PAYLOAD"), puts

    # another key id: refused by control, nothing stored, nothing reached moto
    assert out["other"][0] == 403 and out["other"][1]["error"] == "credential_endpoint_mismatch", out["other"]
    refused = [e for e in events if e.get("event") == "http" and "other-key" in str(e.get("path"))]
    assert [e["decision"] for e in refused] == ["deny"] and refused[0]["reason"] == "credential_endpoint_mismatch"
    logged = world.moto_log.read_text()
    assert f"/{BUCKET}/default/obj" in logged and "other-key" not in logged  # moto logs every request it gets

    # the real pair is nowhere the agent can read
    assert out["scanned"] > 0 and out["found"] == [], out["found"]
    for value in (world.secret, world.key_id):
        assert value not in result.stdout and value not in result.stderr
