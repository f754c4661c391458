//! A raw `METH_FASTCALL | METH_KEYWORDS` entry point for `call_soon`, the loop's hottest method
//! (every `Future` callback and every `Task` step goes through it, usually with `context=`).
//!
//! PyO3's generated wrapper costs about 320 instructions per call here (trampoline, generic
//! argument extraction, the thread-local GIL counter); this entry parses the one positional and
//! one keyword argument directly and calls the same `LoopCore::call_soon_impl`. The PyO3 method
//! stays on `LoopCore` (it is what the stubs describe); `install` puts this descriptor on the
//! Python subclass `ferroloop.Loop`, where attribute lookup finds it first.
//!
//! Invariants:
//! - CPython calls the function with the GIL held, with `nargs` positional arguments followed by
//!   one value per name in `kwnames`, all borrowed for the duration of the call.
//! - The descriptor is created for the `LoopCore` type, and CPython checks that `self` is an
//!   instance of it before calling.
//! - No panic crosses the FFI boundary: the body runs under `catch_unwind`, and a panic becomes
//!   a `PanicException`, as in PyO3's own wrappers.
//! - Semantics and error messages match the PyO3 method; `tests/loop/test_call_soon.py` runs
//!   every case against asyncio's loop.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::panic::PanicException;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use crate::event_loop::LoopCore;

/// A `PyMethodDef` in a static: CPython only reads it.
struct MethodDef(ffi::PyMethodDef);

// SAFETY: the definition is never mutated after construction, and its pointers refer to
// 'static C strings and a function.
unsafe impl Sync for MethodDef {}

static CALL_SOON: MethodDef = MethodDef(ffi::PyMethodDef {
    ml_name: c"call_soon".as_ptr(),
    ml_meth: ffi::PyMethodDefPointer {
        PyCFunctionFastWithKeywords: call_soon_fast,
    },
    ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
    ml_doc: c"call_soon(callback, *args, context=None)\n--\n\nArrange for callback(*args) to be called soon, in order."
        .as_ptr(),
});

/// Puts the fast `call_soon` on `cls` (a subclass of `LoopCore`).
#[pyfunction]
pub fn _install_fast_methods(cls: &Bound<'_, PyAny>) -> PyResult<()> {
    let py = cls.py();
    let core = py.get_type::<LoopCore>();
    // SAFETY: we hold the GIL; the type pointer is alive (held by `core`), and CPython only reads
    // the 'static method definition (the `*mut` is an artefact of the C signature).
    let descr = unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            ffi::PyDescr_NewMethod(
                core.as_type_ptr(),
                std::ptr::addr_of!(CALL_SOON.0).cast_mut(),
            ),
        )
    }?;
    cls.setattr(intern!(py, "call_soon"), descr)
}

unsafe extern "C" fn call_soon_fast(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargsf: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls METH_FASTCALL functions on a thread that holds the GIL.
    let py = unsafe { Python::assume_attached() };
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: see the module invariants: a live LoopCore instance and `nargs` + len(kwnames)
        // borrowed argument pointers.
        unsafe { call_soon_body(py, slf, args, nargsf, kwnames) }
    }));
    match outcome {
        Ok(Ok(obj)) => obj,
        Ok(Err(err)) => {
            err.restore(py);
            std::ptr::null_mut()
        }
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|m| (*m).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic in ferroloop's call_soon".to_owned());
            PanicException::new_err(msg).restore(py);
            std::ptr::null_mut()
        }
    }
}

/// # Safety
/// The arguments must be as CPython passes them to a `METH_FASTCALL | METH_KEYWORDS` method of
/// `LoopCore` (see the module invariants), with the GIL held.
unsafe fn call_soon_body(
    py: Python<'_>,
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargsf: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> PyResult<*mut ffi::PyObject> {
    // SAFETY: `nargsf` comes from CPython's vectorcall protocol.
    let nargs = unsafe { ffi::PyVectorcall_NARGS(nargsf as usize) } as usize;
    let nkw = if kwnames.is_null() {
        0
    } else {
        // SAFETY: `kwnames` is a tuple of str when not NULL.
        unsafe { ffi::PyTuple_GET_SIZE(kwnames) as usize }
    };
    let values: &[*mut ffi::PyObject] = if nargs + nkw == 0 {
        &[]
    } else {
        // SAFETY: CPython passes `nargs + nkw` valid pointers at `args`.
        unsafe { std::slice::from_raw_parts(args, nargs + nkw) }
    };
    if nargs == 0 {
        return Err(PyTypeError::new_err(
            "call_soon() missing 1 required positional argument: 'callback'",
        ));
    }
    let mut context = None;
    for i in 0..nkw {
        // SAFETY: `i < len(kwnames)`; items are borrowed str objects.
        let name = unsafe { Bound::from_borrowed_ptr(py, ffi::PyTuple_GET_ITEM(kwnames, i as _)) };
        let wanted = intern!(py, "context");
        if name.is(wanted)
            || name
                .cast::<PyString>()
                .is_ok_and(|n| n.to_str().is_ok_and(|t| t == "context"))
        {
            // SAFETY: the value of keyword `i` follows the positional arguments.
            context = Some(unsafe { Bound::from_borrowed_ptr(py, values[nargs + i]) });
        } else {
            return Err(PyTypeError::new_err(format!(
                "call_soon() got an unexpected keyword argument '{name}'"
            )));
        }
    }
    // SAFETY: positional arguments are borrowed, live object pointers.
    let callback = unsafe { Bound::from_borrowed_ptr(py, values[0]) };
    let rest = if nargs == 1 {
        PyTuple::empty(py)
    } else {
        let items = values[1..nargs].iter().map(|&p| {
            // SAFETY: as above, for each positional argument after the callback.
            unsafe { Bound::from_borrowed_ptr(py, p) }
        });
        PyTuple::new(py, items)?
    };
    // SAFETY: CPython's method descriptor checked that `slf` is a LoopCore instance.
    let core = unsafe { Bound::from_borrowed_ptr(py, slf).cast_into_unchecked::<LoopCore>() };
    let handle = LoopCore::call_soon_impl(&core, &callback, rest, context)?;
    Ok(handle.into_ptr())
}
