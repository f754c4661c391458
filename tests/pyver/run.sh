#!/usr/bin/env bash
# Our test suite (pytest) and CPython's own asyncio suite on ferroloop, under CPython 3.12 to 3.15
# and the free-threaded 3.14t.
#
#   tests/pyver/run.sh 3.12        (make test-py312)
#   tests/pyver/run.sh 3.13        (make test-py313)
#   tests/pyver/run.sh 3.14        (make test-py314)
#   tests/pyver/run.sh 3.15        (make test-py315; a release candidate)
#   tests/pyver/run.sh 3.14t       (make test-py314t; 3.14.4 built with --disable-gil)
#
# This machine's Python is 3.11; asyncio changed in 3.12 to 3.15 (Server._attach(transport),
# Unix socket files removed on close, callback arguments hidden from reprs outside debug mode,
# the running task kept per thread, ...), so ferroloop's transports, which subclass asyncio's
# classes, are checked here too, and so are the CPython loans (crates/py/src/cpython_loans.rs),
# whose fast paths each version must keep (the run fails if one fell back; on a free-threaded
# build the layout loans are expected to fall back, cpython_loans.rs).
# CPython is built once from a distribution's copy of the upstream source release (the
# .orig.tar.xz, pinned by its sha256) into $PY3xx_PREFIX (default ~/.cache/ferroloop/py3xx;
# about 400 s of CPU, 4-8 min on 2 cores), then a venv (.venv3xx) gets the test tools and ferroloop built
# for that Python (cargo target dir target/py3xx, so the 3.11 build is not invalidated). The
# baseline of CPython's suite and what does not pass are in tests/py3xx/.
set -euo pipefail
cd "$(dirname "$0")/../.."
# Each step's header says how long the run has taken so far (CI's time budget, .ci/run).
phase() { echo "== [${SECONDS}s] $*"; }

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
3.14 | 3.14t)
    VERSION=3.14.4
    SHA256=d923c51303e38e249136fc1bdf3568d56ecb03214efdef48516176d3d7faaef8
    URL="http://deb.debian.org/debian/pool/main/p/python3.14/python3.14_${VERSION}.orig.tar.xz"
    PREFIX="${PY314_PREFIX:-$HOME/.cache/ferroloop/py314}"
    if [ "$1" = 3.14t ]; then
        PREFIX="${PY314T_PREFIX:-$HOME/.cache/ferroloop/py314t}"
    fi
    ;;
3.15)
    # A release candidate: Debian's file name spells it 3.15.0~rc2, the tarball's directory 3.15.0rc2.
    VERSION=3.15.0rc2
    SHA256=8d93af5eaaaea5adfd41bd786a7ba3f03f2ad1ab57c6a65e0b963deab91d5ad7
    URL="http://deb.debian.org/debian/pool/main/p/python3.15/python3.15_3.15.0~rc2.orig.tar.xz"
    PREFIX="${PY315_PREFIX:-$HOME/.cache/ferroloop/py315}"
    ;;
*)
    echo "usage: $0 3.12|3.13|3.14|3.15|3.14t" >&2
    exit 2
    ;;
esac
TAG="py${1/./}"
# A free-threaded build (3.14t): CPython configured with --disable-gil; its executable is
# python3.14t. ferroloop declares that it uses the GIL (crates/py/src/lib.rs), so importing it
# turns the GIL back on.
CONFIGURE_EXTRA=()
if [[ "$1" == *t ]]; then
    CONFIGURE_EXTRA=(--disable-gil)
fi
PY="$PREFIX/bin/python$1"
VENV=".venv${1/./}"

if ! "$PY" -c 'import ssl, sqlite3, ctypes' 2>/dev/null; then
    phase "building CPython $VERSION into $PREFIX (once)"
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
    (
        cd "$work/Python-$VERSION"
        ./configure -q --prefix="$PREFIX" "${CONFIGURE_EXTRA[@]}" --enable-shared \
            LDFLAGS="-Wl,-rpath,$PREFIX/lib"
        phase "make -j$(nproc)"
        make -s -j"$(nproc)" >/dev/null
        phase "make install"
        make -s install >/dev/null
    )
fi

if [ ! -x "$VENV/bin/python" ]; then
    phase "making $VENV (pip installs the test tools)"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q "maturin>=1.7,<2" "pytest>=8" "pytest-timeout>=2.3" "httpx[http2]" fastapi \
        starlette aiohttp websockets anyio trustme gunicorn flask django
fi
# Test dependencies added after a venv was made.
for module in gunicorn flask django prometheus_client h2; do
    "$VENV/bin/python" -c "import $module" 2>/dev/null || "$VENV/bin/pip" install -q "$module"
done
phase "building ferroloop for $("$VENV/bin/python" --version)"
VIRTUAL_ENV="$PWD/$VENV" PATH="$PWD/$VENV/bin:$PATH" CARGO_TARGET_DIR="target/$TAG" \
    "$VENV/bin/maturin" develop --release -q

phase "the CPython loans under $VERSION (each must be used: a fallback here is a regression)"
"$VENV/bin/python" - <<'PY'
import sys
import sysconfig
import warnings

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from ferroloop import _native
print(_native.CPYTHON_LOANS)
ok = {"used", "not needed"}
if sysconfig.get_config_var("Py_GIL_DISABLED"):
    # The layout loans are not read for free-threaded builds (cpython_loans.rs): their fallbacks
    # are expected there, the others must still be used. The module declares that it uses the
    # GIL, so the interpreter turned the GIL on for it, with its own RuntimeWarning.
    ok.add("fallback: free-threaded build")
    if not sys._is_gil_enabled():
        sys.exit("the GIL is off after importing ferroloop (it declares gil_used = true)")
    caught = [w for w in caught if "global interpreter lock (GIL) has been enabled" not in str(w.message)]
if caught:
    sys.exit(f"importing ferroloop warned: {[str(w.message) for w in caught]}")
off = {k: v for k, v in _native.CPYTHON_LOANS.items() if v not in ok}
sys.exit(f"CPython loans not used on this version: {off}" if off else 0)
PY

phase "CPython $VERSION's asyncio suite on ferroloop"
"$VENV/bin/python" tests/external/run_cpython_asyncio.py --check "tests/$TAG/cpython_asyncio_baseline.json"
phase "our tests under $VERSION (what differs from 3.11: tests/$TAG/EXCEPTIONS.md, docs/usage.md)"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests
phase "done; CPU time (user, system) of this script, then of what it ran:"
times
