//! CPython's private internals are a loan: every place ferroloop relies on a private CPython
//! layout, a private function or an interpreter behaviour the C API does not promise is listed
//! here, is checked when the module is initialised, and has a portable fallback (public C API
//! only) that is used when the check fails. A CPython newer than any ferroloop was checked on
//! gets the fallbacks and one `RuntimeWarning`, never an `ImportError`.
//!
//! The loans (name as in `_native.CPYTHON_LOANS`; where; what it buys; check; fallback):
//!
//! - `task_layout` (`task_base.rs`, `task.rs`): `ferroloop.Task` is a subclass of the C
//!   `_asyncio.Task` whose instance layout (`TaskObj`, private to `Modules/_asynciomodule.c`) is
//!   fixed at compile time (176 bytes on 3.11-3.12, 144 on 3.13, 168 on 3.14-3.15), and whose
//!   base part is left zeroed, which the C Task's `tp_dealloc` must tolerate (checked in the
//!   source of each version listed). Buys: about 8,000 instructions per server request and
//!   most of a gathered task's cost. Check: the running version is one whose source was read
//!   (`VERIFIED`), `__basicsize__`, item size, subclassability and where the instance dict
//!   lives. Fallback: `ferroloop._native.Task` is not made; `ferroloop.Task` is `asyncio.Task`,
//!   `create_task`, `ferroloop.task_factory` and the server make asyncio's Tasks.
//! - `gc_header` (`gc_head.rs`): whether the collector tracks an object, read from the word
//!   before the object (`PyGC_Head._gc_next`, `Include/internal/pycore_gc.h`) instead of calling
//!   `PyObject_GC_IsTracked`, for every handle leaving the ready queue. Check: the word agrees
//!   with the function on a live list, tracked and untracked. Fallback: the function.
//! - `context_layout` (`context_pool.rs`): `contextvars.Context` objects reused for the copies
//!   the loop makes of the caller's context, which reads and writes a `Context`'s fields
//!   (`Include/internal/pycore_context.h`) and the thread state's `context` pointer (an offset
//!   in `PyThreadState` that depends on the minor version). Buys about 85 instructions per
//!   callback. Check: sizes, offsets and entering/exiting a context observed on live objects.
//!   Fallback: `PyContext_CopyCurrent` for every copy, nothing pooled.
//! - `handle_reuse` (`handle_alloc.rs`): a dead `Handle`'s memory (a GC object, untracked) made
//!   into a new handle with `PyObject_Init` and `PyObject_GC_Track`, and a live one kept whole
//!   without `tp_dealloc`: an interpreter behaviour the C API does not promise (that nothing
//!   else is kept per object outside its memory), read in each listed version's
//!   `Objects/object.c` and `Python/gc.c`. Buys about 500 instructions per callback. Check: a
//!   verified version and the `Handle` type's layout against a live instance. Fallback: PyO3's
//!   allocation and `tp_dealloc` for every handle.
//! - `current_tasks_dict` (`task.rs`, `Registry`): on 3.11-3.13 the running task of each loop
//!   is in the private dict `_asyncio._current_tasks`, written directly. Check: the dict exists
//!   and `_asyncio._enter_task` is the one `asyncio.tasks` uses. Fallback: calling
//!   `_enter_task`/`_leave_task`. From 3.14 asyncio keeps the running task in the thread state
//!   and there is no dict: nothing to borrow, no warning.
//! - `task_registry` (`task_registry.rs`, `python/ferroloop/_task_registry.py`): on 3.11-3.13
//!   asyncio registers each task in a private `weakref.WeakSet`, whose `add` ferroloop replaces
//!   with a native one (reading the set's private attributes). Check: on the Python side
//!   (exact `WeakSet`, a listed version). Fallback: the set left alone. 3.14 registers tasks in
//!   a per-thread linked list: nothing to borrow.
//! - `private_functions` (`private_fn.rs`): `_PyType_Lookup` (the MRO lookup through the type
//!   cache, for the TLS protocol's slots), `_PyObject_GetMethod` (the interpreter's method load,
//!   for `own_call_soon` on every task step: it reads the instance's attributes without making
//!   its dict, which would cost the loop its specialised method loads on 3.12 and 3.13) and
//!   `_PyBytes_Resize` (shrinking a fresh bytes object after `recv`), exported but private.
//!   Looked up with `dlsym` instead of linked, so that a CPython without them still imports the
//!   module. Check: the symbol is found. Fallback: the MRO walked through `__mro__` and each
//!   class's `__dict__`; `getattr` and a comparison with the loop's cached bound method; a copy
//!   of the bytes received.
//! - `cached_call_soon` (`cached_method.rs`): `Loop.call_soon` and the other hot methods
//!   (`call_later`, `call_at`, `create_future`, `create_task`, `time`) are type objects with a
//!   `tp_vectorcall`, which the specialising interpreter calls straight from its
//!   `CALL_BUILTIN_CLASS` instruction (73 instructions per callback), and which bind once per
//!   loop. Correct under any interpreter (it only uses the public vectorcall protocol); only its
//!   speed is borrowed, so there is nothing to check, and it is turned off only when the
//!   fallbacks are forced. Fallback: plain method descriptors.
//!
//! Not loans (public, if not limited, API compiled from the version's own headers by pyo3-ffi):
//! the fields of `PyTypeObject`, `PyMethodDescrObject.d_method`, `PyGetSetDescrObject.d_getset`,
//! `PyMemberDescrObject.d_member` and `PyCFunctionObject.m_ml`, each read only after an exact
//! type check. `gil.rs` guards against a behaviour (threads ended with `pthread_exit` at
//! finalization before 3.14) without relying on it.
//!
//! On a free-threaded build (3.14t) the layout loans (`task_layout`, `gc_header`,
//! `context_layout`, `handle_reuse`) are not read nor checked: their fallbacks are used, without
//! a warning, and `CPYTHON_LOANS` says `"fallback: free-threaded build"`.
//!
//! `FERROLOOP_PORTABLE=1` in the environment when the module is first imported forces every
//! fallback (no warning then: it was asked for); `make test-portable` runs the suite so.
//! `FERROLOOP_PORTABLE=unknown-python` makes the import behave as on a CPython newer than every
//! listed one (for the test of that path).
//!
//! Invariants:
//! - Each loan is decided once, by [`take`], while the module is initialised (with the GIL
//!   held, before any object that could use it exists), and never changes afterwards.
//! - A failed check (not a forced fallback) adds one line to the warning that [`warn_failed`]
//!   emits once, at the end of module initialisation. A warning turned into an error by the
//!   user's filters is written to stderr instead: it never fails the import.

