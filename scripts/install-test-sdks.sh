#!/usr/bin/env bash
# The real SDKs of the agent's-own-protocols e2e tests (tests/e2e/agent_protocols.py): the MCP, GraphQL and JSON-RPC
# clients the agent runs with Debian's /usr/bin/python3 under its own uid, and the servers the tests start on their
# test hosts. One tree, root-owned and 0755 so that every uid reads it and none writes it; the agent reaches it
# through PYTHONPATH=<dir>/lib/python3.X/site-packages. Run as root; idempotent (a stamp records what is in it).
set -euo pipefail
umask 022
dir=${OPENSHELL_TEST_SDKS:-/opt/openshell-test-sdks}
want="mcp==2.3.0 uvicorn==0.55.0 strawberry-graphql==0.341.2 gql[requests]==4.4.0 json-rpc==1.15.0 jsonrpcclient==4.0.3 requests==2.34.2"
if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$want" ]; then exit 0; fi
if [ "$(id -u)" != 0 ] || [ ! -x /usr/bin/python3 ] || ! /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null; then
  echo "install-test-sdks: needs root and /usr/bin/python3 with venv; the SDK e2e tests will skip" >&2
  exit 0
fi
rm -rf "$dir"
/usr/bin/python3 -m venv "$dir"
# shellcheck disable=SC2086  # $want is a list of requirement specifiers
"$dir/bin/python" -m pip install -q --disable-pip-version-check $want
chmod -R a+rX,go-w "$dir"
echo "$want" > "$dir/.installed"
