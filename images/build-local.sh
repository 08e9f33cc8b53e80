#!/bin/sh
# Build the openshell-sandbox image with no container registry at all (images/README.md, "Building without any
# registry pull"): a Debian bookworm base from debootstrap, imported into podman; the Python dependencies as
# wheels fetched on the host; the image built from images/Containerfile with no network during the build.
#
#   sh images/build-local.sh [TAG]            (default TAG: localhost/openshell-sandbox:dev; run as root)
#   sh images/build-local.sh --base-only      (only the cached base and wheels: make test-k8s probes the runtime
#                                              with the base before it builds the image)
#   sh images/build-local.sh --agent-image    (a plain Debian bookworm image with curl, python3 and pip, nothing
#                                              of ours, cached as localhost/debian-agent:bookworm: make test-k8s
#                                              runs it as the proxy-pod topology's workload)
#
# The base (a tarball and the imported image localhost/debian-python:bookworm) and the wheels are cached under
# $OPENSHELL_IMAGE_CACHE (default /var/cache/openshell-sandbox), so a second build takes seconds; delete that
# directory (and `podman rmi localhost/debian-python:bookworm`) for a fresh base. Podman runs with runc and
# explicit ulimits (these hosts are cgroup v1; crun fails there) through a private containers.conf unless
# CONTAINERS_CONF is already set. The Debian mirror is the first one of /etc/apt/sources.list* (override: MIRROR).
set -eu

BASE_ONLY=
AGENT_IMAGE=
if [ "${1:-}" = --base-only ]; then BASE_ONLY=1; shift; fi
if [ "${1:-}" = --agent-image ]; then AGENT_IMAGE=localhost/debian-agent:bookworm; shift; fi
TAG=${1:-localhost/openshell-sandbox:dev}
CACHE=${OPENSHELL_IMAGE_CACHE:-/var/cache/openshell-sandbox}
BASE=localhost/debian-python:bookworm
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
[ -x "$ROOT/.venv/bin/python" ] && PY="$ROOT/.venv/bin/python"

say() { printf 'build-local: %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then say "run as root (debootstrap and rootful podman)"; exit 2; fi
for tool in podman runc debootstrap; do
    command -v "$tool" > /dev/null || { say "$tool is missing: apt-get install podman runc debootstrap"; exit 2; }
done

mkdir -p "$CACHE"
chmod 0755 "$CACHE"
if [ -z "${CONTAINERS_CONF:-}" ]; then
    nofile=$(ulimit -Hn); [ "$nofile" = unlimited ] && nofile=65536
    [ "$nofile" -gt 65536 ] && nofile=65536
    CONTAINERS_CONF="$CACHE/containers.conf"
    cat > "$CONTAINERS_CONF.$$" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=4096:4096"]
[engine]
runtime = "runc"
[network]
network_backend = "netavark"
EOF
    mv "$CONTAINERS_CONF.$$" "$CONTAINERS_CONF"
    export CONTAINERS_CONF
fi

if [ -z "${MIRROR:-}" ]; then
    MIRROR=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | sed -n -e 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' -e 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*\)[[:space:]]\+bookworm[[:space:]].*/\2/p' \
        | grep -v security | head -n 1)
    MIRROR=${MIRROR:-http://deb.debian.org/debian}
fi

# Two builds at once (two make test-k8s runs) take turns filling the cache: the base and the wheels.
exec 9> "$CACHE/.lock"
flock 9

# 1. The base: debootstrap once, then the tarball is the cache (and the imported image, when still present).
debian_image() {  # IMAGE TARBALL PACKAGES: a minbase bookworm with PACKAGES, imported as IMAGE
    if podman image exists "$1"; then say "$1 already present"; return; fi
    if [ ! -s "$CACHE/$2" ]; then
        say "debootstrap bookworm ($3) from $MIRROR (about a minute or two)"
        rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
        trap 'rm -rf "$rootfs"' EXIT
        debootstrap --variant=minbase --include="$3" bookworm "$rootfs" "$MIRROR" > "$CACHE/debootstrap.log" 2>&1 \
            || { say "debootstrap failed; see $CACHE/debootstrap.log"; tail -n 20 "$CACHE/debootstrap.log" >&2; exit 1; }
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        tar --numeric-owner -C "$rootfs" -cf "$CACHE/$2.tmp" .
        mv "$CACHE/$2.tmp" "$CACHE/$2"
        rm -rf "$rootfs"
        trap - EXIT
    else
        say "$1 from the cached $CACHE/$2"
    fi
    podman import --change 'CMD ["/bin/bash"]' "$CACHE/$2" "$1" > /dev/null
}
if [ -n "$AGENT_IMAGE" ]; then
    debian_image "$AGENT_IMAGE" debian-agent-bookworm.tar python3,python3-pip,curl,ca-certificates
    say "built $AGENT_IMAGE"
    exit 0
fi
debian_image "$BASE" debian-python-bookworm.tar python3,python3-venv,ca-certificates

# 2. The wheels (pip on the host has the index); kept between runs, refreshed only when missing.
wheels="$CACHE/wheels"
mkdir -p "$wheels"
"$PY" -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version 3.11 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$wheels" "$ROOT" 'setuptools>=68' wheel
rm -f "$wheels"/openshell_sandbox-*  # the project itself is built from the context, never a stale wheel
flock -u 9
exec 9>&-
if [ -n "$BASE_ONLY" ]; then say "base $BASE and the wheels are ready"; exit 0; fi

# 3. The image, with no network at all during the build. No intermediate images are kept (--layers=false), and
#    the image this tag named before is removed once nothing uses it, so repeated builds do not pile up.
say "podman build $TAG"
old_id=$(podman image inspect --format '{{.Id}}' "$TAG" 2>/dev/null || true)
podman build -q --layers=false --network=none --ulimit "nofile=1024:1024" --ulimit "nproc=4096:4096" \
    -v "$wheels:/wheels:ro" --build-arg BASE="$BASE" \
    --build-arg PIP_ARGS="--no-index --find-links=/wheels" \
    -f "$ROOT/images/Containerfile" -t "$TAG" "$ROOT" > /dev/null
new_id=$(podman image inspect --format '{{.Id}}' "$TAG")
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then
    podman rmi "$old_id" > /dev/null 2>&1 || true
fi
say "built $TAG"
