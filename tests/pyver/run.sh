#!/usr/bin/env bash
# Our test suite (pytest) and CPython's own asyncio suite on ferroloop, under CPython 3.12 or 3.13.
#
#   tests/pyver/run.sh 3.12        (make test-py312)
#   tests/pyver/run.sh 3.13        (make test-py313)
#
# This machine's Python is 3.11; asyncio changed in 3.12 and 3.13 (Server._attach(transport),
# Unix socket files removed on close, callback arguments hidden from reprs outside debug mode,
# ...), so ferroloop's transports, which subclass asyncio's classes, are checked here too.
# CPython is built once from a distribution's copy of the upstream source release (the
# .orig.tar.xz, pinned by its sha256) into $PY312_PREFIX / $PY313_PREFIX (default
# ~/.cache/ferroloop/py312, .../py313; about 4 min on 2 cores), then a venv (.venv312,
# .venv313) gets the test tools and ferroloop built for that Python (cargo target dir
# target/py312, target/py313, so the 3.11 build is not invalidated). The baseline of CPython's
# suite and what does not pass are in tests/py312/, tests/py313/.
set -euo pipefail
cd "$(dirname "$0")/../.."

case "${1:-}" in
3.12)
    # Debian's pool no longer has 3.12; Ubuntu noble's is the newest 3.12 orig tarball there.
    VERSION=3.12.3
    SHA256=56bfef1fdfc1221ce6720e43a661e3eb41785dd914ce99698d8c7896af4bdaa1
    URL="http://archive.ubuntu.com/ubuntu/pool/main/p/python3.12/python3.12_${VERSION}.orig.tar.xz"
    PREFIX="${PY312_PREFIX:-$HOME/.cache/ferroloop/py312}"
    ;;
3.13)
    VERSION=3.13.5
    SHA256=93e583f243454e6e9e4588ca2c2662206ad961659863277afcdb96801647d640
    URL="http://deb.debian.org/debian/pool/main/p/python3.13/python3.13_${VERSION}.orig.tar.xz"
    PREFIX="${PY313_PREFIX:-$HOME/.cache/ferroloop/py313}"
    ;;
*)
    echo "usage: $0 3.12|3.13" >&2
    exit 2
    ;;
esac
TAG="py${1/./}"
PY="$PREFIX/bin/python$1"
VENV=".venv${1/./}"

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
        starlette aiohttp websockets anyio trustme gunicorn flask django
fi
# Test dependencies added after a venv was made.
for module in gunicorn flask django; do
    "$VENV/bin/python" -c "import $module" 2>/dev/null || "$VENV/bin/pip" install -q "$module"
done
echo "== building ferroloop for $("$VENV/bin/python" --version)"
VIRTUAL_ENV="$PWD/$VENV" PATH="$PWD/$VENV/bin:$PATH" CARGO_TARGET_DIR="target/$TAG" \
    "$VENV/bin/maturin" develop --release -q

echo "== CPython $VERSION's asyncio suite on ferroloop"
"$VENV/bin/python" tests/external/run_cpython_asyncio.py --check "tests/$TAG/cpython_asyncio_baseline.json"
echo "== our tests under $VERSION (what differs from 3.11: tests/$TAG/EXCEPTIONS.md, docs/usage.md)"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests
