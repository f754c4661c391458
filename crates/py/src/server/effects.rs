//! What one step of a connection leaves to do once its state is no longer borrowed: loop
//! registrations, Future results, logs, the access log, closing, the next step. A step
//! (`Conn`'s methods) borrows the state, decides, and collects `Effects`; `Conn::apply` runs
//! them after the borrow ends, because they call Python code (a Future's callbacks, the
//! loggers, the loop) that may call back into the connection.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyString;

use super::conn::Conn;
use super::HttpServer;

/// One access log line: `(client, method, path, http_version, status)`. `client` is the scope's
/// `"client"` when the response completed, or `None` to name the TCP peer.
pub(super) type AccessRecord = (
    Option<Py<PyAny>>,
    Py<PyString>,
    Py<PyString>,
    &'static str,
    u16,
);

#[derive(Default)]
#[must_use]
#[allow(
    clippy::struct_excessive_bools,
    reason = "independent effects of one step, not a state"
)]
pub(super) struct Effects {
    pub(super) reading: Option<bool>,
    pub(super) writing: Option<bool>,
    pub(super) resolve: Vec<(Py<PyAny>, Py<PyAny>)>,
    pub(super) logs: Vec<(String, Option<Py<PyAny>>)>,
    /// Logged at WARNING: the client's fault (a malformed request), not the server's.
    pub(super) warnings: Vec<String>,
    /// A WebSocket handshake's outcome for the log, as uvicorn logs it at INFO on its error
    /// logger: `(path with query, outcome)`, the outcome `[accepted]` or the refusal's status.
    pub(super) websocket_log: Option<(String, String)>,
    pub(super) access: Option<AccessRecord>,
    pub(super) close: bool,
    /// Run the state machine again (a pipelined request may be waiting).
    pub(super) advance: bool,
    /// Output was held back (`corked` just set): ask the loop to flush it when the batch ends.
    pub(super) cork: bool,
    /// Raised by `send()` once the other effects ran (the bytes before the error still go out).
    pub(super) error: Option<PyErr>,
    /// A handed-over connection is idle: give it back to the front once its output is written
    /// (`Conn::hand_back`).
    pub(super) hand_back: bool,
    /// Tell the front what became of a handed-over connection (`Done` with this detail).
    pub(super) front_done: Option<(u64, u8)>,
    /// Bulk work started (`true`) or ended on this connection (`HttpServer::bulk_changed`).
    pub(super) bulk: Option<bool>,
    /// The connection is HTTP/2 (its preface, or ALPN): it becomes an `H2Conn` (`http2/`).
    pub(super) h2: bool,
}

impl Conn {
    pub(super) fn apply(slf: &Bound<'_, Self>, fx: Effects) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let server = this.server.bind(py).get();
        for (message, exc) in fx.logs {
            server.log(py, &message, exc.as_ref().map(|e| e.bind(py)));
        }
        for message in fx.warnings {
            server.warn(py, &message);
        }
        if let Some((path, outcome)) = fx.websocket_log {
            server.log_websocket(py, this.client.bind(py), &path, &outcome);
        }
        if let Some((client, method, path, version, status)) = fx.access {
            if let Some(log) = server.access_log() {
                let client = client.unwrap_or_else(|| this.client.clone_ref(py));
                if let Err(e) = log.bind(py).call1((client, method, path, version, status)) {
                    e.write_unraisable(py, Some(log.bind(py)));
                }
            }
        }
        if fx.close {
            Self::close_now(slf)?;
        } else {
            if let Some(on) = fx.reading {
                Self::register(slf, false, on)?;
            }
            if let Some(on) = fx.writing {
                Self::register(slf, true, on)?;
            }
            if fx.cork {
                // Written now if the loop cannot hold it (no batch running, or its state busy):
                // `corked` must never stay set without a flush to come.
                let core = server.loop_core().get();
                let deferred = core
                    .defer_flush(py, slf.as_any(), Self::flush_deferred)
                    .unwrap_or(false);
                if !deferred {
                    Self::flush_deferred(slf.as_any())?;
                }
            }
        }
        for (fut, value) in fx.resolve {
            let fut = fut.bind(py);
            if !fut.call_method0(intern!(py, "done"))?.is_truthy()? {
                fut.call_method1(intern!(py, "set_result"), (value,))?;
            }
        }
        if let Some((token, detail)) = fx.front_done {
            HttpServer::tell_front(this.server.bind(py), token, detail)?;
        }
        if let Some(started) = fx.bulk {
            HttpServer::bulk_changed(this.server.bind(py), started)?;
        }
        if fx.h2 {
            return super::http2::H2Conn::adopt(slf);
        }
        if fx.advance {
            Self::advance(slf)?;
        }
        if fx.hand_back {
            Self::hand_back(slf)?;
        }
        Ok(())
    }
}
