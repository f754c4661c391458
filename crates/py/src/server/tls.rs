//! The server's TLS options (`HttpServer(tls_cert=..., tls_key=...)`) made into a rustls
//! configuration; the per-connection session is `ferroloop_core::tls::TlsConn`.

use std::sync::Arc;

use ferroloop_core::tls::{server_config, ClientAuth};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use rustls::ServerConfig;

pub(super) use ferroloop_core::tls::{Read, TlsConn};

/// The `HttpServer` keyword arguments `tls_*`: no certificate and no key is a plain server.
pub(super) fn from_options(
    cert: Option<Vec<u8>>,
    key: Option<Vec<u8>>,
    client_ca: Option<&[u8]>,
    client_auth: u8,
    versions: Option<Vec<String>>,
) -> PyResult<Option<Arc<ServerConfig>>> {
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => {
            let auth = ClientAuth::from_cert_reqs(client_auth).map_err(PyValueError::new_err)?;
            let versions = versions.unwrap_or_else(|| vec!["1.2".into(), "1.3".into()]);
            server_config(&cert, &key, client_ca, auth, &versions)
                .map(Some)
                .map_err(PyValueError::new_err)
        }
        _ => Err(PyValueError::new_err(
            "TLS needs both a certificate (tls_cert) and its key (tls_key)",
        )),
    }
}

/// `check_tls(tls_cert, tls_key, tls_client_ca, tls_client_auth, tls_versions)`: builds the
/// configuration `HttpServer` would and drops it, so that unusable TLS files are reported at
/// start-up, before the app is loaded (`Config.load_tls`). Raises `ValueError` with the reason.
#[pyfunction]
#[pyo3(signature = (tls_cert, tls_key, tls_client_ca=None, tls_client_auth=0, tls_versions=None))]
pub fn check_tls(
    tls_cert: Vec<u8>,
    tls_key: Vec<u8>,
    tls_client_ca: Option<Vec<u8>>,
    tls_client_auth: u8,
    tls_versions: Option<Vec<String>>,
) -> PyResult<()> {
    from_options(
        Some(tls_cert),
        Some(tls_key),
        tls_client_ca.as_deref(),
        tls_client_auth,
        tls_versions,
    )
    .map(drop)
}
