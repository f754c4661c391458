//! Releasing the GIL around blocking work, without a crash when Python exits meanwhile.
//!
//! On CPython before 3.14 a thread that takes the GIL back after interpreter finalization began
//! (a daemon thread running a loop, or calling `call_soon_threadsafe`) is ended with
//! `pthread_exit` from inside `PyEval_RestoreThread`. That forced unwind runs into Rust frames
//! and PyO3's trampoline, which catches it and aborts the process ("FATAL: exception not
//! rethrown") or leaves it to crash. PyO3 guards its own `PyGILState_Ensure` against this
//! (pyo3 #4874) but not `Python::detach`.
//!
//! Taking the GIL back is not the only place this happens: a loop thread running a Python
//! callback gives the GIL up whenever the interpreter asks it to, and is ended the same way when
//! it asks for it back, with Rust frames (and their destructors, which touch Python objects)
//! below. So at exit a loop thread is first parked at a point where it holds nothing:
//! `ferroloop` registers [`_prepare_exit`] with `atexit` at import (so it runs after the exit
//! functions registered later, just before CPython starts finalizing). It sets `EXITING` and
//! waits, with the GIL released, until no loop thread other than the exiting one is running
//! Python (`ACTIVE`, the loop threads between polls); every such thread checks `EXITING` at the
//! top of each iteration and after each poll, and parks there with the GIL released.
//!
//! Invariants:
//! - A loop thread counts itself in `ACTIVE` only while it holds the GIL inside
//!   `_run_forever_native` (not while it waits in `epoll_wait`, not once parked), so the exit
//!   wait ends as soon as every loop is asleep or parked. The exiting thread never parks, and
//!   neither does a loop started after `EXITING` was set (by exit code that may be joining its
//!   thread); such a loop is not counted.
//! - [`detach`] re-takes the GIL through a `C-unwind` declaration of `PyEval_RestoreThread`,
//!   inside a frame whose guard, if that unwind happens, parks the thread for good instead of
//!   letting it go further. That is what CPython 3.14 itself does with such threads: the
//!   process exits around them.
//! - The closure runs without the GIL: it must not touch Python objects (it is `Send`, and every
//!   caller only makes syscalls and atomic operations).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pyo3::ffi;
use pyo3::prelude::*;

/// Set by [`_prepare_exit`]: loop threads other than [`EXITER`] park at their next check.
static EXITING: AtomicBool = AtomicBool::new(false);
/// `pthread_self()` of the thread that called [`_prepare_exit`] (the one finalizing Python).
static EXITER: AtomicU64 = AtomicU64::new(0);
/// Loop threads holding the GIL between two polls (see the module's invariants).
static ACTIVE: AtomicIsize = AtomicIsize::new(0);

