//! `asyncio.Task` (`_asyncio.Task`, the C Task) as the base class of `ferroloop.Task`, so that
//! `isinstance(task, asyncio.Task)` and `isinstance(task, asyncio.Future)` hold for a native
//! task as they do for asyncio's.
//!
//! `ferroloop.Task` does not use the C Task's state: every attribute and method asyncio's
//! `Task` and `Future` define is defined again on `ferroloop.Task` (its own state is the
//! Rust `State` behind the C layout), and the base part of each instance stays as the base's
//! `tp_new` left it: zeroed, which the C Task's own functions treat as a task whose `__init__`
//! never ran. What the base part is still used for: the instance `__dict__`, the weak
//! reference list (asyncio's task registry holds tasks weakly) and, through the base's
//! `tp_dealloc`, freeing both and the object.
//!
//! Invariants:
//! - `ferroloop.Task`'s type is made only if `TaskObjLayout` is exactly
//!   `_asyncio.Task.__basicsize__` bytes on a version whose C Task was read (the `task_layout`
//!   loan of `cpython_loans.rs`): `take_layout` decides it when the module is initialised,
//!   before anything could make the type, and `NATIVE` records it. The sizes are those of
//!   CPython 3.11 to 3.15 on 64-bit platforms. Otherwise (or with `FERROLOOP_PORTABLE=1`)
//!   `_native.Task` is `asyncio.Task` itself and no code path makes a `task::Task`: every
//!   caller checks [`native_tasks`] first.
//! - The base part is never initialised: `_asyncio.Task.__init__` is not run on a
//!   `ferroloop.Task` (`ferroloop.Task.__init__` is its own, see `task::install_task_slots`),
//!   so the C Task's code that reaches one through a non-exact type check sees an
//!   uninitialised task. asyncio's C code takes its shortcuts only for the exact types
//!   (`Future_CheckExact`, `Task_CheckExact`), so it treats a `ferroloop.Task` as any other
//!   future-like object, through its methods.
//! - The base's `tp_dealloc` frees the object; on CPython 3.12 and later the base is a heap
//!   type whose `tp_dealloc` also releases the instance's reference to its type, which PyO3's
//!   `tp_dealloc` releases too, so `task::task_dealloc` takes one more reference first
//!   (`base_releases_type`).

use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};

use crate::cpython_loans::{self, Loan};

/// `_asyncio.Task.__basicsize__` on 64-bit CPython 3.11 and 3.12 (`TaskObj`).
#[cfg(not(Py_3_13))]
const TASK_BASICSIZE: usize = 176;
/// `_asyncio.Task.__basicsize__` on 64-bit CPython 3.13 (`TaskObj`; the instance dict and
/// weak reference list moved before the object header).
#[cfg(all(Py_3_13, not(Py_3_14)))]
const TASK_BASICSIZE: usize = 144;
/// `_asyncio.Task.__basicsize__` on 64-bit CPython 3.14 and 3.15 (`TaskObj` of
/// `Modules/_asynciomodule.c`, the same in 3.14.4 and 3.15.0rc2: the future's
/// `fut_awaited_by`, `fut_is_task` and `fut_awaited_by_is_set` added for
/// `asyncio.capture_call_graph`, and the task's `task_node`, its link in the thread's list of
/// tasks that `asyncio.all_tasks` walks; `task_tid` only in free-threaded builds). The base's
/// `tp_dealloc` unlinks `task_node` only when it is set, so a zeroed base part is still a
/// task that was never registered; `_asyncio._register_task` links a subclass's instance too
/// (`Task_Check`), through this part of its memory, and its `tp_dealloc` unlinks it.
#[cfg(Py_3_14)]
const TASK_BASICSIZE: usize = 168;

const OPAQUE_WORDS: usize =
    (TASK_BASICSIZE - std::mem::size_of::<ffi::PyObject>()) / std::mem::size_of::<usize>();

/// The C Task's instance layout as far as a subclass needs it: the object header, then bytes
/// this crate never reads.
#[repr(C)]
pub struct TaskObjLayout {
    ob_base: ffi::PyObject,
    _opaque: [usize; OPAQUE_WORDS],
}

/// `asyncio.Task`, the C Task type of the `_asyncio` module, as a base for `#[pyclass]`.
#[repr(transparent)]
pub struct AsyncioTask(PyAny);

