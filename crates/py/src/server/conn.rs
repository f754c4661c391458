//! One HTTP/1.1 connection's driver: the socket (and its TLS session), the write queue, the
//! loop registrations and the Python objects, around the sans-IO connection
//! `ferroloop_core::http::conn::Http1Conn`, which owns the protocol: the phase and its
//! transition table, the read buffer, heads and bodies, pipelining, `Expect: 100-continue`,
//! keep-alive and the response's progress.
//!
//! The driver's files, one concept each: `conn.rs` (this: the state, opening, closing, the
//! sweep), `effects.rs` (what a step leaves to do once the state is no longer borrowed),
//! `input.rs` (reading and the next request), `output.rs` (writing, holding back, the
//! graceful close), `app.rs` (starting the app and its end), `receive.rs` and `respond.rs`
//! (the app's `receive()` and `send()`), `websocket/`, `drain.rs`, `handoff.rs`.
//!
//! Phases (`Phase`, changed only by `Http1Conn`, all on the loop thread; the table is
//! `ferroloop_core::http::conn::TRANSITIONS`):
//! - `Idle`: waiting for a request head. The deadline is the keep-alive timeout, or the
//!   header timeout once part of a head has arrived (slowloris).
//! - `Busy`: a request is in flight. Reading goes on, to see a disconnect and to buffer the
//!   body, until `READ_HIGH` unconsumed bytes are buffered (flow control). Pipelined requests
//!   wait in the buffer; the next one starts when this response is complete. Until its app
//!   starts (a queued `Ready::Call` entry, see `advance`), `app.facts` is `None` and the
//!   request's head is still in the buffer: nothing consumes the buffer before that.
//! - `Closing`: the last response is queued; once it is written the write side is shut.
//! - `Lingering`: write side shut, reading and discarding until the peer closes or the
//!   deadline passes, so unread input does not turn our close into a reset that loses the
//!   response.
//! - `Closed`: out of the poller and the fd closed (or handed back to the front). The `Conn`
//!   object may live on (an app task holds it): every method checks the phase first and never
//!   touches the fd number again.
//!
//! Methods borrow the state, decide, and return `Effects` that run after the borrow ends
//! (registrations, Future results, logs, the access log), because those call Python code that may
//! call back into this connection.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use ferroloop_core::front::DONE_CLOSED;
use ferroloop_core::http::conn::{Exchange, Http1Conn, Settings};
use ferroloop_core::http::HEAD_TIMED_OUT;
use ferroloop_core::{clock, Flushed, OutQueue};
use pyo3::exceptions::PyTypeError;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes};
use pyo3::PyTraverseError;

pub(super) use ferroloop_core::http::conn::{Phase, LINGER, READ_CHUNK, READ_HIGH};

use super::cycle::Ready;
use super::effects::Effects;
use super::handoff::Handoff;
use super::output::close_when_written;
use super::scope::{self, RequestFacts};
use super::tls::TlsConn;
use super::websocket::{self, WsSession};
use super::{HttpServer, Options};
use crate::cell::LoopCell;
use crate::event_loop::LoopCore;

/// `send()` waits while more than this many bytes are queued for the socket.
pub(super) const WRITE_HIGH: usize = 64 * 1024;
/// ... until the queue is back under this.
pub(super) const WRITE_LOW: usize = 16 * 1024;
/// Chunked bodies up to this size are copied into the write queue with their framing; larger
/// ones are written from the app's buffer.
pub(super) const COPY_MAX: usize = 16 * 1024;
/// A `Content-Length` body part up to this size is copied behind the head in the write queue,
/// so head and body leave in one `send` instead of a two-buffer `sendmsg` (about 300 ns less
/// kernel time per response on loopback; copying 2 KiB costs well under that).
pub(super) const SMALL_BODY_COPY: usize = 2 * 1024;
/// A body part sent inside a ready batch is held back until the batch ends while the queue,
/// with it, stays within this many bytes (`LoopCore::defer_flush`); a larger one goes out at
/// once, behind what was held back.
pub(super) const CORK_MAX: usize = 16 * 1024;

/// The driver's own data for one request: its Python objects, its waiters, its WebSocket
/// session. The protocol's part is the `Exchange` around it (`Http1Conn`).
#[derive(Default)]
pub(super) struct Request {
    /// Filled when the app starts (`start_pending`); `None` while the request waits for its
    /// start entry, its head still in the read buffer.
    pub(super) facts: Option<RequestFacts>,
    /// The app's header fields from `http.response.start`, checked there (`start_head`).
    pub(super) headers: Vec<(Py<PyBytes>, Py<PyBytes>)>,
    pub(super) receive_waiter: Option<Py<PyAny>>,
    pub(super) drain_waiter: Option<Py<PyAny>>,
    /// The request is a WebSocket upgrade (`websocket/`): its session.
    pub(super) ws: Option<Box<WsSession>>,
    /// For the worker's request counters (`HttpServer::response_done`), when it has a seat:
    /// its method (an index of `request_counts::METHODS`) and when its head was read.
    pub(super) method: u8,
    pub(super) started: f64,
}

