//! `LoopCell`: the loop's mutable state, shared between the loop thread and Python callers.
//!
//! Invariants:
//! - The state is only touched with the GIL held, so in practice the lock is never contended;
//!   it exists so that misuse (a non-thread-safe loop method called from another thread while the
//!   loop waits in epoll with the GIL released) is an error instead of a data race.
//! - The lock is only ever *tried*, never waited for, so it cannot deadlock: re-entering it
//!   (a destructor run inside a locked section calling back into the loop) raises `RuntimeError`.
//! - Python objects removed from the state are returned out of the locked section and dropped
//!   after it, because dropping one can run arbitrary Python code.

use std::sync::{Mutex, MutexGuard, TryLockError};

use pyo3::exceptions::PyRuntimeError;
use pyo3::PyResult;

#[derive(Debug, Default)]
pub struct LoopCell<T> {
    inner: Mutex<T>,
}

impl<T> LoopCell<T> {
    pub fn new(value: T) -> Self {
        Self {
            inner: Mutex::new(value),
        }
    }

    /// Locks the state or explains why it cannot.
    pub fn lock(&self) -> PyResult<MutexGuard<'_, T>> {
        match self.inner.try_lock() {
            Ok(g) => Ok(g),
            Err(TryLockError::Poisoned(p)) => Ok(p.into_inner()),
            Err(TryLockError::WouldBlock) => Err(PyRuntimeError::new_err(
                "ferroloop: loop state is in use (a non-thread-safe loop method was called from \
                 another thread, or re-entrantly from a destructor); use call_soon_threadsafe",
            )),
        }
    }

    /// Locks for the garbage collector: `None` if the state is in use right now, in which case
    /// the caller skips it (skipping a visit only keeps objects alive, never frees them early).
    pub fn try_lock_for_gc(&self) -> Option<MutexGuard<'_, T>> {
        match self.inner.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}
