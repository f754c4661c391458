//! `Handle` and `TimerHandle`: what `call_soon`, `call_later` and `add_reader` return, and what
//! the loop runs.
//!
//! Invariants:
//! - Only the loop creates handles (no `__new__`), so `context` is always a `contextvars.Context`
//!   and `loop_` is always the owning loop, except for the one `detached()` handle (`None` for
//!   both), which is created cancelled, so nothing ever reads them.
//! - The ready queue holds `Ready` entries: handles, and C Task steps and wake-ups that
//!   `call_soon` queued without a handle (it returns the `detached()` one for them).
//! - `inner.callback`/`inner.args` are `Some` until `cancel()` (which drops them, as asyncio does,
//!   to break reference cycles early) or the garbage collector's `__clear__`.
//! - A `TimerHandle`'s `timer_id` is `u64::MAX` unless it sits in its loop's timer heap; only the
//!   loop thread changes it (on schedule, fire, cancel, close).
//! - A `TimerHandle` in its loop's timer heap is not tracked by the garbage collector
//!   (it is made so: `new_timer_handle(.., false)`); it is tracked again when it comes out
//!   (`unscheduled`: fired, cancelled, or the heap drained). Meanwhile the loop's
//!   traversal visits what the handle references in its place (`visit_scheduled`), so cycles
//!   through an unreachable loop and its pending timers are still found. The collector's passes
//!   over a large heap of pending timers (one per `call_later`, every timeout) cost that much
//!   less: each visit of a handle is one traversal of the loop, not a tracked object of its own.
//! - The same holds one level down for the context of such a waiting handle (a timer in the
//!   heap, a handle in the injector or the ready queue) when it is the copy of the caller's
//!   context that the loop made for it (no `context=`): `make_handle` keeps it untracked with
//!   the handle (`context_untracked` set) and it is tracked again with it (`track_again`, from
//!   `unscheduled`, the injector's drains and `Queued`'s drop), and meanwhile the loop's
//!   traversal runs the context's own `tp_traverse` in its
//!   place. Should anything else take a reference to it meanwhile (`get_context()`), it is
//!   visited as a plain reference instead, a no-op while it is untracked: what it references
//!   then counts as held from outside (kept alive), and is never visited twice. A `Context` must
//!   be tracked when it is freed (its `tp_dealloc` unlinks it unchecked), so `Drop for Handle`
//!   tracks it again if the flag is still set. Each waiting handle's context copy was a tracked
//!   object of its own, which every collection of the young generations and every full one
//!   walked: 100k pending timers cost 6,230 instructions each to schedule, 4,294 with this.
//! - The same holds for a `Handle` that `call_soon_threadsafe` queued from another thread while
//!   it waits in the loop's injector (made untracked, `visit_injected` in the loop's
//!   traversal; moved to the ready queue as it is, where the next rule takes over, or tracked
//!   again with `track_again` when the loop drops the injector's contents): a
//!   thread pushing faster than the loop drains leaves thousands of handles there, and the
//!   collector's passes over them cost about a third of each push before.
//! - The same holds for a `call_soon` handle (and a `call_soon_threadsafe` one made on the loop's
//!   thread) while it waits in the ready queue: it is made untracked (`new_handle(.., false)`),
//!   with its own context copy, and the loop's traversal visits it in place (`Ready::visit`).
//!   Whichever way its entry leaves the queue (run, skipped as cancelled, dropped by `close()` or
//!   the loop's `tp_clear`), `Queued`'s drop tracks it again, with its context, if anything else
//!   still references it (the caller kept it, or the exception handler did). While it runs its
//!   entry is out of the queue and nothing visits it in place: what it references then only
//!   looks referenced from outside, which keeps it alive, never frees it. One the entry held
//!   alone is kept whole for the next handle (`handle_alloc::release_sole`). Every collection
//!   of the young generation walked each queued handle (one per callback) and linking and
//!   unlinking it touched its neighbours in the collector's list.
//! - A `Handle` value is dropped only with the GIL held (its `tp_dealloc`, `release_sole`, or the
//!   loop code that made it), so `Drop for Handle` releases its references with a plain decref;
//!   a context only it referenced goes back to `context_pool` (which untracks it) instead of
//!   being freed.
//! - `native` is set only for a callback of a type in `native_call.rs`'s table with no argument or
//!   one, and calling it does what calling the callback from Python would.

use std::ffi::{c_int, c_void};
use std::mem::ManuallyDrop;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use pyo3::exceptions::{PyKeyboardInterrupt, PySystemExit};
use pyo3::ffi;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;
use pyo3::{Borrowed, PyTraverseError};

use crate::cell::LoopCell;
use crate::event_loop::LoopCore;
use crate::handle_threadsafe::{wait_while_running, RunState, Running};
use crate::hooks;
use crate::native_call::NativeCall;

/// A callback's positional arguments. None and one argument are kept without a tuple:
/// `call_soon(cb)` and `call_soon(cb, arg)` are the common shapes (every done callback of a C
/// `Future`, `fut.set_result` scheduled with its value), and the call is made with vectorcall, so
/// no tuple is allocated, referenced or freed for them.
pub(crate) enum CallArgs {
    /// No arguments (asyncio's `_args` is the empty tuple).
    Empty,
    One(Py<PyAny>),
    /// Two or more arguments (or an empty tuple, if a caller built one).
    Tuple(Py<PyTuple>),
}

