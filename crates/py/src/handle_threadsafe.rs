//! What a `call_soon_threadsafe` handle adds to a `Handle`: asyncio 3.14's `_ThreadSafeHandle`
//! rule that `cancel()` and `cancelled()`, called from another thread while the callback runs,
//! wait until it has returned (so a thread that cancels knows the callback is not running, and
//! reads a final answer). From the thread that runs the callback (the callback cancelling its
//! own handle) they do not wait: the cancel is recorded and the callback runs to its end.
//! asyncio 3.14 does this with an `RLock` per handle, taken around every run; ferroloop does it
//! on every Python version, with one word per handle and a lock only when someone waits.
//!
//! Invariants:
//! - A handle's `RunState` word holds `THREADSAFE` from its creation (by `call_soon_threadsafe`)
//!   on; `RUNNING`, with the running thread's `pthread_self()` in the bits above `FLAGS`,
//!   exactly while a [`Running`] exists for it (made before the callback is called, dropped
//!   after it returned, whatever it returned); `WAITED` only while `RUNNING`, once a thread
//!   waits. `pthread_self()` is the address of the thread's descriptor, aligned well past
//!   `FLAGS`, so the bits do not overlap. Every change happens with the GIL held.
//! - A waiter (`wait_while_running`) reads `RUNNING` and sets `WAITED` in one GIL-held section,
//!   then releases the GIL and waits on `WAIT` until `RUNNING` is clear, re-reading it under
//!   `WAIT`'s mutex. The runner clears the word (GIL held, so never between the waiter's read
//!   and its `WAITED`) and then, if `WAITED` was set, takes that mutex and notifies: a waiter
//!   that read `RUNNING` under the mutex is already waiting, one that comes later reads it
//!   clear. No wake-up is lost, and a handle nobody waits for costs the runner two stores.
//! - A handle run again from inside its own callback (`handle._run()`, nested) ends the outer
//!   run's `RUNNING` early: a waiter may then stop waiting before the outer call returned.
//!   asyncio's `RLock` would hold it; nothing in asyncio or ferroloop runs a handle that way.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use pyo3::prelude::*;

const THREADSAFE: u64 = 1;
const RUNNING: u64 = 2;
const WAITED: u64 = 4;
const FLAGS: u64 = 7;

/// The word a `Handle` keeps for this (see the invariants).
#[derive(Default)]
pub(crate) struct RunState(AtomicU64);

impl RunState {
    pub(crate) fn mark_threadsafe(&self) {
        self.0.fetch_or(THREADSAFE, Ordering::Relaxed);
    }

    pub(crate) fn is_threadsafe(&self) -> bool {
        self.0.load(Ordering::Relaxed) & THREADSAFE != 0
    }

    fn running(&self) -> bool {
        self.0.load(Ordering::Acquire) & RUNNING != 0
    }
}

static WAIT: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());

fn this_thread() -> u64 {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as u64 }
}

/// A threadsafe handle's callback is running (see the invariants); dropped when it returned.
#[must_use = "the callback counts as running until this is dropped"]
pub(crate) struct Running<'a>(&'a RunState);

impl<'a> Running<'a> {
    /// GIL held, just before the callback is called.
    pub(crate) fn begin(_py: Python<'_>, state: &'a RunState) -> Self {
        state.0.store(
            (this_thread() & !FLAGS) | THREADSAFE | RUNNING,
            Ordering::Release,
        );
        Self(state)
    }
}

impl Drop for Running<'_> {
    /// GIL held (the loop code that ran the callback).
    fn drop(&mut self) {
        if self.0 .0.swap(THREADSAFE, Ordering::Release) & WAITED != 0 {
            let _guard = WAIT
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            WAIT.1.notify_all();
        }
    }
}

/// GIL held: if `state`'s callback is running on another thread, waits (GIL released) until it
/// has returned. Returns at once for a handle that is not threadsafe, not running, or running
/// on this thread.
pub(crate) fn wait_while_running(py: Python<'_>, state: &RunState) {
    let word = state.0.load(Ordering::Acquire);
    if word & RUNNING == 0 || word & !FLAGS == this_thread() & !FLAGS {
        return;
    }
    state.0.fetch_or(WAITED, Ordering::Relaxed);
    // `gil::detach`: a daemon thread waiting here at interpreter exit is parked, not unwound.
    crate::gil::detach(py, || {
        let mut guard = WAIT
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while state.running() {
            guard = WAIT
                .1
                .wait(guard)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    });
}
