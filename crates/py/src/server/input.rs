//! A connection's read side: reading the socket (or its TLS session) into the protocol's
//! buffer, and the step that follows new input or a complete response (`advance`): in `Idle`
//! the next request head (accepted, refused, or waited for), in `Busy` body bytes for a waiting
//! `receive()` or a WebSocket's frames.
//!
//! Invariant: one read per readiness event, not reads until `EAGAIN`: the poller is
//! level-triggered, so what is left is reported at the next poll, and a connection streaming a
//! large body gets one `READ_CHUNK` per loop iteration, like every other ready connection.
//! Reading until `EAGAIN` took up to 512 KiB per event (the buffer's doubled capacity); copying
//! that, in the kernel and into the body's `bytes`, lengthened every iteration, and a small
//! request on another connection waited for two of them.

use std::os::fd::RawFd;

use ferroloop_core::clock;
use ferroloop_core::http::conn::HeadEvent;
use ferroloop_core::http::HttpError;
use pyo3::prelude::*;

use super::conn::{Conn, ConnState, Phase, Request, READ_CHUNK};
use super::effects::Effects;
use super::handoff::Handoff;
use super::output::{close_when_written, flush_now, start_closing};
use super::tls;
use super::websocket::{self, Upgrade};
use super::HttpServer;
use crate::event_loop::LoopCore;

/// What one read found.
enum Read {
    /// Bytes, or nothing yet.
    Data,
    /// The peer ended its input.
    Eof,
    /// The read failed (a reset).
    Failed,
}

/// Reads once from the socket: at most `READ_CHUNK` bytes, nothing while the protocol's buffer
/// is full (`Http1Conn::read_into`). Returns whether the read failed (a reset); notes the end
/// of input on an orderly close.
pub(super) fn read_available(fd: RawFd, st: &mut ConnState) -> bool {
    let ConnState { http, tls, .. } = st;
    let read = match tls.as_deref_mut() {
        None => http.read_into(|buf| recv_into(fd, buf)),
        // One read per readiness event, as without TLS; `read` leaves no plaintext inside the
        // session, so nothing read waits unseen for a poll that would not report it.
        Some(tls) => http.read_into(|buf| match tls.read(fd, buf) {
            tls::Read::Took(_) | tls::Read::WouldBlock => Read::Data,
            tls::Read::Eof => Read::Eof,
            tls::Read::Failed => Read::Failed,
        }),
    };
    match read {
        None | Some(Read::Data) => false,
        Some(Read::Eof) => {
            http.receive_eof();
            false
        }
        Some(Read::Failed) => true,
    }
}

/// One `recv` of at most `READ_CHUNK` bytes into the spare capacity of `buf` (the protocol
/// leaves at least that much).
fn recv_into(fd: RawFd, buf: &mut Vec<u8>) -> Read {
    let len = buf.len();
    debug_assert!(buf.capacity() - len >= READ_CHUNK);
    loop {
        // SAFETY: `read_into` left at least `READ_CHUNK` bytes of spare capacity after `len`;
        // the kernel writes at most that many there and the length is set to cover exactly
        // the bytes it wrote.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().add(len).cast(), READ_CHUNK, 0) };
        if n > 0 {
            // SAFETY: the kernel initialized `n` bytes after `len`.
            unsafe { buf.set_len(len + n as usize) };
            return Read::Data;
        }
        if n == 0 {
            return Read::Eof;
        }
        let err = std::io::Error::last_os_error();
        return match err.kind() {
            std::io::ErrorKind::WouldBlock => Read::Data,
            std::io::ErrorKind::Interrupted => continue,
            _ => Read::Failed,
        };
    }
}

