//! `contextvars.Context` objects reused for the copies the loop makes of the caller's context.
//!
//! asyncio copies the current context for every `call_soon`, `call_later` and
//! `call_soon_threadsafe` made without `context=`, and the handle drops the copy when it has run.
//! Through CPython that is `PyContext_CopyCurrent` (a new `Context` from CPython's free list,
//! linked into the collector's lists) and, when the handle dies, `context_tp_dealloc` (unlinked,
//! its variables released, back to the free list): about 85 instructions per callback under
//! callgrind. A copy is a `Context` whose variables are the current context's (an immutable
//! mapping shared, not copied), so the loop keeps the copies its handles drop when nothing else
//! references them, and makes the next copy by pointing one of those at the current context's
//! variables.
//!
//! This reads two CPython structures that the C API does not expose: a `Context`'s fields
//! (`ctx_prev`, `ctx_vars`, `ctx_weakreflist`, `ctx_entered`, unchanged from 3.7 to 3.15) and the
//! thread state's `context` pointer (at an offset that depends on the minor version). `install`
//! checks both against live objects at module initialisation (the `context_layout` loan of
//! `cpython_loans.rs`, which also refuses versions not listed there and `FERROLOOP_PORTABLE=1`);
//! if either differs, nothing is pooled and every copy goes through `PyContext_CopyCurrent`.
//!
//! Invariants:
//! - `ENABLED` is set once, at module initialisation, and only if a `Context` and the thread state
//!   are laid out as `Layout` says (checked on live objects by `install`).
//! - A context in `POOL` is an exact `Context` that only the pool references (reference count 1),
//!   not tracked by the collector, not entered (`ctx_prev` NULL, `ctx_entered` 0), without weak
//!   references and with `ctx_vars` NULL. Nothing can reach it, so nothing traverses it or sees
//!   the NULL.
//! - `copy_current` hands a pooled context out with `ctx_vars` set to the current context's
//!   variables (a new reference): from then on it is a context like any other copy, except that
//!   it is not tracked. The caller owns it and keeps it untracked only where a traversal visits
//!   what it references in its place (a waiting handle's own context: handle.rs's invariants);
//!   anywhere else it must be tracked first.
//! - `recycle` takes a context only under the pool's conditions above (checked on the object,
//!   never assumed), and releases the variables after the context is in the pool, since
//!   releasing them can run arbitrary code (which may itself copy or recycle contexts).
//! - `POOL` is touched only with the GIL held (a `LoopCell`), in sections that run no Python
//!   code. Pooled contexts are never freed: at most `POOL_CAPACITY` of them (48 bytes each) per
//!   process.

use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::ffi;
use pyo3::prelude::*;

use crate::cell::LoopCell;
use crate::cpython_loans::{self, Loan};

/// Contexts kept for reuse: a loop that runs N callbacks per iteration drops and copies about N
/// contexts in turn, so a few are enough for the steady state; the bound keeps a burst (a
/// million timers cancelled at once) from pinning memory.
const POOL_CAPACITY: usize = 256;

/// CPython's `struct _pycontextobject` (Include/internal/pycore_context.h, 3.7 to 3.15).
#[repr(C)]
struct RawContext {
    ob_base: ffi::PyObject,
    ctx_prev: *mut ffi::PyObject,
    ctx_vars: *mut ffi::PyObject,
    ctx_weakreflist: *mut ffi::PyObject,
    ctx_entered: std::ffi::c_int,
}

/// Byte offset of `context` in `PyThreadState` (Include/cpython/pystate.h) for the version this
/// module is built for; `install` checks it on the running thread.
/// (Read from each version's header: `offsetof(PyThreadState, context)` compiled against it.)
#[cfg(not(Py_3_12))]
const THREAD_CONTEXT_OFFSET: usize = 224;
/// 3.12 to 3.14 (3.14 added fields to `PyThreadState`, all after `context`).
#[cfg(all(Py_3_12, not(Py_3_15)))]
const THREAD_CONTEXT_OFFSET: usize = 208;
/// 3.15 (`gil_requested`, `base_frame` and `last_profiled_frame` added before `context`).
#[cfg(Py_3_15)]
const THREAD_CONTEXT_OFFSET: usize = 232;

