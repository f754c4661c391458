//! Running the app for a connection's request: its start (the scope, the `Cycle`, the task),
//! deferred to the end of the ready batch with native tasks, and its end (the exception logged,
//! a `500` for a response never started, a close for one left unfinished). This is the part a
//! second protocol reuses: it needs a scope, a `Cycle` naming the request, and `receive`/`send`.

use ferroloop_core::http::error_response;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::conn::{Conn, Phase};
use super::cycle::Cycle;
use super::effects::Effects;
use super::scope;
use super::websocket::WsSession;
use crate::event_loop::LoopCore;
use crate::task::Task;

impl Conn {
    /// The `Ready::Call` entry queued by `advance`.
    pub(super) fn start_entry(target: &Bound<'_, PyAny>) -> PyResult<()> {
        let conn = target.cast::<Conn>()?;
        let py = target.py();
        conn.get().server.bind(py).get().start_queued(py, false)?;
        Self::start_pending(conn, true)
    }

    /// Builds the scope of the request whose head `idle_step` accepted and starts its app;
    /// `run_now`: the app's task runs its first step before this returns. Nothing happens if
    /// the connection closed meanwhile (an abort).
    pub(super) fn start_pending(slf: &Bound<'_, Self>, run_now: bool) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let server = this.server.bind(py).get();
        let (scope, seq, forwarded) = {
            let mut st = this.state.borrow(py)?;
            let waiting =
                st.phase() == Phase::Busy && st.req().is_some_and(|r| r.app.facts.is_none());
            if !waiting {
                return Ok(());
            }
            let is_ws = st.ws_seq == st.http.seq();
            let (input, head) = (st.http.input(), st.http.head());
            let built = scope::build_scope(
                py,
                server.base(),
                input,
                head,
                &this.client,
                server.wsgi().is_some(),
            )
            .and_then(|(scope, facts)| {
                if is_ws {
                    scope::to_websocket_scope(py, &scope, input, head)?;
                }
                Ok((scope, facts))
            });
            st.http.consume_head();
            let req = st.req_mut().expect("checked above");
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
            req.app.facts = Some(facts);
            (scope, seq, forwarded)
        };
        Self::start_app(slf, &scope, seq, forwarded, run_now)
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
            let Some(req) = st.http.current(seq) else {
                drop(st);
                return Self::apply(slf, fx);
            };
            let (started, told_gone, is_head) =
                (req.resp.started, req.disconnect_told(), req.info.is_head);
            let ws_open = st.ws().is_some_and(WsSession::is_open);
            if ws_open {
                Self::ws_app_finished(&mut st, &mut fx, exc.is_some() || cancelled);
            } else if st.phase() == Phase::Busy {
                // An app told the client is gone may stop without finishing its response: not
                // its error (uvicorn checks `disconnected` the same way), so nothing is logged
                // and no 500 is sent; the connection closes.
                let returned = exc.is_none() && !cancelled;
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
}
