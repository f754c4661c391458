//! The PEP 3333 environ of a request, built from its ASGI scope (so `--root-path` and the
//! proxy headers apply exactly as for ASGI apps).
//!
//! Strings are "bytes as unicode": each byte of the request is one code point (latin-1), so
//! `PATH_INFO` keeps bytes that are not UTF-8. Header fields become `HTTP_*` keys (repeated
//! fields joined with `,`, cookies with `; `); a field name with `_` is dropped, as gunicorn
//! and nginx do, because it would be indistinguishable from the one spelled with `-`.

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyList, PyString, PyTuple};

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

pub(super) fn build<'py>(
    py: Python<'py>,
    scope: &Bound<'py, PyDict>,
    input: &Bound<'py, WsgiInput>,
    multiprocess: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let env = PyDict::new(py);
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
    let server = scope.get_item(intern!(py, "server"))?;
    let (name, port) = match server
        .as_ref()
        .map(|s| address(py, s))
        .transpose()?
        .flatten()
    {
        Some(np) => np,
        None => (
            intern!(py, "localhost").clone().into_any(),
            intern!(py, "80").clone().into_any(),
        ),
    };
    env.set_item(intern!(py, "SERVER_NAME"), name)?;
    env.set_item(intern!(py, "SERVER_PORT"), port)?;
    if let Some(client) = scope.get_item(intern!(py, "client"))? {
        if let Some((host, port)) = address(py, &client)? {
            env.set_item(intern!(py, "REMOTE_ADDR"), host)?;
            env.set_item(intern!(py, "REMOTE_PORT"), port)?;
        }
    }
    let headers = item(scope, intern!(py, "headers"))?;
    for pair in headers.cast::<PyList>()?.iter() {
        let pair = pair.cast::<PyTuple>()?;
        let name = pair.get_item(0)?;
        let name = name.cast::<PyBytes>()?.as_bytes();
        let Some(key) = cgi_key(name) else {
            continue;
        };
        let value = pair.get_item(1)?;
        let value = latin1(py, value.cast::<PyBytes>()?.as_bytes())?;
        let key = PyString::new(py, &key);
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
    env.set_item(intern!(py, "wsgi.version"), (1, 0))?;
    env.set_item(
        intern!(py, "wsgi.url_scheme"),
        item(scope, intern!(py, "scheme"))?,
    )?;
    env.set_item(intern!(py, "wsgi.input"), input)?;
    env.set_item(
        intern!(py, "wsgi.errors"),
        py.import(intern!(py, "sys"))?
            .getattr(intern!(py, "stderr"))?,
    )?;
    env.set_item(intern!(py, "wsgi.multithread"), PyBool::new(py, true))?;
    env.set_item(
        intern!(py, "wsgi.multiprocess"),
        PyBool::new(py, multiprocess),
    )?;
    env.set_item(intern!(py, "wsgi.run_once"), PyBool::new(py, false))?;
    env.set_item(intern!(py, "wsgi.input_terminated"), PyBool::new(py, true))?;
    env.set_item(
        intern!(py, "wsgi.file_wrapper"),
        py.get_type::<WsgiFileWrapper>(),
    )?;
    Ok(env)
}
