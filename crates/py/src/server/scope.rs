//! Building ASGI objects natively: the http scope, `http.request` / `http.disconnect` messages.
//!
//! Keys are interned strings; fixed values (`"http"`, `"1.1"`, the common methods and header
//! names) are cached once per interpreter. Every per-request field is built fresh for each
//! request: nothing a request can mutate is shared with another.
//!
//! The scope, its `asgi` dict and its `extensions` dict start as copies of per-server templates
//! that already hold every key, in the order a scope lists them, with the fixed values filled
//! in: `PyDict_Copy` of such a dict clones its key table in one go, and each per-request value
//! then replaces a placeholder instead of inserting a key (no hashing into a growing table,
//! no resize). Only immutable values (strings, the server address tuple) come from a template.

use std::borrow::Cow;

use ferroloop_core::http::{Head, Version};
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use pyo3::PyTraverseError;

/// Header names common enough to share one `bytes` object across requests (they are immutable).
const COMMON_HEADERS: &[&[u8]] = &[
    b"host",
    b"user-agent",
    b"accept",
    b"accept-encoding",
    b"accept-language",
    b"connection",
    b"content-type",
    b"content-length",
    b"cookie",
    b"referer",
    b"origin",
    b"authorization",
    b"cache-control",
    b"transfer-encoding",
    b"expect",
    b"x-forwarded-for",
    b"x-forwarded-proto",
    b"x-request-id",
    b"upgrade",
    b"pragma",
];

const METHODS: &[&str] = &[
    "GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "CONNECT", "TRACE",
];

static HEADER_NAMES: PyOnceLock<Vec<Py<PyBytes>>> = PyOnceLock::new();
static METHOD_NAMES: PyOnceLock<Vec<Py<PyString>>> = PyOnceLock::new();

pub(super) fn header_name<'py>(py: Python<'py>, name: &[u8]) -> Bound<'py, PyBytes> {
    let cache = HEADER_NAMES.get_or_init(py, || {
        COMMON_HEADERS
            .iter()
            .map(|n| PyBytes::new(py, n).unbind())
            .collect()
    });
    match COMMON_HEADERS.iter().position(|n| *n == name) {
        Some(i) => cache[i].bind(py).clone(),
        None => PyBytes::new(py, name),
    }
}

