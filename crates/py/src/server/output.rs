//! A connection's write side: writing the queue (plaintext, or sealed by its TLS session),
//! holding small output back until the ready batch ends (`CORK_MAX`), waking a `send()` that
//! waits for the queue to drain, and the graceful close: once the last output is written the
//! write side is shut and the connection lingers (`Http1Conn::shut`).
//!
//! Invariant: `corked` is set only with a flush to come (the loop's deferred list, or at once
//! when the loop cannot defer it), and nothing is held back across a poll.

use pyo3::prelude::*;

use ferroloop_core::{clock, net};

use super::conn::{Conn, ConnState, Phase, CORK_MAX, WRITE_LOW};
use super::effects::Effects;

impl Conn {
    /// The end of the ready batch in which output was held back (`CORK_MAX`): writes it.
    pub(super) fn flush_deferred(target: &Bound<'_, PyAny>) -> PyResult<()> {
        let slf = target.cast::<Conn>()?;
        let py = target.py();
        let mut fx = Effects::default();
        {
            let mut st = slf.get().state.borrow(py)?;
            st.corked = false;
            match st.phase() {
                Phase::Closed | Phase::Lingering => return Ok(()),
                Phase::Closing => start_closing(&mut st, &mut fx),
                Phase::Idle | Phase::Busy => flush_now(&mut st, &mut fx),
            }
            fx.hand_back = st.phase() == Phase::Idle && st.handoff.is_some();
        }
        Self::apply(slf, fx)
    }

    pub(super) fn on_writable(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let mut fx = Effects::default();
        {
            let mut st = this.state.borrow(py)?;
            if st.phase() == Phase::Closed {
                return Ok(());
            }
            match st.write_out(this.fd) {
                Err(_) => {
                    st.http.receive_eof();
                    fx.close = true;
                }
                Ok(_) => after_write(py, &mut st, &mut fx),
            }
        }
        Self::apply(slf, fx)
    }
}

/// Tries to write the queue now; registers the writer if something is left.
pub(super) fn flush_now(st: &mut ConnState, fx: &mut Effects) {
    let fd = st.fd;
    if fd < 0 || st.out_empty() {
        return;
    }
    if st.write_out(fd).is_err() {
        st.clear_out();
        fx.close = true;
    } else if !st.out_empty() {
        st.set_writing(fx, true);
    }
}

/// Inside a ready batch (`batch`), holds what is queued back until the batch ends while it is
/// within `CORK_MAX`; otherwise writes it now.
pub(super) fn flush_or_cork(st: &mut ConnState, fx: &mut Effects, batch: bool) {
    if batch && st.out_pending() <= CORK_MAX {
        hold_back(st, fx);
    } else {
        flush_now(st, fx);
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
    let _closing = st.http.close();
    start_closing(st, fx);
}

/// `Closing`: once the queue is written, shut the write side and linger. Under TLS the
/// close_notify alert is queued behind the last plaintext and written first.
pub(super) fn start_closing(st: &mut ConnState, fx: &mut Effects) {
    let fd = st.fd;
    flush_now(st, fx);
    if st.out.is_empty() && fd >= 0 {
        if let Some(tls) = st.tls.as_deref_mut() {
            if tls.close_notify() {
                flush_now(st, fx);
            }
        }
    }
    if !st.out_empty() || fd < 0 {
        st.set_writing(fx, true);
        return;
    }
    linger(st, fx);
}

/// The output is written: shut the write side and read until the peer closes (`Lingering`).
fn linger(st: &mut ConnState, fx: &mut Effects) {
    // Failure (the peer is gone) just means close now.
    if net::shutdown_write(st.fd).is_err() {
        fx.close = true;
        return;
    }
    st.http.shut(clock::monotonic());
    st.set_writing(fx, false);
    st.set_reading(fx, true);
}

/// After the writer flushed: stop watching writability once empty, wake a `send()` waiting for
/// the queue to drain, and finish a close.
pub(super) fn after_write(py: Python<'_>, st: &mut ConnState, fx: &mut Effects) {
    if st.out_pending() <= WRITE_LOW {
        if let Some(f) = st.req_mut().and_then(|r| r.app.drain_waiter.take()) {
            fx.resolve.push((f, py.None()));
        }
    }
    if st.out_empty() {
        if st.phase() == Phase::Closing {
            // Linger, once a TLS close_notify went out too.
            start_closing(st, fx);
            return;
        }
        st.set_writing(fx, false);
        fx.hand_back = st.phase() == Phase::Idle && st.handoff.is_some();
    }
}