impl CallArgs {
    /// From an argument tuple; no argument or a single one is taken out of it.
    pub(crate) fn from_tuple(args: Bound<'_, PyTuple>) -> PyResult<Self> {
        Ok(match args.len() {
            0 => Self::Empty,
            1 => Self::One(args.get_item(0)?.unbind()),
            _ => Self::Tuple(args.unbind()),
        })
    }

    /// Whether there are no arguments.
    pub(crate) fn is_empty(&self, py: Python<'_>) -> bool {
        match self {
            Self::Empty => true,
            Self::One(_) => false,
            Self::Tuple(t) => t.bind(py).is_empty(),
        }
    }

    /// The arguments as a tuple (asyncio's `Handle._args`); made anew for a single argument.
    pub(crate) fn to_tuple(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        match self {
            Self::Empty => Ok(PyTuple::empty(py).unbind()),
            Self::One(a) => Ok(PyTuple::new(py, [a])?.unbind()),
            Self::Tuple(t) => Ok(t.clone_ref(py)),
        }
    }

    fn clone_ref(&self, py: Python<'_>) -> Self {
        match self {
            Self::Empty => Self::Empty,
            Self::One(a) => Self::One(a.clone_ref(py)),
            Self::Tuple(t) => Self::Tuple(t.clone_ref(py)),
        }
    }

    /// A `Bound` copy, to call with after the handle's state is released (dropping a `Bound`
    /// is a plain decref; a `Py` drop checks a thread-local GIL counter first).
    fn bind_clone<'py>(&self, py: Python<'py>) -> BoundArgs<'py> {
        match self {
            Self::Empty => BoundArgs::Empty,
            Self::One(a) => BoundArgs::One(a.bind(py).clone()),
            Self::Tuple(t) => BoundArgs::Tuple(t.bind(py).clone()),
        }
    }

    /// The object the collector visits for the arguments (null for none).
    fn gc_ref(&self) -> *mut ffi::PyObject {
        match self {
            Self::Empty => ptr::null_mut(),
            Self::One(a) => a.as_ptr(),
            Self::Tuple(t) => t.as_ptr(),
        }
    }
}

/// `callback(arg)` by vectorcall, with the slot before the argument free for the callee
/// (`PY_VECTORCALL_ARGUMENTS_OFFSET`: a bound method puts `self` there instead of building a new
/// argument array). PyO3's `call1` wraps the same call in a tuple conversion: about 35
/// instructions more per call under callgrind.
pub(crate) fn call_one<'py>(
    callback: &Bound<'py, PyAny>,
    arg: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = callback.py();
    let mut slots = [std::ptr::null_mut(), arg.as_ptr()];
    // SAFETY: we hold the GIL (`py`); `callback` and `arg` are live for the call; `slots[1..]`
    // is one argument and `slots[0]` may be overwritten by the callee, which the offset flag
    // allows (the array is ours and is not read afterwards).
    unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            ffi::PyObject_Vectorcall(
                callback.as_ptr(),
                slots.as_mut_ptr().add(1),
                1 | ffi::PY_VECTORCALL_ARGUMENTS_OFFSET,
                std::ptr::null_mut(),
            ),
        )
    }
}

/// `CallArgs` held for one call.
enum BoundArgs<'py> {
    Empty,
    One(Bound<'py, PyAny>),
    Tuple(Bound<'py, PyTuple>),
}

impl<'py> BoundArgs<'py> {
    /// The arguments of a native call (`native_call.rs`): none or one.
    fn single(&self) -> Option<&Bound<'py, PyAny>> {
        match self {
            Self::One(a) => Some(a),
            Self::Empty | Self::Tuple(_) => None,
        }
    }

    /// `callback(*args)`.
    fn call(&self, callback: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Self::Empty => callback.call0(),
            Self::One(a) => call_one(callback, a),
            Self::Tuple(t) if t.is_empty() => callback.call0(),
            Self::Tuple(t) => callback.call1(t),
        }
    }
}

#[derive(Default)]
struct Inner {
    callback: Option<Py<PyAny>>,
    args: Option<CallArgs>,
    /// The repr frozen at cancel time in debug mode (asyncio's `_repr`).
    repr: Option<Py<PyAny>>,
}

#[pyclass(module = "ferroloop", name = "Handle", subclass, frozen, weakref)]
pub struct Handle {
    // `ManuallyDrop`: taken apart by `Drop for Handle` (no second pass over the emptied state).
    inner: ManuallyDrop<LoopCell<Inner>>,
    cancelled: AtomicBool,
    /// `call_soon_threadsafe`'s handles: whether the callback runs now (`handle_threadsafe`).
    run_state: RunState,
    /// The direct call for a native callback (`native_call.rs`), found when the handle is made.
    native: Option<NativeCall>,
    // `ManuallyDrop`: released by `Drop for Handle` with a plain decref.
    context: ManuallyDrop<Py<PyAny>>,
    /// Set while the loop keeps `context` out of the collector's lists (a waiting handle's own
    /// context copy: see the module invariants).
    context_untracked: AtomicBool,
    loop_: ManuallyDrop<Py<PyAny>>,
    source_traceback: Option<Py<PyAny>>,
}

