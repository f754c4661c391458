//! `LoopCell`: mutable state that only GIL holders touch.
//!
//! Invariants:
//! - Every access takes a `Python<'_>` token, so it happens with the GIL held; the GIL
//!   serializes all such accesses, and acquiring/releasing it orders memory between threads.
//!   That is why the cell can be `Sync` without a locked instruction on the hot path.
//! - A borrow flag still guards against overlap: a guard kept across `Python::detach`, or a
//!   destructor that runs while the state is borrowed and calls back into the loop, makes the
//!   second borrow fail with `RuntimeError` instead of aliasing the state.
//! - Python objects removed from the state are returned out of the borrowed section and dropped
//!   after it, because dropping one can run arbitrary Python code.
//! - On a free-threaded CPython (`Py_GIL_DISABLED`, 3.14t) the module declares that it uses the
//!   GIL (`lib.rs`), so the interpreter turns the GIL back on when it is imported and the
//!   serialization above holds. Only a user who forces the GIL off (`PYTHON_GIL=0`) breaks it;
//!   for that case the flag is taken with one compare-and-swap there, so that two threads can
//!   never both hold the value: the second gets the `RuntimeError` instead of aliasing it.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::exceptions::PyRuntimeError;
use pyo3::{PyResult, Python};

pub struct LoopCell<T> {
    borrowed: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reached through `borrow`/`try_borrow_for_gc`, which require the GIL
// (a `Python` token, or running inside the garbage collector, which holds it). GIL holders are
// serialized, the flag prevents overlapping borrows (atomically where the GIL may be off, see
// the module invariants), and `T: Send` lets the value be used from whichever thread holds it.
unsafe impl<T: Send> Sync for LoopCell<T> {}

pub struct Guard<'a, T> {
    cell: &'a LoopCell<T>,
}

impl<T> LoopCell<T> {
    pub const fn new(value: T) -> Self {
        Self {
            borrowed: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// The value, out of the cell (no flag needed: the cell is consumed).
    pub fn into_inner(self) -> T {
        self.value.into_inner()
    }

    /// Borrows the state or explains why it cannot.
    pub fn borrow(&self, _py: Python<'_>) -> PyResult<Guard<'_, T>> {
        self.try_borrow_for_gc().ok_or_else(|| {
            PyRuntimeError::new_err(
                "ferroloop: loop state is in use (a non-thread-safe loop method was called from \
                 another thread, or re-entrantly from a destructor); use call_soon_threadsafe",
            )
        })
    }

    /// Borrows for the garbage collector (which runs with the GIL held): `None` if the state is
    /// in use right now, in which case the caller skips it (skipping a visit only keeps objects
    /// alive, never frees them early).
    #[cfg(not(Py_GIL_DISABLED))]
    pub fn try_borrow_for_gc(&self) -> Option<Guard<'_, T>> {
        if self.borrowed.load(Ordering::Acquire) {
            return None;
        }
        self.borrowed.store(true, Ordering::Release);
        Some(Guard { cell: self })
    }

    /// As above, with the flag taken atomically (a free-threaded build; module invariants).
    #[cfg(Py_GIL_DISABLED)]
    pub fn try_borrow_for_gc(&self) -> Option<Guard<'_, T>> {
        self.borrowed
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| Guard { cell: self })
    }
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while `borrowed` is set by it, so no other reference to
        // the value exists (see the module invariants).
        unsafe { &*self.cell.value.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only use of the guard.
        unsafe { &mut *self.cell.value.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        self.cell.borrowed.store(false, Ordering::Release);
    }
}
