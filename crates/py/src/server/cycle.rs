//! One request's ASGI side: `Cycle` gives the app its `receive` and `send` callables and is the
//! app task's done callback; `Ready` is the awaitable they return when nothing has to wait.
//!
//! A `Cycle` is immutable: it names its connection and its request's sequence number. All the
//! request's state lives in the connection (`conn.rs`), which compares the number with its current
//! request: a cycle whose request has completed gets `http.disconnect` from `receive()` and an
//! error from `send()`, exactly as under uvicorn.

use pyo3::exceptions::PyTypeError;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3::PyTraverseError;

use super::conn::Conn;
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
        let exc = match val {
            Some(v) if !v.is_none() => v.clone(),
            _ => typ.clone(),
        };
        let exc = if exc.is_instance_of::<pyo3::types::PyType>() {
            exc.call0()?
        } else {
            exc
        };
        Err(PyErr::from_value(exc))
    }

    fn close(_slf: &Bound<'_, Self>) {}

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.value)
    }
}

#[pyclass(module = "ferroloop._native", name = "RequestCycle", frozen)]
pub struct Cycle {
    pub(crate) conn: Py<Conn>,
    pub(crate) seq: u64,
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

    /// The app task's done callback.
    fn __call__(&self, py: Python<'_>, task: &Bound<'_, PyAny>) -> PyResult<()> {
        let conn = self.conn.bind(py);
        let server = conn.get().server().bind(py).get();
        drop(server.task_done(py, task));
        let cancelled: bool = task.call_method0(intern!(py, "cancelled"))?.extract()?;
        let exc = if cancelled {
            None
        } else {
            let e = task.call_method0(intern!(py, "exception"))?;
            (!e.is_none()).then_some(e)
        };
        Conn::app_finished(conn, self.seq, exc.as_ref(), cancelled)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.conn)
    }
}