/// A handle is dropped only with the GIL held: in its `tp_dealloc`, or by the loop code that
/// made it and failed to wrap it in a Python object (every such path holds a `Python` token).
/// So its references are released as `Bound`s, a plain decref; PyO3's `Py` drop first reads a
/// thread-local GIL counter (`__tls_get_addr` in a shared library), which cost about 45
/// instructions per `call_soon` handle under callgrind.
impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: see above: whoever drops a Handle holds the GIL.
        let py = unsafe { Python::assume_attached() };
        // SAFETY: this is the handle's drop; none of the three fields is used again.
        let (inner, context, loop_) = unsafe {
            (
                ManuallyDrop::take(&mut self.inner),
                ManuallyDrop::take(&mut self.context),
                ManuallyDrop::take(&mut self.loop_),
            )
        };
        let Inner {
            callback,
            args,
            repr,
        } = inner.into_inner();
        if let Some(callback) = callback {
            drop(callback.into_bound(py));
        }
        match args {
            Some(CallArgs::One(a)) => drop(a.into_bound(py)),
            Some(CallArgs::Tuple(t)) => drop(t.into_bound(py)),
            Some(CallArgs::Empty) | None => {}
        }
        if let Some(repr) = repr {
            drop(repr.into_bound(py));
        }
        // A context nothing else references is kept for the next copy (`context_pool`),
        // tracked or not.
        let untracked = self.context_untracked.load(Ordering::Relaxed);
        if let Err(context) = crate::context_pool::recycle(py, context, untracked) {
            // A `Context` must be tracked when it is freed (its `tp_dealloc` unlinks it from
            // the collector's list unchecked); one that is untracked here (see the module
            // invariants) is referenced elsewhere too, so this is a safety net.
            if untracked {
                gc_track(&context);
            }
            drop(context.into_bound(py));
        }
        drop(loop_.into_bound(py));
    }
}

impl Handle {
    pub(crate) fn new(
        py: Python<'_>,
        callback: Py<PyAny>,
        args: CallArgs,
        context: Py<PyAny>,
        loop_: Py<PyAny>,
        source_traceback: Option<Py<PyAny>>,
    ) -> Self {
        let native = crate::native_call::lookup(callback.bind(py), &args);
        Self {
            inner: ManuallyDrop::new(LoopCell::new(Inner {
                callback: Some(callback),
                args: Some(args),
                repr: None,
            })),
            cancelled: AtomicBool::new(false),
            run_state: RunState::default(),
            context_untracked: AtomicBool::new(false),
            native,
            context: ManuallyDrop::new(context),
            loop_: ManuallyDrop::new(loop_),
            source_traceback,
        }
    }

    /// A cancelled handle that holds nothing but `None`: the `detached()` one, and the sample
    /// `handle_alloc` measures a `TimerHandle`'s layout with.
    pub(crate) fn inert(py: Python<'_>) -> Self {
        Self {
            inner: ManuallyDrop::new(LoopCell::new(Inner::default())),
            cancelled: AtomicBool::new(true),
            run_state: RunState::default(),
            context_untracked: AtomicBool::new(false),
            native: None,
            context: ManuallyDrop::new(py.None()),
            loop_: ManuallyDrop::new(py.None()),
            source_traceback: None,
        }
    }

    /// Marks the handle's context as kept out of the collector's lists with the handle: a reused
    /// copy (`context_pool`) the handle alone references, for a handle made untracked (see the
    /// module invariants).
    pub(crate) fn set_context_untracked(&self) {
        self.context_untracked.store(true, Ordering::Relaxed);
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// A `call_soon_threadsafe` handle: `cancel()` and `cancelled()` from another thread wait
    /// for a running callback (`handle_threadsafe`).
    pub(crate) fn mark_threadsafe(&self) {
        self.run_state.mark_threadsafe();
    }

    /// Runs the callback in the handle's context. Returns `Err` only for `KeyboardInterrupt` and
    /// `SystemExit` (which stop the loop, as in asyncio) or for a failing exception handler;
    /// every other exception goes to the loop's exception handler.
    pub(crate) fn run(slf: &Bound<'_, Handle>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let (callback, args) = {
            let g = this.inner.borrow(py)?;
            match (&g.callback, &g.args) {
                // Bound clones: dropping them is a plain decref (a `Py` drop checks a
                // thread-local GIL counter first).
                (Some(c), Some(a)) => (c.bind(py).clone(), a.bind_clone(py)),
                _ => return Ok(()),
            }
        };
        let context = this.context.bind(py);
        // A threadsafe handle counts as running until the call returned (handle_threadsafe).
        let _running = this
            .run_state
            .is_threadsafe()
            .then(|| Running::begin(py, &this.run_state));
        let result = if is_context(context) {
            run_in_context(context, || match this.native {
                Some(native) => native(&callback, args.single()),
                None => args.call(&callback).map(drop),
            })
        } else {
            // asyncio runs `self._context.run(self._callback, *self._args)` whatever `context=`
            // was given: an object with a `run` method works, anything else fails there (an
            // AttributeError for the exception handler).
            call_context_run(context, &callback, &args)
        };
        match result {
            Ok(()) => Ok(()),
            Err(e) => report_failure(slf.as_any(), &this.loop_, e),
        }
    }

    pub(crate) fn loop_obj(&self) -> &Py<PyAny> {
        &self.loop_
    }

    fn clear_call(&self, py: Python<'_>, freeze_repr: Option<Py<PyAny>>) {
        let dropped = {
            let Ok(mut g) = self.inner.borrow(py) else {
                return;
            };
            if freeze_repr.is_some() {
                g.repr = freeze_repr;
            }
            (g.callback.take(), g.args.take())
        };
        drop(dropped);
    }

