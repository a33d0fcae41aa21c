#!/bin/sh
# Install hango-worker from a built wheel into a fresh virtualenv.
#
# This is the final stage of the Dockerfile, kept as a script so the exact same
# steps run outside Docker (tests/test_deploy.py builds the wheel and runs this).
#
#   deploy/install-wheel.sh VENV WHEEL [WHEELHOUSE]
#
#   VENV        where to create the virtualenv (must not exist yet), e.g. /opt/venv
#   WHEEL       the hango_worker-*.whl file to install
#   WHEELHOUSE  optional folder of dependency wheels: install offline from it
#               (--no-index); without it, dependencies come from the package index
#
# Environment: PYTHON (default python3) is the interpreter the venv is made from.
# Nothing is compiled: only wheels are installed (--only-binary :all:).
set -eu

if [ "$#" -lt 2 ] || [ "$#" -gt 3 ]; then
    echo "usage: $0 VENV WHEEL [WHEELHOUSE]" >&2
    exit 64
fi
venv=$1
wheel=$2
wheelhouse=${3:-}
python=${PYTHON:-python3}

if [ ! -f "$wheel" ]; then
    echo "$0: no such wheel: $wheel" >&2
    exit 66
fi
if [ -e "$venv" ]; then
    echo "$0: $venv already exists; refusing to install over it" >&2
    exit 73
fi

"$python" -m venv "$venv"
if [ -n "$wheelhouse" ]; then
    "$venv/bin/python" -m pip install --disable-pip-version-check --no-input \
        --only-binary :all: --no-index --find-links "$wheelhouse" "$wheel"
else
    "$venv/bin/python" -m pip install --disable-pip-version-check --no-input \
        --only-binary :all: "$wheel"
fi
# Fail the build now, not at the first start, if the entry point is broken.
"$venv/bin/hango-worker" --help >/dev/null
"$venv/bin/hango-worker" --version
# What is installed, for audits and vulnerability scanners (no network needed).
mkdir -p "$venv/share/hango-worker"
"$venv/bin/python" -m pip inspect --local --disable-pip-version-check \
    >"$venv/share/hango-worker/installed-packages.json"
echo "installed $(basename "$wheel") into $venv"
