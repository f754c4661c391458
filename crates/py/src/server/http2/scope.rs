//! The http scope of an HTTP/2 stream, from the request `h2` decoded: as HTTP/1.1's
//! (`server/scope.rs`, whose per-server template it copies) with `http_version` `"2"`, the
//! `:authority` pseudo-header as a `host` field when the request has none, and no extensions
//! (trailers, `pathsend` and `zerocopysend` are not served over HTTP/2 yet).

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::server::scope::{header_name, method_str, percent_decode, ScopeBase};

/// What the stream keeps of its request (access log, counters).
pub(super) struct Facts {
    pub(super) method: Py<PyString>,
    pub(super) path: Py<PyString>,
    pub(super) forwarded: bool,
    pub(super) is_head: bool,
}

pub(super) fn build<'py>(
    py: Python<'py>,
    base: &ScopeBase,
    parts: &http::request::Parts,
    client: &Py<PyAny>,
) -> PyResult<(Bound<'py, PyDict>, Facts)> {
    let scope = base.template.bind(py).copy()?;
    scope.set_item(intern!(py, "asgi"), base.asgi.bind(py).copy()?)?;
    scope.set_item(intern!(py, "http_version"), intern!(py, "2"))?;
    scope.set_item(intern!(py, "client"), client.bind(py))?;
    let method = method_str(py, parts.method.as_str().as_bytes());
    scope.set_item(intern!(py, "method"), &method)?;

    let raw_path = parts.uri.path().as_bytes();
    let decoded = percent_decode(raw_path);
    let path_text = String::from_utf8_lossy(&decoded);
    let root = base.root_path.bind(py).to_str()?;
    let path = PyString::new(py, &format!("{root}{path_text}"));
    scope.set_item(intern!(py, "path"), &path)?;
    let mut raw = base.root_path_bytes.clone();
    raw.extend_from_slice(raw_path);
    scope.set_item(intern!(py, "raw_path"), PyBytes::new(py, &raw))?;
    let query = parts.uri.query().unwrap_or("").as_bytes();
    scope.set_item(intern!(py, "query_string"), PyBytes::new(py, query))?;

    let headers = PyList::empty(py);
    if !parts.headers.contains_key(http::header::HOST) {
        if let Some(authority) = parts.uri.authority() {
            let pair = PyTuple::new(
                py,
                [
                    header_name(py, b"host").into_any(),
                    PyBytes::new(py, authority.as_str().as_bytes()).into_any(),
                ],
            )?;
            headers.append(pair)?;
        }
    }
    let mut forwarded = false;
    for (name, value) in &parts.headers {
        let name = name.as_str().as_bytes();
        forwarded |= name == b"x-forwarded-for" || name == b"x-forwarded-proto";
        let pair = PyTuple::new(
            py,
            [
                header_name(py, name).into_any(),
                PyBytes::new(py, value.as_bytes()).into_any(),
            ],
        )?;
        headers.append(pair)?;
    }
    scope.set_item(intern!(py, "headers"), headers)?;
    if let Some(state) = &base.state {
        scope.set_item(intern!(py, "state"), state.bind(py).copy()?)?;
    }
    scope.set_item(intern!(py, "extensions"), PyDict::new(py))?;
    let facts = Facts {
        method: method.unbind(),
        path: path.unbind(),
        forwarded,
        is_head: parts.method == http::Method::HEAD,
    };
    Ok((scope, facts))
}