    fn cancel_base(&self, py: Python<'_>, as_object: &Bound<'_, PyAny>) -> PyResult<()> {
        if self.cancelled.swap(true, Ordering::Relaxed) {
            return Ok(());
        }
        // In debug mode asyncio keeps the repr of the cancelled handle for post-mortems.
        let debug = match self.loop_.bind(py).cast::<LoopCore>() {
            Ok(core) => core.get().debug(),
            Err(_) => self
                .loop_
                .bind(py)
                .call_method0(intern!(py, "get_debug"))?
                .is_truthy()?,
        };
        let frozen = if debug {
            Some(as_object.repr()?.into_any().unbind())
        } else {
            None
        };
        self.clear_call(py, frozen);
        Ok(())
    }
}

/// Whether `obj` is a `contextvars.Context` (a final type: no subclass can exist).
fn is_context(obj: &Bound<'_, PyAny>) -> bool {
    obj.get_type().as_ptr() == (&raw mut ffi::PyContext_Type).cast()
}

/// `context.run(callback, *args)` through Python, for a `context=` that is not a `Context`.
fn call_context_run<'py>(
    context: &Bound<'py, PyAny>,
    callback: &Bound<'py, PyAny>,
    args: &BoundArgs<'py>,
) -> PyResult<()> {
    let py = context.py();
    let mut all = vec![callback.clone()];
    match args {
        BoundArgs::Empty => {}
        BoundArgs::One(a) => all.push(a.clone()),
        BoundArgs::Tuple(t) => all.extend(t.iter()),
    }
    context
        .getattr(intern!(py, "run"))?
        .call1(PyTuple::new(py, all)?)
        .map(drop)
}

/// `context.run(call)` without a bound method: `PyContext_Enter`, the call, `PyContext_Exit`.
pub(crate) fn run_in_context(
    context: &Bound<'_, PyAny>,
    call: impl FnOnce() -> PyResult<()>,
) -> PyResult<()> {
    let py = context.py();
    let ctx = context.as_ptr();
    // SAFETY: we hold the GIL (`py`), and `ctx` is a live object kept alive by `context`.
    // PyContext_Enter type-checks it and fails cleanly if it is already entered.
    if unsafe { ffi::PyContext_Enter(ctx) } < 0 {
        return Err(PyErr::fetch(py));
    }
    let r = call();
    // SAFETY: we entered `ctx` just above on this thread and still hold the GIL, so it is the
    // current context and exiting it cannot fail.
    unsafe { ffi::PyContext_Exit(ctx) };
    r
}

/// An entry of the loop's ready queue.
pub(crate) enum Ready {
    /// A `Handle` (or `TimerHandle`): from `call_soon`, a due timer, a ready fd.
    Handle(Queued),
    /// A C Task's step (no argument) or wake-up (the awaited future), queued by `call_soon`
    /// without a `Handle` object (see `LoopCore::call_soon_impl`): run as
    /// `context.run(step, *arg)`.
    Step {
        step: Py<PyAny>,
        arg: Option<Py<PyAny>>,
        context: Py<PyAny>,
    },
    /// A `ferroloop.Task`'s step (`task.rs`), run in the task's context; `throw` is the
    /// exception to throw into its coroutine, if any.
    Task {
        task: Py<crate::task::Task>,
        throw: Option<Py<PyAny>>,
    },
    /// Native work on a Python object, run as `run(target)` without a context of its own: the
    /// server's deferred start of a request (`server/conn.rs`). Failures are reported as a
    /// Rust-handed task's are.
    Call {
        target: Py<PyAny>,
        run: fn(&Bound<'_, PyAny>) -> PyResult<()>,
    },
}

impl From<Py<Handle>> for Ready {
    fn from(handle: Py<Handle>) -> Self {
        Self::Handle(Queued(ManuallyDrop::new(handle)))
    }
}

/// A handle in the ready queue. A `call_soon` handle is made untracked by the collector and the
/// loop's traversal visits what it references in its place (see the module invariants); however
/// the entry leaves the queue (run, skipped, dropped at close), dropping it tracks the handle
/// again, with its context, if anything else still references it.
pub(crate) struct Queued(ManuallyDrop<Py<Handle>>);

impl Queued {
    pub(crate) fn bind<'a, 'py>(&'a self, py: Python<'py>) -> &'a Bound<'py, Handle> {
        self.0.bind(py)
    }
}

/// Entries are dropped with the GIL held (by the loop's code, or the loop's `tp_clear` and
/// `tp_dealloc`), so the handle is released with a plain decref.
impl Drop for Queued {
    fn drop(&mut self) {
        // SAFETY: see above.
        let py = unsafe { Python::assume_attached() };
        // SAFETY: this is the entry's drop; the field is not used again.
        let handle = unsafe { ManuallyDrop::take(&mut self.0) }.into_bound(py);
        let obj = handle.as_ptr();
        // SAFETY: the GIL is held and `obj` is alive (we hold a reference); a handle is a GC type.
        if unsafe { crate::gc_head::is_tracked(obj) } {
            return drop(handle);
        }
        // SAFETY: the GIL is held and `obj` is alive (we hold a reference).
        if unsafe { ffi::Py_REFCNT(obj) } > 1 {
            track_again(handle.as_unbound(), handle.get());
            drop(handle);
        } else {
            crate::handle_alloc::release_sole(handle);
        }
    }
}

impl Ready {
    /// Runs a `Step` entry (a `Handle` entry runs through `Handle::run`); errors as there.
    pub(crate) fn run_step(
        loop_: &Bound<'_, PyAny>,
        step: &Bound<'_, PyAny>,
        arg: Option<&Bound<'_, PyAny>>,
        context: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let py = loop_.py();
        let result = run_in_context(context, || {
            match arg {
                None => step.call0(),
                Some(a) => call_one(step, a),
            }
            .map(drop)
        });
        let Err(e) = result else {
            return Ok(());
        };
        if e.is_instance_of::<PyKeyboardInterrupt>(py) || e.is_instance_of::<PySystemExit>(py) {
            return Err(e);
        }
        // The report names a handle, as for any callback: made now, on this cold path.
        let args = match arg {
            None => CallArgs::Empty,
            Some(a) => CallArgs::One(a.clone().unbind()),
        };
        let handle = Bound::new(
            py,
            Handle::new(
                py,
                step.clone().unbind(),
                args,
                context.clone().unbind(),
                loop_.clone().unbind(),
                None,
            ),
        )?;
        report_failure(handle.as_any(), &loop_.clone().unbind(), e)
    }

