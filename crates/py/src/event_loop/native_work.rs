//! Work native extensions hand to the loop through the C API (`crate::capi`): a C function to
//! call, or a registered future to resolve with a value a C function builds.
//!
//! Invariants:
//! - A [`NativeWork`] the injector accepted (`try_push`) runs exactly once, with the GIL, on
//!   the thread that drives the loop: in an iteration (`take_injected`); or inside
//!   `Loop.close()` before the loop is marked closed (`close_remotes`), so its callbacks may
//!   still resolve futures; or, for a loop freed without `close()`, when the loop drops it
//!   (`Drop`, errors to `sys.unraisablehook`). Every place the loop drops injected work holds
//!   the GIL (tp_dealloc, tp_clear, close), which `Drop` relies on.
//! - A refused one (`try_push` after the injector was sealed) is [`NativeWork::disarm`]ed: its
//!   function never runs and the caller keeps `arg`.
//! - The future table is touched only with the GIL held (register, run, close, the GC's
//!   traversal); its mutex makes `Shared` `Sync` and is never contended. It is closed (emptied,
//!   then refusing registrations) at the moment the injector is sealed, so no resolve is
//!   accepted for a future the table dropped.
//! - Tokens are never reused (a counter from 1), so a stale token finds nothing rather than
//!   another caller's future.

use std::ffi::c_void;
use std::sync::Mutex;

use ferroloop_core::IntMap;
use ferroloop_embed::abi::{BuildFn, CallFn};
use pyo3::exceptions::{PyRuntimeError, PySystemError};
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyString;
use pyo3::PyTraverseError;

use super::{LoopCore, Taken};

/// One queued C API request.
pub struct NativeWork {
    /// `None` once it ran or was disarmed.
    kind: Option<Kind>,
}

enum Kind {
    Call {
        func: CallFn,
        arg: *mut c_void,
    },
    Resolve {
        token: u64,
        build: BuildFn,
        arg: *mut c_void,
    },
}

// SAFETY: `arg` is the caller's pointer, handed over with the request; we never dereference
// it, only pass it back to the caller's own function, on the loop thread, which the C API's
// contract says it must accept.
unsafe impl Send for NativeWork {}

impl NativeWork {
    pub fn call(func: CallFn, arg: *mut c_void) -> Self {
        Self {
            kind: Some(Kind::Call { func, arg }),
        }
    }

    pub fn resolve(token: u64, build: BuildFn, arg: *mut c_void) -> Self {
        Self {
            kind: Some(Kind::Resolve { token, build, arg }),
        }
    }

    /// A request that was not queued: forget it without running anything.
    pub fn disarm(mut self) {
        self.kind = None;
    }

    /// Runs the request (loop thread, GIL held). `table` is `None` when the loop is being freed:
    /// the value is built (so `arg` is released) and dropped.
    pub fn run(mut self, py: Python<'_>, table: Option<&FutureTable>) -> PyResult<()> {
        match self.kind.take() {
            None => Ok(()),
            Some(Kind::Call { func, arg }) => {
                // SAFETY: the GIL is held and `func(arg)` is what the caller asked us to run
                // here, once.
                let rc = unsafe { func(arg) };
                match (rc, PyErr::take(py)) {
                    (0, None) => Ok(()),
                    (_, Some(e)) => Err(e),
                    (_, None) => Err(PySystemError::new_err(
                        "a native callback (ferroloop C API remote_call) returned an error without setting an exception",
                    )),
                }
            }
            Some(Kind::Resolve { token, build, arg }) => {
                // SAFETY: as above; `build` returns a new reference or NULL with an exception.
                let value = unsafe { Bound::from_owned_ptr_or_err(py, build(arg).cast()) };
                let Some(table) = table else { return Ok(()) };
                let Some(future) = table.take(token) else {
                    return Err(PyRuntimeError::new_err(format!(
                        "ferroloop C API remote_resolve: no future is registered under token {token} (resolved twice, or registered on another loop)"
                    )));
                };
                let future = future.bind(py);
                // asyncio's `_set_result_unless_cancelled`, with the `cancelled()` call only
                // where the set failed (an asyncio future refuses a result once cancelled, with
                // `InvalidStateError`): one Python call per completion instead of two.
                let set = match value {
                    Ok(v) => future.call_method1(intern!(py, "set_result"), (v,)),
                    Err(e) => {
                        future.call_method1(intern!(py, "set_exception"), (e.into_value(py),))
                    }
                };
                match set {
                    Ok(_) => Ok(()),
                    Err(_) if future.call_method0(intern!(py, "cancelled"))?.is_truthy()? => Ok(()),
                    Err(e) => Err(e),
                }
            }
        }
    }
}

