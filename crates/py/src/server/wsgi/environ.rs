//! The PEP 3333 environ of a request, built from its ASGI scope (so `--root-path` and the
//! proxy headers apply exactly as for ASGI apps).
//!
//! Strings are "bytes as unicode": each byte of the request is one code point (latin-1), so
//! `PATH_INFO` keeps bytes that are not UTF-8. Header fields become `HTTP_*` keys (repeated
//! fields joined with `,`, cookies with `; `); a field name with `_` is dropped, as gunicorn
//! and nginx do, because it would be indistinguishable from the one spelled with `-`.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use pyo3::PyTraverseError;

use ferroloop_core::http::cgi_key;

use super::{WsgiFileWrapper, WsgiInput};
use crate::server::scope::percent_decode;

/// `bytes` decoded as latin-1: one code point per byte.
fn latin1<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyString>> {
    if bytes.is_ascii() {
        // SAFETY: ASCII is valid UTF-8.
        return Ok(PyString::new(py, unsafe {
            std::str::from_utf8_unchecked(bytes)
        }));
    }
    let len = ffi::Py_ssize_t::try_from(bytes.len())
        .map_err(|_| PyTypeError::new_err("field too long"))?;
    // SAFETY: the GIL is held; `bytes` is valid for `len` bytes; a NULL errors argument is
    // "strict", which cannot fail for latin-1; the result is a new reference or NULL with an
    // exception set, which `from_owned_ptr_or_err` turns into `Err`.
    unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            ffi::PyUnicode_DecodeLatin1(bytes.as_ptr().cast(), len, std::ptr::null()),
        )
    }
    // SAFETY: PyUnicode_DecodeLatin1 returns a str.
    .map(|s| unsafe { s.cast_into_unchecked() })
}

fn item<'py>(
    scope: &Bound<'py, PyDict>,
    key: &Bound<'py, PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    scope
        .get_item(key)?
        .ok_or_else(|| PyTypeError::new_err(format!("the scope has no {key}")))
}

/// `(host, port)` as the environ's two strings; a Unix socket's `(path, None)` gives port "0".
fn address<'py>(
    py: Python<'py>,
    addr: &Bound<'py, PyAny>,
) -> PyResult<Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
    let Ok(t) = addr.cast::<PyTuple>() else {
        return Ok(None);
    };
    if t.len() < 2 {
        return Ok(None);
    }
    let host = t.get_item(0)?.str()?.into_any();
    let port = t.get_item(1)?;
    let port = if port.is_none() {
        intern!(py, "0").clone().into_any()
    } else {
        port.str()?.into_any()
    };
    Ok(Some((host, port)))
}