    /// Runs a `Task` entry; a failure goes to the exception handler as a callback's would.
    pub(crate) fn run_task(
        loop_: &Bound<'_, PyAny>,
        task: &Bound<'_, crate::task::Task>,
        throw: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let py = loop_.py();
        let Err(e) = crate::task::Task::run_queued(task, throw) else {
            return Ok(());
        };
        if e.is_instance_of::<PyKeyboardInterrupt>(py) || e.is_instance_of::<PySystemExit>(py) {
            return Err(e);
        }
        let step = crate::task::Task::step_callable(task)?;
        let context = task.call_method0(intern!(py, "get_context"))?;
        let handle = Bound::new(
            py,
            Handle::new(
                py,
                step.unbind(),
                CallArgs::Empty,
                context.unbind(),
                loop_.clone().unbind(),
                None,
            ),
        )?;
        report_failure(handle.as_any(), &loop_.clone().unbind(), e)
    }

    pub(crate) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self {
            Self::Handle(h) => visit_in_place(&h.0, h.0.get(), visit),
            Self::Step { step, arg, context } => {
                visit.call(step)?;
                visit.call(arg)?;
                visit.call(context)
            }
            Self::Task { task, throw } => {
                visit.call(task)?;
                visit.call(throw)
            }
            Self::Call { target, .. } => visit.call(target),
        }
    }
}

static DETACHED: PyOnceLock<Py<Handle>> = PyOnceLock::new();

/// What `call_soon` returns for a C Task's step or wake-up, which it queues without a handle: one
/// shared handle, already cancelled and without a callback, so `cancel()` on it does nothing.
/// `_asyncio` is what passes those to `call_soon`, and it drops the result unread.
pub(crate) fn detached(py: Python<'_>) -> PyResult<Py<Handle>> {
    DETACHED
        .get_or_try_init(py, || Py::new(py, Handle::inert(py)))
        .map(|h| h.clone_ref(py))
}

/// Sends an exception raised by a callback to the loop's exception handler.
pub(crate) fn report_failure(
    handle: &Bound<'_, PyAny>,
    loop_: &Py<PyAny>,
    e: PyErr,
) -> PyResult<()> {
    let py = handle.py();
    if e.is_instance_of::<PyKeyboardInterrupt>(py) || e.is_instance_of::<PySystemExit>(py) {
        return Err(e);
    }
    loop_
        .bind(py)
        .call_method1(intern!(py, "_callback_failed"), (handle, e.into_value(py)))?;
    Ok(())
}

#[pymethods]
impl Handle {
    pub(crate) fn cancel(slf: &Bound<'_, Self>) -> PyResult<()> {
        let this = slf.get();
        wait_while_running(slf.py(), &this.run_state);
        this.cancel_base(slf.py(), slf.as_any())
    }

    fn cancelled(&self, py: Python<'_>) -> bool {
        wait_while_running(py, &self.run_state);
        self.is_cancelled()
    }

    fn get_context(&self, py: Python<'_>) -> Py<PyAny> {
        self.context.clone_ref(py)
    }

    fn _run(slf: &Bound<'_, Self>) -> PyResult<()> {
        Handle::run(slf)
    }

    #[getter]
    fn _callback(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.inner
            .borrow(py)
            .ok()?
            .callback
            .as_ref()
            .map(|c| c.clone_ref(py))
    }

    #[getter]
    fn _args(&self, py: Python<'_>) -> PyResult<Option<Py<PyTuple>>> {
        let Ok(g) = self.inner.borrow(py) else {
            return Ok(None);
        };
        g.args.as_ref().map(|a| a.to_tuple(py)).transpose()
    }

    #[getter]
    fn _cancelled(&self) -> bool {
        self.is_cancelled()
    }

    #[getter]
    fn _loop(&self, py: Python<'_>) -> Py<PyAny> {
        self.loop_.clone_ref(py)
    }

    #[getter]
    fn _context(&self, py: Python<'_>) -> Py<PyAny> {
        self.context.clone_ref(py)
    }