use std::ffi::CString;
use std::sync::Mutex;

use pyo3::exceptions::PyRuntimeWarning;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A private CPython internal that ferroloop borrows (see the module documentation).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Loan {
    TaskLayout,
    GcHeader,
    ContextLayout,
    HandleReuse,
    CurrentTasksDict,
    PrivateFunctions,
    CachedCallSoon,
}

/// The CPython minor versions (3.x) whose source each loan was checked against, inclusive;
/// `None` for a loan whose correctness does not depend on the version.
const fn verified(loan: Loan) -> Option<(u8, u8)> {
    match loan {
        Loan::TaskLayout | Loan::GcHeader | Loan::ContextLayout | Loan::HandleReuse => {
            Some((11, 15))
        }
        Loan::CurrentTasksDict => Some((11, 13)),
        Loan::PrivateFunctions | Loan::CachedCallSoon => None,
    }
}

/// Whether the loan was read for free-threaded builds (`Py_GIL_DISABLED`, 3.14t) too. Their
/// object header is larger, GC objects have no `PyGC_Head` before them (the collector finds
/// them in mimalloc's heaps and keeps its bits in the header), and the C Task and `Context`
/// layouts differ: the layout loans were read for the builds with the GIL only, and on a
/// free-threaded one they are not even checked (a check reads memory that may not be what it
/// expects there) but fall back.
const fn read_for_free_threaded(loan: Loan) -> bool {
    match loan {
        Loan::TaskLayout | Loan::GcHeader | Loan::ContextLayout | Loan::HandleReuse => false,
        Loan::CurrentTasksDict | Loan::PrivateFunctions | Loan::CachedCallSoon => true,
    }
}

/// From this minor version on the loan has nothing to borrow (CPython works differently): its
/// fallback is then the normal path, with no warning.
const fn superseded_from(loan: Loan) -> Option<u8> {
    match loan {
        Loan::CurrentTasksDict => Some(14),
        _ => None,
    }
}

impl Loan {
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Self::TaskLayout => "task_layout",
            Self::GcHeader => "gc_header",
            Self::ContextLayout => "context_layout",
            Self::HandleReuse => "handle_reuse",
            Self::CurrentTasksDict => "current_tasks_dict",
            Self::PrivateFunctions => "private_functions",
            Self::CachedCallSoon => "cached_call_soon",
        }
    }

    /// What the fallback gives up, for the warning.
    const fn fallback(self) -> &'static str {
        match self {
            Self::TaskLayout => "ferroloop.Task is asyncio.Task",
            Self::GcHeader => "PyObject_GC_IsTracked",
            Self::ContextLayout => "no context pool",
            Self::HandleReuse => "no handle pool",
            Self::CurrentTasksDict => "_enter_task calls",
            Self::PrivateFunctions => "public lookups",
            Self::CachedCallSoon => "plain method descriptors",
        }
    }
}

