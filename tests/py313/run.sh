#!/usr/bin/env bash
# Our test suite (pytest) and CPython 3.13's own asyncio suite on ferroloop, under CPython 3.13.
#
#   tests/py313/run.sh
#
# This machine's Python is 3.11; asyncio changed in 3.12 and 3.13 (Server._attach(transport),
# Unix socket files removed on close, callback arguments hidden from reprs outside debug mode,
# ...), so ferroloop's transports, which subclass asyncio's classes, are checked here too.
# CPython 3.13 is built once from Debian's source tarball (the upstream release, reachable
# through the Debian mirror) into $PY313_PREFIX (default ~/.cache/ferroloop/py313, about 4 min
# on 2 cores), then a venv (.venv313) gets the test tools and ferroloop built for 3.13
# (cargo target dir target/py313, so the 3.11 build is not invalidated).
set -euo pipefail
cd "$(dirname "$0")/../.."

VERSION=3.13.5
SHA256=93e583f243454e6e9e4588ca2c2662206ad961659863277afcdb96801647d640
URL="http://deb.debian.org/debian/pool/main/p/python3.13/python3.13_${VERSION}.orig.tar.xz"
PREFIX="${PY313_PREFIX:-$HOME/.cache/ferroloop/py313}"
PY="$PREFIX/bin/python3.13"
VENV=.venv313

if ! "$PY" -c 'import ssl, sqlite3, ctypes' 2>/dev/null; then
    echo "== building CPython $VERSION into $PREFIX (once)"
    # What the build needs beyond a C compiler and make (which the Rust build needs too). A
    # fresh machine's package lists may be empty: refresh them before installing.
    deps=(curl xz-utils pkg-config libssl-dev zlib1g-dev libffi-dev libbz2-dev liblzma-dev libsqlite3-dev)
    if ! dpkg -s "${deps[@]}" >/dev/null 2>&1; then
        apt-get update -q >/dev/null
        apt-get install -y -q "${deps[@]}" >/dev/null
    fi
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    curl -fsSL "$URL" -o "$work/src.tar.xz"
    echo "$SHA256  $work/src.tar.xz" | sha256sum -c --quiet
    tar -xf "$work/src.tar.xz" -C "$work"
    (cd "$work/Python-$VERSION" \
        && ./configure -q --prefix="$PREFIX" --enable-shared LDFLAGS="-Wl,-rpath,$PREFIX/lib" \
        && make -s -j"$(nproc)" >/dev/null && make -s install >/dev/null)
fi

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q "maturin>=1.7,<2" "pytest>=8" "pytest-timeout>=2.3" httpx fastapi \
        starlette aiohttp websockets anyio trustme
fi
echo "== building ferroloop for $("$VENV/bin/python" --version)"
VIRTUAL_ENV="$PWD/$VENV" PATH="$PWD/$VENV/bin:$PATH" CARGO_TARGET_DIR=target/py313 \
    "$VENV/bin/maturin" develop --release -q

echo "== CPython $VERSION's asyncio suite on ferroloop"
"$VENV/bin/python" tests/external/run_cpython_asyncio.py --check tests/py313/cpython_asyncio_baseline.json
echo "== our tests under $VERSION (what differs from 3.11: tests/py313/EXCEPTIONS.md, docs/usage.md)"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests
