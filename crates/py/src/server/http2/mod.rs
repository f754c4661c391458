//! HTTP/2 on the loop thread (`--http auto`, the default, and `--http 2`): h2c with prior
//! knowledge on the HTTP/1.1 port, told apart by the connection preface, and h2 over TLS chosen
//! by ALPN. The protocol (frames, HPACK, streams, flow control, GOAWAY) is the `h2` crate's; this
//! module drives it without tokio's runtime and gives each stream to the app as an ASGI http
//! scope (`stream.rs`).
//!
//! How `h2` is driven: its `Connection` is a future over `io::SocketIo` (tokio's I/O traits on the
//! non-blocking fd). The loop polls it, with the GIL, when the fd is readable or writable
//! (`Http2Connection.__call__`) and at the end of a ready batch in which an app sent or
//! received something (`defer_flush`), until nothing is left to do. The wakers `h2` is given
//! only record what woke (`Woken`): the connection's, or a stream's id; a drive polls the
//! connection, then services the streams that were woken, and goes round again while
//! anything was woken meanwhile. No thread, no timer, no runtime.
//!
//! Files: this one, the connection (adoption, the drive, closing, lingering); `mode.rs`
//! (`--http`, telling HTTP/2 from HTTP/1.1); `io.rs` (the socket for `h2`); `wake.rs` (the
//! wakers); `app.rs` (the app's `receive`/`send` and task); `stream.rs` (one stream);
//! `scope.rs` (its scope).
//!
//! Ownership and invariants:
//! - An HTTP/1.1 `Conn` becomes HTTP/2 before its first request (`adopt`): it gives up its fd,
//!   the bytes it read and its TLS session, and leaves the server's `conns`; the `H2Conn` joins
//!   `h2_conns`, owns the fd from then on and closes it once (`close_now`).
//! - The reader is registered while the peer may send and no write is blocked (a blocked
//!   write stops `h2` reading, and a level-triggered fd left registered would spin); the
//!   writer while a write is blocked.
//! - State is borrowed only between calls into Python: futures are resolved, apps started
//!   and logs written after the borrow ends (`Fx`).
//! - Once `h2` is done with the connection it lingers (`lingering`): input is read and dropped
//!   until the peer closes or `LINGER` passes, so a reset cannot destroy the last GOAWAY.

mod app;
mod io;
mod mode;
mod scope;
mod stream;
mod wake;

use std::collections::HashMap;
use std::future::Future as _;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use ferroloop_core::front::DONE_CLOSED;
use ferroloop_core::tls::TlsConn;
use pyo3::exceptions::PyTypeError;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyString};
use pyo3::PyTraverseError;

pub(super) use mode::detect;
pub(crate) use mode::HttpMode;
pub use stream::H2Cycle;

use super::conn::{Conn, Phase};
use super::HttpServer;
use crate::cell::LoopCell;
use crate::event_loop::LoopCore;
use io::{IoFlags, SocketIo};
use stream::Stream;
use wake::{ConnWake, StreamWake, Woken};

/// Streams a client may open at once (SETTINGS_MAX_CONCURRENT_STREAMS; RFC 9113 §6.5.2
/// recommends at least 100, hyper's server default is 200, granian's 200).
const MAX_CONCURRENT_STREAMS: u32 = 200;
/// Each stream's receive window: as much request body as may wait for the app per stream
/// (the HTTP/1.1 side stops reading at 256 KiB, `READ_HIGH`).
const STREAM_WINDOW: u32 = 256 * 1024;
/// The connection's receive window, shared by its streams.
const CONNECTION_WINDOW: u32 = 1024 * 1024;
/// How long a closing connection reads and drops input (`H2State::lingering`), as the
/// HTTP/1.1 side's `LINGER`.
const LINGER: f64 = super::conn::LINGER;
/// Rounds of a drive before it yields to the loop (a drive ends when nothing was woken).
const DRIVE_ROUNDS: usize = 64;

type Handshake = h2::server::Handshake<SocketIo, Bytes>;
type Connection = h2::server::Connection<SocketIo, Bytes>;
type Accepted = (
    http::Request<h2::RecvStream>,
    h2::server::SendResponse<Bytes>,
);

enum Proto {
    Handshaking(Pin<Box<Handshake>>),
    Open(Box<Connection>),
    Done,
}

#[allow(
    clippy::struct_excessive_bools,
    reason = "independent facts of one connection, not a state"
)]
struct H2State {
    proto: Proto,
    streams: HashMap<u32, Stream>,
    reading: bool,
    writing: bool,
    closed: bool,
    /// A drive is queued for the end of the running batch.
    drive_queued: bool,
    /// `h2` is done with the connection (its last frames written, the write side shut) and
    /// input is read and dropped until the peer closes or this deadline passes (`LINGER`):
    /// closing with unread input would reset the connection and could destroy the GOAWAY
    /// before the peer reads it.
    lingering: Option<f64>,
    /// Since when the connection has had no stream (`INFINITY` while it has one): past
    /// `--timeout-keep-alive` it is shut down gracefully (`check_idle`).
    idle_since: f64,
}

/// Effects collected under the borrow, applied after it.
#[derive(Default)]
#[must_use]
struct Fx {
    reading: Option<bool>,
    writing: Option<bool>,
    resolve: Vec<(Py<PyAny>, Py<PyAny>)>,
    /// Streams whose app is to start: `(id, scope, forwarded)`.
    starts: Vec<(u32, Py<PyDict>, bool)>,
    logs: Vec<(String, Option<Py<PyAny>>)>,
    /// `(method, path, status)` of a response that completed.
    access: Vec<(Py<PyString>, Py<PyString>, u16)>,
    close: bool,
}

#[pyclass(module = "ferroloop._native", name = "Http2Connection", frozen)]
pub struct H2Conn {
    pub(super) server: Py<HttpServer>,
    fd: RawFd,
    client: Py<PyAny>,
    /// Behind the front: the token it handed the connection under, for the `Done` at close.
    front_token: Option<u64>,
    woken: Arc<Woken>,
    conn_waker: Waker,
    flags: Arc<IoFlags>,
    state: LoopCell<H2State>,
}

impl H2Conn {
    /// Turns the HTTP/1.1 connection `conn`, before its first request, into an HTTP/2 one.
    pub(super) fn adopt(conn: &Bound<'_, Conn>) -> PyResult<()> {
        let py = conn.py();
        let this = conn.get();
        let server = this.server().bind(py);
        let (early, tls, writing, eof, handoff) = {
            let mut st = this.state.borrow(py)?;
            if st.phase() != Phase::Idle {
                return Ok(());
            }
            let early = st.http.input().to_vec();
            let eof = st.http.eof();
            st.http.abort(); // Closed: the HTTP/1.1 side is done with the socket
            (
                early,
                st.tls.take(),
                std::mem::replace(&mut st.writing, false),
                eof,
                st.handoff.take(),
            )
        };
        if writing {
            Conn::register(conn, true, false)?;
        }
        drop(server.get().conn_closed(py, this.fd));
        // Behind the front the connection stays on this worker for its life, as a TLS one: the
        // front hears of it again when it closes (`close_now`).
        let token = handoff.map(|h| h.token);
        let h2 = Self::open(
            server,
            this.fd,
            this.client.clone_ref(py),
            early,
            tls,
            token,
        )?;
        if eof {
            // The peer closed already: the first drive stops watching the socket.
            h2.get().flags.eof.store(true, Ordering::Relaxed);
        }
        Self::drive(h2.bind(py))
    }

    fn open(
        server: &Bound<'_, HttpServer>,
        fd: RawFd,
        client: Py<PyAny>,
        early: Vec<u8>,
        tls: Option<Box<TlsConn>>,
        front_token: Option<u64>,
    ) -> PyResult<Py<Self>> {
        let py = server.py();
        let woken = Arc::new(Woken::default());
        let flags = Arc::new(IoFlags::default());
        let io = SocketIo::new(fd, early, tls, flags.clone());
        let handshake = h2::server::Builder::new()
            .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .handshake(io);
        let conn = Py::new(
            py,
            Self {
                server: server.clone().unbind(),
                fd,
                client,
                front_token,
                conn_waker: Waker::from(Arc::new(ConnWake(woken.clone()))),
                woken,
                flags,
                state: LoopCell::new(H2State {
                    proto: Proto::Handshaking(Box::pin(handshake)),
                    streams: HashMap::new(),
                    reading: true,
                    writing: false,
                    closed: false,
                    drive_queued: false,
                    lingering: None,
                    idle_since: ferroloop_core::clock::monotonic(),
                }),
            },
        )?;
        server.get().h2_opened(py, fd, conn.clone_ref(py))?;
        // Replaces the HTTP/1.1 connection as the fd's reader.
        Self::register(conn.bind(py), false, true)?;
        Ok(conn)
    }

    fn register(slf: &Bound<'_, Self>, write: bool, on: bool) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let loop_ = this.server.bind(py).get().loop_core().bind(py);
        LoopCore::set_native_callback(loop_, this.fd, slf.as_any(), write, on)
    }

    /// Polls `h2` and services the woken streams until nothing is woken (or `DRIVE_ROUNDS`).
    pub(super) fn drive(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        for _ in 0..DRIVE_ROUNDS {
            let mut fx = Fx::default();
            {
                let mut st = this.state.borrow(py)?;
                if st.closed || st.lingering.is_some() {
                    return Ok(());
                }
                this.woken.conn.store(false, Ordering::Relaxed);
                let accepted = Self::poll_proto(&mut st.proto, &this.conn_waker, &mut fx);
                for (request, respond) in accepted {
                    this.open_stream(py, &mut st, request, respond, &mut fx)?;
                }
                for id in this.woken.take_streams() {
                    if let Some(s) = st.streams.get_mut(&id) {
                        s.service(py, &mut fx.resolve)?;
                    }
                }
                st.streams.retain(|_, s| !s.over());
                if !st.streams.is_empty() {
                    st.idle_since = f64::INFINITY;
                } else if st.idle_since.is_infinite() {
                    st.idle_since = ferroloop_core::clock::monotonic();
                }
                this.watch(&mut st, &mut fx);
                if fx.close {
                    for s in st.streams.values_mut() {
                        s.connection_gone(py, &mut fx.resolve)?;
                    }
                }
            }
            let close = fx.close;
            Self::apply(slf, fx)?;
            if close || !this.woken.any() {
                return Ok(());
            }
        }
        // Still woken after `DRIVE_ROUNDS` (`h2` yields after a budget of frames, waking
        // itself): the rest runs from the ready queue, after the other work queued now.
        let core = this.server.bind(py).get().loop_core().bind(py);
        LoopCore::push_call(core, slf.as_any(), Self::drive_entry).map(drop)
    }

    fn drive_entry(target: &Bound<'_, PyAny>) -> PyResult<()> {
        Self::drive(target.cast::<Self>()?)
    }

    /// Polls the handshake, then the connection for new streams.
    fn poll_proto(proto: &mut Proto, waker: &Waker, fx: &mut Fx) -> Vec<Accepted> {
        let mut cx = Context::from_waker(waker);
        let mut accepted = Vec::new();
        if let Proto::Handshaking(hs) = proto {
            let polled = hs.as_mut().poll(&mut cx);
            match polled {
                Poll::Ready(Ok(conn)) => *proto = Proto::Open(Box::new(conn)),
                // Not HTTP/2 after all (a wrong preface), or the peer left.
                Poll::Ready(Err(_)) => *proto = Proto::Done,
                Poll::Pending => {}
            }
        }
        let mut over = false;
        if let Proto::Open(conn) = proto {
            loop {
                let polled = conn.poll_accept(&mut cx);
                match polled {
                    Poll::Ready(Some(Ok(pair))) => accepted.push(pair),
                    // The connection is over: closed by GOAWAY both ways, or by an error
                    // (I/O, or the peer broke the protocol, which `h2` answered with GOAWAY).
                    Poll::Ready(Some(Err(_)) | None) => {
                        over = true;
                        break;
                    }
                    Poll::Pending => break,
                }
            }
        }
        if over {
            *proto = Proto::Done;
        }
        if matches!(proto, Proto::Done) {
            fx.close = true;
        }
        accepted
    }

