//! One HTTP/1.1 connection: reads into a buffer, parses heads and bodies with the sans-IO codec,
//! runs one request at a time through the app, and writes responses in order.
//!
//! Phases (`Phase`), all changed on the loop thread:
//! - `Idle`: waiting for a request head. The deadline is the keep-alive timeout, or the
//!   header timeout once part of a head has arrived (slowloris).
//! - `Busy`: a request is in flight (`req`). Reading goes on, to see a disconnect and to
//!   buffer the body, until `READ_HIGH` unconsumed bytes are buffered (flow control). Pipelined
//!   requests wait in the buffer; the next one starts when this response is complete. Until its
//!   app starts (a queued `Ready::Call` entry, see `advance`), `req.facts` is `None` and the
//!   request's head is still in the buffer at `rpos`: nothing consumes the buffer before that.
//! - `Closing`: the last response is queued; once it is written the write side is shut.
//! - `Lingering`: write side shut, reading and discarding until the peer closes or the
//!   deadline passes, so unread input does not turn our close into a reset that loses the
//!   response.
//! - `Closed`: out of the poller and the fd closed. The `Conn` object may live on (an app task
//!   holds it): every method checks the phase first and never touches the fd number again.
//!
//! Methods borrow the state, decide, and return `Effects` that run after the borrow ends
//! (registrations, Future results, logs, the access log), because those call Python code that may
//! call back into this connection.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use ferroloop_core::front::{DONE_CLOSED, DONE_KEPT};
use ferroloop_core::http::{
    error_response, parse_head, BodyDecoder, BodyKind, Framing, Head, HttpError, RequestInfo,
    HEAD_TIMED_OUT,
};
use ferroloop_core::{clock, Flushed, OutQueue};
use pyo3::exceptions::PyTypeError;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyString};
use pyo3::PyTraverseError;

use super::cycle::{Cycle, Ready};
use super::handoff::Handoff;
use super::scope::{self, RequestFacts};
use super::tls::{self, TlsConn};
use super::websocket::{self, Upgrade, WsSession};
use super::HttpServer;
use crate::cell::LoopCell;
use crate::event_loop::LoopCore;
use crate::task::Task;

/// Stop reading while this many received bytes wait for the app (a request body, pipelined
/// requests): the client is then held back by TCP flow control.
pub(super) const READ_HIGH: usize = 256 * 1024;
/// `send()` waits while more than this many bytes are queued for the socket.
pub(super) const WRITE_HIGH: usize = 64 * 1024;
/// ... until the queue is back under this.
pub(super) const WRITE_LOW: usize = 16 * 1024;
/// Bytes read per readiness event (one `recv`; see `read_available`). A connection streaming
/// a large body gets this much per loop iteration, so it sets how long a small request on
/// another connection waits for a turn: uvloop reads 256 KB per event, and uvicorn stops
/// reading once 64 KiB of body wait for the app.
pub(super) const READ_CHUNK: usize = 64 * 1024;
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
/// How long a lingering close waits for the peer.
pub(super) const LINGER: f64 = 2.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Idle,
    Busy,
    Closing,
    Lingering,
    Closed,
}

#[derive(Default)]
pub(super) struct Response {
    pub(super) status: u16,
    pub(super) started: bool,
    /// The app's header fields from `http.response.start`, checked there (`start_head`).
    pub(super) headers: Vec<(Py<PyBytes>, Py<PyBytes>)>,
    pub(super) trailers: bool,
    pub(super) framing: Option<Framing>,
    pub(super) body_done: bool,
    /// Body bytes sent so far, checked against a declared `content-length`.
    pub(super) body_sent: u64,
    /// Trailer fields received so far (`more_trailers`), written after the last chunk.
    pub(super) pending_trailers: Vec<(Vec<u8>, Vec<u8>)>,
}

