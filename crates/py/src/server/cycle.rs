//! One request's ASGI side: `Cycle` gives the app its `receive` and `send` callables and is the
//! app task's done callback; `Ready` is the awaitable they return when nothing has to wait.
//!
//! A `Cycle` is immutable: it names its connection and its request's sequence number. All the
//! request's state lives in the connection (`conn.rs`), which compares the number with its current
//! request: a cycle whose request has completed gets `http.disconnect` from `receive()` and an
//! error from `send()`, exactly as under uvicorn.
//!
//! The app gets `receive` and `send` as built-in methods bound to the cycle (`bound_methods`),
//! made from static `METH_NOARGS` / `METH_O` definitions: no attribute lookup per request and no
//! argument parsing per call. They run the same code as the `receive`/`send` pymethods.
//!
//! `Ready` also has an `am_send` slot (`install_ready_am_send`, called once when the module is
//! initialised): `await ready` in a coroutine is CPython's `SEND` on the awaitable, which calls
//! `am_send` when the type has one and otherwise `__next__`, whose result has to travel in a
//! `StopIteration` exception that is created, raised, caught and freed on every `await`.

use pyo3::exceptions::asyncio::CancelledError;
use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3::{PyTraverseError, PyTypeInfo};

use super::conn::Conn;
use crate::fastcall::{bound_builtin, entry, MethodDef};
use crate::sock_ops::stop_iteration;

/// An awaitable that is already done: awaiting it returns `value` without suspending the
/// coroutine (the coroutine protocol ends at the first `send`).
#[pyclass(module = "ferroloop._native", name = "Ready", frozen)]
pub struct Ready {
    value: Py<PyAny>,
}

impl Ready {
    pub(crate) fn new(value: Py<PyAny>) -> Self {
        Self { value }
    }

    /// What awaiting it returns.
    pub(crate) fn value(&self, py: Python<'_>) -> Py<PyAny> {
        self.value.clone_ref(py)
    }
}

#[pymethods]
impl Ready {
    #[new]
    fn py_new() -> PyResult<Self> {
        Err(PyTypeError::new_err(
            "Ready objects are created by the server",
        ))
    }

    fn __await__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<()> {
        Err(stop_iteration(py, self.value.bind(py)))
    }

    fn send(&self, py: Python<'_>, _value: &Bound<'_, PyAny>) -> PyResult<()> {
        Err(stop_iteration(py, self.value.bind(py)))
    }

    #[pyo3(signature = (typ, val=None, _tb=None))]
    fn throw(
        _slf: &Bound<'_, Self>,
        typ: &Bound<'_, PyAny>,
        val: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        Err(crate::sock_ops::thrown(typ, val))
    }

    fn close(_slf: &Bound<'_, Self>) {}

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.value)
    }
}

/// `Ready`'s `am_send`: the await is over at once, returning the value.
///
/// # Safety
/// Called by CPython only, with the GIL held, on an instance of `Ready` (the slot is on that
/// type, which cannot be subclassed); `result` points to where the return value goes.
unsafe extern "C" fn ready_am_send(
    slf: *mut ffi::PyObject,
    _arg: *mut ffi::PyObject,
    result: *mut *mut ffi::PyObject,
) -> ffi::PySendResult {
    // SAFETY: CPython holds the GIL while it calls a type slot.
    let py = unsafe { Python::assume_attached() };
    // SAFETY: `slf` is a live, borrowed reference to a `Ready` (see the function's contract).
    let slf = unsafe { Borrowed::from_ptr(py, slf).cast_unchecked::<Ready>() };
    // SAFETY: `result` is valid for a write; the new reference is handed to the caller.
    unsafe { *result = slf.get().value.clone_ref(py).into_ptr() };
    ffi::PySendResult::PYGEN_RETURN
}

/// Puts `ready_am_send` in `Ready`'s async slots.
pub fn install_ready_am_send(py: Python<'_>) {
    // SAFETY: `ready_am_send` takes any `Ready`; this runs during module initialisation with the
    // GIL held, before any `Ready` exists.
    unsafe { crate::fastcall::install_am_send(Ready::type_object_raw(py), ready_am_send) };
}

static RECEIVE: MethodDef = MethodDef::meth_noargs(
    c"receive",
    cycle_receive,
    c"receive()\n--\n\nASGI receive(): an awaitable of the next message.",
);
static SEND: MethodDef = MethodDef::meth_o(
    c"send",
    cycle_send,
    c"send(message, /)\n--\n\nASGI send(message).",
);