impl Drop for NativeWork {
    /// Dropped unrun by a loop freed without `close()`: runs now (see the invariants).
    fn drop(&mut self) {
        if let Some(kind) = self.kind.take() {
            // SAFETY: the loop drops injected work only with the GIL held (module invariants).
            let py = unsafe { Python::assume_attached() };
            if let Err(e) = (Self { kind: Some(kind) }).run(py, None) {
                e.write_unraisable(py, None);
            }
        }
    }
}

/// The futures registered for `remote_resolve`, by token.
#[derive(Default)]
pub struct FutureTable {
    inner: Mutex<TableState>,
}

#[derive(Default)]
struct TableState {
    /// By token. The tokens are this table's own counter, not a peer's choice, so SipHash's
    /// flooding resistance buys nothing: with it, hashing was about 500 instructions of each
    /// completion's register and resolve (callgrind, `benchmarks/wake`'s capsule path).
    futures: IntMap<u64, Py<PyAny>>,
    last_token: u64,
    closed: bool,
}

impl FutureTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, TableState> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// GIL held: keeps `future` until it is resolved; returns its token (never 0).
    pub fn register(&self, _py: Python<'_>, future: Py<PyAny>) -> PyResult<u64> {
        let mut st = self.lock();
        if st.closed {
            return Err(PyRuntimeError::new_err("Event loop is closed"));
        }
        st.last_token += 1;
        let token = st.last_token;
        st.futures.insert(token, future);
        Ok(token)
    }

    fn take(&self, token: u64) -> Option<Py<PyAny>> {
        self.lock().futures.remove(&token)
    }

    /// GIL held: drops every registered future and refuses later registrations.
    pub fn close(&self, _py: Python<'_>) {
        let futures = {
            let mut st = self.lock();
            st.closed = true;
            std::mem::take(&mut st.futures)
        };
        drop(futures);
    }

    /// How many futures wait for a resolve (a test probe).
    pub fn pending(&self) -> usize {
        self.lock().futures.len()
    }

    /// The collector's traversal (GIL held, so the lock is free; `try_lock` to be sure never
    /// to block in a traversal).
    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Ok(st) = self.inner.try_lock() {
            for f in st.futures.values() {
                visit.call(f)?;
            }
        }
        Ok(())
    }
}

/// What the loop's exception handler is told when a native callback raised.
const NATIVE_FAILURE: &str = "Exception in a native callback handed to the loop (ferroloop C API)";

impl LoopCore {
    /// Whether the loop is closed (the C API's `remote_new` refuses it).
    pub(crate) fn is_closed_flag(&self) -> bool {
        self.flags.closed()
    }

    /// A failed injected task or native request, to the loop's exception handler
    /// (`Loop._callback_failed`). `Err` only for what must leave the loop (KeyboardInterrupt,
    /// SystemExit) or a failing handler.
    pub(super) fn report_injected_failure(
        slf: &Bound<'_, Self>,
        e: PyErr,
        native: bool,
    ) -> PyResult<()> {
        let py = slf.py();
        let loop_ = slf.clone().into_any().unbind();
        if native {
            let source = PyString::new(py, NATIVE_FAILURE);
            crate::handle::report_failure(source.as_any(), &loop_, e)
        } else {
            crate::handle::report_failure(slf.as_any(), &loop_, e)
        }
    }

    /// `Loop.close()`, before the loop is marked closed: seals the injector against C API work,
    /// runs every request it accepted (queued, or taken in and not run yet), then drops the
    /// futures still registered. A second call does nothing.
    pub(super) fn close_remotes(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        if this.shared.injector.seal() {
            return Ok(());
        }
        this.drain_injector(py)?;
        let natives: Vec<NativeWork> = {
            let mut taken = this
                .injected_tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut natives = Vec::new();
            let mut rust = Vec::new();
            for t in taken.drain(..) {
                match t {
                    Taken::Native(w) => natives.push(w),
                    other @ Taken::Rust(_) => rust.push(other),
                }
            }
            *taken = rust;
            natives
        };
        let mut result = Ok(());
        for w in natives {
            if let Err(e) = w.run(py, Some(&this.shared.futures)) {
                if let Err(e) = Self::report_injected_failure(slf, e, true) {
                    result = result.and(Err(e));
                }
            }
        }
        this.shared.futures.close(py);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" fn count(arg: *mut c_void) -> std::ffi::c_int {
        // SAFETY: the tests pass a pointer to a live `u32`.
        unsafe { *arg.cast::<u32>() += 1 };
        0
    }

    #[test]
    fn disarmed_work_never_runs() {
        let mut n = 0u32;
        NativeWork::call(count, (&raw mut n).cast()).disarm();
        assert_eq!(n, 0);
    }
}