pub(super) struct Request {
    pub(super) seq: u64,
    pub(super) info: RequestInfo,
    pub(super) expect_continue: bool,
    pub(super) decoder: BodyDecoder,
    pub(super) body_bytes: u64,
    /// The app has been given the last `http.request` message.
    pub(super) body_delivered: bool,
    /// `receive()` has told the app the client is gone (`http.disconnect`) while the
    /// connection was still open: the client half-closed. Returning without a response is
    /// then the app's right, not its error.
    pub(super) disconnect_told: bool,
    /// Filled when the app starts (`start_pending`); `None` while the request waits for its
    /// start entry, its head still in the read buffer at `rpos`.
    pub(super) facts: Option<RequestFacts>,
    pub(super) resp: Response,
    pub(super) receive_waiter: Option<Py<PyAny>>,
    pub(super) drain_waiter: Option<Py<PyAny>>,
    /// The request is a WebSocket upgrade (`websocket/`): its session.
    pub(super) ws: Option<Box<WsSession>>,
    /// For the worker's request counters (`HttpServer::response_done`), when it has a seat:
    /// its method (an index of `request_counts::METHODS`) and when its head was read.
    pub(super) method: u8,
    pub(super) started: f64,
}

impl Request {
    fn new(
        seq: u64,
        info: RequestInfo,
        expect_continue: bool,
        decoder: BodyDecoder,
        ws: Option<Box<WsSession>>,
    ) -> Self {
        Self {
            seq,
            info,
            expect_continue,
            decoder,
            body_bytes: 0,
            body_delivered: false,
            disconnect_told: false,
            facts: None,
            resp: Response::default(),
            receive_waiter: None,
            drain_waiter: None,
            ws,
            method: 0,
            started: 0.0,
        }
    }
}

#[allow(clippy::struct_excessive_bools)] // independent facts about one socket
pub(super) struct ConnState {
    pub(super) fd: RawFd,
    pub(super) phase: Phase,
    pub(super) rbuf: Vec<u8>,
    pub(super) rpos: usize,
    pub(super) out: OutQueue,
    pub(super) head: Head,
    /// The reader / writer is registered in the loop's fd table.
    pub(super) reading: bool,
    pub(super) writing: bool,
    /// Output is held back in `out` until the ready batch ends: the loop holds this
    /// connection in its deferred list and calls `flush_deferred` then.
    pub(super) corked: bool,
    pub(super) eof: bool,
    pub(super) seq: u64,
    pub(super) req: Option<Request>,
    pub(super) deadline: f64,
    /// The deadline is the header timeout (part of a head has arrived).
    pub(super) header_clock: bool,
    /// When the connection last became `Idle` (accepted, or its last response complete): a
    /// graceful shutdown closes it once it has been idle for `drain::DRAIN_QUIET`.
    pub(super) idle_since: f64,
    /// The sequence number of the connection's WebSocket request, 0 if none: its cycle's
    /// `receive()`/`send()` take the WebSocket paths even after the request left `req`.
    pub(super) ws_seq: u64,
    /// The TLS session of a connection to a TLS server (`tls.rs`): `out` then holds plaintext
    /// and the session the ciphertext.
    pub(super) tls: Option<Box<TlsConn>>,
    /// The connection came from the dispatching front (`handoff.rs`) and may go back to it.
    pub(super) handoff: Option<Handoff>,
    /// Its current request is bulk work this worker counts (`HttpServer::bulk_changed`).
    pub(super) bulk: bool,
}