/// The app's `receive` and `send`: built-in methods bound to `cycle`.
pub(super) fn bound_methods<'py>(
    cycle: &Bound<'py, Cycle>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    // SAFETY: `cycle_receive` and `cycle_send` take a live `Cycle` as `self`.
    let bind = |def: &'static MethodDef| unsafe { bound_builtin(cycle.as_any(), def) };
    Ok((bind(&RECEIVE)?, bind(&SEND)?))
}

/// Runs `body` with the `Cycle` a built-in method was bound to, as a C entry point.
///
/// # Safety
/// The GIL is held, and `slf` is the `Cycle` the function was bound to in `bound_methods`,
/// borrowed for the call.
unsafe fn on_cycle(
    slf: *mut ffi::PyObject,
    body: impl FnOnce(Python<'_>, &Cycle) -> PyResult<Py<PyAny>>,
) -> *mut ffi::PyObject {
    // SAFETY: the caller holds the GIL (see the function's contract).
    let py = unsafe { Python::assume_attached() };
    entry(py, || {
        // SAFETY: `slf` is a live, borrowed `Cycle` (see the function's contract).
        let cycle = unsafe { Borrowed::from_ptr(py, slf).cast_unchecked::<Cycle>() };
        body(py, cycle.get()).map(Py::into_ptr)
    })
}

/// `RECEIVE`'s C function, called by CPython with the GIL held and `slf` the bound `Cycle`.
unsafe extern "C" fn cycle_receive(
    slf: *mut ffi::PyObject,
    _noargs: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls a built-in method with the GIL held and its bound `self`.
    unsafe { on_cycle(slf, |py, cycle| cycle.receive(py)) }
}

/// `SEND`'s C function, as `cycle_receive`; `message` is the one positional argument.
unsafe extern "C" fn cycle_send(
    slf: *mut ffi::PyObject,
    message: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: as in `cycle_receive`; METH_O passes one live argument, borrowed for the call.
    unsafe {
        on_cycle(slf, |py, cycle| {
            cycle.send(py, &Borrowed::from_ptr(py, message))
        })
    }
}

#[pyclass(module = "ferroloop._native", name = "RequestCycle", frozen)]
pub struct Cycle {
    pub(crate) conn: Py<Conn>,
    pub(crate) seq: u64,
}

impl Cycle {
    /// A native app task (`task.rs`) is done: what `__call__` does, without asking the task.
    pub(crate) fn task_finished(
        &self,
        py: Python<'_>,
        task: &Bound<'_, PyAny>,
        exc: Option<&Bound<'_, PyAny>>,
        cancelled: bool,
    ) -> PyResult<()> {
        let conn = self.conn.bind(py);
        let server = conn.get().server().bind(py).get();
        drop(server.task_done(py, task));
        Conn::app_finished(conn, self.seq, exc, cancelled)
    }
}

#[pymethods]
impl Cycle {
    #[new]
    fn py_new() -> PyResult<Self> {
        Err(PyTypeError::new_err(
            "RequestCycle objects are created by the server",
        ))
    }

    /// ASGI `receive()`: an awaitable of the next `http.request` / `http.disconnect` message.
    fn receive(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Conn::receive(self.conn.bind(py), self.seq)
    }

    /// ASGI `send(message)`.
    fn send(&self, py: Python<'_>, message: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let message = message
            .cast::<PyDict>()
            .map_err(|_| PyTypeError::new_err("ASGI send() takes a message dict"))?;
        Conn::send(self.conn.bind(py), self.seq, message)
    }

    /// The app task's done callback: log its exception, answer 500 or close as
    /// `app_finished` decides.
    fn __call__(&self, py: Python<'_>, task: &Bound<'_, PyAny>) -> PyResult<()> {
        let conn = self.conn.bind(py);
        let server = conn.get().server().bind(py).get();
        drop(server.task_done(py, task));
        // `exception()` of a cancelled task raises `CancelledError`, so one call tells both
        // (a separate `cancelled()` call cost about 200 instructions per request).
        let (exc, cancelled) = match task.call_method0(intern!(py, "exception")) {
            Ok(e) => ((!e.is_none()).then_some(e), false),
            Err(err) if err.is_instance_of::<CancelledError>(py) => (None, true),
            Err(err) => return Err(err),
        };
        Conn::app_finished(conn, self.seq, exc.as_ref(), cancelled)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.conn)
    }
}

// `RequestCycle.__call__(task)`, called directly by the loop (`native_call.rs`).
crate::native_call::native_call!(Cycle, |slf, task| Some(slf.get().__call__(slf.py(), task?)));