/// The method as a `str` (shared objects for the standard methods).
pub fn method_str<'py>(py: Python<'py>, method: &[u8]) -> Bound<'py, PyString> {
    let cache = METHOD_NAMES.get_or_init(py, || {
        METHODS
            .iter()
            .map(|m| PyString::intern(py, m).unbind())
            .collect()
    });
    match METHODS.iter().position(|m| m.as_bytes() == method) {
        Some(i) => cache[i].bind(py).clone(),
        // httparse only accepts token characters, so this is ASCII.
        None => PyString::new(py, &String::from_utf8_lossy(method)),
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// `%XX` decoding (an invalid escape is kept as is, like `urllib.parse.unquote`).
pub fn percent_decode(raw: &[u8]) -> Cow<'_, [u8]> {
    if !raw.contains(&b'%') {
        return Cow::Borrowed(raw);
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' && i + 2 < raw.len() {
            if let (Some(h), Some(l)) = (hex(raw[i + 1]), hex(raw[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    Cow::Owned(out)
}

/// The per-server parts of every scope, built once when the server starts.
pub struct ScopeBase {
    pub root_path: Py<PyString>,
    pub root_path_bytes: Vec<u8>,
    pub state: Option<Py<PyDict>>,
    /// Every scope key in order, with the fixed values (`type`, `http_version` 1.1, `server`,
    /// `scheme`, `root_path`) and `None` for the others.
    pub(super) template: Py<PyDict>,
    /// `{"version": "3.0", "spec_version": "2.4"}`.
    pub(super) asgi: Py<PyDict>,
    /// The extension names, each with `None` (a fresh `{}` goes in per request).
    extensions: Py<PyDict>,
}

/// The extensions every scope announces (each with an empty dict, per the ASGI spec).
fn extension_names(py: Python<'_>) -> [&Bound<'_, PyString>; 3] {
    [
        intern!(py, "http.response.trailers"),
        intern!(py, "http.response.pathsend"),
        intern!(py, "http.response.zerocopysend"),
    ]
}

impl ScopeBase {
    pub fn new(
        py: Python<'_>,
        server: Py<PyAny>,
        scheme: &str,
        root_path: &str,
        state: Option<Py<PyDict>>,
    ) -> PyResult<Self> {
        let root = PyString::new(py, root_path);
        let none = py.None();
        let template = PyDict::new(py);
        template.set_item(intern!(py, "type"), intern!(py, "http"))?;
        template.set_item(intern!(py, "asgi"), &none)?;
        template.set_item(intern!(py, "http_version"), intern!(py, "1.1"))?;
        template.set_item(intern!(py, "server"), server)?;
        template.set_item(intern!(py, "client"), &none)?;
        template.set_item(intern!(py, "scheme"), PyString::intern(py, scheme))?;
        template.set_item(intern!(py, "method"), &none)?;
        template.set_item(intern!(py, "root_path"), &root)?;
        for key in [
            intern!(py, "path"),
            intern!(py, "raw_path"),
            intern!(py, "query_string"),
            intern!(py, "headers"),
        ] {
            template.set_item(key, &none)?;
        }
        if state.is_some() {
            template.set_item(intern!(py, "state"), &none)?;
        }
        template.set_item(intern!(py, "extensions"), &none)?;
        let asgi = PyDict::new(py);
        asgi.set_item(intern!(py, "version"), intern!(py, "3.0"))?;
        asgi.set_item(intern!(py, "spec_version"), intern!(py, "2.4"))?;
        let extensions = PyDict::new(py);
        for name in extension_names(py) {
            extensions.set_item(name, &none)?;
        }
        Ok(Self {
            root_path: root.unbind(),
            root_path_bytes: root_path.as_bytes().to_vec(),
            state,
            template: template.unbind(),
            asgi: asgi.unbind(),
            extensions: extensions.unbind(),
        })
    }

    /// For the server's `__traverse__`.
    pub fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.state)?;
        visit.call(&self.template)?;
        visit.call(&self.asgi)?;
        visit.call(&self.extensions)
    }
}

/// What the connection keeps of a request for its own use (access log, framing).
pub struct RequestFacts {
    pub method: Py<PyString>,
    pub path: Py<PyString>,
    /// The scope's own `query_string` object (shared, not copied).
    pub query: Py<PyBytes>,
    /// The scope itself, kept only when the access log is on: the log names `scope["client"]`
    /// as it is when the response completes, i.e. after a proxy-headers middleware (or the
    /// app) rewrote it, as uvicorn does.
    pub scope: Option<Py<PyDict>>,
    /// The request has an `X-Forwarded-For` or `X-Forwarded-Proto` header.
    pub forwarded: bool,
}

/// Builds the http scope of `head` (whose ranges index `buf`). `for_wsgi`: the scope only
/// feeds a WSGI environ (and the proxy headers, and the access log), so the parts only an ASGI
/// app reads (`asgi`, `state`, `extensions`) stay `None`.
pub fn build_scope<'py>(
    py: Python<'py>,
    base: &ScopeBase,
    buf: &[u8],
    head: &Head,
    client: &Py<PyAny>,
    for_wsgi: bool,
) -> PyResult<(Bound<'py, PyDict>, RequestFacts)> {
    let scope = base.template.bind(py).copy()?;
    if !for_wsgi {
        scope.set_item(intern!(py, "asgi"), base.asgi.bind(py).copy()?)?;
    }
    if head.version == Version::Http10 {
        scope.set_item(intern!(py, "http_version"), intern!(py, "1.0"))?;
    }
    scope.set_item(intern!(py, "client"), client.bind(py))?;
    let method = method_str(py, &buf[head.method.clone()]);
    scope.set_item(intern!(py, "method"), &method)?;

    // As uvicorn: `path` and `raw_path` carry the root path in front of the request's path.
    let raw_path = &buf[head.path.clone()];
    let decoded = percent_decode(raw_path);
    let path_text = String::from_utf8_lossy(&decoded);
    let path = if base.root_path_bytes.is_empty() {
        PyString::new(py, &path_text)
    } else {
        let root = base.root_path.bind(py).to_str()?;
        PyString::new(py, &format!("{root}{path_text}"))
    };
    scope.set_item(intern!(py, "path"), &path)?;
    let raw = if base.root_path_bytes.is_empty() {
        PyBytes::new(py, raw_path)
    } else {
        PyBytes::new_with(py, base.root_path_bytes.len() + raw_path.len(), |b| {
            b[..base.root_path_bytes.len()].copy_from_slice(&base.root_path_bytes);
            b[base.root_path_bytes.len()..].copy_from_slice(raw_path);
            Ok(())
        })?
    };
    scope.set_item(intern!(py, "raw_path"), raw)?;
    let query = PyBytes::new(py, &buf[head.query.clone()]);
    scope.set_item(intern!(py, "query_string"), &query)?;

    let headers = PyList::empty(py);
    let mut forwarded = false;
    for (name, value) in &head.headers {
        let name = &buf[name.clone()];
        forwarded |= name == b"x-forwarded-for" || name == b"x-forwarded-proto";
        let pair = PyTuple::new(
            py,
            [
                header_name(py, name).into_any(),
                PyBytes::new(py, &buf[value.clone()]).into_any(),
            ],
        )?;
        headers.append(pair)?;
    }
    scope.set_item(intern!(py, "headers"), headers)?;
    if !for_wsgi {
        if let Some(state) = &base.state {
            scope.set_item(intern!(py, "state"), state.bind(py).copy()?)?;
        }
        let extensions = base.extensions.bind(py).copy()?;
        for name in extension_names(py) {
            extensions.set_item(name, PyDict::new(py))?;
        }
        scope.set_item(intern!(py, "extensions"), extensions)?;
    }
    let facts = RequestFacts {
        method: method.unbind(),
        path: path.unbind(),
        query: query.unbind(),
        scope: None,
        forwarded,
    };
    Ok((scope, facts))
}

/// Turns the http scope `build_scope` made for a WebSocket upgrade into a websocket scope, as
/// uvicorn's: `type` `"websocket"`, `scheme` `ws`/`wss`, no `method`, `subprotocols` from every
/// `Sec-WebSocket-Protocol` field, and the one extension `websocket.http.response` (the app may
/// deny the upgrade with an HTTP response). Not on the plain HTTP path: a handshake is rare
/// next to the messages that follow it.
pub fn to_websocket_scope(
    py: Python<'_>,
    scope: &Bound<'_, PyDict>,
    buf: &[u8],
    head: &Head,
) -> PyResult<()> {
    scope.set_item(intern!(py, "type"), intern!(py, "websocket"))?;
    let secure = scope
        .get_item(intern!(py, "scheme"))?
        .is_some_and(|s| s.eq(intern!(py, "https")).unwrap_or(false));
    let scheme = if secure {
        intern!(py, "wss")
    } else {
        intern!(py, "ws")
    };
    scope.set_item(intern!(py, "scheme"), scheme)?;
    scope.del_item(intern!(py, "method"))?;
    let subprotocols = PyList::empty(py);
    for (name, value) in head.header_fields(buf) {
        if name == b"sec-websocket-protocol" {
            for token in value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if !token.is_empty() {
                    subprotocols.append(PyString::new(py, &String::from_utf8_lossy(token)))?;
                }
            }
        }
    }
    scope.set_item(intern!(py, "subprotocols"), subprotocols)?;
    let extensions = PyDict::new(py);
    extensions.set_item(intern!(py, "websocket.http.response"), PyDict::new(py))?;
    scope.set_item(intern!(py, "extensions"), extensions)?;
    Ok(())
}

/// `{"type": "http.request", "body": body, "more_body": more}`.
pub fn request_message<'py>(
    py: Python<'py>,
    body: Bound<'py, PyBytes>,
    more: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let msg = PyDict::new(py);
    msg.set_item(intern!(py, "type"), intern!(py, "http.request"))?;
    msg.set_item(intern!(py, "body"), body)?;
    msg.set_item(intern!(py, "more_body"), more)?;
    Ok(msg)
}

/// `{"type": "http.disconnect"}`.
pub fn disconnect_message(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let msg = PyDict::new(py);
    msg.set_item(intern!(py, "type"), intern!(py, "http.disconnect"))?;
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::percent_decode;

    #[test]
    fn percent_decoding_keeps_invalid_escapes() {
        assert_eq!(&*percent_decode(b"/a%20b"), b"/a b");
        assert_eq!(&*percent_decode(b"/%zz%4"), b"/%zz%4");
        assert_eq!(&*percent_decode(b"/%C3%A9"), "/é".as_bytes());
        assert_eq!(&*percent_decode(b"/plain"), b"/plain");
        assert_eq!(&*percent_decode(b"%"), b"%");
    }
}
