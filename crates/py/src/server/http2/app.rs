//! The app's side of an HTTP/2 connection: starting a stream's app task, its `receive()` and
//! `send()` (called by `H2Cycle`), and the end of its task. Each collects its effects under the
//! connection's borrow and applies them after it (`H2Conn::apply`), then asks for a drive.

use bytes::Bytes;
use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use super::stream::Sent;
use super::{borrow_fields, Fx, H2Conn, H2Cycle};
use crate::event_loop::LoopCore;

impl H2Conn {
    pub(super) fn start_app(
        slf: &Bound<'_, Self>,
        id: u32,
        scope: &Bound<'_, PyDict>,
        forwarded: bool,
    ) -> PyResult<()> {
        let py = slf.py();
        let server = slf.get().server.bind(py).get();
        let cycle = Bound::new(
            py,
            H2Cycle {
                conn: slf.clone().unbind(),
                id,
            },
        )?;
        let receive = cycle.getattr(intern!(py, "receive"))?;
        let send = cycle.getattr(intern!(py, "send"))?;
        let core = server.loop_core().bind(py);
        let native = server.native_tasks(core)?;
        let started = server
            .app_for(forwarded)
            .bind(py)
            .call1((scope, receive, send))
            .and_then(|coro| {
                let context = server.task_context(py)?;
                let name = server.task_name(py)?;
                LoopCore::create_task_as(core, &coro, Some(name.as_any()), Some(&context), native)
            });
        match started {
            Ok(task) => {
                let task = task.bind(py);
                server.task_started(py, task)?;
                task.call_method1(intern!(py, "add_done_callback"), (cycle,))?;
                Ok(())
            }
            Err(e) => {
                let exc = e.into_value(py).into_any();
                Self::app_finished(slf, id, Some(exc.bind(py)), false)
            }
        }
    }

    pub(super) fn receive(slf: &Bound<'_, Self>, id: u32) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let got = {
            let mut st = this.state.borrow(py)?;
            match st.streams.get_mut(&id) {
                None => Some(
                    crate::server::scope::disconnect_message(py)?
                        .into_any()
                        .unbind(),
                ),
                Some(s) => {
                    if s.receive_waiter.is_some() {
                        return Err(PyRuntimeError::new_err(
                            "receive() called while another receive() of this request waits",
                        ));
                    }
                    s.next_message(py)?
                }
            }
        };
        let result = if let Some(msg) = got {
            crate::server::conn::ready(py, msg)?
        } else {
            let core = this.server.bind(py).get().loop_core().bind(py);
            let fut = LoopCore::create_future(core)?;
            let mut st = this.state.borrow(py)?;
            let Some(s) = st.streams.get_mut(&id) else {
                let msg = crate::server::scope::disconnect_message(py)?;
                return crate::server::conn::ready(py, msg.into_any().unbind());
            };
            s.receive_waiter = Some(fut.clone_ref(py));
            fut
        };
        // Body bytes given to the app free window space: `h2` has a WINDOW_UPDATE to send.
        Self::want_drive(slf)?;
        Ok(result)
    }

    pub(super) fn send(
        slf: &Bound<'_, Self>,
        id: u32,
        message: &Bound<'_, PyDict>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let typ = crate::server::respond::message_type(message)?
            .to_str()?
            .to_owned();
        let mut fx = Fx::default();
        let sent = {
            let mut st = this.state.borrow(py)?;
            let Some(s) = st.streams.get_mut(&id) else {
                return Err(PyRuntimeError::new_err(
                    "send() on a request whose stream is over",
                ));
            };
            match typ.as_str() {
                "http.response.start" => {
                    s.start(py, message)?;
                    Sent::Done
                }
                "http.response.body" => {
                    let body = message.get_item(intern!(py, "body"))?;
                    let more = match message.get_item(intern!(py, "more_body"))? {
                        Some(m) => m.is_truthy()?,
                        None => false,
                    };
                    let bytes = match &body {
                        None => Bytes::new(),
                        Some(b) => match b.cast::<PyBytes>() {
                            Ok(b) => Bytes::copy_from_slice(b.as_bytes()),
                            Err(_) => Bytes::from(b.extract::<Vec<u8>>()?),
                        },
                    };
                    let fields = this.fields(py);
                    let fields = borrow_fields(&fields);
                    let core = this.server.bind(py).get().loop_core().bind(py);
                    let sent = s.body(core, bytes, more, &fields)?;
                    if !more {
                        let server = this.server.bind(py).get();
                        server.response_done(py, s.method_index, s.status, s.started_at);
                        fx.access
                            .push((s.method.clone_ref(py), s.path.clone_ref(py), s.status));
                        if let Some(f) = s.receive_waiter.take() {
                            let msg = crate::server::scope::disconnect_message(py)?;
                            fx.resolve.push((f, msg.into_any().unbind()));
                        }
                    }
                    sent
                }
                other => {
                    return Err(PyRuntimeError::new_err(format!(
                        "ASGI message type {other:?} is not served over HTTP/2 yet"
                    )))
                }
            }
        };
        Self::apply(slf, fx)?;
        Self::want_drive(slf)?;
        match sent {
            Sent::Done => crate::server::conn::ready_none(py),
            Sent::Wait(fut) => Ok(fut),
        }
    }

    /// The app's task ended: its exception is logged, an unfinished response answered (500)
    /// or reset.
    pub(super) fn app_finished(
        slf: &Bound<'_, Self>,
        id: u32,
        exc: Option<&Bound<'_, PyAny>>,
        cancelled: bool,
    ) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let mut fx = Fx::default();
        if let Some(e) = exc {
            fx.logs.push((
                "Exception in ASGI application\n".into(),
                Some(e.clone().unbind()),
            ));
        }
        let returned = exc.is_none() && !cancelled;
        {
            let mut st = this.state.borrow(py)?;
            if let Some(s) = st.streams.get_mut(&id) {
                s.task_done = true;
                if !s.gone && !s.finished {
                    if returned {
                        let what = if s.started {
                            "ASGI callable returned without completing response."
                        } else {
                            "ASGI callable returned without starting response."
                        };
                        fx.logs.push((what.into(), None));
                    }
                    let was_started = s.started;
                    let fields = this.fields(py);
                    s.abandon(&borrow_fields(&fields));
                    if !was_started {
                        let server = this.server.bind(py).get();
                        server.response_done(py, s.method_index, 500, s.started_at);
                        fx.access
                            .push((s.method.clone_ref(py), s.path.clone_ref(py), 500));
                    }
                }
                s.discard_body();
                if s.over() {
                    st.streams.remove(&id);
                }
            }
        }
        Self::apply(slf, fx)?;
        Self::want_drive(slf)
    }
}
