//! WSGI apps (PEP 3333) on the native server: the connection and HTTP layers are the ones ASGI
//! apps use (`conn.rs`); only the app-running layer differs. A WSGI app blocks, so it runs in a
//! pool of Python threads, never on the loop thread.
//!
//! Data flow of one request:
//! 1. Loop thread (`start`): the scope is built as for ASGI; the first body part is taken if it
//!    is already there (`WsgiInput::preread`), and a `WsgiCall` is queued for the pool. The
//!    call is the request's "task" in the server's task table, so `--limit-concurrency`,
//!    graceful shutdown and `abort` (its `cancel()`) count and stop it like an app task.
//! 2. A pool thread (`WsgiPool.work`, the body of each `threading.Thread` the Python side
//!    starts): builds the environ from the scope (`environ.rs`), calls the app in a fresh copy
//!    of the server's context, iterates its result and calls its `close()`.
//! 3. Response parts (`call::Part`: the head, a block, a file) go back to the loop thread
//!    through the loop's cross-thread queue (`LoopRemote`, coalesced wake-ups), where
//!    `Conn::send_http` checks, frames and writes them as it does an ASGI app's messages. An
//!    exact `list`/`tuple` result (the common case) is one hand-over with the request's end;
//!    an iterator is one per non-empty block.
//! 4. `wsgi.input` reads that find no buffered bytes ask the loop thread for the next body
//!    part (`Conn::receive`) and wait for it with the GIL released (`call.rs`).
//!
//! Invariants:
//! - A pool thread never touches a connection's state: every `Conn` call happens in a closure
//!   run by the loop thread. The pool thread holds only `Py` handles and `Arc`s.
//! - Blocks are never delayed (PEP 3333): each is handed over as soon as the app yields it. Flow
//!   control is a byte credit (`Flow`): a pool thread waits while more than `WRITE_HIGH` bytes
//!   it handed over are not yet written (or queued under the connection's high-water mark).
//! - Every wait of a pool thread on the loop is released by the loop (an answer, a Future's
//!   callback, or the dropped closure's guard), or by `WsgiPool.close()`: no wait outlives the
//!   pool.
//! - The request's end (`finish`) is handed over after the result's `close()` returned, so the
//!   connection's next request never starts before the previous app is done with its
//!   resources.

mod call;
mod environ;
mod file;
mod input;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3::PyTraverseError;

pub use call::WsgiCall;
use environ::EnvironBase;
pub use file::WsgiFileWrapper;
pub use input::WsgiInput;

use super::conn::Conn;

/// How often a pool thread waiting on the loop checks whether the pool was closed.
const STOP_POLL: Duration = Duration::from_millis(250);

/// What the pool threads share: the queue of calls, and whether the pool is closed.
#[derive(Default)]
pub(crate) struct PoolShared {
    queue: Mutex<VecDeque<Py<WsgiCall>>>,
    cond: Condvar,
    closed: AtomicBool,
}

