#!/bin/sh
# The agent-side clients of the inference and signing e2e tests (tests/e2e/test_inference.py,
# tests/e2e/test_signing_boto3.py): the official openai and anthropic SDKs, boto3, and moto's server for the test
# host, in a virtual environment of Debian's /usr/bin/python3 whose files every uid can read (the agent runs as a
# dedicated uid with PYTHONPATH naming its site-packages). Idempotent: a stamp records what was installed.
# Run as root: scripts/install-inference-sdks.sh [DIR]   (default /opt/openshell-inference-sdks)
set -eu
dir=${1:-/opt/openshell-inference-sdks}
want="openai==3.63.0 anthropic==2.17.0 boto3==1.44.18 moto[server]==5.2.6"
if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$want" ]; then
  exit 0
fi
[ -x /usr/bin/python3 ] || { echo "install-inference-sdks: /usr/bin/python3 is needed" >&2; exit 1; }
umask 022
[ -x "$dir/bin/python" ] || /usr/bin/python3 -m venv "$dir"
# shellcheck disable=SC2086 # the list is words on purpose
"$dir/bin/python" -m pip install -q $want
chmod -R a+rX "$dir"
printf '%s' "$want" > "$dir/.installed"