impl Conn {
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
            if st.phase() == Phase::Closed || !st.reading {
                return Ok(());
            }
            let failed = read_available(this.fd, &mut st);
            if st.phase() == Phase::Lingering {
                st.http.discard_input();
                if st.http.eof() || failed {
                    drop(st);
                    return Self::close_now(slf);
                }
                return Ok(());
            }
            if failed {
                st.http.receive_eof();
            }
            // TLS: handshake flights, alerts and tickets rustls made while reading go out now.
            if st.tls.as_ref().is_some_and(|t| t.has_output()) {
                flush_now(&mut st, &mut fx);
            }
            // A socket at end of input (half-closed by the client, or reset) stays readable:
            // watching it on would wake the loop again at once, a busy loop until the
            // response is done. Nothing more can arrive.
            if st.http.eof() {
                st.set_reading(&mut fx, false);
            }
        }
        Self::apply(slf, fx)?;
        Self::advance(slf)
    }

    /// The state machine step after new input or a completed response.
    pub(super) fn advance(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let server = this.server.bind(py).get();
        let mut fx = Effects::default();
        let start = {
            let mut st = this.state.borrow(py)?;
            match st.phase() {
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

    /// `Idle`: look for a head; on success the request becomes current and `true` is returned:
    /// its app is to be started (`start_pending`), the head left in the buffer until then.
    fn idle_step(
        py: Python<'_>,
        server: &HttpServer,
        st: &mut ConnState,
        fx: &mut Effects,
    ) -> bool {
        // Before the first request: HTTP/2's preface (or ALPN's `h2`) makes it an `H2Conn`.
        if st.http.seq() == 0
            && st.http.has_input()
            && super::http2::detect(server.opts().http, st, fx)
        {
            return false;
        }
        if st.http.has_input() && st.handoff.as_ref().is_some_and(Handoff::goes_back) {
            // On its way back to the front: the next request goes with it.
            fx.hand_back = true;
            return false;
        }
        match st.http.next_head(clock::monotonic) {
            HeadEvent::Wait => false,
            HeadEvent::InputEnded => {
                close_when_written(st, fx);
                false
            }
            HeadEvent::Invalid(e) => {
                Self::reject(py, server, st, fx, &e);
                false
            }
            HeadEvent::Head => Self::accept_head(py, server, st, fx),
        }
    }

    /// A whole head was read: refused (503 over capacity or shutting down, a bad upgrade), sent
    /// back to the front (bulk work on a fast-lane worker), or begun.
    fn accept_head(
        py: Python<'_>,
        server: &HttpServer,
        st: &mut ConnState,
        fx: &mut Effects,
    ) -> bool {
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
        // Nothing follows a WebSocket on its connection, nor a request the draining front
        // marked as the last.
        let close_after = st.handoff.as_ref().is_some_and(|h| h.close_after);
        let upgrade = ws.is_some();
        if upgrade {
            // A WebSocket stays on this worker: the front counts it no more.
            fx.front_done = st
                .handoff
                .take()
                .map(|h| (h.token, ferroloop_core::front::DONE_KEPT));
        }
        let (method, started) = server.request_started(st.http.method());
        let app = Request {
            ws,
            method,
            started,
            ..Request::default()
        };
        let seq = st.http.begin(upgrade, close_after, app);
        if upgrade {
            st.ws_seq = seq;
        }
        true
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
        let answer = st
            .http
            .reject(e, &server.fields(date.as_ref().map(|d| &d[..])));
        let warning = (e.status != 503).then(|| format!("invalid HTTP request: {}", e.reason));
        st.out.push(&answer);
        fx.warnings.extend(warning);
        start_closing(st, fx);
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
        st.http.refuse();
        fx.warnings.extend(warning);
        start_closing(st, fx);
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
        let waiting = st.req().is_some_and(|r| r.app.receive_waiter.is_some());
        if waiting {
            let msg = Self::next_message(py, server, st, fx)?;
            if let Some(msg) = msg {
                let req = st.req_mut().expect("busy has a request");
                let fut = req.app.receive_waiter.take().expect("checked above");
                fx.resolve.push((fut, msg));
            }
        }
        if st.http.input_full() && st.reading {
            st.set_reading(fx, false);
        }
        Ok(())
    }
}