impl PoolShared {
    pub(crate) fn closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Pool thread, GIL released: waits on `cond` (notified under `lock`) until `ready` gives
    /// an answer; `None` once the pool is closed, which is checked every `STOP_POLL` (`close`
    /// does not know every waiter).
    fn wait_for<T, R>(
        &self,
        lock: &Mutex<T>,
        cond: &Condvar,
        mut ready: impl FnMut(&mut T) -> Option<R>,
    ) -> Option<R> {
        let mut guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(answer) = ready(&mut guard) {
                return Some(answer);
            }
            if self.closed() {
                return None;
            }
            guard = cond
                .wait_timeout(guard, STOP_POLL)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Blocks (the caller has released the GIL) until a call is queued or the pool closes.
    fn next_call(&self) -> Option<Py<WsgiCall>> {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if self.closed() {
                return None;
            }
            if let Some(call) = queue.pop_front() {
                return Some(call);
            }
            queue = self
                .cond
                .wait(queue)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// The WSGI app and the threads' shared queue. Given to `HttpServer` in place of an ASGI app;
/// the Python side starts the threads (`threading.Thread(target=pool.work)`) and closes the
/// pool after the server stopped.
#[pyclass(module = "ferroloop._native", name = "WsgiPool", frozen)]
pub struct WsgiPool {
    app: Py<PyAny>,
    /// Rewrites a scope from its proxy headers (`ProxyHeadersMiddleware.apply`), if the
    /// server trusts them: called before the environ is built.
    proxy: Option<Py<PyAny>>,
    environ: EnvironBase,
    shared: Arc<PoolShared>,
}

#[pymethods]
impl WsgiPool {
    #[new]
    #[pyo3(signature = (app, *, multiprocess=false, proxy=None))]
    fn new(app: Bound<'_, PyAny>, multiprocess: bool, proxy: Option<Py<PyAny>>) -> PyResult<Self> {
        if !app.is_callable() {
            return Err(PyTypeError::new_err(format!(
                "a WSGI app is a callable app(environ, start_response), not {}",
                app.get_type().name()?
            )));
        }
        Ok(Self {
            environ: EnvironBase::new(app.py(), multiprocess)?,
            app: app.unbind(),
            proxy,
            shared: Arc::default(),
        })
    }

    /// A pool thread's body: runs queued calls until the pool is closed.
    fn work(slf: &Bound<'_, Self>) {
        let py = slf.py();
        let this = slf.get();
        loop {
            let shared = Arc::clone(&this.shared);
            let Some(call) = py.detach(move || shared.next_call()) else {
                return;
            };
            call::run(py, this, call.bind(py));
        }
    }

    /// No more calls run: idle threads return from `work`, a thread waiting on the loop gives
    /// up (its app sees an error), and calls still queued are dropped (the server has been
    /// aborted by then, so their connections are closed).
    fn close(&self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        let dropped = std::mem::take(
            &mut *self
                .shared
                .queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        self.shared.cond.notify_all();
        drop(dropped);
    }

    /// Calls queued and not yet taken by a thread.
    #[getter]
    fn queued(&self) -> usize {
        self.shared
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    #[getter]
    fn closed(&self) -> bool {
        self.shared.closed()
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.app)?;
        if let Some(p) = &self.proxy {
            visit.call(p)?;
        }
        self.environ.visit(&visit)
    }
}

impl WsgiPool {
    fn submit(&self, call: Py<WsgiCall>) -> Result<(), Py<WsgiCall>> {
        let mut queue = self
            .shared
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.shared.closed() {
            return Err(call);
        }
        queue.push_back(call);
        drop(queue);
        self.shared.cond.notify_one();
        Ok(())
    }
}

/// Loop thread: request `seq` of `conn` (whose scope is built) goes to the pool.
pub(super) fn start(
    conn: &Bound<'_, Conn>,
    pool: &Bound<'_, WsgiPool>,
    scope: &Bound<'_, PyDict>,
    seq: u64,
    forwarded: bool,
) -> PyResult<()> {
    let py = conn.py();
    let server = conn.get().server().bind(py).get();
    let remote = server.loop_core().bind(py).get().remote();
    let shared = Arc::clone(&pool.get().shared);
    let mut input = WsgiInput::new(
        conn.clone().unbind(),
        seq,
        remote.clone(),
        Arc::clone(&shared),
    );
    if !Conn::expects_continue(conn, seq)? {
        // The common case: a body that came with the head (or none) is in the environ before
        // the app runs, with no round trip through the loop. `Expect: 100-continue` waits for
        // the app's first read, as PEP 3333 asks.
        input.preread(py);
    }
    let queued = Py::new(py, input).and_then(|input| {
        let call = Bound::new(
            py,
            WsgiCall::new(
                conn.clone().unbind(),
                seq,
                remote,
                shared,
                scope.clone().unbind(),
                forwarded,
                input,
            ),
        )?;
        server.task_started(py, call.as_any())?;
        pool.get().submit(call.unbind()).map_err(|call| {
            drop(server.task_done(py, call.bind(py).as_any()));
            PyRuntimeError::new_err("the WSGI thread pool is closed (server shutting down)")
        })
    });
    match queued {
        Ok(()) => Ok(()),
        // As if the app had failed at once: a 500, and the error in the log.
        Err(e) => {
            let exc = e.into_value(py).into_any();
            Conn::app_finished(conn, seq, Some(exc.bind(py)), false)
        }
    }
}

/// One answer from the loop thread to a waiting pool thread.
pub(crate) struct Slot {
    value: Mutex<Option<PyResult<Py<PyAny>>>>,
    cond: Condvar,
}

impl Slot {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            value: Mutex::new(None),
            cond: Condvar::new(),
        })
    }

    /// Stores the answer (only the first one counts) and wakes the waiter.
    pub(crate) fn fill(&self, value: PyResult<Py<PyAny>>) {
        let mut v = self.value.lock().unwrap_or_else(PoisonError::into_inner);
        if v.is_none() {
            *v = Some(value);
        }
        drop(v);
        self.cond.notify_all();
    }

    /// The answer, if there is one already.
    pub(crate) fn try_take(&self) -> Option<PyResult<Py<PyAny>>> {
        self.value
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Pool thread, GIL released: the answer, or an error once the pool is closed.
    pub(crate) fn wait(&self, pool: &PoolShared) -> PyResult<Py<PyAny>> {
        pool.wait_for(&self.value, &self.cond, Option::take)
            .unwrap_or_else(|| {
                Err(PyRuntimeError::new_err(
                    "the server stopped while the WSGI app waited for the connection",
                ))
            })
    }
}

/// Fills its slot when used, or with an error when dropped unused (a closure the loop never
/// ran, a Future garbage-collected unresolved), so the waiter is always released.
pub(crate) struct Filler(Option<Arc<Slot>>);

impl Filler {
    pub(crate) fn new(slot: &Arc<Slot>) -> Self {
        Self(Some(Arc::clone(slot)))
    }

    pub(crate) fn fill(mut self, value: PyResult<Py<PyAny>>) {
        if let Some(slot) = self.0.take() {
            slot.fill(value);
        }
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        if let Some(slot) = self.0.take() {
            slot.fill(Err(PyRuntimeError::new_err(
                "the server's loop went away before answering the WSGI app",
            )));
        }
    }
}
