//! A worker behind the dispatching front (`ferroloop_core::front`): connections arrive over
//! the worker's channel instead of from a listener, each with its request head already read,
//! and go back to the front once their response is written.
//!
//! - `HttpServer` made with `handoff=True` watches its socket (the channel) for `Conn`
//!   messages; each becomes a `Conn` whose read buffer starts with the bytes the front read.
//! - A handed-over connection stays here for its next requests while the worker "keeps
//!   connections" (`keeps_connections`: no bulk request runs here, the worker is not stopping,
//!   the front is not draining), so keep-alive traffic crosses no process. Otherwise, once a
//!   response is complete and the connection may be kept alive, it is marked `GoesBack`,
//!   waits until its output is written (`hand_back` is asked again after each write), leaves
//!   the poller and goes back as `Return`, with any bytes of the next request read meanwhile;
//!   our copy of the fd closes once the datagram is sent.
//! - Bulk work (a body over `--lane-bulk-body`, or chunked) arriving on a kept connection: a
//!   fast-lane worker gives the connection back with the request unread (`RETURN_BULK`), for a
//!   general worker; a general worker runs it, and first gives back every idle connection
//!   (`bulk_changed`), so none waits behind the upload. The front hears when bulk work starts
//!   and ends here, and sends this worker nothing small meanwhile while another is free.
//! - A connection that closes here, or stays here as a WebSocket, is reported as `Done`, so
//!   the front's count of this worker's load stays exact.
//! - The channel stays watched through a graceful shutdown: the draining front may still hand
//!   over requests it had read, and closes the channel when it has no more (then `connections`
//!   no longer counts it).

use std::os::fd::{FromRawFd, OwnedFd};

use ferroloop_core::front::{
    BULK_ENDED, BULK_STARTED, CLOSE_AFTER, DRAINING, LEAVING, RETURN_BULK,
};
use ferroloop_core::handoff::{ChannelIn, ChannelOut, Kind, Message, Peer};
use ferroloop_core::http::BodyKind;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyTuple};

use super::conn::{Conn, ConnState, Phase};
use super::effects::Effects;
use super::{peer_to_py, HttpServer};
use crate::event_loop::LoopCore;

/// What a handed-over connection remembers of its handoff.
pub(crate) struct Handoff {
    pub(super) token: u64,
    pub(super) listener: u8,
    pub(super) peer: Peer,
    /// The front is draining: the response says `Connection: close`.
    pub(super) close_after: bool,
    pub(super) fate: Fate,
    /// Its current request is bulk work this worker counts (`HttpServer::bulk_changed`).
    pub(super) bulk: bool,
}

/// Where a handed-over connection goes once idle.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Stays for its next request.
    Stays,
    /// Goes back to the front.
    GoesBack,
    /// Goes back because its next request is bulk work and this is a fast-lane worker.
    GoesBackBulk,
    /// Kept here until it closes, never given back: a TLS session lives in this process (the
    /// front placed it when it was accepted). The worker drains it itself.
    Pinned,
}

impl Handoff {
    pub(super) fn pinned(&self) -> bool {
        self.fate == Fate::Pinned
    }

    pub(super) fn goes_back(&self) -> bool {
        matches!(self.fate, Fate::GoesBack | Fate::GoesBackBulk)
    }
}

/// The worker's end of its channel to the front.
#[derive(Default)]
pub(crate) struct Channel {
    inp: ChannelIn,
    out: ChannelOut,
    /// Registered for writability (messages wait in `out`).
    writing: bool,
    /// Not yet at end of stream (the front is there).
    pub(super) open: bool,
    /// The front drains: every response says `Connection: close`.
    pub(super) draining: bool,
    /// Bulk requests running here (their connections' `bulk` set).
    bulk_running: usize,
}

impl Channel {
    pub(super) fn new() -> Self {
        Self {
            open: true,
            ..Self::default()
        }
    }
}

