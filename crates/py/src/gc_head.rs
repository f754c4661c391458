//! Whether the garbage collector tracks an object, read inline from its GC header.
//!
//! `PyObject_GC_IsTracked` is a function call into libpython; the loop asks for every handle
//! leaving its ready queue. In CPython 3.11 to 3.15 (with the GIL; `Include/internal/pycore_gc.h`) an object of a GC type is
//! preceded by its `PyGC_Head`, whose first word (`_gc_next`) is non-zero exactly while the
//! object is tracked: CPython's own `_PyObject_GC_IS_TRACKED` reads it so.
//!
//! Invariants:
//! - `INLINE` is set once, at module initialisation (`install`), and only if that word agreed
//!   with `PyObject_GC_IsTracked` on a live object both tracked and untracked, on a version the
//!   `gc_header` loan lists (`cpython_loans.rs`), unless `FERROLOOP_PORTABLE=1`. Otherwise
//!   `is_tracked` calls the function.

use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::cpython_loans::{self, Loan};

static INLINE: AtomicBool = AtomicBool::new(false);

/// The `_gc_next` word of `obj`'s GC header.
///
/// # Safety
/// `obj` is a live object of a GC type, and the GIL is held.
unsafe fn gc_next(obj: *mut ffi::PyObject) -> usize {
    // SAFETY: a GC object's memory starts with its `PyGC_Head` (two words), right before the
    // object header (see the module doc); the caller guarantees the object is live.
    unsafe { *obj.cast::<usize>().sub(2) }
}

/// Checks the GC header layout on a live list and turns the inline read on. Called once, at
/// module initialisation.
pub(crate) fn install(py: Python<'_>) {
    let agrees = cpython_loans::take(py, Loan::GcHeader, || {
        let list = PyList::empty(py);
        let obj = list.as_ptr();
        // SAFETY: we hold the GIL; `obj` is a live list (a GC type, tracked when made),
        // untracked and tracked again through the C API, which is always allowed; its header
        // is only read.
        let agrees = unsafe {
            let tracked = ffi::PyObject_GC_IsTracked(obj) != 0 && gc_next(obj) != 0;
            ffi::PyObject_GC_UnTrack(obj.cast());
            let untracked = ffi::PyObject_GC_IsTracked(obj) == 0 && gc_next(obj) == 0;
            ffi::PyObject_GC_Track(obj.cast());
            tracked && untracked && gc_next(obj) != 0
        };
        if agrees {
            Ok(())
        } else {
            Err("the GC header word disagrees with PyObject_GC_IsTracked".to_owned())
        }
    });
    INLINE.store(agrees, Ordering::Relaxed);
}

/// Whether the collector tracks `obj` (`PyObject_GC_IsTracked`).
///
/// # Safety
/// `obj` is a live object of a GC type, and the GIL is held.
#[inline]
pub(crate) unsafe fn is_tracked(obj: *mut ffi::PyObject) -> bool {
    // SAFETY: the caller's contract; the inline read only once `install` checked the layout.
    unsafe {
        if INLINE.load(Ordering::Relaxed) {
            gc_next(obj) != 0
        } else {
            ffi::PyObject_GC_IsTracked(obj) != 0
        }
    }
}