    #[getter]
    fn _source_traceback(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.source_traceback.as_ref().map(|t| t.clone_ref(py))
    }

    #[getter]
    fn _repr(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.inner
            .borrow(py)
            .ok()?
            .repr
            .as_ref()
            .map(|r| r.clone_ref(py))
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        if let Some(r) = slf.get().inner.borrow(py)?.repr.as_ref() {
            return Ok(r.clone_ref(py));
        }
        Ok(hooks::call(py, "handle_repr", (slf,))?.unbind())
    }

    /// What PyO3 would call as `tp_traverse`; [`install_traverse`] replaces that slot with
    /// [`handle_traverse`] at module initialisation, and both visit [`Handle::gc_refs`].
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.visit_refs(&visit)
    }

    fn __clear__(&self) {
        if let Some(mut g) = self.inner.try_borrow_for_gc() {
            let taken = std::mem::take(&mut *g);
            drop(g);
            drop(taken);
        }
    }
}

impl Handle {
    /// Every reference the handle holds, null where unset, for the collector: the callback, its
    /// arguments and the frozen repr (skipped while the state is borrowed: skipping only keeps
    /// objects alive), the context, the loop and the source traceback.
    fn gc_refs(&self) -> [*mut ffi::PyObject; 6] {
        let opt = |o: Option<&Py<PyAny>>| o.map_or(ptr::null_mut(), Py::as_ptr);
        let mut refs = [
            ptr::null_mut(),
            ptr::null_mut(),
            ptr::null_mut(),
            self.context.as_ptr(),
            self.loop_.as_ptr(),
            opt(self.source_traceback.as_ref()),
        ];
        if let Some(g) = self.inner.try_borrow_for_gc() {
            refs[0] = opt(g.callback.as_ref());
            refs[1] = g.args.as_ref().map_or(ptr::null_mut(), CallArgs::gc_ref);
            refs[2] = opt(g.repr.as_ref());
        }
        refs
    }
}

impl Handle {
    /// Visits every reference the handle holds (not its type), in its place: a context the
    /// loop keeps out of the collector's lists, and that nothing else references, is traversed
    /// in place too (what it references is visited, not the context).
    fn visit_refs(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        let context = self.context.as_ptr();
        for r in self.gc_refs() {
            if r.is_null() {
                continue;
            }
            if r == context && self.context_untracked.load(Ordering::Relaxed) {
                // SAFETY: `context` is a live `Context` this handle holds a reference to; the
                // collector runs with the GIL held.
                let alone =
                    unsafe { !crate::gc_head::is_tracked(context) && ffi::Py_REFCNT(context) == 1 };
                if alone {
                    traverse_in_place(context, visit)?;
                    continue;
                }
                // Someone else holds it too (`get_context()`): visiting it is a no-op while it
                // is untracked, so what it references counts as referenced from outside (kept
                // alive), never twice.
            }
            // SAFETY: `r` is a live object the handle holds a reference to; the `Bound` made from it
            // is never dropped, so no reference count changes.
            let obj = ManuallyDrop::new(unsafe { Bound::from_owned_ptr(visit_py(), r) });
            visit.call(obj.as_unbound())?;
        }
        Ok(())
    }
}

/// Runs `obj`'s own `tp_traverse` with the loop's visitor: what `obj` references is visited as
/// if the loop referenced it.
fn traverse_in_place(obj: *mut ffi::PyObject, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
    struct Forward<'a, 'b> {
        visit: &'a PyVisit<'b>,
        error: Option<PyTraverseError>,
    }
    unsafe extern "C" fn forward(obj: *mut ffi::PyObject, arg: *mut c_void) -> c_int {
        // SAFETY: `arg` is the `Forward` below, alive for the `tp_traverse` call.
        let state = unsafe { &mut *arg.cast::<Forward<'_, '_>>() };
        // SAFETY: `obj` is a live object the traversed one references (never NULL: `Py_VISIT`
        // skips NULLs); the `Bound` is never dropped, so no reference count changes.
        let obj = ManuallyDrop::new(unsafe { Bound::from_owned_ptr(visit_py(), obj) });
        match state.visit.call(obj.as_unbound()) {
            Ok(()) => 0,
            Err(e) => {
                state.error = Some(e);
                1
            }
        }
    }
    // SAFETY: `obj` is alive (the handle references it) and its type's `tp_traverse` is called
    // as the collector would call it, with a visitor and its argument; the collector runs with
    // the GIL held.
    let Some(traverse) = (unsafe { (*ffi::Py_TYPE(obj)).tp_traverse }) else {
        return Ok(());
    };
    let mut state = Forward { visit, error: None };
    // SAFETY: as above; `state` outlives the call.
    let ret = unsafe { traverse(obj, forward, ptr::from_mut(&mut state).cast()) };
    match state.error {
        Some(e) if ret != 0 => Err(e),
        _ => Ok(()),
    }
}

/// Tracks a handle's context again if it was kept untracked with the handle (`make_handle`):
/// when the handle is tracked again. Called with the GIL held.
fn track_own_context(handle: &Handle) {
    if handle.context_untracked.swap(false, Ordering::Relaxed) {
        gc_track(&handle.context);
    }
}

/// A waiting handle (`obj`, whose `Handle` part is `handle`) that left its waiting place while
/// something else still references it: tracked by the collector again, with its own context
/// copy if that waited untracked with it (see the module invariants). Called with the GIL held.
pub(crate) fn track_again<T>(obj: &Py<T>, handle: &Handle) {
    track_own_context(handle);
    gc_track(obj);
}

