//! `--http`: which protocols a server speaks, and how an HTTP/1.1 connection before its first
//! request is found to be HTTP/2 (its preface, or ALPN under TLS).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::server::conn::ConnState;
use crate::server::effects::Effects;
use ferroloop_core::http::{h2_preface as preface, Preface};

/// Which protocols the server speaks (`--http`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HttpMode {
    pub h1: bool,
    pub h2: bool,
}

impl HttpMode {
    /// `"auto"` (HTTP/1.1 and HTTP/2), `"1"`, `"2"`. A WSGI app is served HTTP/1.1 only
    /// (`auto` means `1` for it): its streams are not implemented over HTTP/2 yet.
    pub(crate) fn parse(value: &str, wsgi: bool) -> PyResult<Self> {
        match value {
            "auto" => Ok(Self {
                h1: true,
                h2: !wsgi,
            }),
            "2" if wsgi => Err(PyValueError::new_err(
                "--http 2 needs an ASGI app: WSGI over HTTP/2 is not implemented yet \
                 (use --http auto or 1)",
            )),
            "1" => Ok(Self {
                h1: true,
                h2: false,
            }),
            "2" => Ok(Self {
                h1: false,
                h2: true,
            }),
            other => Err(PyValueError::new_err(format!(
                "http must be 'auto', '1' or '2', not {other:?}"
            ))),
        }
    }

    /// The ALPN protocols a TLS server offers, in its order of preference.
    pub(crate) fn alpn(self) -> Vec<Vec<u8>> {
        let mut protocols = Vec::new();
        if self.h2 {
            protocols.push(b"h2".to_vec());
        }
        if self.h1 {
            protocols.push(b"http/1.1".to_vec());
        }
        protocols
    }
}

/// `Conn::idle_step` before a connection's first request: `true` when it must not parse an
/// HTTP/1.1 head, because the connection is HTTP/2 (`fx.h2` is set: it becomes an `H2Conn`) or
/// too few bytes have come to tell.
pub(crate) fn detect(mode: HttpMode, st: &ConnState, fx: &mut Effects) -> bool {
    match wanted(mode, st) {
        Preface::No => false,
        Preface::Partial => true,
        Preface::Yes => {
            fx.h2 = true;
            true
        }
    }
}

/// Whether an HTTP/1.1 connection before its first request is HTTP/2: by ALPN under TLS,
/// else by its first bytes. `Partial`: too few bytes yet.
fn wanted(mode: HttpMode, st: &ConnState) -> Preface {
    if !mode.h2 {
        return Preface::No;
    }
    if !mode.h1 {
        return Preface::Yes;
    }
    if let Some(tls) = st.tls.as_deref() {
        if tls.alpn_protocol() == Some(&b"h2"[..]) {
            return Preface::Yes;
        }
    }
    match preface(st.http.input()) {
        Preface::Partial if st.http.eof() => Preface::No,
        p => p,
    }
}
