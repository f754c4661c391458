//! A request's `receive()`: body bytes straight from the connection's read buffer (one `bytes`
//! per call, built from every decoded run available), `Expect: 100-continue` on the first call,
//! and `http.disconnect` once the client is gone or the response is complete.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use ferroloop_core::http::HttpError;

use super::conn::{flush_now, ready, Conn, ConnState, Effects, Phase};
use super::scope;
use super::HttpServer;
use crate::event_loop::LoopCore;

impl Conn {
    /// The next message for `receive()` if one is available now: body bytes, the end of the
    /// body, or a disconnect. `None`: wait for input.
    pub(super) fn next_message(
        py: Python<'_>,
        server: &HttpServer,
        st: &mut ConnState,
        fx: &mut Effects,
    ) -> PyResult<Option<Py<PyAny>>> {
        let disconnect = || scope::disconnect_message(py).map(|m| Some(m.into_any().unbind()));
        if st.phase == Phase::Closed {
            return disconnect();
        }
        let limit = server.opts().limit_body;
        let ConnState {
            rbuf,
            rpos,
            req,
            eof,
            ..
        } = &mut *st;
        let Some(req) = req.as_mut() else {
            return disconnect();
        };
        if req.body_delivered {
            // After the body: wait for the response to complete or the client to leave.
            req.disconnect_told = *eof;
            return if *eof { disconnect() } else { Ok(None) };
        }
        let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
        let mut failure = None;
        loop {
            match req.decoder.decode(&rbuf[*rpos..]) {
                Ok(d) => {
                    if !d.data.is_empty() {
                        runs.push(*rpos + d.data.start..*rpos + d.data.end);
                    }
                    *rpos += d.consumed;
                    if d.done || d.consumed == 0 {
                        break;
                    }
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let total: usize = runs.iter().map(ExactSizeIterator::len).sum();
        req.body_bytes += total as u64;
        let done = req.decoder.is_done();
        if failure.is_none() && total == 0 && !done && *eof && !req.resp.started {
            // The client closed its side (or reset) before the declared body was complete:
            // a malformed request, answered (a half-closed client still reads) like a framing
            // error, not blamed on the app that then returns without a response (a 500).
            failure = Some(HttpError {
                status: 400,
                reason: "request body cut short: the client closed the connection before \
                         sending all of it",
            });
        }
        if failure.is_none() {
            if let Some(limit) = limit {
                if req.body_bytes > limit {
                    failure = Some(HttpError {
                        status: 413,
                        reason: "request body larger than the limit; raise --limit-body",
                    });
                }
            }
        }
        if let Some(e) = failure {
            // A framing error mid-body: answer it if no response started, then close; the app
            // sees the client as gone.
            let started = req.resp.started;
            if started {
                fx.close = true;
            } else {
                Self::reject(py, server, st, fx, &e);
                if let Some(req) = st.req.as_mut() {
                    req.resp.started = true;
                }
            }
            return disconnect();
        }
        if total == 0 && !done {
            req.disconnect_told = *eof;
            return if *eof { disconnect() } else { Ok(None) };
        }
        let body = match runs.as_slice() {
            [one] => PyBytes::new(py, &rbuf[one.clone()]),
            _ => PyBytes::new_with(py, total, |out| {
                let mut at = 0;
                for r in &runs {
                    out[at..at + r.len()].copy_from_slice(&rbuf[r.clone()]);
                    at += r.len();
                }
                Ok(())
            })?,
        };
        if *rpos == rbuf.len() {
            rbuf.clear();
            *rpos = 0;
        }
        req.body_delivered = done;
        Ok(Some(
            scope::request_message(py, body, !done)?.into_any().unbind(),
        ))
    }

    /// `receive()` of request `seq`.
    pub(super) fn receive(slf: &Bound<'_, Self>, seq: u64) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let server = this.server.bind(py).get();
        let mut fx = Effects::default();
        let result = {
            let mut st = this.state.borrow(py)?;
            if st.ws_seq == seq {
                drop(st);
                return Self::ws_receive(slf, seq);
            }
            let current = st.req.as_ref().is_some_and(|r| r.seq == seq);
            if !current || st.phase == Phase::Closed {
                drop(st);
                return ready(py, scope::disconnect_message(py)?.into_any().unbind());
            }
            let fd = this.fd;
            {
                let req = st.req.as_mut().expect("current");
                if req.receive_waiter.is_some() {
                    return Err(PyRuntimeError::new_err(
                        "receive() called while another receive() of the same request is waiting",
                    ));
                }
                if req.expect_continue && !req.resp.started && !req.body_delivered {
                    req.expect_continue = false;
                    st.out.push(b"HTTP/1.1 100 Continue\r\n\r\n");
                    flush_now(&mut st, &mut fx, fd);
                }
            }
            let msg = Self::next_message(py, server, &mut st, &mut fx)?;
            // Reading resumes once the app consumes (flow control), or to see the next input.
            if !st.reading && !st.eof && matches!(st.phase, Phase::Busy) {
                st.reading = true;
                fx.reading = Some(true);
            }
            Self::message_or_waiter(py, server, &mut st, msg)?
        };
        Self::receive_done(slf, fx, result)
    }

    /// A `receive()`'s answer under the state's borrow: `Ok(message)` now, or `Err(future)`,
    /// a Future kept as the request's receive waiter and resolved when a message is there.
    pub(super) fn message_or_waiter(
        py: Python<'_>,
        server: &HttpServer,
        st: &mut ConnState,
        msg: Option<Py<PyAny>>,
    ) -> PyResult<Result<Py<PyAny>, Py<PyAny>>> {
        if let Some(msg) = msg {
            return Ok(Ok(msg));
        }
        let fut = LoopCore::create_future(server.loop_core().bind(py))?;
        if let Some(req) = st.req.as_mut() {
            req.receive_waiter = Some(fut.clone_ref(py));
        }
        Ok(Err(fut))
    }

    /// The end of a `receive()`: the effects run, then the message as a ready awaitable, or
    /// the Future.
    pub(super) fn receive_done(
        slf: &Bound<'_, Self>,
        fx: Effects,
        result: Result<Py<PyAny>, Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        Self::apply(slf, fx)?;
        match result {
            Ok(msg) => ready(slf.py(), msg),
            Err(fut) => Ok(fut),
        }
    }
}