/// A request in flight: the protocol's state and the driver's.
pub(super) type Req = Exchange<Request>;

pub(super) struct ConnState {
    pub(super) fd: RawFd,
    /// The protocol (`ferroloop_core::http::conn`): phase, read buffer, current request,
    /// deadlines.
    pub(super) http: Http1Conn<Request>,
    pub(super) out: OutQueue,
    /// The reader / writer is registered in the loop's fd table.
    pub(super) reading: bool,
    pub(super) writing: bool,
    /// Output is held back in `out` until the ready batch ends: the loop holds this
    /// connection in its deferred list and calls `flush_deferred` then.
    pub(super) corked: bool,
    /// The sequence number of the connection's WebSocket request, 0 if none: its cycle's
    /// `receive()`/`send()` take the WebSocket paths even after the request left `http`.
    pub(super) ws_seq: u64,
    /// The TLS session of a connection to a TLS server (`tls.rs`): `out` then holds plaintext
    /// and the session the ciphertext.
    pub(super) tls: Option<Box<TlsConn>>,
    /// The connection came from the dispatching front (`handoff.rs`) and may go back to it.
    pub(super) handoff: Option<Handoff>,
}

impl ConnState {
    pub(super) fn phase(&self) -> Phase {
        self.http.phase()
    }

    /// The request in flight, if any.
    pub(super) fn req(&self) -> Option<&Req> {
        self.http.exchange()
    }

    pub(super) fn req_mut(&mut self) -> Option<&mut Req> {
        self.http.exchange_mut()
    }

    /// Bytes queued for the socket and not yet written: plaintext, and ciphertext under TLS.
    pub(super) fn out_pending(&self) -> usize {
        self.out.pending() + self.tls.as_ref().map_or(0, |t| t.pending())
    }

    /// Nothing is left to write (TLS records rustls made on its own included).
    pub(super) fn out_empty(&self) -> bool {
        self.out.is_empty() && !self.tls.as_ref().is_some_and(|t| t.has_output())
    }

    /// Writes what is queued, as far as the socket takes it.
    pub(super) fn write_out(&mut self, fd: RawFd) -> std::io::Result<Flushed> {
        match self.tls.as_deref_mut() {
            None => self.out.flush(fd),
            Some(tls) => tls.flush(&mut self.out, fd),
        }
    }

    /// Writes what is queued and then `extra` (`OutQueue::flush_with`); returns how much of
    /// `extra` was taken. Under TLS all of it is: it is queued and sealed.
    pub(super) fn write_out_with(&mut self, fd: RawFd, extra: &[u8]) -> std::io::Result<usize> {
        match self.tls.as_deref_mut() {
            None => self.out.flush_with(fd, extra),
            Some(tls) => {
                self.out.push(extra);
                let _written_or_blocked = tls.flush(&mut self.out, fd)?;
                Ok(extra.len())
            }
        }
    }

    /// Forgets everything queued (the connection is gone or failed).
    pub(super) fn clear_out(&mut self) {
        self.out.clear();
        if let Some(tls) = self.tls.as_deref_mut() {
            tls.clear();
        }
    }

    /// The current request's WebSocket session, if it is a WebSocket.
    pub(super) fn ws(&self) -> Option<&WsSession> {
        self.req().and_then(|r| r.app.ws.as_deref())
    }

    pub(super) fn ws_mut(&mut self) -> Option<&mut WsSession> {
        self.req_mut().and_then(|r| r.app.ws.as_deref_mut())
    }

    /// Turns the reader on or off; the effect registers it.
    pub(super) fn set_reading(&mut self, fx: &mut Effects, on: bool) {
        if self.reading != on {
            self.reading = on;
            fx.reading = Some(on);
        }
    }

    /// Turns the writer on or off; the effect registers it.
    pub(super) fn set_writing(&mut self, fx: &mut Effects, on: bool) {
        if self.writing != on {
            self.writing = on;
            fx.writing = Some(on);
        }
    }
}

/// What a waiting Future gets when its connection closes (`close_now`).
enum Gone {
    /// A `receive()` of an HTTP request: `http.disconnect`.
    Http,
    /// A WebSocket's `receive()`: `websocket.disconnect` with this code and reason.
    WebSocket((u16, String)),
    /// A `send()` waiting for the queue to drain: `None`.
    Drained,
}