impl ConnState {
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
        self.req.as_ref().and_then(|r| r.ws.as_deref())
    }

    pub(super) fn ws_mut(&mut self) -> Option<&mut WsSession> {
        self.req.as_mut().and_then(|r| r.ws.as_deref_mut())
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
        let deadline = now + server.get().opts().timeout_header;
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
                    phase: Phase::Idle,
                    rbuf: data,
                    rpos: 0,
                    out: OutQueue::new(),
                    head: Head::default(),
                    reading: true,
                    writing: false,
                    corked: false,
                    eof: false,
                    seq: 0,
                    req: None,
                    deadline,
                    header_clock: true,
                    idle_since: now,
                    ws_seq: 0,
                    tls,
                    handoff,
                    bulk: false,
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

    /// The end of the ready batch in which output was held back (`CORK_MAX`): writes it.
    fn flush_deferred(target: &Bound<'_, PyAny>) -> PyResult<()> {
        let slf = target.cast::<Conn>()?;
        let py = target.py();
        let mut fx = Effects::default();
        {
            let mut st = slf.get().state.borrow(py)?;
            st.corked = false;
            let fd = st.fd;
            match st.phase {
                Phase::Closed | Phase::Lingering => return Ok(()),
                Phase::Closing => start_closing(&mut st, &mut fx, fd),
                Phase::Idle | Phase::Busy => flush_now(&mut st, &mut fx, fd),
            }
            fx.hand_back = st.phase == Phase::Idle && st.handoff.is_some();
        }
        Self::apply(slf, fx)
    }

    /// Readiness callback from the loop's fd table (`writable` says which direction).
    pub(super) fn on_ready(slf: &Bound<'_, Self>, writable: bool) -> PyResult<()> {
        if writable {
            Self::on_writable(slf)
        } else {
            Self::on_readable(slf)
        }
    }

    fn on_readable(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let mut fx = Effects::default();
        {
            let mut st = this.state.borrow(py)?;
            if matches!(st.phase, Phase::Closed) || !st.reading {
                return Ok(());
            }
            let failed = read_available(this.fd, &mut st);
            if st.phase == Phase::Lingering {
                st.rbuf.clear();
                st.rpos = 0;
                if st.eof || failed {
                    drop(st);
                    return Self::close_now(slf);
                }
                return Ok(());
            }
            if failed {
                st.eof = true;
            }
            // TLS: handshake flights, alerts and tickets rustls made while reading go out now.
            if st.tls.as_ref().is_some_and(|t| t.has_output()) {
                flush_now(&mut st, &mut fx, this.fd);
            }
            // A socket at end of input (half-closed by the client, or reset) stays readable:
            // watching it on would wake the loop again at once, a busy loop until the
            // response is done. Nothing more can arrive.
            if st.eof {
                st.reading = false;
                fx.reading = Some(false);
            }
        }
        Self::apply(slf, fx)?;
        Self::advance(slf)
    }

    fn on_writable(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let mut fx = Effects::default();
        {
            let mut st = this.state.borrow(py)?;
            if matches!(st.phase, Phase::Closed) {
                return Ok(());
            }
            match st.write_out(this.fd) {
                Err(_) => {
                    st.eof = true;
                    fx.close = true;
                }
                Ok(_) => after_write(py, &mut st, &mut fx),
            }
        }
        Self::apply(slf, fx)
    }

    /// The state machine step after new input or a completed response.
    pub(super) fn advance(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let server = this.server.bind(py).get();
        let mut fx = Effects::default();
        let start = {
            let mut st = this.state.borrow(py)?;
            match st.phase {
                Phase::Idle => Self::idle_step(py, server, &mut st, &mut fx),
                Phase::Busy => {
                    Self::busy_step(py, server, &mut st, &mut fx)?;
                    false
                }
                _ => false,
            }
        };
        Self::apply(slf, fx)?;
        if start {
            // With native app tasks the app starts from its own entry at the end of the
            // running batch: every request read in this iteration is parsed first, then each
            // app runs in turn with its scope, task and coroutine made just before its first
            // step (see `start_pending`), still in this iteration, so its response leaves with
            // the batch's writes (`LoopCore::push_call_at_batch_end`). Otherwise (a task
            // factory, asyncio's Task, debug mode) it starts now, and its task queues its
            // first step.
            let core = server.loop_core().bind(py);
            let deferred = server.native_tasks(core)?
                && LoopCore::push_call_at_batch_end(core, slf.as_any(), Self::start_entry)?;
            if deferred {
                server.start_queued(py, true)?;
            } else {
                Self::start_pending(slf, false)?;
            }
        }
        Ok(())
    }

    /// The `Ready::Call` entry queued by `advance`.
    fn start_entry(target: &Bound<'_, PyAny>) -> PyResult<()> {
        let conn = target.cast::<Conn>()?;
        let py = target.py();
        conn.get().server.bind(py).get().start_queued(py, false)?;
        Self::start_pending(conn, true)
    }

    /// Builds the scope of the request whose head `idle_step` parsed and starts its app;
    /// `run_now`: the app's task runs its first step before this returns. Nothing happens if
    /// the connection closed meanwhile (an abort).
    fn start_pending(slf: &Bound<'_, Self>, run_now: bool) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let server = this.server.bind(py).get();
        let (scope, seq, forwarded) = {
            let mut st = this.state.borrow(py)?;
            let waiting =
                st.phase == Phase::Busy && st.req.as_ref().is_some_and(|r| r.facts.is_none());
            if !waiting {
                return Ok(());
            }
            let is_ws = st.ws_seq == st.seq;
            let built = scope::build_scope(
                py,
                server.base(),
                &st.rbuf[st.rpos..],
                &st.head,
                &this.client,
                server.wsgi().is_some(),
            )
            .and_then(|(scope, facts)| {
                if is_ws {
                    scope::to_websocket_scope(py, &scope, &st.rbuf[st.rpos..], &st.head)?;
                }
                Ok((scope, facts))
            });
            st.rpos += st.head.head_len;
            let req = st.req.as_mut().expect("checked above");
            let seq = req.seq;
            let (scope, mut facts) = match built {
                Ok(b) => b,
                Err(e) => {
                    // As if the app had failed at once: a 500, and the traceback in the log.
                    drop(st);
                    let exc = e.into_value(py).into_any();
                    return Self::app_finished(slf, seq, Some(exc.bind(py)), false);
                }
            };
            if server.access_log().is_some() {
                facts.scope = Some(scope.clone().unbind());
            }
            let forwarded = facts.forwarded;
            req.facts = Some(facts);
            (scope, seq, forwarded)
        };
        Self::start_app(slf, &scope, seq, forwarded, run_now)
    }

    /// `Idle`: parse a head; on success the request becomes current and `true` is returned: its
    /// app is to be started (`start_pending`), the head left in the buffer until then.
    fn idle_step(
        py: Python<'_>,
        server: &HttpServer,
        st: &mut ConnState,
        fx: &mut Effects,
    ) -> bool {
        if st.rpos == st.rbuf.len() {
            if st.eof {
                close_when_written(st, fx);
            }
            return false;
        }
        if st.seq == 0 && super::http2::detect(server.opts().http, st, fx) {
            return false;
        }
        if st.handoff.as_ref().is_some_and(Handoff::goes_back) {
            // On its way back to the front: the next request goes with it.
            fx.hand_back = true;
            return false;
        }
        let ConnState {
            rbuf, rpos, head, ..
        } = &mut *st;
        let parsed = parse_head(&mut rbuf[*rpos..], &server.opts().limits, head);
        match parsed {
            Ok(false) => {
                if st.eof {
                    close_when_written(st, fx);
                } else if !st.header_clock {
                    st.header_clock = true;
                    st.deadline = clock::monotonic() + server.opts().timeout_header;
                }
                false
            }
            Err(e) => {
                Self::reject(py, server, st, fx, &e);
                false
            }
            Ok(true) => {
                if let (Some(limit), BodyKind::Length(n)) = (server.opts().limit_body, st.head.body)
                {
                    if n > limit {
                        let e = HttpError {
                            status: 413,
                            reason: "request body larger than the limit; raise --limit-body",
                        };
                        Self::reject(py, server, st, fx, &e);
                        return false;
                    }
                }
                if server.over_capacity(py) {
                    let e = HttpError {
                        status: 503,
                        reason: "Service Unavailable",
                    };
                    Self::reject(py, server, st, fx, &e);
                    return false;
                }
                let ws = match websocket::upgrade_step(py, server, st, fx) {
                    Upgrade::No => None,
                    // A session would outlive the graceful shutdown (`drain.rs`).
                    Upgrade::Yes(_) if server.shutting_down(py) => {
                        let e = HttpError {
                            status: 503,
                            reason: "the server is shutting down",
                        };
                        Self::reject(py, server, st, fx, &e);
                        return false;
                    }
                    Upgrade::Yes(session) => Some(session),
                    Upgrade::Refused(_) => return false,
                };
                if Self::bulk_step(server, st, fx, ws.is_some()) {
                    return false;
                }
                let close_after = st.handoff.as_ref().is_some_and(|h| h.close_after);
                if ws.is_some() {
                    // A WebSocket stays on this worker: the front counts it no more.
                    fx.front_done = st.handoff.take().map(|h| (h.token, DONE_KEPT));
                }
                let head = &st.head;
                let method = &st.rbuf[st.rpos..][head.method.clone()];
                let is_head = method == b"HEAD";
                let (method, started) = server.request_started(method);
                let info = RequestInfo {
                    version: head.version,
                    is_head,
                    // Nothing follows a WebSocket on its connection, nor a request the
                    // draining front marked as the last.
                    keep_alive: head.keep_alive && ws.is_none() && !close_after,
                };
                st.seq += 1;
                if ws.is_some() {
                    st.ws_seq = st.seq;
                }
                let decoder = BodyDecoder::new(head.body, &server.opts().limits);
                let mut req = Request::new(st.seq, info, head.expect_continue, decoder, ws);
                (req.method, req.started) = (method, started);
                st.req = Some(req);
                st.phase = Phase::Busy;
                st.deadline = f64::INFINITY;
                st.header_clock = false;
                true
            }
        }
    }

    /// Sends an error response for a request that never reached the app, then closes.
    pub(super) fn reject(
        py: Python<'_>,
        server: &HttpServer,
        st: &mut ConnState,
        fx: &mut Effects,
        e: &HttpError,
    ) {
        let date = server.date(py);
        // The request's method if its head was parsed; otherwise the first token of the request
        // line, if it got that far (after the empty lines RFC 9112 §2.2 lets a client send).
        let is_head = st.req.as_ref().map_or_else(
            || {
                let input = &st.rbuf[st.rpos..];
                let start = input.iter().position(|&b| b != b'\r' && b != b'\n');
                start.is_some_and(|at| input[at..].starts_with(b"HEAD "))
            },
            |r| r.info.is_head,
        );
        let bytes = error_response(
            e.status,
            e.reason,
            &server.fields(date.as_ref().map(|d| &d[..])),
            is_head,
        );
        let warning = (e.status != 503).then(|| format!("invalid HTTP request: {}", e.reason));
        Self::refuse(st, fx, &bytes, warning);
    }

    /// Queues `answer` to a request that never reached the app, drops what was read, logs
    /// `warning` (the client's fault), and closes once the answer is written.
    pub(super) fn refuse(
        st: &mut ConnState,
        fx: &mut Effects,
        answer: &[u8],
        warning: Option<String>,
    ) {
        st.out.push(answer);
        st.rbuf.clear();
        st.rpos = 0;
        st.phase = Phase::Closing;
        fx.warnings.extend(warning);
        let fd = st.fd;
        start_closing(st, fx, fd);
    }

    /// `Busy`: hand newly arrived body bytes (or the disconnect) to a waiting `receive()`.
    fn busy_step(
        py: Python<'_>,
        server: &HttpServer,
        st: &mut ConnState,
        fx: &mut Effects,
    ) -> PyResult<()> {
        if st.ws().is_some() {
            return Self::ws_input(py, server, st, fx);
        }
        let waiting = st.req.as_ref().is_some_and(|r| r.receive_waiter.is_some());
        if waiting {
            let msg = Self::next_message(py, server, st, fx)?;
            if let Some(msg) = msg {
                let req = st.req.as_mut().expect("busy has a request");
                let fut = req.receive_waiter.take().expect("checked above");
                fx.resolve.push((fut, msg));
            }
        }
        if st.rbuf.len() - st.rpos >= READ_HIGH && st.reading {
            st.reading = false;
            fx.reading = Some(false);
        }
        Ok(())
    }

    /// `forwarded`: the request carries proxy headers (see `HttpServer::app_for`).
    /// `run_now`: a native task runs its first step before this returns (see `start_pending`).
    fn start_app(
        slf: &Bound<'_, Self>,
        scope: &Bound<'_, PyDict>,
        seq: u64,
        forwarded: bool,
        run_now: bool,
    ) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let server_b = this.server.bind(py);
        let server = server_b.get();
        if let Some(pool) = server.wsgi() {
            return super::wsgi::start(slf, pool.bind(py), scope, seq, forwarded);
        }
        let cycle = Bound::new(
            py,
            Cycle {
                conn: slf.clone().unbind(),
                seq,
            },
        )?;
        let (receive, send) = super::cycle::bound_methods(&cycle)?;
        let loop_core = server.loop_core().bind(py);
        let native = server.native_tasks(loop_core)?;
        // Every app task runs in a fresh copy of the server's context (see `task_context`).
        let started = server
            .app_for(forwarded)
            .bind(py)
            .call1((scope, receive, send))
            .and_then(|coro| {
                let context = server.task_context(py)?;
                let name = server.task_name(py)?;
                if native {
                    let hook = cycle.clone().unbind();
                    let task = Task::create(
                        loop_core,
                        &coro,
                        Some(name.into_any()),
                        Some(context),
                        Some(hook),
                        !run_now,
                    )?;
                    return Ok((task.into_any().unbind(), false));
                }
                LoopCore::create_task_as(
                    loop_core,
                    &coro,
                    Some(name.as_any()),
                    Some(&context),
                    false,
                )
                .map(|t| (t, true))
            });
        match started {
            Ok((task, needs_callback)) => {
                let task = task.into_bound(py);
                server.task_started(py, &task)?;
                if needs_callback {
                    task.call_method1(intern!(py, "add_done_callback"), (cycle,))?;
                } else if run_now {
                    Task::run_first_step(task.cast::<Task>()?, loop_core)?;
                }
                Ok(())
            }
            Err(e) => {
                let exc = e.into_value(py).into_any();
                Self::app_finished(slf, seq, Some(exc.bind(py)), false)
            }
        }
    }

    /// The app's task ended (or calling the app failed): log its exception, and answer 500 or
    /// close if it left its response unfinished.
    pub(super) fn app_finished(
        slf: &Bound<'_, Self>,
        seq: u64,
        exc: Option<&Bound<'_, PyAny>>,
        cancelled: bool,
    ) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let server = this.server.bind(py).get();
        let mut fx = Effects::default();
        if let Some(e) = exc {
            fx.logs.push((
                if server.wsgi().is_some() {
                    "Exception in WSGI application\n".into()
                } else {
                    "Exception in ASGI application\n".into()
                },
                Some(e.clone().unbind()),
            ));
        }
        {
            let mut st = this.state.borrow(py)?;
            let current = st.req.as_ref().is_some_and(|r| r.seq == seq);
            let ws_open = st.ws().is_some_and(WsSession::is_open);
            if current && ws_open {
                Self::ws_app_finished(&mut st, &mut fx, exc.is_some() || cancelled);
            } else if current && st.phase == Phase::Busy {
                let started = st.req.as_ref().is_some_and(|r| r.resp.started);
                // An app told the client is gone may stop without finishing its response: not
                // its error (uvicorn checks `disconnected` the same way), so nothing is logged
                // and no 500 is sent; the connection closes.
                let returned = exc.is_none() && !cancelled;
                let told_gone = st.req.as_ref().is_some_and(|r| r.disconnect_told);
                if started {
                    if returned && !told_gone {
                        fx.logs.push((
                            "ASGI callable returned without completing response.".into(),
                            None,
                        ));
                    }
                    fx.close = true;
                } else if returned && told_gone {
                    fx.close = true;
                } else {
                    if returned {
                        let what = if st.ws().is_some() {
                            "ASGI callable returned without completing handshake."
                        } else {
                            "ASGI callable returned without starting response."
                        };
                        fx.logs.push((what.into(), None));
                    }
                    let date = server.date(py);
                    let is_head = st.req.as_ref().is_some_and(|r| r.info.is_head);
                    let bytes = error_response(
                        500,
                        "Internal Server Error",
                        &server.fields(date.as_ref().map(|d| &d[..])),
                        is_head,
                    );
                    st.out.push(&bytes);
                    Self::complete(py, server, &mut st, &mut fx, 500, false);
                }
            }
        }
        Self::apply(slf, fx)
    }

    /// The connection is closed (its fd is gone).
    pub(super) fn is_closed(slf: &Bound<'_, Self>) -> bool {
        slf.get()
            .state
            .borrow(slf.py())
            .map_or(true, |st| st.phase == Phase::Closed)
    }

    /// Request `seq` is current and waits for `100 Continue` before its body.
    pub(super) fn expects_continue(slf: &Bound<'_, Self>, seq: u64) -> PyResult<bool> {
        let st = slf.get().state.borrow(slf.py())?;
        Ok(st
            .req
            .as_ref()
            .is_some_and(|r| r.seq == seq && r.expect_continue))
    }

    /// Closes at once: out of the poller, fd closed, waiters told the client is gone.
    pub(super) fn close_now(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let (reading, writing, waiters, (front_done, bulk_ended)) = {
            let mut st = this.state.borrow(py)?;
            if st.phase == Phase::Closed {
                return Ok(());
            }
            st.phase = Phase::Closed;
            let front_done = st.handoff.take().map(|h| h.token);
            let bulk_ended = std::mem::take(&mut st.bulk);
            if st.corked {
                // Held back only because a batch was running: written as it would have been
                // at `send()` (say a part sent before the app failed), once, without waiting.
                st.corked = false;
                let _ = st.write_out(this.fd);
            }
            st.clear_out();
            st.rbuf = Vec::new();
            st.rpos = 0;
            // (future, what it gets): `Gone::Http` / `Gone::WebSocket` a disconnect message,
            // `Gone::Drained` None. Messages are made once the fd is closed.
            let mut waiters = Vec::new();
            if let Some(req) = st.req.as_mut() {
                let gone = req
                    .ws
                    .as_mut()
                    .map_or(Gone::Http, |ws| Gone::WebSocket(ws.gone_code()));
                waiters.extend(req.receive_waiter.take().map(|f| (f, gone)));
                waiters.extend(req.drain_waiter.take().map(|f| (f, Gone::Drained)));
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
            if st.deadline > now && !(draining && Self::drain_due(&st, now)) {
                return Ok(());
            }
            let phase = st.phase;
            match phase {
                // Still writing its response to a client that does not read: the front never
                // gets it back.
                Phase::Idle
                    if st.handoff.as_ref().is_some_and(|h| !h.pinned())
                        && st.rpos == st.rbuf.len() =>
                {
                    fx.close = true;
                }
                Phase::Idle if st.rpos < st.rbuf.len() => {
                    let server = this.server.bind(py).get();
                    Self::reject(py, server, &mut st, &mut fx, &HEAD_TIMED_OUT);
                    st.deadline = now + LINGER;
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
                    st.deadline = now + LINGER;
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
            if let Some(req) = &st.req {
                visit.call(&req.receive_waiter)?;
                visit.call(&req.drain_waiter)?;
                if let Some(facts) = &req.facts {
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
            .and_then(|mut st| st.req.take());
        drop(dropped);
    }
}

// `Connection.__call__(writable)`, called directly by the loop (`native_call.rs`).
crate::native_call::native_call!(Conn, |slf, arg| {
    let writable = arg?.cast::<PyBool>().ok()?;
    Some(Self::on_ready(slf, writable.is_true()))
});

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

/// Tries to write the queue now; registers the writer if something is left.
pub(super) fn flush_now(st: &mut ConnState, fx: &mut Effects, fd: RawFd) {
    if fd < 0 || st.out_empty() {
        return;
    }
    if st.write_out(fd).is_err() {
        st.clear_out();
        fx.close = true;
    } else if !st.out_empty() && !st.writing {
        st.writing = true;
        fx.writing = Some(true);
    }
}

/// Inside a ready batch (`batch`), holds what is queued back until the batch ends while it is
/// within `CORK_MAX`; otherwise writes it now.
pub(super) fn flush_or_cork(st: &mut ConnState, fx: &mut Effects, fd: RawFd, batch: bool) {
    if batch && st.out_pending() <= CORK_MAX {
        hold_back(st, fx);
    } else {
        flush_now(st, fx, fd);
    }
}

/// Leaves what is queued for the end of the ready batch: the loop is asked once (`fx.cork`,
/// carried out by `apply`) to call `flush_deferred` then.
pub(super) fn hold_back(st: &mut ConnState, fx: &mut Effects) {
    if !st.corked {
        st.corked = true;
        fx.cork = true;
    }
}

/// Closes an idle connection once the last response is written: at once if it is (or the
/// queue cannot be written), else (and always under TLS, for the close_notify) through
/// `Closing`. The response may still be queued: held back until the batch ends (`CORK_MAX`),
/// or waiting for a slow reader.
pub(super) fn close_when_written(st: &mut ConnState, fx: &mut Effects) {
    // Under TLS the close_notify is still to be written (`start_closing`).
    if (st.out_empty() && st.tls.is_none()) || st.fd < 0 {
        fx.close = true;
        return;
    }
    st.phase = Phase::Closing;
    let fd = st.fd;
    start_closing(st, fx, fd);
}

/// `Closing`: once the queue is written, shut the write side and linger. Under TLS the
/// close_notify alert is queued behind the last plaintext and written first.
pub(super) fn start_closing(st: &mut ConnState, fx: &mut Effects, fd: RawFd) {
    flush_now(st, fx, fd);
    if st.out.is_empty() && fd >= 0 {
        if let Some(tls) = st.tls.as_deref_mut() {
            if tls.close_notify() {
                flush_now(st, fx, fd);
            }
        }
    }
    if !st.out_empty() || fd < 0 {
        if !st.writing {
            st.writing = true;
            fx.writing = Some(true);
        }
        return;
    }
    linger(st, fx, fd);
}

pub(super) fn linger(st: &mut ConnState, fx: &mut Effects, fd: RawFd) {
    // SAFETY: shutdown on our open socket; failure (peer gone) just means close now.
    if unsafe { libc::shutdown(fd, libc::SHUT_WR) } < 0 {
        fx.close = true;
        return;
    }
    st.phase = Phase::Lingering;
    st.deadline = clock::monotonic() + LINGER;
    if st.writing {
        st.writing = false;
        fx.writing = Some(false);
    }
    if !st.reading {
        st.reading = true;
        fx.reading = Some(true);
    }
}

/// After the writer flushed: stop watching writability once empty, wake a `send()` waiting for
/// the queue to drain, and finish a close.
pub(super) fn after_write(py: Python<'_>, st: &mut ConnState, fx: &mut Effects) {
    let fd = st.fd;
    if st.out_pending() <= WRITE_LOW {
        if let Some(req) = st.req.as_mut() {
            if let Some(f) = req.drain_waiter.take() {
                fx.resolve.push((f, py.None()));
            }
        }
    }
    if st.out_empty() {
        if st.phase == Phase::Closing {
            // Linger, once a TLS close_notify went out too.
            start_closing(st, fx, fd);
            return;
        }
        if st.writing {
            st.writing = false;
            fx.writing = Some(false);
        }
        fx.hand_back = st.phase == Phase::Idle && st.handoff.is_some();
    }
}

/// Reads once from the socket: at most `READ_CHUNK` bytes, nothing when `READ_HIGH +
/// READ_CHUNK` bytes wait already (see `make_room`). Returns whether the read failed (a reset);
/// sets `eof` on an orderly close.
///
/// One read per readiness event, not reads until `EAGAIN`: the poller is level-triggered, so
/// what is left is reported at the next poll, and a connection streaming a large body gets one
/// `READ_CHUNK` per loop iteration, like every other ready connection. Reading until `EAGAIN`
/// took up to 512 KiB per event (the buffer's doubled capacity); copying that, in the kernel
/// and into the body's `bytes`, lengthened every iteration, and a small request on another
/// connection waited for two of them.
pub(super) fn read_available(fd: RawFd, st: &mut ConnState) -> bool {
    if st.tls.is_some() {
        return read_available_tls(fd, st);
    }
    if !make_room(&mut st.rbuf, &mut st.rpos) {
        return false;
    }
    let len = st.rbuf.len();
    debug_assert!(st.rbuf.capacity() - len >= READ_CHUNK);
    loop {
        // SAFETY: `make_room` left at least `READ_CHUNK` bytes of spare capacity after `len`;
        // the kernel writes at most that many there and the length is set to cover exactly
        // the bytes it wrote.
        let n = unsafe { libc::recv(fd, st.rbuf.as_mut_ptr().add(len).cast(), READ_CHUNK, 0) };
        if n > 0 {
            // SAFETY: the kernel initialized `n` bytes after `len`.
            unsafe { st.rbuf.set_len(len + n as usize) };
            return false;
        }
        if n == 0 {
            st.eof = true;
            return false;
        }
        let err = std::io::Error::last_os_error();
        return match err.kind() {
            std::io::ErrorKind::WouldBlock => false,
            std::io::ErrorKind::Interrupted => continue,
            _ => true,
        };
    }
}

/// Before a read: drops what was consumed and makes room for `READ_CHUNK` more bytes; `false`
/// when `READ_HIGH + READ_CHUNK` unconsumed bytes are buffered already (flow control).
fn make_room(rbuf: &mut Vec<u8>, rpos: &mut usize) -> bool {
    if *rpos > 0 && *rpos == rbuf.len() {
        rbuf.clear();
        *rpos = 0;
    }
    if rbuf.len() - *rpos >= READ_HIGH + READ_CHUNK {
        return false;
    }
    if rbuf.capacity() - rbuf.len() < READ_CHUNK {
        if *rpos > 0 {
            rbuf.drain(..*rpos);
            *rpos = 0;
        }
        rbuf.reserve(READ_CHUNK);
    }
    true
}

/// `read_available` under TLS: ciphertext is read and decrypted into the buffer, with the same
/// bound on what is buffered.
fn read_available_tls(fd: RawFd, st: &mut ConnState) -> bool {
    let ConnState {
        tls,
        rbuf,
        rpos,
        eof,
        ..
    } = st;
    let tls = tls.as_deref_mut().expect("checked by the caller");
    if !make_room(rbuf, rpos) {
        return false;
    }
    // One read per readiness event, as without TLS; `read` leaves no plaintext inside the
    // session, so nothing read waits unseen for a poll that would not report it.
    match tls.read(fd, rbuf) {
        tls::Read::Took(_) | tls::Read::WouldBlock => false,
        tls::Read::Eof => {
            *eof = true;
            false
        }
        tls::Read::Failed => true,
    }
}
