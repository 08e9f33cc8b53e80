#!/usr/bin/env bash
# Install what `make test-k8s` needs on a fresh Debian 12 machine of this kind (run as root; idempotent):
# rootful podman 4.3 with runc (crun fails on cgroup-v1 hosts), netavark (and the iptables it drives),
# catatonit (podman builds its pod infra image from it, offline), and debootstrap for the image's base.
# Where they cannot be installed (not root, no apt, no mirror) it says why and exits 0: the k8s tests then skip,
# naming what is missing, rather than fail.
set -euo pipefail
need=()
for tool in podman:podman runc:runc debootstrap:debootstrap iptables:iptables; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool##*:}")
done
for helper in netavark:netavark aardvark-dns:aardvark-dns catatonit:catatonit; do
  dpkg -s "${helper##*:}" >/dev/null 2>&1 || need+=("${helper##*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "make test-k8s: missing ${need[*]} and cannot install them here (needs root and apt-get):" \
      "the k8s tests will skip; as root: apt-get install ${need[*]}" >&2
    exit 0
  fi
  log=$(mktemp)
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${need[@]}"; } > "$log" 2>&1; then
    echo "make test-k8s: apt-get install ${need[*]} failed: the k8s tests will skip. Its last lines:" >&2
    tail -n 5 "$log" >&2
  fi
  rm -f "$log"
fi
