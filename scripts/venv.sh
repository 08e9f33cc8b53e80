#!/bin/sh
# Build the Makefile's virtual environment: scripts/venv.sh VENV EXTRAS [--install-missing]
#
# The base interpreter is Debian's /usr/bin/python3 when it exists (a venv built from it in a 0755 checkout is
# readable by the other uids the daemons and tests use), else the first python3 on PATH. EXTRAS is "" for
# the package alone (make demo) or "test" (make test, make lint). The install is editable, so the venv follows
# the checkout. A stamp per extras set records what was installed from which pyproject.toml.
set -eu
venv=$1
extras=$2
install_missing=${3:-}
cd "$(dirname "$0")/.."

# OPENSHELL_BASE_PYTHON overrides the choice (the tests use it to play a Debian without python3-venv)
if [ -n "${OPENSHELL_BASE_PYTHON:-}" ]; then base=$OPENSHELL_BASE_PYTHON
elif [ -x /usr/bin/python3 ]; then base=/usr/bin/python3
else base=$(command -v python3 || true); fi
if [ -z "$base" ]; then
  echo "openshell-sandbox: no python3 found (Debian: apt-get install python3 python3-venv)" >&2
  exit 1
fi

if ! "$base" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  if [ -n "$install_missing" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "openshell-sandbox: $base has no venv/ensurepip; installing python3-venv" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  else
    echo "openshell-sandbox: $base cannot create a virtual environment (no venv/ensurepip)." >&2
    echo "  Install it first: apt-get install python3-venv   (as root, or with sudo)" >&2
    exit 1
  fi
fi

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import sys' >/dev/null 2>&1; then
  rm -rf "$venv"
  "$base" -m venv "$venv"
fi

spec=.
stamp="$venv/.installed"
if [ -n "$extras" ]; then spec=".[$extras]"; stamp="$venv/.installed-$extras"; fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -e "$spec"
  touch "$stamp"
fi