static TASK_TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn task_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    TASK_TYPE
        .get_or_try_init(py, || {
            Ok(py
                .import("_asyncio")?
                .getattr("Task")?
                .cast_into::<PyType>()?
                .unbind())
        })
        .map(|t| t.bind(py))
}

fn task_type_ptr(py: Python<'_>) -> *mut ffi::PyTypeObject {
    match task_type(py) {
        Ok(t) => t.as_type_ptr(),
        // `take_layout` found the type before `ferroloop.Task`'s was made (the only user of
        // this function), and the type is cached once read.
        Err(e) => panic!("_asyncio.Task is not available: {e}"),
    }
}

pyo3::pyobject_native_type!(AsyncioTask, TaskObjLayout, task_type_ptr, "asyncio", "Task");
// What `pyo3::pyobject_subclassable_native_type!` declares for PyO3's own native types (that
// macro names a type PyO3 does not export; `PyAny`'s mutability is the same one).
impl pyo3::impl_::pyclass::PyClassBaseType for AsyncioTask {
    type LayoutAsBase = pyo3::impl_::pycell::PyClassObjectBase<TaskObjLayout>;
    type BaseNativeType = AsyncioTask;
    type Initializer = pyo3::impl_::pyclass_init::PyNativeTypeInitializer<Self>;
    type PyClassMutability = <PyAny as pyo3::impl_::pyclass::PyClassBaseType>::PyClassMutability;
    type Layout<T: pyo3::impl_::pyclass::PyClassImpl> = pyo3::impl_::pycell::PyStaticClassObject<T>;
}

/// Whether `ferroloop.Task` may be made (see the module invariants).
static NATIVE: AtomicBool = AtomicBool::new(false);

/// Whether `ferroloop.Task` exists as a native subclass of `asyncio.Task`; when not,
/// `ferroloop.Task` is `asyncio.Task` and nothing may make a `task::Task`.
pub fn native_tasks() -> bool {
    NATIVE.load(Ordering::Relaxed)
}

/// Decides the `task_layout` loan: `_asyncio.Task` laid out as `TaskObjLayout` and
/// subclassable, on a version whose C Task was read. Runs before `ferroloop.Task`'s type is
/// made; returns (and records for [`native_tasks`]) whether it may be.
pub fn take_layout(py: Python<'_>) -> bool {
    let native = cpython_loans::take(py, Loan::TaskLayout, || check_layout(py));
    NATIVE.store(native, Ordering::Relaxed);
    native
}

fn check_layout(py: Python<'_>) -> Result<(), String> {
    let ty = task_type(py).map_err(|e| format!("no _asyncio.Task: {e}"))?;
    let tp = ty.as_type_ptr();
    // SAFETY: `tp` is a live type object (held by `TASK_TYPE`); its size fields are plain reads
    // with the GIL held, its flags read through the C API (an atomic on free-threaded builds).
    let (basicsize, itemsize, flags) = unsafe {
        (
            (*tp).tp_basicsize,
            (*tp).tp_itemsize,
            ffi::PyType_GetFlags(tp),
        )
    };
    let basetype = flags & ffi::Py_TPFLAGS_BASETYPE != 0;
    // SAFETY: as above.
    let dictoffset = unsafe { (*tp).tp_dictoffset };
    // Where `visit_dict` finds the instance dict.
    #[cfg(Py_3_13)]
    let dict_as_expected = flags & ffi::Py_TPFLAGS_MANAGED_DICT != 0;
    #[cfg(not(Py_3_13))]
    let dict_as_expected = dictoffset > 0 && dictoffset < basicsize;
    if usize::try_from(basicsize).ok() != Some(std::mem::size_of::<TaskObjLayout>())
        || itemsize != 0
        || !basetype
        || !dict_as_expected
    {
        return Err(format!(
            "built for an _asyncio.Task of {} bytes, this one is {basicsize} bytes (item size \
             {itemsize}, subclassable: {basetype}, dict offset {dictoffset})",
            std::mem::size_of::<TaskObjLayout>()
        ));
    }
    #[cfg(Py_3_14)]
    keep_base_slots(tp)?;
    Ok(())
}

/// Whether the base's `tp_dealloc` releases the instance's reference to its type: a heap
/// type's does (CPython 3.12 and later make `_asyncio`'s types heap types), a static type's
/// does not (3.11).
pub fn base_releases_type(py: Python<'_>) -> bool {
    // SAFETY: a live type object's flags, read with the GIL held.
    unsafe { ffi::PyType_GetFlags(task_type_ptr(py)) & ffi::Py_TPFLAGS_HEAPTYPE != 0 }
}

