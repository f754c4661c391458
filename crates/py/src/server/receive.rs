//! A request's `receive()`: body bytes straight from the connection's read buffer (one `bytes`
//! per call, built from every decoded run available), `Expect: 100-continue` on the first call,
//! and `http.disconnect` once the client is gone or the response is complete.

use ferroloop_core::http::conn::{BodyEvent, CONTINUE};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::conn::{ready, Conn, ConnState, Phase};
use super::effects::Effects;
use super::output::flush_now;
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
        let event = st.http.read_body(|buf, runs, total| match runs {
            [one] => Ok(PyBytes::new(py, &buf[one.clone()])),
            _ => PyBytes::new_with(py, total, |out| {
                let mut at = 0;
                for r in runs {
                    out[at..at + r.len()].copy_from_slice(&buf[r.clone()]);
                    at += r.len();
                }
                Ok(())
            }),
        });
        match event {
            BodyEvent::Data { body, more } => Ok(Some(
                scope::request_message(py, body?, more)?.into_any().unbind(),
            )),
            BodyEvent::Wait => Ok(None),
            BodyEvent::Gone => disconnect(),
            BodyEvent::Invalid(e) => {
                // A framing error mid-body: answer it if no response started, then close; the
                // app sees the client as gone.
                let started = st.req().is_some_and(|r| r.resp.started);
                if started {
                    fx.close = true;
                } else {
                    Self::reject(py, server, st, fx, &e);
                    if let Some(req) = st.req_mut() {
                        req.resp.started = true;
                    }
                }
                disconnect()
            }
        }
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
            let Some(req) = st.http.current(seq).filter(|_| st.phase() != Phase::Closed) else {
                drop(st);
                return ready(py, scope::disconnect_message(py)?.into_any().unbind());
            };
            if req.app.receive_waiter.is_some() {
                return Err(PyRuntimeError::new_err(
                    "receive() called while another receive() of the same request is waiting",
                ));
            }
            if st.http.take_continue() {
                st.out.push(CONTINUE);
                flush_now(&mut st, &mut fx);
            }
            let msg = Self::next_message(py, server, &mut st, &mut fx)?;
            // Reading resumes once the app consumes (flow control), or to see the next input.
            if !st.reading && !st.http.eof() && st.phase() == Phase::Busy {
                st.set_reading(&mut fx, true);
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
        if let Some(req) = st.req_mut() {
            req.app.receive_waiter = Some(fut.clone_ref(py));
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
