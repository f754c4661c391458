//! Python helpers the native code calls on cold paths (reprs, debug-mode stacks), imported once
//! from `ferroloop._hooks` and cached for the interpreter's lifetime.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

static HOOKS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// Calls `ferroloop._hooks.<name>(*args)`.
pub fn call<'py>(
    py: Python<'py>,
    name: &str,
    args: impl pyo3::call::PyCallArgs<'py>,
) -> PyResult<Bound<'py, PyAny>> {
    let module = HOOKS.get_or_try_init(py, || py.import("ferroloop._hooks").map(Bound::unbind))?;
    module.bind(py).getattr(name)?.call1(args)
}

static FUTURE_TYPE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static TASK_TYPE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static BASE_CREATE_TASK: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn cached<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyAny>>,
    module: &str,
    path: &[&str],
) -> PyResult<&'py Bound<'py, PyAny>> {
    cell.get_or_try_init(py, || {
        let mut obj = py.import(module)?.into_any();
        for name in path {
            obj = obj.getattr(*name)?;
        }
        Ok(obj.unbind())
    })
    .map(|o| o.bind(py))
}

/// `asyncio.Future` (the C implementation when present, exactly what asyncio's loop uses).
pub fn future_type(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    cached(py, &FUTURE_TYPE, "asyncio.futures", &["Future"])
}

/// `asyncio.Task`.
pub fn task_type(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    cached(py, &TASK_TYPE, "asyncio.tasks", &["Task"])
}

/// `asyncio.BaseEventLoop.create_task`, for task factories and debug mode.
pub fn base_create_task(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    cached(
        py,
        &BASE_CREATE_TASK,
        "asyncio.base_events",
        &["BaseEventLoop", "create_task"],
    )
}

static TASK_STEP_TYPE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Whether `callback` is a C Task's step (`ferroloop._hooks.TASK_STEP_TYPE`; `None` there, so
/// never, when asyncio's Task is not the C one).
pub fn is_task_step(callback: &Bound<'_, PyAny>) -> PyResult<bool> {
    let ty = cached(
        callback.py(),
        &TASK_STEP_TYPE,
        "ferroloop._hooks",
        &["TASK_STEP_TYPE"],
    )?;
    Ok(std::ptr::eq(callback.get_type_ptr().cast(), ty.as_ptr()))
}

static SOCKET_TYPE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static SOCKET_OPS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Whether `obj` is exactly a `socket.socket` (not an SSL socket, wrapper or test double).
pub fn is_plain_socket(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let ty = cached(obj.py(), &SOCKET_TYPE, "socket", &["socket"])?;
    Ok(obj.get_type().is(ty))
}

/// `ferroloop._sockets.SocketOps`, the Python implementation of the `sock_*` methods.
pub fn socket_ops(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    cached(py, &SOCKET_OPS, "ferroloop._sockets", &["SocketOps"])
}