    /// Registrations after a poll: the writer while a write is blocked; the reader while the
    /// peer may send and no write is blocked.
    fn watch(&self, st: &mut H2State, fx: &mut Fx) {
        let blocked = self.flags.write_blocked.swap(false, Ordering::Relaxed);
        if blocked != st.writing {
            st.writing = blocked;
            fx.writing = Some(blocked);
        }
        let read = !blocked && !self.flags.eof.load(Ordering::Relaxed);
        if read != st.reading {
            st.reading = read;
            fx.reading = Some(read);
        }
    }

    fn open_stream(
        &self,
        py: Python<'_>,
        st: &mut H2State,
        request: http::Request<h2::RecvStream>,
        respond: h2::server::SendResponse<Bytes>,
        fx: &mut Fx,
    ) -> PyResult<()> {
        let id = respond.stream_id().as_u32();
        let server = self.server.bind(py).get();
        let (parts, recv) = request.into_parts();
        let (scope, facts) = scope::build(py, server.base(), &parts, &self.client)?;
        let waker = Waker::from(Arc::new(StreamWake {
            woken: self.woken.clone(),
            id,
        }));
        let mut stream = Stream::new(
            waker,
            recv,
            respond,
            facts.is_head,
            facts.method,
            facts.path,
        );
        (stream.method_index, stream.started_at) =
            server.request_started(parts.method.as_str().as_bytes());
        if server.over_capacity(py) {
            // As HTTP/1.1 answers over --limit-concurrency: 503, the app not called.
            stream.task_done = true;
            let _ = stream.start(py, &unavailable(py)?);
            let fields = self.fields(py);
            let fields = borrow_fields(&fields);
            stream.send_head(true, &fields);
            stream.finish_unsent();
            stream.discard_body();
        } else {
            fx.starts.push((id, scope.unbind(), facts.forwarded));
        }
        if !stream.over() {
            st.streams.insert(id, stream);
        }
        Ok(())
    }

    /// The server's own response fields (`date`, `server`, `--header`).
    fn fields(&self, py: Python<'_>) -> Vec<(Vec<u8>, Vec<u8>)> {
        let server = self.server.bind(py).get();
        let date = server.date(py);
        let f = server.fields(date.as_ref().map(|d| &d[..]));
        let mut out: Vec<(Vec<u8>, Vec<u8>)> = f.extra.to_vec();
        if let Some(d) = f.date {
            out.push((b"date".to_vec(), d.to_vec()));
        }
        if let Some(s) = f.server {
            out.push((b"server".to_vec(), s.to_vec()));
        }
        out
    }

    fn apply(slf: &Bound<'_, Self>, fx: Fx) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let server = this.server.bind(py).get();
        for (message, exc) in fx.logs {
            server.log(py, &message, exc.as_ref().map(|e| e.bind(py)));
        }
        if let Some(log) = server.access_log() {
            for (method, path, status) in fx.access {
                let args = (this.client.clone_ref(py), method, path, "2", status);
                if let Err(e) = log.bind(py).call1(args) {
                    e.write_unraisable(py, Some(log.bind(py)));
                }
            }
        }
        if fx.close {
            Self::linger(slf)?;
        } else {
            if let Some(on) = fx.writing {
                Self::register(slf, true, on)?;
            }
            if let Some(on) = fx.reading {
                Self::register(slf, false, on)?;
            }
        }
        for (fut, value) in fx.resolve {
            let fut = fut.bind(py);
            if !fut.call_method0(intern!(py, "done"))?.is_truthy()? {
                fut.call_method1(intern!(py, "set_result"), (value,))?;
            }
        }
        for (id, scope, forwarded) in fx.starts {
            Self::start_app(slf, id, scope.bind(py), forwarded)?;
        }
        Ok(())
    }

