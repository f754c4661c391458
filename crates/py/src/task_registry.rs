//! A native `add` for asyncio's task registry: the `weakref.WeakSet` that every C `Task` is
//! added to when it is created (`_asyncio._all_tasks` on CPython 3.11, `_scheduled_tasks` on
//! 3.12 and 3.13), and that `asyncio.all_tasks()` iterates.
//!
//! The C `Task.__init__` registers itself with `PyObject_CallMethodOneArg(registry, "add",
//! task)`. That runs `WeakSet.add`, a Python method, and when the task dies its weak reference's
//! callback `WeakSet._remove`, a Python closure: together about 3,300 instructions per task, more
//! than a tenth of a gathered task's whole cost. Method lookup finds an instance attribute before
//! a plain function of the class, so `_install_task_registry` puts a built-in `add` in the set's `__dict__`;
//! the C code then calls it with a vectorcall. Both functions do what `WeakSet`'s Python code
//! does, in the same order, through the same attributes:
//!
//! - `add(item)`: if `self._pending_removals` is non-empty, call `self._commit_removals()`; then
//!   `self.data.add(weakref.ref(item, remove))`.
//! - `remove(wr)` (the weak reference's callback): append `wr` to `self._pending_removals`
//!   while `self._iterating` is non-empty (an iteration is in progress), else
//!   `self.data.discard(wr)`.
//!
//! `remove` is the native counterpart of the set's `_remove` closure; `WeakSet`'s other methods
//! (`__iter__`, `__len__`, `discard`, `_commit_removals`) only see the weak references in `data`
//! and never which callback they carry.
//!
//! Invariants:
//! - The attributes read (`data`, `_pending_removals`, `_iterating`, `_commit_removals`) are
//!   `WeakSet`'s in CPython 3.11 through 3.13; `_install_task_registry` refuses anything that is not exactly a
//!   `weakref.WeakSet` with them, and `ferroloop._task_registry` only installs on those versions.
//! - `add` and `remove` are bound to one state that holds the set, as a bound `WeakSet.add` does.
//!   The set's `__dict__` holds `add`, and `data`'s weak references hold `remove`: cycles the
//!   collector sees through `TaskRegistry.__traverse__` and breaks by clearing the set's dict.
//!   (`_remove` holds the set weakly and does nothing once it is gone; here the state keeps the
//!   set alive as long as one of its weak references is, and the set's `data` goes with it.)
//! - `data`, `_pending_removals` and `_iterating` are read once, at install: `WeakSet` binds them
//!   only in `__init__` (3.11 to 3.13) and changes them in place afterwards.
//! - Both functions run with the GIL held (CPython calls them); no panic crosses the boundary
//!   (`fastcall::entry`).

use std::sync::OnceLock;

use pyo3::ffi;
use pyo3::gc::{PyTraverseError, PyVisit};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PySet};

use crate::fastcall::{bound_builtin, entry, MethodDef};

/// The state `add` and `remove` are bound to: the set, the three
/// objects `WeakSet` keeps in its instance attributes (read once: a generic attribute lookup costs
/// about 240 instructions and a `__dict__` lookup about 130, four per task), and the `remove`
/// function, made once.
#[pyclass(module = "ferroloop._native", frozen)]
pub struct TaskRegistry {
    set: Py<PyAny>,
    data: Py<PySet>,
    pending_removals: Py<PyList>,
    iterating: Py<PySet>,
    remove: OnceLock<Py<PyAny>>,
}

#[pymethods]
impl TaskRegistry {
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.set)?;
        visit.call(&self.data)?;
        visit.call(&self.pending_removals)?;
        visit.call(&self.iterating)?;
        if let Some(remove) = self.remove.get() {
            visit.call(remove)?;
        }
        Ok(())
    }
}

static ADD: MethodDef = MethodDef::meth_o(
    c"add",
    add,
    c"add(item)\n--\n\nAdd a weak reference to item (WeakSet.add, native).",
);

static REMOVE: MethodDef = MethodDef::meth_o(
    c"_remove",
    remove,
    c"_remove(ref)\n--\n\nDrop a dead weak reference (WeakSet._remove, native).",
);

/// The installed registry's state, for `register` (one per interpreter, like the registry).
static INSTALLED: pyo3::sync::PyOnceLock<Py<TaskRegistry>> = pyo3::sync::PyOnceLock::new();