impl HttpServer {
    /// The channel is readable (`writable` false) or writable.
    pub(super) fn on_channel(slf: &Bound<'_, Self>, writable: bool) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        if writable {
            return Self::flush_channel(slf);
        }
        loop {
            let received = {
                let mut st = this.state.borrow(py)?;
                let Some(chan) = st.channel.as_mut().filter(|c| c.open) else {
                    return Ok(());
                };
                chan.inp.recv(this.listen_fd)
            };
            match received {
                Ok(None) => return Ok(()),
                Ok(Some(msg)) if msg.kind == Kind::Conn => Self::adopt(slf, msg)?,
                Ok(Some(msg)) if msg.kind == Kind::Done && msg.token == DRAINING => {
                    if let Some(chan) = this.state.borrow(py)?.channel.as_mut() {
                        chan.draining = true;
                    }
                    // The front applies its drain rule to the idle connections; pinned ones
                    // (TLS, HTTP/2) drain here, by the same rule (HTTP/2: GOAWAY).
                    Self::give_back_idle(slf)?;
                    if this.pins() {
                        Self::drain_connections(slf)?;
                    } else {
                        Self::shutdown_h2(slf)?;
                    }
                }
                Ok(Some(_)) => {}
                Err(e) => {
                    if e.kind() != std::io::ErrorKind::UnexpectedEof {
                        this.log(py, &format!("the front's channel failed: {e}"), None);
                    }
                    return Self::close_channel(slf);
                }
            }
        }
    }

    /// A connection from the front: served as if accepted here, its buffer already filled.
    fn adopt(slf: &Bound<'_, Self>, msg: Message) -> PyResult<()> {
        let py = slf.py();
        let Some(fd) = msg.fd else {
            return Ok(());
        };
        let raw = std::os::fd::IntoRawFd::into_raw_fd(fd);
        let handoff = Handoff {
            token: msg.token,
            listener: msg.listener,
            peer: msg.peer,
            close_after: msg.detail & CLOSE_AFTER != 0,
            bulk: false,
            fate: if slf.get().pins() {
                Fate::Pinned
            } else {
                Fate::Stays
            },
        };
        let client = peer_to_py(py, msg.peer)?;
        let conn = match Conn::open(slf, raw, client, msg.data, Some(handoff)) {
            Ok(conn) => conn,
            Err(e) => {
                // `open` closed the fd; the front must still count the request as finished.
                Self::tell_front(slf, msg.token, ferroloop_core::front::DONE_CLOSED)?;
                return Err(e);
            }
        };
        slf.get()
            .state
            .borrow(py)?
            .conns
            .insert(raw, conn.clone_ref(py));
        Conn::advance(conn.bind(py))
    }

    /// A connection handed here stays for its next request while this is true: the front is
    /// there and not draining, this worker is not stopping, and no bulk request runs here.
    pub(super) fn keeps_connections(&self, py: Python<'_>) -> bool {
        self.state.borrow(py).is_ok_and(|st| {
            !st.shutting_down
                && st
                    .channel
                    .as_ref()
                    .is_some_and(|c| c.open && !c.draining && c.bulk_running == 0)
        })
    }

    /// This worker is a fast-lane one: bulk work goes back to the front.
    pub(super) fn fast_lane(&self) -> bool {
        self.opts().lane_fast
    }

    /// A bulk request started (`true`) or ended here. The first gives every idle connection
    /// back to the front, so none waits behind the bulk work; the front hears of both.
    pub(super) fn bulk_changed(slf: &Bound<'_, Self>, started: bool) -> PyResult<()> {
        let py = slf.py();
        let edge = {
            let mut st = slf.get().state.borrow(py)?;
            let Some(chan) = st.channel.as_mut() else {
                return Ok(());
            };
            if started {
                chan.bulk_running += 1;
                chan.bulk_running == 1
            } else {
                chan.bulk_running = chan.bulk_running.saturating_sub(1);
                chan.bulk_running == 0
            }
        };
        if !edge {
            return Ok(());
        }
        let detail = if started { BULK_STARTED } else { BULK_ENDED };
        Self::tell_front(slf, LEAVING, detail)?;
        if started {
            Self::give_back_idle(slf)?;
        }
        Ok(())
    }

    /// Every idle handed-over connection goes back to the front (once its output is written).
    pub(super) fn give_back_idle(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let conns: Vec<Py<Conn>> = {
            let st = slf.get().state.borrow(py)?;
            st.conns.values().map(|c| c.clone_ref(py)).collect()
        };
        for conn in conns {
            let idle = {
                let mut st = conn.get().state.borrow(py)?;
                let idle = st.phase() == Phase::Idle;
                match st.handoff.as_mut() {
                    Some(h) if idle && !h.pinned() => {
                        h.fate = Fate::GoesBack;
                        true
                    }
                    _ => false,
                }
            };
            if idle {
                Conn::hand_back(conn.bind(py))?;
            }
        }
        Ok(())
    }

    /// Queues `Done` for request `token` (the connection closed, or stays as a WebSocket).
    pub(super) fn tell_front(slf: &Bound<'_, Self>, token: u64, detail: u8) -> PyResult<()> {
        Self::send_to_front(slf, Message::done(token, detail))
    }

    fn send_to_front(slf: &Bound<'_, Self>, msg: Message) -> PyResult<()> {
        {
            let mut st = slf.get().state.borrow(slf.py())?;
            match st.channel.as_mut() {
                // Without the front, a returned connection just closes (its fd drops here).
                Some(chan) if chan.open => chan.out.push(msg),
                _ => return Ok(()),
            }
        }
        Self::flush_channel(slf)
    }

    fn flush_channel(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let (flushed, was_writing) = {
            let mut st = this.state.borrow(py)?;
            let Some(chan) = st.channel.as_mut().filter(|c| c.open) else {
                return Ok(());
            };
            (chan.out.flush(this.listen_fd), chan.writing)
        };
        match flushed {
            Err(_) => Self::close_channel(slf),
            Ok(empty) if empty == was_writing => {
                // Watch writability while messages wait, and no longer.
                let loop_ = this.loop_core().bind(py);
                let fd = PyInt::new(py, this.listen_fd);
                if empty {
                    LoopCore::remove_fd_handle(loop_, fd.as_any(), true)?;
                } else {
                    let args = PyTuple::new(py, [true])?;
                    LoopCore::set_fd_handle(loop_, fd.as_any(), slf.as_any(), args, true)?;
                }
                if let Some(chan) = this.state.borrow(py)?.channel.as_mut() {
                    chan.writing = !empty;
                }
                Ok(())
            }
            Ok(_) => Ok(()),
        }
    }

    /// The front is gone (or the server aborts): no more handoffs; what waits to be sent is
    /// dropped (returned connections close with it).
    pub(super) fn close_channel(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let (was_open, writing, dropped) = {
            let mut st = this.state.borrow(py)?;
            let Some(chan) = st.channel.as_mut() else {
                return Ok(());
            };
            let dropped = std::mem::take(&mut chan.out);
            (
                std::mem::replace(&mut chan.open, false),
                std::mem::replace(&mut chan.writing, false),
                dropped,
            )
        };
        drop(dropped);
        if was_open {
            let loop_ = this.loop_core().bind(py);
            let fd = PyInt::new(py, this.listen_fd);
            LoopCore::remove_fd_handle(loop_, fd.as_any(), false)?;
            if writing {
                LoopCore::remove_fd_handle(loop_, fd.as_any(), true)?;
            }
        }
        Ok(())
    }

    /// Responses say `Connection: close` and end their connection: the server shuts down.
    /// Behind the front, only when the front drains (or is gone): a worker that stops on its
    /// own (`--limit-max-requests`, SIGHUP) gives its connections back, kept alive, for the
    /// next worker.
    pub(crate) fn closing_connections(&self, py: Python<'_>) -> bool {
        self.state
            .borrow(py)
            .is_ok_and(|st| match st.channel.as_ref() {
                Some(chan) => chan.draining || !chan.open || (st.shutting_down && self.pins()),
                None => st.shutting_down,
            })
    }

    /// Behind the front with TLS: every connection handed here is pinned (`Fate::Pinned`).
    pub(super) fn pins(&self) -> bool {
        self.tls_config().is_some()
    }

    /// Idle connections here are closed once quiet (`drain.rs`): the server shuts down, or,
    /// for pinned connections, which never go back, the front drains.
    pub(crate) fn draining_own(&self, py: Python<'_>) -> bool {
        self.state.borrow(py).is_ok_and(|st| {
            st.shutting_down
                || (self.pins() && st.channel.as_ref().is_some_and(|c| c.draining || !c.open))
        })
    }

    /// The channel is open: it counts as a connection, so a graceful shutdown waits for the
    /// front to finish draining.
    pub(super) fn channel_open(&self, py: Python<'_>) -> bool {
        self.state
            .borrow(py)
            .is_ok_and(|st| st.channel.as_ref().is_some_and(|c| c.open))
    }
}

