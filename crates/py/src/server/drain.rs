//! Graceful drain of one connection, from `HttpServer.shutdown` until it closes: no request the
//! client sent is left unanswered while the server could still answer it.
//!
//! What holds from the drain on (`HttpServer::shutting_down`, set once and never cleared):
//! - Every response head written says `connection: close` (`respond::write_head`) and the
//!   connection closes after that response (`Conn::complete`). A response whose head went out
//!   before the drain told the client it may send another request: its connection goes back to
//!   `Idle`, as below.
//! - A request already read, or arriving while the connection is open, is served (by the app,
//!   as any other: the drain only changes what happens after its response). A WebSocket
//!   upgrade is refused with 503 instead (`Conn::idle_step`): its session would outlive the
//!   drain.
//! - An `Idle` connection with nothing buffered is kept open until it has been idle for
//!   `DRAIN_QUIET` (`ConnState::idle_since`: accepted, or its last response completed). A
//!   keep-alive client that sends its next request at once, and a new connection whose request
//!   is on its way, are answered. Past that, the connection is closed write side first
//!   (`SHUT_WR`) and lingers up to `DRAIN_LINGER`, reading and discarding: a request that
//!   crosses our FIN is never started, so the client may safely send it again elsewhere. Closing
//!   at once instead would lose, for a client that sends just then, exactly what the
//!   keep-alive promise let it send (measured in `tests/server/test_shutdown.py`).
//! - A pipelined request already buffered behind a request answered with `connection: close` is
//!   not served: that header tells the client its later requests were not processed (RFC 9112
//!   §9.3.2), which is what makes them safe to retry.
//!
//! The sweep (`HttpServer::_sweep`, every `DRAIN_SWEEP` seconds while draining) finds the quiet
//! connections (`Conn::check_deadline` → `drain_quiet`).

use pyo3::prelude::*;

use super::conn::{Conn, ConnState, Phase};
use super::effects::Effects;
use super::handoff::Handoff;
use super::input::read_available;
use super::output::start_closing;

// How long an idle connection is kept open in a graceful shutdown, counted from when it became
// idle, for a request the client may already be sending, and how long a connection closed by
// the drain reads and discards before closing for good: one rule for the workers and the front
// (`ferroloop_core::front`, where they are defined and the measurement behind them is given).
pub(crate) use ferroloop_core::front::{DRAIN_LINGER, DRAIN_QUIET};
/// The sweep interval while draining: a quiet connection is closed at most this late.
pub(crate) const DRAIN_SWEEP: f64 = 0.05;

impl Conn {
    /// The drain begins (`HttpServer.shutdown`): a WebSocket is closed (1012); an idle
    /// connection serves what has already arrived, or is closed if it is already quiet; a busy
    /// one finishes its response (with `connection: close`, unless its head is out already).
    pub(super) fn shutdown(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let now = ferroloop_core::clock::monotonic();
        let quiet = {
            let mut st = this.state.borrow(py)?;
            if st.phase() == Phase::Busy && st.ws().is_some() {
                let mut fx = Effects::default();
                Self::ws_shutdown(py, &mut st, &mut fx)?;
                drop(st);
                return Self::apply(slf, fx);
            }
            // A handed-over connection goes back to the front instead (`hand_back`), unless it
            // is pinned here.
            if st.phase() != Phase::Idle || st.handoff.as_ref().is_some_and(|h| !h.pinned()) {
                return Ok(());
            }
            Self::drain_due(&st, now)
        };
        Self::drain_idle(slf, now, quiet)
    }

    /// The sweep found an idle connection quiet (or past its deadline) during the drain.
    pub(super) fn drain_quiet(slf: &Bound<'_, Self>, now: f64) -> PyResult<()> {
        Self::drain_idle(slf, now, true)
    }

    /// An idle connection has been quiet long enough to be closed by the drain (nothing
    /// buffered, idle for `DRAIN_QUIET`).
    pub(super) fn drain_due(st: &ConnState, now: f64) -> bool {
        st.phase() == Phase::Idle
            && st.handoff.as_ref().is_none_or(Handoff::pinned)
            && !st.http.has_input()
            && now >= st.http.idle_since() + DRAIN_QUIET
    }

    /// An idle connection in the drain: reads what the socket has; a request (or the client's
    /// close) goes through the state machine as usual; otherwise, if `close` (it is quiet), the
    /// write side is shut and the connection lingers up to `DRAIN_LINGER`.
    fn drain_idle(slf: &Bound<'_, Self>, now: f64, close: bool) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let mut fx = Effects::default();
        {
            let mut st = this.state.borrow(py)?;
            if st.phase() != Phase::Idle {
                return Ok(());
            }
            if st.reading && read_available(this.fd, &mut st) {
                st.http.receive_eof();
            }
            let arrived = st.http.has_input() || st.http.eof();
            if arrived {
                drop(st);
                return Self::advance(slf);
            }
            if !close {
                return Ok(());
            }
            if st.tls.as_ref().is_some_and(|t| t.is_handshaking()) {
                // No session yet, so nothing of ours to protect: close.
                fx.close = true;
            } else {
                // Under TLS the close_notify goes out before the FIN.
                let _closing = st.http.close();
                start_closing(&mut st, &mut fx);
                if st.phase() == Phase::Lingering {
                    let deadline = st.http.deadline().min(now + DRAIN_LINGER);
                    st.http.set_deadline(deadline);
                }
            }
        }
        Self::apply(slf, fx)
    }
}
