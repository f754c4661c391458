//! Python helpers the native code calls on cold paths (reprs, debug-mode stacks), imported once
//! from `ferroloop._hooks` and cached for the interpreter's lifetime.

use pyo3::ffi;
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

/// Whether `callback` is a C Task's step (`ferroloop._hooks.TASK_STEP_TYPE`). Never when that
/// is `None` (asyncio's Task is not the C one) or could not be found (an import failing during
/// interpreter shutdown, say): the shortcut is then simply not taken.
pub fn is_task_step(callback: &Bound<'_, PyAny>) -> bool {
    let py = callback.py();
    let ty = TASK_STEP_TYPE.get_or_init(py, || {
        py.import("ferroloop._hooks")
            .and_then(|m| m.getattr("TASK_STEP_TYPE"))
            .map_or_else(|_| py.None(), Bound::unbind)
    });
    std::ptr::eq(callback.get_type_ptr().cast(), ty.as_ptr())
}

static TASK_WAKEUP_DEF: PyOnceLock<usize> = PyOnceLock::new();

/// Whether `callback` is a C Task's wake-up: a built-in function made from `_asyncio`'s static
/// `task_wakeup` method definition, found once from `ferroloop._hooks.task_wakeup_probe()` (whose
/// object is then dropped). Never if none was found, as for `is_task_step`.
pub fn is_task_wakeup(callback: &Bound<'_, PyAny>) -> bool {
    let py = callback.py();
    let def = *TASK_WAKEUP_DEF.get_or_init(py, || {
        py.import("ferroloop._hooks")
            .and_then(|m| m.call_method0("task_wakeup_probe"))
            .ok()
            .and_then(|wakeup| method_def_of(&wakeup))
            .unwrap_or(0)
    });
    def != 0 && method_def_of(callback) == Some(def)
}

/// The address of the `PyMethodDef` behind an exact built-in function object.
pub(crate) fn method_def_of(obj: &Bound<'_, PyAny>) -> Option<usize> {
    // SAFETY: we hold the GIL (`obj` is bound to it) and `obj` is alive.
    let exact = unsafe { ffi::PyCFunction_CheckExact(obj.as_ptr()) } != 0;
    // SAFETY: an object whose type is exactly `builtin_function_or_method` is a
    // `PyCFunctionObject`, and `m_ml` is set at creation and never changed.
    exact.then(|| unsafe { (*obj.as_ptr().cast::<ffi::PyCFunctionObject>()).m_ml as usize })
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

static NATIVE_TASK_FACTORY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Whether `factory` is `ferroloop.task_factory` (then `create_task` builds the task natively).
pub fn is_native_task_factory(factory: &Bound<'_, PyAny>) -> bool {
    cached(
        factory.py(),
        &NATIVE_TASK_FACTORY,
        "ferroloop._task",
        &["task_factory"],
    )
    .is_ok_and(|f| f.is(factory))
}