/// Set once `install` checked the layouts (the thread state offset is the constant above).
static ENABLED: AtomicBool = AtomicBool::new(false);

struct Pool {
    len: usize,
    /// Pooled contexts (see the module invariants) in `..len`; stale pointers beyond.
    contexts: [*mut RawContext; POOL_CAPACITY],
}

// SAFETY: the pointers are pooled contexts that only the pool references, reached only through
// `POOL`, with the GIL held.
unsafe impl Send for Pool {}

static POOL: LoopCell<Pool> = LoopCell::new(Pool {
    len: 0,
    contexts: [ptr::null_mut(); POOL_CAPACITY],
});

/// The current thread's context (a borrowed pointer), NULL if the thread has none yet.
///
/// # Safety
/// The GIL is held and `ENABLED` is set.
unsafe fn thread_context() -> *mut ffi::PyObject {
    // SAFETY: with the GIL held the thread state is live; `ENABLED` says `context` is a pointer at
    // `THREAD_CONTEXT_OFFSET` in it.
    unsafe {
        let ts = ffi::PyThreadState_Get();
        *ts.cast::<*mut ffi::PyObject>()
            .byte_add(THREAD_CONTEXT_OFFSET)
    }
}

fn is_exact_context(obj: *mut ffi::PyObject) -> bool {
    // SAFETY: callers pass a live object; only its type pointer is read.
    unsafe { ffi::Py_TYPE(obj) == (&raw mut ffi::PyContext_Type).cast() }
}

/// Checks the two layouts on live objects and turns pooling on. Called once, at module
/// initialisation (with the GIL held, on the importing thread).
pub(crate) fn install(py: Python<'_>) {
    let enabled = cpython_loans::take(py, Loan::ContextLayout, || match check_layouts(py) {
        Ok(true) => Ok(()),
        Ok(false) => Err("a Context or the thread state is laid out differently".to_owned()),
        Err(e) => Err(format!("checking the layouts failed: {e}")),
    });
    ENABLED.store(enabled, Ordering::Relaxed);
}

/// Whether a `Context` and the thread state are laid out as `RawContext` and
/// `THREAD_CONTEXT_OFFSET` say, observed on live objects.
fn check_layouts(py: Python<'_>) -> PyResult<bool> {
    // SAFETY: the type object is static; its size fields are only read.
    let (basicsize, weaklist) = unsafe {
        let tp = &raw const ffi::PyContext_Type;
        ((*tp).tp_basicsize, (*tp).tp_weaklistoffset)
    };
    if usize::try_from(basicsize).ok() != Some(size_of::<RawContext>())
        || usize::try_from(weaklist).ok() != Some(std::mem::offset_of!(RawContext, ctx_weakreflist))
    {
        return Ok(false);
    }
    // Two copies of the current context share its variables; entering one makes it the thread's
    // context with the previous one in `ctx_prev`; exiting undoes both.
    // SAFETY: we hold the GIL; each call returns a new reference or NULL with an exception set.
    let (a, b) = unsafe {
        (
            Bound::from_owned_ptr_or_err(py, ffi::PyContext_CopyCurrent())?,
            Bound::from_owned_ptr_or_err(py, ffi::PyContext_CopyCurrent())?,
        )
    };
    let (pa, pb) = (
        a.as_ptr().cast::<RawContext>(),
        b.as_ptr().cast::<RawContext>(),
    );
    // SAFETY: we hold the GIL; `a` and `b` are live `Context`s of the size checked above, and the
    // thread state is live. Only pointer-sized words within both are read, and `a` is entered and
    // exited through the C API.
    let as_expected = unsafe {
        let slot = ffi::PyThreadState_Get()
            .cast::<*mut ffi::PyObject>()
            .byte_add(THREAD_CONTEXT_OFFSET);
        let before = *slot;
        let fresh = (*pa).ctx_prev.is_null()
            && (*pa).ctx_entered == 0
            && (*pa).ctx_weakreflist.is_null()
            && !(*pa).ctx_vars.is_null()
            && (*pa).ctx_vars == (*pb).ctx_vars
            && !before.is_null()
            && is_exact_context(before)
            && (*before.cast::<RawContext>()).ctx_vars == (*pa).ctx_vars;
        fresh && {
            if ffi::PyContext_Enter(a.as_ptr()) < 0 {
                return Err(PyErr::fetch(py));
            }
            let entered = *slot == a.as_ptr() && (*pa).ctx_entered == 1 && (*pa).ctx_prev == before;
            ffi::PyContext_Exit(a.as_ptr());
            entered && *slot == before && (*pa).ctx_entered == 0 && (*pa).ctx_prev.is_null()
        }
    };
    Ok(as_expected)
}