#[pyclass(module = "ferroloop._native", name = "Connection", frozen)]
pub struct Conn {
    pub(super) server: Py<HttpServer>,
    pub(super) fd: RawFd,
    pub(super) client: Py<PyAny>,
    pub(super) state: LoopCell<ConnState>,
}

impl Conn {
    pub(crate) fn server(&self) -> &Py<HttpServer> {
        &self.server
    }

    /// Wraps an accepted fd and registers its reader.
    /// `data`: bytes already read from it (by the front, which handed it over: `handoff`).
    pub(super) fn open(
        server: &Bound<'_, HttpServer>,
        fd: RawFd,
        client: Py<PyAny>,
        data: Vec<u8>,
        handoff: Option<Handoff>,
    ) -> PyResult<Py<Conn>> {
        let py = server.py();
        let now = clock::monotonic();
        let tls = match server.get().tls_config() {
            None => None,
            Some(config) => match TlsConn::new(config) {
                Ok(t) => Some(Box::new(t)),
                Err(e) => {
                    // SAFETY: the fd was just accepted, is ours, and is in no poller.
                    drop(unsafe { OwnedFd::from_raw_fd(fd) });
                    return Err(e.into());
                }
            },
        };
        let conn = Py::new(
            py,
            Conn {
                server: server.clone().unbind(),
                fd,
                client,
                state: LoopCell::new(ConnState {
                    fd,
                    http: Http1Conn::new(settings(server.get().opts()), data, now),
                    out: OutQueue::new(),
                    reading: true,
                    writing: false,
                    corked: false,
                    ws_seq: 0,
                    tls,
                    handoff,
                }),
            },
        )?;
        if let Err(e) = Self::register(conn.bind(py), false, true) {
            // SAFETY: the fd was just accepted, is ours, and is in no poller.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
            return Err(e);
        }
        Ok(conn)
    }

    pub(super) fn register(slf: &Bound<'_, Self>, write: bool, on: bool) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let loop_ = this.server.bind(py).get().loop_core().bind(py);
        LoopCore::set_native_callback(loop_, this.fd, slf.as_any(), write, on)
    }

    /// The connection is closed (its fd is gone).
    pub(super) fn is_closed(slf: &Bound<'_, Self>) -> bool {
        slf.get()
            .state
            .borrow(slf.py())
            .map_or(true, |st| st.phase() == Phase::Closed)
    }

    /// Request `seq` is current and waits for `100 Continue` before its body.
    pub(super) fn expects_continue(slf: &Bound<'_, Self>, seq: u64) -> PyResult<bool> {
        let st = slf.get().state.borrow(slf.py())?;
        Ok(st.http.current(seq).is_some_and(Exchange::expects_continue))
    }

    /// Closes at once: out of the poller, fd closed, waiters told the client is gone.
    pub(super) fn close_now(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let (reading, writing, waiters, (front_done, bulk_ended)) = {
            let mut st = this.state.borrow(py)?;
            if st.phase() == Phase::Closed {
                return Ok(());
            }
            if st.corked {
                // Held back only because a batch was running: written as it would have been
                // at `send()` (say a part sent before the app failed), once, without waiting.
                st.corked = false;
                let _ = st.write_out(this.fd);
            }
            let _closed = st.http.abort();
            let (front_done, bulk_ended) = st
                .handoff
                .take()
                .map_or((None, false), |h| (Some(h.token), h.bulk));
            st.clear_out();
            // (future, what it gets): `Gone::Http` / `Gone::WebSocket` a disconnect message,
            // `Gone::Drained` None. Messages are made once the fd is closed.
            let mut waiters = Vec::new();
            if let Some(req) = st.req_mut() {
                let app = &mut req.app;
                let gone = app
                    .ws
                    .as_mut()
                    .map_or(Gone::Http, |ws| Gone::WebSocket(ws.gone_code()));
                waiters.extend(app.receive_waiter.take().map(|f| (f, gone)));
                waiters.extend(app.drain_waiter.take().map(|f| (f, Gone::Drained)));
            }
            (
                std::mem::replace(&mut st.reading, false),
                std::mem::replace(&mut st.writing, false),
                waiters,
                (front_done, bulk_ended),
            )
        };
        let unregistered = (|| {
            if reading {
                Self::register(slf, false, false)?;
            }
            if writing {
                Self::register(slf, true, false)?;
            }
            Ok::<(), PyErr>(())
        })();
        // SAFETY: the fd is ours, out of the poller now, and `Closed` keeps every other path
        // away from it.
        drop(unsafe { OwnedFd::from_raw_fd(this.fd) });
        let server = this.server.bind(py).get();
        drop(server.conn_closed(py, this.fd));
        server.trace_connection(py, this.client.clone_ref(py), false);
        if let Some(token) = front_done {
            HttpServer::tell_front(this.server.bind(py), token, DONE_CLOSED)?;
        }
        if bulk_ended {
            HttpServer::bulk_changed(this.server.bind(py), false)?;
        }
        for (fut, gone) in waiters {
            let value = match gone {
                Gone::Http => scope::disconnect_message(py)?.into_any().unbind(),
                Gone::WebSocket((code, reason)) => {
                    websocket::disconnect_message(py, code, &reason)?
                }
                Gone::Drained => py.None(),
            };
            let fut = fut.bind(py);
            if !fut.call_method0(intern!(py, "done"))?.is_truthy()? {
                fut.call_method1(intern!(py, "set_result"), (value,))?;
            }
        }
        unregistered
    }