#[cfg(Py_3_13)]
extern "C" {
    // Public C API since CPython 3.13 (`Include/cpython/object.h`), not declared by pyo3-ffi.
    fn PyObject_VisitManagedDict(
        obj: *mut ffi::PyObject,
        visit: ffi::visitproc,
        arg: *mut std::ffi::c_void,
    ) -> std::ffi::c_int;
    // Likewise.
    fn PyObject_ClearManagedDict(obj: *mut ffi::PyObject);
}

/// The C Task's `tp_traverse` and `tp_clear` (CPython 3.14+, see `visit_base`), kept by
/// `take_layout` when the loan is taken.
#[cfg(Py_3_14)]
static BASE_SLOTS: std::sync::OnceLock<(ffi::traverseproc, ffi::inquiry)> =
    std::sync::OnceLock::new();

/// Keeps the C Task's `tp_traverse` and `tp_clear` for `visit_base` and `clear_base`; an
/// error if it has none (then the loan is not taken).
#[cfg(Py_3_14)]
fn keep_base_slots(tp: *mut ffi::PyTypeObject) -> Result<(), String> {
    // SAFETY: a live type object's slots, read with the GIL held.
    let slots = unsafe { ((*tp).tp_traverse, (*tp).tp_clear) };
    match slots {
        (Some(traverse), Some(clear)) => {
            let _ = BASE_SLOTS.set((traverse, clear));
            Ok(())
        }
        _ => Err("_asyncio.Task has no tp_traverse or tp_clear".to_owned()),
    }
}

/// Visits what the C part of `obj` (an instance of a subclass of `asyncio.Task`) references:
/// the type, the instance dict and, from CPython 3.14, the fields asyncio's own functions may
/// write there. `asyncio.future_add_to_awaited_by(fut, waiter)` (3.14's `gather`, `shield`,
/// `TaskGroup`) records `waiter` in the C Future's `fut_awaited_by` set of any instance of a
/// subclass, a `ferroloop.Task` included; the C Task's own `tp_traverse`, which visits the
/// type, every field (NULL in a part never initialised, so skipped) and the managed dict, is
/// then exactly what the C part references. Before 3.14 nothing writes the C part.
///
/// # Safety
/// The collector's `visit` and `arg`, the GIL held, `obj` live and of such a type.
pub unsafe fn visit_base(
    obj: *mut ffi::PyObject,
    visit: ffi::visitproc,
    arg: *mut std::ffi::c_void,
) -> std::ffi::c_int {
    #[cfg(Py_3_14)]
    if let Some((traverse, _)) = BASE_SLOTS.get() {
        // SAFETY: see the function's contract; the C Task's traverse reads only its own part
        // of the object (of the size `take_layout` checked) and the managed dict.
        return unsafe { traverse(obj, visit, arg) };
    }
    // SAFETY: `Py_TYPE` of a live object; an instance of a heap type holds a reference to it,
    // which the base's traverse would visit on 3.12+ and PyO3's does on 3.11.
    let ret = unsafe { visit(ffi::Py_TYPE(obj).cast(), arg) };
    if ret != 0 {
        return ret;
    }
    // SAFETY: see the function's contract.
    unsafe { visit_dict(obj, visit, arg) }
}

/// Drops what the C part of `obj` references (as `visit_base` visits it), for the collector's
/// `tp_clear`.
///
/// # Safety
/// The GIL held, `obj` live and an instance of a subclass of `asyncio.Task`.
pub unsafe fn clear_base(obj: *mut ffi::PyObject) {
    #[cfg(Py_3_14)]
    if let Some((_, clear)) = BASE_SLOTS.get() {
        // SAFETY: see the function's contract; the C Task's clear empties its own fields (NULL
        // ones stay NULL) and the managed dict.
        unsafe { clear(obj) };
        return;
    }
    // SAFETY: see the function's contract.
    unsafe { clear_dict(obj) };
}