/// Adds `item` to the installed registry as its `add` would: `Ok(false)` when none is installed
/// (the caller then goes through `_register_task`). Saves `_register_task`'s call and method
/// lookup for `ferroloop.Task`.
pub(crate) fn register(item: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = item.py();
    let Some(state) = INSTALLED.get(py) else {
        return Ok(false);
    };
    add_to(py, state.get(), item)?;
    Ok(true)
}

fn add_to(py: Python<'_>, st: &TaskRegistry, item: &Bound<'_, PyAny>) -> PyResult<()> {
    if !st.pending_removals.bind(py).is_empty() {
        st.set
            .bind(py)
            .call_method0(intern!(py, "_commit_removals"))?;
    }
    let Some(remove) = st.remove.get() else {
        return Err(pyo3::exceptions::PyRuntimeError::new_err(
            "task registry not ready",
        ));
    };
    // SAFETY: we hold the GIL; both pointers are live for the call, and a new reference (or
    // NULL with an exception set) comes back.
    let wr = unsafe {
        Bound::from_owned_ptr_or_err(py, ffi::PyWeakref_NewRef(item.as_ptr(), remove.as_ptr()))
    }?;
    st.data.bind(py).add(wr)?;
    Ok(())
}

/// Puts the native `add` in `registry.__dict__` (see the module docs). `registry` must be exactly
/// a `weakref.WeakSet`, with `WeakSet`'s attributes.
#[pyfunction]
pub fn _install_task_registry(registry: &Bound<'_, PyAny>) -> PyResult<()> {
    let py = registry.py();
    let weakset = py.import("weakref")?.getattr("WeakSet")?;
    if !registry.get_type().is(&weakset) || !registry.hasattr("_commit_removals")? {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "the task registry must be exactly a weakref.WeakSet",
        ));
    }
    let state = Bound::new(
        py,
        TaskRegistry {
            set: registry.clone().unbind(),
            data: registry.getattr("data")?.cast_into::<PySet>()?.unbind(),
            pending_removals: registry
                .getattr("_pending_removals")?
                .cast_into::<PyList>()?
                .unbind(),
            iterating: registry
                .getattr("_iterating")?
                .cast_into::<PySet>()?
                .unbind(),
            remove: OnceLock::new(),
        },
    )?;
    // SAFETY: `add` and `remove` take a `TaskRegistry` as `self`.
    let (add_fn, remove) = unsafe {
        (
            bound_builtin(state.as_any(), &ADD)?,
            bound_builtin(state.as_any(), &REMOVE)?,
        )
    };
    let _ = state.get().remove.set(remove.unbind());
    registry.setattr("add", add_fn)?;
    let _ = INSTALLED.set(py, state.unbind());
    Ok(())
}

/// `add`'s and `remove`'s `self`.
///
/// # Safety
/// `state` is the object the function was bound to (only `_install_task_registry` binds them,
/// to a `TaskRegistry`), borrowed for the call.
unsafe fn state<'a>(py: Python<'a>, state: &'a *mut ffi::PyObject) -> PyResult<&'a TaskRegistry> {
    // SAFETY: as the function's contract says.
    let st = unsafe { Bound::ref_from_ptr(py, state) };
    Ok(st.cast::<TaskRegistry>()?.get())
}

unsafe extern "C" fn add(
    state: *mut ffi::PyObject,
    item: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls METH_O functions on a thread that holds the GIL.
    let py = unsafe { Python::assume_attached() };
    entry(py, || {
        // SAFETY: CPython passes the bound object and the argument, both borrowed for the call.
        let st = unsafe { self::state(py, &state) }?;
        // SAFETY: as above.
        let item = unsafe { Bound::ref_from_ptr(py, &item) };
        add_to(py, st, item)?;
        Ok(py.None().into_ptr())
    })
}

unsafe extern "C" fn remove(
    state: *mut ffi::PyObject,
    wr: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls METH_O functions on a thread that holds the GIL.
    let py = unsafe { Python::assume_attached() };
    entry(py, || {
        // SAFETY: CPython passes the bound object and the argument, both borrowed for the call.
        let st = unsafe { self::state(py, &state) }?;
        // SAFETY: as above.
        let wr = unsafe { Bound::ref_from_ptr(py, &wr) };
        if st.iterating.bind(py).is_empty() {
            st.data.bind(py).discard(wr)?;
        } else {
            st.pending_removals.bind(py).append(wr)?;
        }
        Ok(py.None().into_ptr())
    })
}