/// Puts `obj` (a handle, or a waiting handle's context) back in the collector's lists if it is
/// not in them. Only the loop's code calls it, with the GIL held.
pub(crate) fn gc_track<T>(obj: &Py<T>) {
    let obj = obj.as_ptr();
    // SAFETY: the GIL is held; `obj` is alive and fully initialised (referenced) and of a GC
    // type; `PyObject_GC_Track` runs only on an untracked object (tracking twice aborts).
    unsafe {
        if !crate::gc_head::is_tracked(obj) {
            ffi::PyObject_GC_Track(obj.cast());
        }
    }
}

/// A timer handle that left its loop's heap (fired, cancelled, drained): marked not scheduled,
/// and tracked by the collector again, with its context if that was untracked (see the module
/// invariants). Called by the loop's code, with the GIL held.
pub(crate) fn unscheduled(timer: &Py<TimerHandle>) {
    timer.get().set_timer_id(NOT_SCHEDULED);
    // SAFETY: the loop's code calls this with the GIL held.
    let py = unsafe { Python::assume_attached() };
    track_again(timer, timer.bind(py).as_super().get());
}

/// The loop's traversal of a timer in its heap: the handle itself while the collector tracks
/// it, else what the handle references, in its place (never both: a reference visited twice
/// could make a live object look unreachable).
pub(crate) fn visit_scheduled(
    timer: &Py<TimerHandle>,
    visit: &PyVisit<'_>,
) -> Result<(), PyTraverseError> {
    // SAFETY: as in `handle_traverse`: `timer` is a live `TimerHandle`, whose `Handle` part is
    // laid out as PyO3 laid out `Handle`'s, and the class is frozen.
    let handle: &Handle = unsafe {
        Borrowed::from_ptr(visit_py(), timer.as_ptr())
            .cast_unchecked::<Handle>()
            .get()
    };
    visit_in_place(timer, handle, visit)
}

/// What a queue of the loop's visits for a handle it holds: the handle while the collector
/// tracks it, else what the handle references, in its place (never both: a reference visited
/// twice could make a live object look unreachable).
fn visit_in_place<T>(
    obj: &Py<T>,
    handle: &Handle,
    visit: &PyVisit<'_>,
) -> Result<(), PyTraverseError> {
    // SAFETY: the collector runs with the GIL held and the loop holds a reference to `obj`.
    if unsafe { crate::gc_head::is_tracked(obj.as_ptr()) } {
        return visit.call(obj);
    }
    handle.visit_refs(visit)
}

/// The loop's traversal of a handle waiting in its injector (see the module invariants).
pub(crate) fn visit_injected(
    handle: &Py<Handle>,
    visit: &PyVisit<'_>,
) -> Result<(), PyTraverseError> {
    visit_in_place(handle, handle.get(), visit)
}

/// A `Python` token inside a traversal, which runs with the GIL held.
fn visit_py() -> Python<'static> {
    // SAFETY: only called from `tp_traverse`, which the collector runs with the GIL held; the
    // token is used for pointer conversions only, never to run Python code.
    unsafe { Python::assume_attached() }
}

/// `visit(obj, arg)` for a set pointer; the visitor's non-zero result stops the traversal.
fn visit_raw(obj: *mut ffi::PyObject, visit: ffi::visitproc, arg: *mut c_void) -> c_int {
    if obj.is_null() {
        return 0;
    }
    // SAFETY: `visit` and `arg` are the pair the collector passed to `tp_traverse`, and `obj` is
    // a live object the handle holds a reference to.
    unsafe { visit(obj, arg) }
}

/// The `tp_traverse` of `Handle` and `TimerHandle` (set by [`install_traverse`]), in place of
/// PyO3's. PyO3's wraps the class's `__traverse__` in a panic guard, two thread-local writes and a
/// search of the base types for theirs, and a `TimerHandle` goes through it twice (its own level,
/// then `Handle`'s): under callgrind about 100 instructions per handle visit, paid for every
/// scheduled timer in each collection of the generation that holds the loop (the loop visits its
/// timer heap and ready queue). This visits the same references: the instance's heap type, as
/// PyO3's does for a class whose base is `object`, then what `Handle::__traverse__` visits
/// (`TimerHandle` adds no references): the callback, its arguments, the frozen repr, the
/// context, the loop and the source traceback.
unsafe extern "C" fn handle_traverse(
    obj: *mut ffi::PyObject,
    visit: ffi::visitproc,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: the collector runs with the GIL held; `obj` is a live `Handle` or an instance of a
    // subclass (`TimerHandle`, or a Python subclass whose `subtype_traverse` calls this), so its
    // `Handle` part is laid out as PyO3 laid out `Handle`'s; the handle is frozen, so a shared
    // reference to it is all PyO3 would give `__traverse__`.
    let handle: &Handle = unsafe {
        Borrowed::from_ptr(visit_py(), obj)
            .cast_unchecked::<Handle>()
            .get()
    };
    // SAFETY: `Py_TYPE` of a live object; instances of heap types hold a reference to theirs.
    let ty = unsafe { ffi::Py_TYPE(obj) }.cast::<ffi::PyObject>();
    let refs = std::iter::once(ty).chain(handle.gc_refs());
    for r in refs {
        let ret = visit_raw(r, visit, arg);
        if ret != 0 {
            return ret;
        }
    }
    0
}