/// Visits the instance dict of `obj`, an instance of a subclass of `asyncio.Task`, if it has
/// one: on CPython 3.11 and 3.12 a pointer in the C Task's layout (at the type's
/// `tp_dictoffset`), from 3.13 a dict CPython manages before the object header.
///
/// # Safety
/// The collector's `visit` and `arg`, the GIL held, `obj` live and of such a type.
unsafe fn visit_dict(
    obj: *mut ffi::PyObject,
    visit: ffi::visitproc,
    arg: *mut std::ffi::c_void,
) -> std::ffi::c_int {
    #[cfg(Py_3_13)]
    {
        // SAFETY: see the function's contract; the type has `Py_TPFLAGS_MANAGED_DICT` (the C
        // Task's, inherited), which is what this function requires.
        unsafe { PyObject_VisitManagedDict(obj, visit, arg) }
    }
    #[cfg(not(Py_3_13))]
    {
        // SAFETY: see the function's contract; the C Task's `tp_dictoffset` is positive on
        // these versions (`take_layout`) and inherited, so the slot lies inside the object.
        unsafe {
            let dict = *dict_slot(obj);
            if dict.is_null() {
                0
            } else {
                visit(dict, arg)
            }
        }
    }
}

/// Drops the instance dict of `obj` (as `visit_dict` finds it), for the collector's `tp_clear`.
///
/// # Safety
/// The GIL held, `obj` live and an instance of a subclass of `asyncio.Task`.
unsafe fn clear_dict(obj: *mut ffi::PyObject) {
    #[cfg(Py_3_13)]
    {
        // SAFETY: see the function's contract and `visit_dict`.
        unsafe { PyObject_ClearManagedDict(obj) };
    }
    #[cfg(not(Py_3_13))]
    {
        // SAFETY: see the function's contract and `visit_dict`; the slot is emptied before the
        // dict is released, as `Py_CLEAR` does.
        unsafe {
            let dict = std::mem::replace(&mut *dict_slot(obj), std::ptr::null_mut());
            if !dict.is_null() {
                ffi::Py_DECREF(dict);
            }
        }
    }
}

/// The instance-dict slot of `obj` on CPython 3.11 and 3.12: at the type's `tp_dictoffset`,
/// inside the C Task's layout (pointer-aligned, as every field of a C object struct).
///
/// # Safety
/// `obj` live and an instance of a subclass of `asyncio.Task`, whose `tp_dictoffset`
/// `take_layout` found positive and inside the object.
#[cfg(not(Py_3_13))]
unsafe fn dict_slot(obj: *mut ffi::PyObject) -> *mut *mut ffi::PyObject {
    // SAFETY: see the function's contract.
    unsafe {
        obj.byte_offset((*ffi::Py_TYPE(obj)).tp_dictoffset)
            .cast::<*mut ffi::PyObject>()
    }
}

/// `_asyncio._current_tasks`, the dict of each loop's running task on CPython 3.11 to 3.13,
/// when the `current_tasks_dict` loan was taken (see `take_current_tasks`).
static CURRENT_TASKS: PyOnceLock<Option<Py<PyDict>>> = PyOnceLock::new();

/// Decides the `current_tasks_dict` loan (`cpython_loans.rs`): the running task of each loop
/// is written to `_asyncio._current_tasks` directly if that dict exists and
/// `asyncio.tasks._enter_task` is `_asyncio`'s (which uses it). Called once, at module
/// initialisation.
pub fn take_current_tasks(py: Python<'_>) {
    let mut dict = None;
    cpython_loans::take(py, Loan::CurrentTasksDict, || {
        let find = || -> PyResult<Option<Bound<'_, PyDict>>> {
            let enter = py.import("asyncio.tasks")?.getattr("_enter_task")?;
            let c = py.import("_asyncio")?;
            if !c.getattr("_enter_task")?.is(&enter) {
                return Ok(None);
            }
            Ok(c.getattr("_current_tasks")
                .ok()
                .and_then(|d| d.cast_into::<PyDict>().ok()))
        };
        match find() {
            Ok(Some(d)) => {
                dict = Some(d.unbind());
                Ok(())
            }
            Ok(None) => Err("asyncio does not use _asyncio._current_tasks".to_owned()),
            Err(e) => Err(format!("_asyncio._current_tasks not found: {e}")),
        }
    });
    let _ = CURRENT_TASKS.set(py, dict);
}

/// `_asyncio._current_tasks` if the `current_tasks_dict` loan was taken.
pub fn current_tasks_dict(py: Python<'_>) -> Option<Py<PyDict>> {
    CURRENT_TASKS
        .get(py)
        .and_then(|d| d.as_ref().map(|d| d.clone_ref(py)))
}
