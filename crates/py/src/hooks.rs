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