impl Conn {
    /// A request head was parsed on a handed-over connection: bulk work (`bulk_body`) is
    /// counted here (`Handoff::bulk`, `fx.bulk`), or, on a fast-lane worker and a connection it kept,
    /// goes back to the front unread. Returns whether the connection goes back.
    pub(super) fn bulk_step(
        server: &HttpServer,
        st: &mut ConnState,
        fx: &mut Effects,
        upgrade: bool,
    ) -> bool {
        let bulk = match st.http.head().body {
            BodyKind::Chunked => true,
            BodyKind::Length(n) => n > server.opts().bulk_body,
            BodyKind::Empty => false,
        };
        let kept = st.http.seq() > 0;
        let Some(h) = st.handoff.as_mut().filter(|_| bulk && !upgrade) else {
            return false;
        };
        if server.fast_lane() && kept && !h.pinned() {
            h.fate = Fate::GoesBackBulk;
            fx.hand_back = true;
            return true;
        }
        h.bulk = true;
        fx.bulk = Some(true);
        false
    }

    /// Gives an idle handed-over connection back to the front, once its output is written.
    pub(super) fn hand_back(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let (msg, reading, writing) = {
            let mut st = this.state.borrow(py)?;
            if st.phase() != Phase::Idle || !st.handoff.as_ref().is_some_and(Handoff::goes_back) {
                return Ok(());
            }
            if !st.corked && !st.out_empty() {
                let mut fx = Effects::default();
                super::output::flush_now(&mut st, &mut fx);
                if !st.out_empty() || fx.close {
                    // The write path asks again once the queue is empty (`after_write`).
                    drop(st);
                    return Self::apply(slf, fx);
                }
            }
            if st.corked {
                // Held back until the ready batch ends: `flush_deferred` asks again.
                return Ok(());
            }
            let Some(data) = st.http.hand_back() else {
                return Ok(());
            };
            let h = st.handoff.take().expect("checked above");
            let detail = if h.fate == Fate::GoesBackBulk {
                RETURN_BULK
            } else {
                0
            };
            // SAFETY: the fd is ours and leaves this connection here: `Closed` keeps every
            // other path away from it, and the poller lets go of it below, before the
            // message carrying it is sent (by `send_to_front`, after this block).
            let fd = unsafe { OwnedFd::from_raw_fd(this.fd) };
            let mut msg = Message::conn(Kind::Return, h.token, h.listener, h.peer, fd, data);
            msg.detail = detail;
            (
                msg,
                std::mem::replace(&mut st.reading, false),
                std::mem::replace(&mut st.writing, false),
            )
        };
        if reading {
            Self::register(slf, false, false)?;
        }
        if writing {
            Self::register(slf, true, false)?;
        }
        let server = this.server.bind(py);
        drop(server.get().conn_closed(py, this.fd));
        HttpServer::send_to_front(server, msg)
    }
}