/// Makes [`handle_traverse`] the `tp_traverse` of `Handle` and `TimerHandle`. Called once, at
/// module initialisation.
pub(crate) fn install_traverse(py: Python<'_>) {
    for tp in [
        <Handle as pyo3::PyTypeInfo>::type_object_raw(py),
        <TimerHandle as pyo3::PyTypeInfo>::type_object_raw(py),
    ] {
        // SAFETY: both are heap types created by PyO3, whose slots are ours to set, with the GIL
        // held; the new function visits what PyO3's did (see `handle_traverse`).
        unsafe { (*tp).tp_traverse = Some(handle_traverse) };
    }
}

#[pyclass(module = "ferroloop", name = "TimerHandle", extends = Handle, frozen)]
pub struct TimerHandle {
    when: f64,
    /// `when` as `call_at` was given it, when that was an int (or a bool): asyncio's `when()`
    /// hands back what it was given. An int refers to nothing, so there is nothing to traverse.
    given_int: Option<Py<PyAny>>,
    timer_id: AtomicU64,
}

pub(crate) const NOT_SCHEDULED: u64 = u64::MAX;

impl TimerHandle {
    pub(crate) fn new(when: f64) -> Self {
        Self {
            when,
            given_int: None,
            timer_id: AtomicU64::new(NOT_SCHEDULED),
        }
    }

    /// A timer at `when`, which `when()` reports as `given`, the int it was scheduled with.
    pub(crate) fn with_given_int(when: f64, given: Py<PyAny>) -> Self {
        Self {
            given_int: Some(given),
            ..Self::new(when)
        }
    }

    /// The deadline on the loop clock, as a float.
    pub(crate) fn deadline(&self) -> f64 {
        self.when
    }

    fn when_object(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match &self.given_int {
            Some(given) => given.clone_ref(py),
            None => self.when.into_pyobject(py)?.into_any().unbind(),
        })
    }

    pub(crate) fn set_timer_id(&self, bits: u64) {
        self.timer_id.store(bits, Ordering::Relaxed);
    }

    pub(crate) fn take_timer_id(&self) -> u64 {
        self.timer_id.swap(NOT_SCHEDULED, Ordering::Relaxed)
    }
}

#[pymethods]
impl TimerHandle {
    fn when(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.when_object(py)
    }

    #[getter]
    fn _when(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.when_object(py)
    }

    #[getter]
    fn _scheduled(&self) -> bool {
        self.timer_id.load(Ordering::Relaxed) != NOT_SCHEDULED
    }

    fn cancel(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let base = slf.as_super();
        if !base.get().is_cancelled() {
            let bits = slf.get().take_timer_id();
            if bits != NOT_SCHEDULED {
                let lp = base.get().loop_obj().bind(py);
                if let Ok(core) = lp.cast::<LoopCore>() {
                    core.get().timer_cancelled(py, bits)?;
                }
            }
        }
        base.get().cancel_base(py, base.as_any())
    }

    fn __hash__(&self) -> u64 {
        self.when.to_bits()
    }

    fn __richcmp__(
        slf: &Bound<'_, Self>,
        other: &Bound<'_, PyAny>,
        op: CompareOp,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let Ok(other) = other.cast::<TimerHandle>() else {
            return Ok(py.NotImplemented());
        };
        let (a, b) = (slf.get().when, other.get().when);
        let result = match op {
            CompareOp::Lt => a < b,
            CompareOp::Le => a <= b,
            CompareOp::Gt => a > b,
            CompareOp::Ge => a >= b,
            CompareOp::Eq | CompareOp::Ne => {
                #[allow(clippy::float_cmp, reason = "asyncio compares deadlines exactly")]
                let same = a == b
                    && slf.as_super().get().is_cancelled() == other.as_super().get().is_cancelled()
                    && same_call(slf.as_super().get(), other.as_super().get(), py)?;
                if matches!(op, CompareOp::Eq) {
                    same
                } else {
                    !same
                }
            }
        };
        Ok(pyo3::types::PyBool::new(py, result)
            .to_owned()
            .into_any()
            .unbind())
    }
}

fn same_call(a: &Handle, b: &Handle, py: Python<'_>) -> PyResult<bool> {
    // One lock at a time: `a` and `b` may be the same handle.
    let call_of = |h: &Handle| {
        let Ok(g) = h.inner.borrow(py) else {
            return (None, None);
        };
        (
            g.callback.as_ref().map(|c| c.clone_ref(py)),
            g.args.as_ref().map(|a| a.clone_ref(py)),
        )
    };
    let (ca, aa) = call_of(a);
    let (cb, ab) = call_of(b);
    let as_tuple = |args: Option<CallArgs>| -> PyResult<Option<Py<PyAny>>> {
        args.map(|a| a.to_tuple(py).map(Py::into_any)).transpose()
    };
    let (aa, ab) = (as_tuple(aa)?, as_tuple(ab)?);
    let eq = |x: Option<Py<PyAny>>, y: Option<Py<PyAny>>| -> PyResult<bool> {
        match (x, y) {
            (Some(x), Some(y)) => x.bind(py).eq(y.bind(py)),
            (None, None) => Ok(true),
            _ => Ok(false),
        }
    };
    Ok(eq(ca, cb)? && eq(aa, ab)?)
}
