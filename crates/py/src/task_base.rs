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
//! - `TaskObjLayout` is exactly `_asyncio.Task.__basicsize__` bytes: `check_layout` compares
//!   the two when the module is initialised, before `ferroloop.Task`'s type is made, and the
//!   module refuses to load otherwise (the sizes are those of CPython 3.11 to 3.13 on 64-bit
//!   platforms; a Python whose C Task differs gets an `ImportError` naming both sizes).
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

use pyo3::exceptions::PyImportError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// `_asyncio.Task.__basicsize__` on 64-bit CPython 3.11 and 3.12 (`TaskObj`).
#[cfg(not(Py_3_13))]
const TASK_BASICSIZE: usize = 176;
/// `_asyncio.Task.__basicsize__` on 64-bit CPython 3.13 (`TaskObj`; the instance dict and
/// weak reference list moved before the object header).
#[cfg(Py_3_13)]
const TASK_BASICSIZE: usize = 144;

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
        // `check_layout` found the type when the module was initialised, and a module's
        // attribute once read is cached, so this is not reached after a successful import.
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

/// Refuses to go on (an `ImportError`) unless `_asyncio.Task` is laid out as `TaskObjLayout`
/// and can be subclassed. Runs before `ferroloop.Task`'s type is made.
pub fn check_layout(py: Python<'_>) -> PyResult<()> {
    let ty = task_type(py)
        .map_err(|e| PyImportError::new_err(format!("ferroloop needs _asyncio.Task: {e}")))?;
    let tp = ty.as_type_ptr();
    // SAFETY: `tp` is a live type object (held by `TASK_TYPE`); its size fields and flags are
    // plain reads with the GIL held.
    let (basicsize, itemsize, flags) =
        unsafe { ((*tp).tp_basicsize, (*tp).tp_itemsize, (*tp).tp_flags) };
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
        return Err(PyImportError::new_err(format!(
            "ferroloop was built for an _asyncio.Task of {} bytes, this Python's is {basicsize} \
             bytes (item size {itemsize}, subclassable: {basetype}, dict offset {dictoffset}); \
             build ferroloop for this Python",
            std::mem::size_of::<TaskObjLayout>()
        )));
    }
    Ok(())
}

/// Whether the base's `tp_dealloc` releases the instance's reference to its type: a heap
/// type's does (CPython 3.12 and later make `_asyncio`'s types heap types), a static type's
/// does not (3.11).
pub fn base_releases_type(py: Python<'_>) -> bool {
    // SAFETY: a live type object's flags, read with the GIL held.
    unsafe { (*task_type_ptr(py)).tp_flags & ffi::Py_TPFLAGS_HEAPTYPE != 0 }
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

/// Visits the instance dict of `obj`, an instance of a subclass of `asyncio.Task`, if it has
/// one: on CPython 3.11 and 3.12 a pointer in the C Task's layout (at the type's
/// `tp_dictoffset`), from 3.13 a dict CPython manages before the object header.
///
/// # Safety
/// The collector's `visit` and `arg`, the GIL held, `obj` live and of such a type.
pub unsafe fn visit_dict(
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
        // these versions (`check_layout`) and inherited, so the slot lies inside the object.
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
pub unsafe fn clear_dict(obj: *mut ffi::PyObject) {
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
/// `check_layout` found positive and inside the object.
#[cfg(not(Py_3_13))]
unsafe fn dict_slot(obj: *mut ffi::PyObject) -> *mut *mut ffi::PyObject {
    // SAFETY: see the function's contract.
    unsafe {
        obj.byte_offset((*ffi::Py_TYPE(obj)).tp_dictoffset)
            .cast::<*mut ffi::PyObject>()
    }
}