    /// Asks for a drive when the running batch ends (once per batch), or drives now outside
    /// one: what an app sent or read changed what `h2` has to write.
    fn want_drive(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        {
            let mut st = this.state.borrow(py)?;
            if st.drive_queued || st.closed {
                return Ok(());
            }
            st.drive_queued = true;
        }
        let core = this.server.bind(py).get().loop_core().get();
        let deferred = core
            .defer_flush(py, slf.as_any(), Self::drive_deferred)
            .unwrap_or(false);
        if !deferred {
            Self::drive_deferred(slf.as_any())?;
        }
        Ok(())
    }

    fn drive_deferred(target: &Bound<'_, PyAny>) -> PyResult<()> {
        let slf = target.cast::<Self>()?;
        slf.get().state.borrow(slf.py())?.drive_queued = false;
        Self::drive(slf)
    }

    /// The server's sweep: a connection without streams for `--timeout-keep-alive` seconds is
    /// shut down gracefully (GOAWAY), as an idle HTTP/1.1 connection is closed.
    pub(super) fn check_idle(slf: &Bound<'_, Self>, now: f64) -> PyResult<()> {
        let py = slf.py();
        let keep_alive = slf.get().server.bind(py).get().opts().timeout_keep_alive;
        let idle = {
            let mut st = slf.get().state.borrow(py)?;
            if st.lingering.is_some_and(|deadline| now > deadline) {
                drop(st);
                return Self::close_now(slf);
            }
            let idle = !st.closed
                && st.lingering.is_none()
                && st.streams.is_empty()
                && now - st.idle_since > keep_alive;
            if idle {
                // Once: the shutdown's own exchange (a PING, the last GOAWAY) runs from here.
                st.idle_since = f64::INFINITY;
            }
            idle
        };
        if idle {
            return Self::shutdown(slf);
        }
        Ok(())
    }

    /// Graceful shutdown: GOAWAY; the streams in flight finish, then the connection closes.
    pub(super) fn shutdown(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let close = {
            let mut st = slf.get().state.borrow(py)?;
            match &mut st.proto {
                Proto::Open(conn) => {
                    conn.graceful_shutdown();
                    false
                }
                Proto::Handshaking(_) => true,
                Proto::Done => false,
            }
        };
        if close {
            return Self::close_now(slf);
        }
        Self::drive(slf)
    }

    /// `h2` is done: the streams are told, and the connection reads and drops input until the
    /// peer closes (or `LINGER` passes: `check_idle`), then closes. At once if the peer has.
    fn linger(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let mut resolve = Vec::new();
        let (read, write) = {
            let mut st = this.state.borrow(py)?;
            if st.closed || st.lingering.is_some() {
                return Ok(());
            }
            if this.flags.eof.load(Ordering::Relaxed) {
                drop(st);
                return Self::close_now(slf);
            }
            st.lingering = Some(ferroloop_core::clock::monotonic() + LINGER);
            for s in st.streams.values_mut() {
                s.connection_gone(py, &mut resolve)?;
            }
            st.streams.clear();
            (
                !std::mem::replace(&mut st.reading, true),
                std::mem::replace(&mut st.writing, false),
            )
        };
        // SAFETY: shutdown of our open socket (`h2` may have shut its write side already); a
        // failure (the peer is gone) is seen by the next read.
        unsafe { libc::shutdown(this.fd, libc::SHUT_WR) };
        if read {
            Self::register(slf, false, true)?;
        }
        if write {
            Self::register(slf, true, false)?;
        }
        for (fut, value) in resolve {
            let fut = fut.bind(py);
            if !fut.call_method0(intern!(py, "done"))?.is_truthy()? {
                fut.call_method1(intern!(py, "set_result"), (value,))?;
            }
        }
        Ok(())
    }