    /// The sweep: a connection past its deadline is closed (a partial head first gets 408); in
    /// a graceful shutdown, an idle one also once it has been quiet for `DRAIN_QUIET`.
    pub(super) fn check_deadline(slf: &Bound<'_, Self>, now: f64) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let mut fx = Effects::default();
        {
            let mut st = this.state.borrow(py)?;
            let draining = this.server.bind(py).get().draining_own(py);
            if st.http.deadline() > now && !(draining && Self::drain_due(&st, now)) {
                return Ok(());
            }
            match st.phase() {
                // Still writing its response to a client that does not read: the front never
                // gets it back.
                Phase::Idle
                    if st.handoff.as_ref().is_some_and(|h| !h.pinned()) && !st.http.has_input() =>
                {
                    fx.close = true;
                }
                Phase::Idle if st.http.has_input() => {
                    let server = this.server.bind(py).get();
                    Self::reject(py, server, &mut st, &mut fx, &HEAD_TIMED_OUT);
                    st.http.set_deadline(now + LINGER);
                }
                // A graceful shutdown: closed write side first, unless a request has arrived.
                Phase::Idle if draining => {
                    drop(st);
                    return Self::drain_quiet(slf, now);
                }
                // Under TLS an idle connection past its deadline (keep-alive, or a head that
                // never started) still ends with close_notify, as asyncio's transports do;
                // one whose handshake never completed just closes.
                Phase::Idle if st.tls.as_ref().is_some_and(|t| !t.is_handshaking()) => {
                    close_when_written(&mut st, &mut fx);
                    st.http.set_deadline(now + LINGER);
                }
                Phase::Idle | Phase::Lingering | Phase::Closing => fx.close = true,
                Phase::Busy if st.ws().is_some() => {
                    let server = this.server.bind(py).get();
                    Self::ws_deadline(server, &mut st, &mut fx, now);
                }
                Phase::Busy | Phase::Closed => {}
            }
        }
        Self::apply(slf, fx)
    }
}

#[pymethods]
impl Conn {
    #[new]
    fn py_new() -> PyResult<Self> {
        Err(PyTypeError::new_err(
            "Connection objects are created by the server",
        ))
    }

    /// Readiness of the socket (`writable` says which direction).
    fn __call__(slf: &Bound<'_, Self>, writable: bool) -> PyResult<()> {
        Self::on_ready(slf, writable)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.server)?;
        visit.call(&self.client)?;
        if let Some(st) = self.state.try_borrow_for_gc() {
            if let Some(req) = st.req() {
                visit.call(&req.app.receive_waiter)?;
                visit.call(&req.app.drain_waiter)?;
                if let Some(facts) = &req.app.facts {
                    visit.call(&facts.method)?;
                    visit.call(&facts.path)?;
                    visit.call(&facts.query)?;
                    visit.call(&facts.scope)?;
                }
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        let dropped = self
            .state
            .try_borrow_for_gc()
            .and_then(|mut st| st.http.take_exchange());
        drop(dropped);
    }
}

// `Connection.__call__(writable)`, called directly by the loop (`native_call.rs`).
crate::native_call::native_call!(Conn, |slf, arg| {
    let writable = arg?.cast::<PyBool>().ok()?;
    Some(Self::on_ready(slf, writable.is_true()))
});

/// What each connection's protocol state is made with.
fn settings(opts: &Options) -> Settings {
    Settings {
        limits: opts.limits,
        limit_body: opts.limit_body,
        timeout_header: opts.timeout_header,
        timeout_keep_alive: opts.timeout_keep_alive,
    }
}

/// `ready(value)`: the awaitable that completes at once.
pub(super) fn ready(py: Python<'_>, value: Py<PyAny>) -> PyResult<Py<PyAny>> {
    Ok(Py::new(py, Ready::new(value))?.into_any())
}

static READY_NONE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `ready(None)`, shared: the object holds no state, so every `send()` that need not wait
/// returns the same one instead of allocating.
pub(super) fn ready_none(py: Python<'_>) -> PyResult<Py<PyAny>> {
    READY_NONE
        .get_or_try_init(py, || ready(py, py.None()))
        .map(|r| r.clone_ref(py))
}