/// Whether `install` found the layouts it expects (`_native.CONTEXT_POOL`, so a test notices
/// when pooling is off).
pub(crate) fn installed() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// A copy of the current context in a pooled `Context`, not tracked by the collector (see the
/// module invariants); `None` when the pool is empty or off, or the thread has no context yet
/// (then `PyContext_CopyCurrent` makes one).
#[inline]
pub(crate) fn copy_current(py: Python<'_>) -> Option<Py<PyAny>> {
    if !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    // SAFETY: the GIL is held (`py`) and the layouts were checked (`ENABLED`).
    let current = unsafe { thread_context() };
    if current.is_null() {
        return None;
    }
    let ctx = {
        let mut pool = POOL.try_borrow_for_gc()?;
        let len = pool.len.checked_sub(1)?;
        pool.len = len;
        pool.contexts[len]
    };
    // SAFETY: `current` is the thread's live context (the thread state only ever holds a
    // `Context`), whose variables are never NULL; `ctx` is a pooled context that only we
    // reference now. It takes a new reference to the variables, and the pool's reference becomes
    // the caller's.
    unsafe {
        let vars = (*current.cast::<RawContext>()).ctx_vars;
        ffi::Py_INCREF(vars);
        (*ctx).ctx_vars = vars;
        Some(Bound::from_owned_ptr(py, ctx.cast()).unbind())
    }
}

/// Keeps `context` for a later `copy_current` if nothing else references it and the pool has
/// room; otherwise hands it back. Its reference (the caller's last) is consumed either way.
/// `untracked` says the caller knows it is not tracked by the collector; otherwise it is
/// untracked here. A context handed back is in the state it came in.
#[inline]
pub(crate) fn recycle(
    _py: Python<'_>,
    context: Py<PyAny>,
    untracked: bool,
) -> Result<(), Py<PyAny>> {
    let obj = context.as_ptr();
    if !ENABLED.load(Ordering::Relaxed) || !is_exact_context(obj) {
        return Err(context);
    }
    let raw = obj.cast::<RawContext>();
    // SAFETY: `obj` is a live `Context` (checked) laid out as `RawContext` (`ENABLED`); the GIL
    // is held (`_py`). Only its fields are read.
    let alone = unsafe {
        ffi::Py_REFCNT(obj) == 1
            && (*raw).ctx_entered == 0
            && (*raw).ctx_prev.is_null()
            && (*raw).ctx_weakreflist.is_null()
    };
    if !alone {
        return Err(context);
    }
    let vars = {
        let Some(mut pool) = POOL.try_borrow_for_gc() else {
            return Err(context);
        };
        let len = pool.len;
        if len == POOL_CAPACITY {
            return Err(context);
        }
        // SAFETY: the caller's reference is the only one (checked), so nothing else can see the
        // context while it is untracked and its variables are taken out; a tracked one is
        // untracked first (a `Context` is a GC type). Its reference moves into the pool.
        unsafe {
            if !untracked {
                ffi::PyObject_GC_UnTrack(obj.cast());
            }
            let vars = ptr::replace(&raw mut (*raw).ctx_vars, ptr::null_mut());
            pool.contexts[len] = raw;
            pool.len = len + 1;
            std::mem::forget(context);
            vars
        }
    };
    // Released with the pool free again: this can run arbitrary code.
    if !vars.is_null() {
        // SAFETY: the reference the context held, now ours; the GIL is held.
        unsafe { ffi::Py_DECREF(vars) };
    }
    Ok(())
}
