#!/usr/bin/env bash
# Install what the test suite needs on a fresh Debian machine of this kind (run as root; idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
# node and npm: the CA-trust e2e tests (tests/e2e/test_agent_tools.py)
for tool in ip:iproute2 curl:curl git:git nft:nftables setpriv:util-linux tmux:tmux node:nodejs npm:npm; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool##*:}")
done
# a real client for the HTTPS-inspection e2e tests, importable by the agent's /usr/bin/python3
/usr/bin/python3 -c 'import requests' 2>/dev/null || need+=(python3-requests)
# what `make` needs to build .venv from /usr/bin/python3
[ -x /usr/bin/python3 ] && ! /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null && need+=(python3-venv)
if [ ${#need[@]} -gt 0 ] && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# a real Prometheus server for the /metrics e2e test (tests/e2e/test_metrics_prometheus.py runs its own instance on
# loopback); without recommends (no node exporter), and the packaged service left stopped where systemd runs it
if ! command -v prometheus >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  if command -v systemctl >/dev/null 2>&1; then systemctl disable --now prometheus >/dev/null 2>&1 || true; fi
fi
# the Python packages go into the Makefile's .venv (scripts/venv.sh), never into a system interpreter
# the real MCP, GraphQL and JSON-RPC SDKs of the e2e tests, readable by the agent's uid
bash "$(dirname "$0")/install-test-sdks.sh"
# the agent-side SDKs (openai, anthropic, boto3) and moto's server for the inference and signing e2e tests
if [ "$(id -u)" = 0 ]; then sh "$(dirname "$0")/install-inference-sdks.sh"; fi