    /// Readiness of the socket, either way: drive `h2` (or drain a lingering close).
    fn on_ready(slf: &Bound<'_, Self>) -> PyResult<()> {
        let lingering = slf.get().state.borrow(slf.py())?.lingering.is_some();
        if lingering {
            return Self::drain_lingering(slf);
        }
        Self::drive(slf)
    }

    /// Lingering: drops what the peer sent; closes at its end of input (or an error).
    fn drain_lingering(slf: &Bound<'_, Self>) -> PyResult<()> {
        let mut sink = [0u8; 4096];
        loop {
            // SAFETY: `sink` is valid for writes of its length.
            let n = unsafe { libc::recv(slf.get().fd, sink.as_mut_ptr().cast(), sink.len(), 0) };
            if n > 0 {
                continue;
            }
            let again =
                n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock;
            if again {
                return Ok(());
            }
            return Self::close_now(slf);
        }
    }

    /// Closes at once: out of the poller, fd closed, every waiting stream told.
    pub(super) fn close_now(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let mut resolve = Vec::new();
        let (reading, writing, proto) = {
            let mut st = this.state.borrow(py)?;
            if st.closed {
                return Ok(());
            }
            st.closed = true;
            for s in st.streams.values_mut() {
                s.connection_gone(py, &mut resolve)?;
            }
            (
                std::mem::replace(&mut st.reading, false),
                std::mem::replace(&mut st.writing, false),
                std::mem::replace(&mut st.proto, Proto::Done),
            )
        };
        drop(proto);
        let unregistered = (|| {
            if reading {
                Self::register(slf, false, false)?;
            }
            if writing {
                Self::register(slf, true, false)?;
            }
            Ok::<(), PyErr>(())
        })();
        // SAFETY: the fd is ours (taken over from the HTTP/1.1 connection), out of the poller
        // now, and `closed` keeps every other path away from it.
        drop(unsafe { OwnedFd::from_raw_fd(this.fd) });
        let server = this.server.bind(py).get();
        drop(server.h2_closed(py, this.fd));
        server.trace_connection(py, this.client.clone_ref(py), false);
        if let Some(token) = this.front_token {
            HttpServer::tell_front(this.server.bind(py), token, DONE_CLOSED)?;
        }
        for (fut, value) in resolve {
            let fut = fut.bind(py);
            if !fut.call_method0(intern!(py, "done"))?.is_truthy()? {
                fut.call_method1(intern!(py, "set_result"), (value,))?;
            }
        }
        unregistered
    }
}

/// `{"type": "http.response.start", "status": 503}`, with a text body's field.
fn unavailable(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let msg = PyDict::new(py);
    msg.set_item(intern!(py, "type"), intern!(py, "http.response.start"))?;
    msg.set_item(intern!(py, "status"), 503)?;
    Ok(msg)
}

fn borrow_fields(fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<(&[u8], &[u8])> {
    fields
        .iter()
        .map(|(n, v)| (n.as_slice(), v.as_slice()))
        .collect()
}

#[pymethods]
impl H2Conn {
    #[new]
    fn py_new() -> PyResult<Self> {
        Err(PyTypeError::new_err(
            "Http2Connection objects are created by the server",
        ))
    }

    /// Readiness of the socket: drive the connection.
    fn __call__(slf: &Bound<'_, Self>, writable: &Bound<'_, PyBool>) -> PyResult<()> {
        let _ = writable;
        Self::on_ready(slf)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.server)?;
        visit.call(&self.client)?;
        if let Some(st) = self.state.try_borrow_for_gc() {
            for s in st.streams.values() {
                s.visit(&visit)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        let dropped = self
            .state
            .try_borrow_for_gc()
            .map(|mut st| std::mem::take(&mut st.streams));
        drop(dropped);
    }
}

// `Http2Connection.__call__(writable)`, called directly by the loop (`native_call.rs`).
crate::native_call::native_call!(H2Conn, |slf, arg| {
    arg?.cast::<PyBool>().ok()?;
    Some(Self::on_ready(slf))
});