thread_local! {
    /// This thread is inside `_run_forever_native`.
    static IN_LOOP: Cell<bool> = const { Cell::new(false) };
    /// ... and its loop started before `EXITING` was set: it is counted in `ACTIVE` while
    /// attached, and parks when Python exits.
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn this_thread() -> libc::pthread_t {
    // SAFETY: pthread_self() takes no arguments and cannot fail.
    unsafe { libc::pthread_self() }
}

/// The running loop's part: counted in `ACTIVE` while attached, parked when Python exits.
pub struct LoopThread {
    outer: bool,
}

impl LoopThread {
    /// Entering `_run_forever_native` (with the GIL); its first iteration's
    /// [`park_if_exiting`] parks it if Python is exiting.
    pub fn enter() -> Self {
        let outer = !IN_LOOP.with(Cell::get);
        if outer {
            IN_LOOP.with(|c| c.set(true));
            // Counted first, then checked: a `_prepare_exit` racing this either sees the count
            // (and this loop parks at its first check) or set `EXITING` before the check.
            ACTIVE.fetch_add(1, Ordering::SeqCst);
            if EXITING.load(Ordering::SeqCst) {
                ACTIVE.fetch_sub(1, Ordering::SeqCst);
            } else {
                COUNTED.with(|c| c.set(true));
            }
        }
        Self { outer }
    }
}

impl Drop for LoopThread {
    fn drop(&mut self) {
        if self.outer {
            if COUNTED.with(|c| c.replace(false)) {
                ACTIVE.fetch_sub(1, Ordering::SeqCst);
            }
            IN_LOOP.with(|c| c.set(false));
        }
    }
}

/// At the top of an iteration and after a poll (the GIL held, nothing borrowed): parks this
/// loop thread for good if Python is exiting and this is not the exiting thread.
pub fn park_if_exiting(py: Python<'_>) {
    if !EXITING.load(Ordering::SeqCst)
        || !COUNTED.with(Cell::get)
        || EXITER.load(Ordering::SeqCst) == this_thread()
    {
        return;
    }
    let _ = py;
    ACTIVE.fetch_sub(1, Ordering::SeqCst);
    // SAFETY: this thread holds the GIL (`py`); it gives it up and never takes it back.
    let _ = unsafe { ffi::PyEval_SaveThread() };
    drop(ParkForever);
}

/// `os.register_at_fork(after_in_child=...)`: the child has one thread, this one; loop
/// threads the parent counted in `ACTIVE` do not exist here.
#[pyfunction]
pub fn _after_fork_in_child() {
    ACTIVE.store(isize::from(COUNTED.with(Cell::get)), Ordering::SeqCst);
    EXITING.store(false, Ordering::SeqCst);
}

/// `atexit` hook (see the module's doc): makes the other loop threads park and waits up to
/// `timeout` seconds for them to stop running Python. Returns how many were still running.
#[pyfunction]
pub fn _prepare_exit(py: Python<'_>, timeout: f64) -> isize {
    EXITER.store(this_thread(), Ordering::SeqCst);
    EXITING.store(true, Ordering::SeqCst);
    let own = isize::from(COUNTED.with(Cell::get));
    // At most a minute; NaN, negative or zero: no wait.
    let secs = if timeout > 0.0 {
        timeout.min(60.0)
    } else {
        0.0
    };
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    loop {
        let others = ACTIVE.load(Ordering::SeqCst) - own;
        if others <= 0 || Instant::now() >= deadline {
            return others.max(0);
        }
        detach(py, || std::thread::sleep(Duration::from_micros(200)));
    }
}

mod raw {
    use pyo3::ffi::PyThreadState;

    #[allow(
        clashing_extern_declarations,
        reason = "the same function as pyo3-ffi's, declared C-unwind: it may pthread_exit"
    )]
    extern "C-unwind" {
        pub fn PyEval_RestoreThread(tstate: *mut PyThreadState);
    }
}

/// Parks the thread forever when dropped: reached only while `pthread_exit` unwinds it.
struct ParkForever;

impl Drop for ParkForever {
    fn drop(&mut self) {
        loop {
            // SAFETY: pause() takes no arguments and only waits for a signal.
            unsafe { libc::pause() };
        }
    }
}

/// Takes the GIL back for `tstate`, or parks the thread for good if Python is exiting.
///
/// # Safety
/// `tstate` is what this thread's `PyEval_SaveThread` returned, and the thread has not re-taken
/// the GIL since.
unsafe fn restore_or_park(tstate: *mut ffi::PyThreadState) {
    let park = ParkForever;
    // SAFETY: the caller's contract; if this unwinds (pthread_exit), `park` stops it here.
    unsafe { raw::PyEval_RestoreThread(tstate) };
    std::mem::forget(park);
}

/// Re-takes the GIL when dropped, so a panic in the closure leaves the thread attached.
struct Restore(*mut ffi::PyThreadState);

impl Drop for Restore {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from `PyEval_SaveThread` in `detach` and nothing re-took the
        // GIL since: this guard is the only way back.
        unsafe { restore_or_park(self.0) };
    }
}

/// Runs `f` with the GIL released, as `Python::detach` does (see the module's invariants).
pub fn detach<T, F>(py: Python<'_>, f: F) -> T
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    let _ = py;
    // SAFETY: holding `py` means this thread holds the GIL; the guard gives it back.
    let guard = Restore(unsafe { ffi::PyEval_SaveThread() });
    let out = f();
    drop(guard);
    out
}

/// [`detach`] for a loop thread's poll: not counted in `ACTIVE` while it waits.
pub fn detach_idle<T, F>(py: Python<'_>, f: F) -> T
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    let counted = COUNTED.with(Cell::get);
    if counted {
        ACTIVE.fetch_sub(1, Ordering::SeqCst);
    }
    let out = detach(py, f);
    if counted {
        ACTIVE.fetch_add(1, Ordering::SeqCst);
    }
    out
}