/// `sys.stderr` as it is now (an app or a test may replace it), without an import (whose
/// `__import__` call cost about 2,000 instructions a request); `None` if there is none.
fn stderr(py: Python<'_>) -> Bound<'_, PyAny> {
    // SAFETY: the GIL is held; PySys_GetObject returns a borrowed reference or NULL (without an
    // exception), and `from_borrowed_ptr_or_opt` takes a new reference of its own.
    unsafe { Bound::from_borrowed_ptr_or_opt(py, ffi::PySys_GetObject(c"stderr".as_ptr())) }
        .unwrap_or_else(|| py.None().into_bound(py))
}

/// The environ's fixed parts and what is worth keeping between requests, per pool.
///
/// Invariant: the caches hold only strings made from the server's own data (its addresses)
/// or from header names, at most `MAX_KEYS` of those, so a client sending random names
/// cannot grow them.
pub(super) struct EnvironBase {
    /// Every fixed key in order, with the values that never change and `None` for the others,
    /// so a request's environ is a copy of it with values replaced (no insertions, no resize).
    template: Py<PyDict>,
    /// `SERVER_NAME`/`SERVER_PORT` of the last `scope["server"]` object seen.
    server: Mutex<Option<ServerFields>>,
    /// `HTTP_*` keys by header name (hashed once, reused by every request).
    keys: Mutex<HashMap<Vec<u8>, Py<PyString>>>,
}

/// A `scope["server"]` object, and its `SERVER_NAME` and `SERVER_PORT` strings.
type ServerFields = (Py<PyAny>, Py<PyAny>, Py<PyAny>);

/// How many header names `EnvironBase` keeps the CGI key of.
const MAX_KEYS: usize = 256;

impl EnvironBase {
    pub(super) fn new(py: Python<'_>, multiprocess: bool) -> PyResult<Self> {
        let none = py.None();
        let t = PyDict::new(py);
        for key in [
            intern!(py, "REQUEST_METHOD"),
            intern!(py, "SCRIPT_NAME"),
            intern!(py, "PATH_INFO"),
            intern!(py, "QUERY_STRING"),
            intern!(py, "SERVER_PROTOCOL"),
            intern!(py, "SERVER_NAME"),
            intern!(py, "SERVER_PORT"),
            intern!(py, "REMOTE_ADDR"),
            intern!(py, "REMOTE_PORT"),
        ] {
            t.set_item(key, &none)?;
        }
        t.set_item(intern!(py, "wsgi.version"), (1, 0))?;
        for key in [
            intern!(py, "wsgi.url_scheme"),
            intern!(py, "wsgi.input"),
            intern!(py, "wsgi.errors"),
        ] {
            t.set_item(key, &none)?;
        }
        t.set_item(intern!(py, "wsgi.multithread"), true)?;
        t.set_item(intern!(py, "wsgi.multiprocess"), multiprocess)?;
        t.set_item(intern!(py, "wsgi.run_once"), false)?;
        t.set_item(intern!(py, "wsgi.input_terminated"), true)?;
        t.set_item(
            intern!(py, "wsgi.file_wrapper"),
            py.get_type::<WsgiFileWrapper>(),
        )?;
        Ok(Self {
            template: t.unbind(),
            server: Mutex::new(None),
            keys: Mutex::new(HashMap::new()),
        })
    }

    pub(super) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.template)?;
        if let Ok(server) = self.server.try_lock() {
            if let Some((a, n, p)) = server.as_ref() {
                visit.call(a)?;
                visit.call(n)?;
                visit.call(p)?;
            }
        }
        Ok(())
    }

    /// `SERVER_NAME` and `SERVER_PORT` of the scope's `server` (`localhost`/`80` without one).
    fn server_fields<'py>(
        &self,
        py: Python<'py>,
        server: Option<Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let Some(server) = server else {
            return Ok((
                intern!(py, "localhost").clone().into_any(),
                intern!(py, "80").clone().into_any(),
            ));
        };
        let mut cached = self.server.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((addr, name, port)) = cached.as_ref() {
            if addr.is(&server) {
                return Ok((name.bind(py).clone(), port.bind(py).clone()));
            }
        }
        let (name, port) = address(py, &server)?.unwrap_or_else(|| {
            (
                intern!(py, "localhost").clone().into_any(),
                intern!(py, "80").clone().into_any(),
            )
        });
        *cached = Some((
            server.unbind(),
            name.clone().unbind(),
            port.clone().unbind(),
        ));
        Ok((name, port))
    }

    /// The CGI key of header `name` (`None` for a name with `_`), from the cache when it can.
    fn key<'py>(&self, py: Python<'py>, name: &[u8]) -> Option<Bound<'py, PyString>> {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(key) = keys.get(name) {
            return Some(key.bind(py).clone());
        }
        let key = PyString::new(py, &cgi_key(name)?);
        if keys.len() < MAX_KEYS {
            keys.insert(name.to_vec(), key.clone().unbind());
        }
        Some(key)
    }

    pub(super) fn build<'py>(
        &self,
        py: Python<'py>,
        scope: &Bound<'py, PyDict>,
        input: &Bound<'py, WsgiInput>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let env = self.template.bind(py).copy()?;
        env.set_item(
            intern!(py, "REQUEST_METHOD"),
            item(scope, intern!(py, "method"))?,
        )?;
        let root = item(scope, intern!(py, "root_path"))?;
        let root = root.cast::<PyString>()?.to_str()?;
        env.set_item(intern!(py, "SCRIPT_NAME"), latin1(py, root.as_bytes())?)?;
        let raw_path = item(scope, intern!(py, "raw_path"))?;
        let raw_path = raw_path.cast::<PyBytes>()?.as_bytes();
        // `raw_path` carries the root path in front (as uvicorn's does); PATH_INFO is the rest.
        let own = raw_path.strip_prefix(root.as_bytes()).unwrap_or(raw_path);
        env.set_item(intern!(py, "PATH_INFO"), latin1(py, &percent_decode(own))?)?;
        let query = item(scope, intern!(py, "query_string"))?;
        env.set_item(
            intern!(py, "QUERY_STRING"),
            latin1(py, query.cast::<PyBytes>()?.as_bytes())?,
        )?;
        let version = item(scope, intern!(py, "http_version"))?;
        let protocol = if version.cast::<PyString>()?.to_str()? == "1.0" {
            intern!(py, "HTTP/1.0")
        } else {
            intern!(py, "HTTP/1.1")
        };
        env.set_item(intern!(py, "SERVER_PROTOCOL"), protocol)?;
        let server = scope
            .get_item(intern!(py, "server"))?
            .filter(|s| !s.is_none());
        let (name, port) = self.server_fields(py, server)?;
        env.set_item(intern!(py, "SERVER_NAME"), name)?;
        env.set_item(intern!(py, "SERVER_PORT"), port)?;
        let client = match scope.get_item(intern!(py, "client"))? {
            Some(c) => address(py, &c)?,
            None => None,
        };
        if let Some((host, port)) = client {
            env.set_item(intern!(py, "REMOTE_ADDR"), host)?;
            env.set_item(intern!(py, "REMOTE_PORT"), port)?;
        } else {
            // A Unix-socket peer has no address: the keys are absent, not None.
            env.del_item(intern!(py, "REMOTE_ADDR"))?;
            env.del_item(intern!(py, "REMOTE_PORT"))?;
        }
        let headers = item(scope, intern!(py, "headers"))?;
        for pair in headers.cast::<PyList>()?.iter() {
            let pair = pair.cast::<PyTuple>()?;
            let name = pair.get_item(0)?;
            let name = name.cast::<PyBytes>()?.as_bytes();
            let Some(key) = self.key(py, name) else {
                continue;
            };
            let value = pair.get_item(1)?;
            let value = latin1(py, value.cast::<PyBytes>()?.as_bytes())?;
            match env.get_item(&key)? {
                Some(prev) => {
                    let sep = if name == b"cookie" { "; " } else { "," };
                    let joined = format!(
                        "{}{sep}{}",
                        prev.cast::<PyString>()?.to_str()?,
                        value.to_str()?
                    );
                    env.set_item(key, joined)?;
                }
                None => env.set_item(key, value)?,
            }
        }
        env.set_item(
            intern!(py, "wsgi.url_scheme"),
            item(scope, intern!(py, "scheme"))?,
        )?;
        env.set_item(intern!(py, "wsgi.input"), input)?;
        env.set_item(intern!(py, "wsgi.errors"), stderr(py))?;
        Ok(env)
    }
}