/// What was decided for a loan.
enum Outcome {
    Used,
    Forced,
    Superseded,
    /// A layout loan on a free-threaded build: not checked, not used, and no warning (a known
    /// configuration, documented in docs/usage.md, not a CPython ferroloop does not know).
    FreeThreaded,
    Failed(String),
}

/// The decisions, in the order they were made (see the invariants).
static DECIDED: Mutex<Vec<(Loan, Outcome)>> = Mutex::new(Vec::new());

fn record(loan: Loan, outcome: Outcome) {
    if let Ok(mut d) = DECIDED.lock() {
        d.retain(|(l, _)| *l != loan);
        d.push((loan, outcome));
    }
}

/// Whether `FERROLOOP_PORTABLE=1` forces every fallback.
pub(crate) fn forced() -> bool {
    std::env::var_os("FERROLOOP_PORTABLE").is_some_and(|v| v == "1")
}

/// Whether `FERROLOOP_PORTABLE=unknown-python` asks to behave as on a CPython newer than every
/// listed one: each versioned loan fails its check, with the warning a user would see
/// (`tests/native/test_cpython_loans.py` checks that the import then warns once and works).
fn simulate_unknown() -> bool {
    std::env::var_os("FERROLOOP_PORTABLE").is_some_and(|v| v == "unknown-python")
}

/// The running interpreter's minor version (3.x).
fn minor(py: Python<'_>) -> u8 {
    py.version_info().minor
}

/// Decides whether `loan` is used: not when the fallbacks are forced, nor on a version outside
/// the ones it was checked against, nor when `check` (run only otherwise) says why not. Returns
/// whether the loan may be used; records the outcome for [`warn_failed`] and `CPYTHON_LOANS`.
pub(crate) fn take(py: Python<'_>, loan: Loan, check: impl FnOnce() -> Result<(), String>) -> bool {
    let m = if simulate_unknown() {
        u8::MAX
    } else {
        minor(py)
    };
    if forced() {
        record(loan, Outcome::Forced);
        return false;
    }
    if superseded_from(loan).is_some_and(|from| m >= from) {
        record(loan, Outcome::Superseded);
        return false;
    }
    if cfg!(Py_GIL_DISABLED) && !read_for_free_threaded(loan) {
        record(loan, Outcome::FreeThreaded);
        return false;
    }
    if let Some((lo, hi)) = verified(loan) {
        if !(lo..=hi).contains(&m) {
            let why = format!("read on CPython 3.{lo} to 3.{hi} only");
            record(loan, Outcome::Failed(why));
            return false;
        }
    }
    match check() {
        Ok(()) => {
            record(loan, Outcome::Used);
            true
        }
        Err(why) => {
            record(loan, Outcome::Failed(why));
            false
        }
    }
}

/// `_native.CPYTHON_LOANS`: each loan's name and what was decided (`"used"`, `"forced"`,
/// `"not needed"`, or `"fallback: <why>"`).
pub(crate) fn as_dict(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let dict = PyDict::new(py);
    let decided = DECIDED.lock().map_err(|_| {
        pyo3::exceptions::PyRuntimeError::new_err("cpython_loans: a decision panicked")
    })?;
    for (loan, outcome) in decided.iter() {
        let text = match outcome {
            Outcome::Used => "used".to_owned(),
            Outcome::Forced => "forced".to_owned(),
            Outcome::Superseded => "not needed".to_owned(),
            Outcome::FreeThreaded => "fallback: free-threaded build".to_owned(),
            Outcome::Failed(why) => format!("fallback: {why}"),
        };
        dict.set_item(loan.name(), text)?;
    }
    Ok(dict)
}

/// Emits one `RuntimeWarning` naming every loan whose check failed and the running version, if
/// any did. Called once, at the end of module initialisation.
pub(crate) fn warn_failed(py: Python<'_>) {
    let failed: Vec<String> = match DECIDED.lock() {
        Ok(d) => d
            .iter()
            .filter_map(|(loan, outcome)| match outcome {
                Outcome::Failed(why) => {
                    Some(format!("{} ({why}; {})", loan.name(), loan.fallback()))
                }
                _ => None,
            })
            .collect(),
        Err(_) => return,
    };
    if failed.is_empty() {
        return;
    }
    let v = py.version_info();
    let message = format!(
        "ferroloop on CPython {}.{}.{}: portable fallbacks for {} (slower, same behaviour; \
         FERROLOOP_PORTABLE=1 forces them silently)",
        v.major,
        v.minor,
        v.patch,
        failed.join(", ")
    );
    let Ok(c_message) = CString::new(message.clone()) else {
        return;
    };
    let category = py.get_type::<PyRuntimeWarning>();
    if PyErr::warn(py, &category, &c_message, 1).is_err() {
        // The user's filters made the warning an error: an import must not fail for it.
        eprintln!("RuntimeWarning: {message}");
    }
}
