//! `LoopCore`: the native base class of `ferroloop.Loop`. It owns the ready queue, the timer heap,
//! the fd table, the poller and the cross-thread injector, and runs the loop iteration.
//!
//! Threads and ownership:
//! - One loop thread runs `_run_forever_native`. Everything in `state` is touched only with the
//!   GIL held (see `cell.rs`); the GIL is released only around `epoll_wait`, and no lock on
//!   `state` is held across that wait or across a call into Python.
//! - `shared` (poller + injector) is `Sync` and reachable from any thread without the GIL:
//!   `call_soon_threadsafe` and Rust producers (`LoopRemote`) push into the injector, which
//!   wakes the loop only if it sleeps (see `ferroloop_core::inject`).
//!
//! The iteration itself is in `iteration.rs`, the fd table in `fds.rs`, the C API's queued work
//! and registered futures in `native_work.rs`. `close()` deregisters every fd before the poller
//! itself is closed.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferroloop_core::{clock, Events, Injector, Interest, Poller, PushOutcome, TimerId};
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::ffi;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PyInt, PyTuple};
use pyo3::PyTraverseError;

mod fds;
mod iteration;
mod metrics;
pub mod native_work;
mod state;

use fds::fileobj_to_fd;
use native_work::{FutureTable, NativeWork};
pub(crate) use state::DeferredFlush;
use state::State;

use crate::cached_method::CACHED_METHODS;
use crate::cell::LoopCell;
use crate::handle::{CallArgs, Handle, Ready, TimerHandle, NOT_SCHEDULED};
use crate::sock_ops::{Kind, SocketOperation};
use pyo3::buffer::PyUntypedBuffer;

/// Token of the injector's eventfd in the poller; user fds use their own number.
const WAKER_TOKEN: u64 = u64::MAX;

/// asyncio's `_clock_resolution` for `time.monotonic()`.
const CLOCK_RESOLUTION: f64 = 1e-9;

impl LoopCore {
    /// Drops what other threads queued and the loop did not take (close, or the collector
    /// clearing the loop): handles are tracked by the collector again first, as they would be
    /// when drained, since their callers may still hold them.
    fn drop_injected(&self) {
        // Native work is refused from now on, and the registered futures go (native_work.rs).
        let _ = self.shared.injector.seal();
        // SAFETY: every caller holds the GIL (close, tp_clear, tp_dealloc).
        self.shared
            .futures
            .close(unsafe { Python::assume_attached() });
        let mut queued = Vec::new();
        self.shared.injector.drain_into(&mut queued);
        for item in &queued {
            if let Injected::Handle(h) = item {
                crate::handle::track_again(h, h.get());
            }
        }
        drop(queued);
    }
}

impl Drop for LoopCore {
    /// A loop freed by its reference count (no `close()`, no collector): what other threads
    /// queued leaves through `drop_injected` too. `tp_dealloc` runs with the GIL held.
    fn drop(&mut self) {
        self.drop_injected();
    }
}

/// Rust code to run on the loop thread with the GIL.
pub type RustTask = Box<dyn FnOnce(Python<'_>) -> PyResult<()> + Send>;

/// Work handed to the loop from another thread.
pub enum Injected {
    /// A handle from `call_soon_threadsafe`: queued like `call_soon`.
    Handle(Py<Handle>),
    /// Rust code to run on the loop thread with the GIL (the server's path, and `LoopRemote`).
    Task(RustTask),
    /// A C API request (`crate::capi`).
    Native(NativeWork),
}

/// What the loop took in from the injector and runs at step 3b (`take_injected`).
pub enum Taken {
    Rust(RustTask),
    Native(NativeWork),
}

pub struct Shared {
    poller: Poller,
    injector: Injector<Injected>,
    /// Futures registered through the C API, by token (touched only with the GIL).
    futures: FutureTable,
}

/// A cheap, `Send + Sync` way for Rust threads to hand work to a loop without the GIL.
#[derive(Clone)]
pub struct LoopRemote {
    shared: Arc<Shared>,
}

impl LoopRemote {
    /// Queues `task` to run on the loop thread; wakes the loop only if it sleeps.
    pub fn spawn(
        &self,
        task: impl FnOnce(Python<'_>) -> PyResult<()> + Send + 'static,
    ) -> io::Result<PushOutcome> {
        self.shared.injector.push(Injected::Task(Box::new(task)))
    }

    /// Queues a C API request unless the loop is closed (then it comes back, not run).
    pub fn try_native(&self, work: NativeWork) -> Result<(), NativeWork> {
        match self.shared.injector.try_push(Injected::Native(work)) {
            // Queued; a failed eventfd write cannot be undone, and the loop takes the item
            // at its next wake-up anyway.
            Ok(_) => Ok(()),
            Err(ferroloop_core::Sealed(Injected::Native(work))) => Err(work),
            Err(_) => unreachable!("try_push hands back the item it was given"),
        }
    }

    /// GIL held: registers `future` for a native resolve; its token.
    pub fn register_future(&self, py: Python<'_>, future: Py<PyAny>) -> PyResult<u64> {
        self.shared.futures.register(py, future)
    }
}

/// Flags read on every call: atomics, so the hot path takes the state lock once.
#[derive(Default)]
struct Flags {
    closed: AtomicBool,
    stopping: AtomicBool,
    debug: AtomicBool,
    /// `enable_metrics()` was called: the iteration records `State::stats`.
    metrics: AtomicBool,
}

impl Flags {
    fn closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }
    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }
    fn debug(&self) -> bool {
        self.debug.load(Ordering::Relaxed)
    }
    fn metrics(&self) -> bool {
        self.metrics.load(Ordering::Relaxed)
    }
}

// No `dict`: the Python subclass `ferroloop.Loop` gets its own, which CPython lays out as a managed
// dict (`Py_TPFLAGS_MANAGED_DICT`, with its values in shared keys); docs/measurements.md
// ("Measurements formerly in architecture.md", "The native stream transport") says what that
// saves per lookup.
#[pyclass(
    module = "ferroloop._native",
    name = "LoopCore",
    subclass,
    frozen,
    weakref
)]
pub struct LoopCore {
    state: LoopCell<State>,
    flags: Flags,
    shared: Arc<Shared>,
    /// Loop-thread scratch space; never touched by other threads.
    events: Mutex<Events>,
    injected_tasks: Mutex<Vec<Taken>>,
    /// `{"loop": self}`, built once: the keyword arguments of every Future and Task this loop
    /// creates (the C Future's `__init__` only reads them). Visited and cleared by the GC hooks,
    /// since it refers back to the loop.
    future_kwargs: LoopCell<Option<Py<PyDict>>>,
    /// `{"loop": self, "name": ..., "context": ...}`, built once: the keyword arguments of a Task
    /// created with `context=` (every server app task), whose `"context"` (and `"name"`, when
    /// given) is set before each call and reset to `None` after it, instead of copying
    /// `future_kwargs` per task. Visited and
    /// cleared by the GC hooks like `future_kwargs`.
    context_kwargs: LoopCell<Option<Py<PyDict>>>,
    /// asyncio's `_task_factory` attribute (set by `BaseEventLoop.__init__` and
    /// `set_task_factory`, read by `get_task_factory`), held here so that `create_task` reads it
    /// without a Python attribute lookup. Visited and cleared by the GC hooks.
    task_factory: LoopCell<Option<Py<PyAny>>>,
    /// `create_task` without a task factory makes a `ferroloop.Task` (`task.rs`), unless
    /// `FERROLOOP_NATIVE_TASKS=0` was set when the loop was created; asyncio's Task in debug
    /// mode.
    native_tasks: bool,
    /// This loop's bound hot methods (`call_soon`, ...), each handed out by its descriptor
    /// (`cached_method.rs`, by index) to every attribute fetch (the C `Task`/`Future` lookups of
    /// `call_soon`, `getattr`, `functools.partial`) instead of a new method object each time.
    /// Visited and cleared by the GC hooks, dropped by `close()`.
    bound_methods: LoopCell<[Option<Py<PyAny>>; CACHED_METHODS]>,
}

fn closed_error() -> PyErr {
    PyRuntimeError::new_err("Event loop is closed")
}

/// The calling thread's ident, as `threading.get_ident()` reports it.
fn current_thread_ident() -> u64 {
    // SAFETY: pthread_self has no preconditions; CPython's thread ident is this value.
    unsafe { libc::pthread_self() as u64 }
}

/// A copy of the current context (what asyncio does when `context=None`), and whether it is
/// untracked by the collector (a reused one from `context_pool`; the caller must track it unless
/// it keeps it where a traversal visits it in place).
#[inline]
pub(crate) fn current_context(py: Python<'_>) -> PyResult<(Py<PyAny>, bool)> {
    if let Some(reused) = crate::context_pool::copy_current(py) {
        return Ok((reused, true));
    }
    // SAFETY: we hold the GIL; PyContext_CopyCurrent returns a new reference or NULL with an
    // exception set, which `from_owned_ptr_or_err` turns into `Err`.
    unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyContext_CopyCurrent()) }
        .map(|c| (c.unbind(), false))
}

/// What `make_handle` builds a handle from.
struct HandleParts<'a, 'py> {
    /// In debug mode, the method whose callable check applies (`call_soon` and the timers
    /// check, as asyncio's do); `None` for `add_reader`/`add_writer`, which in asyncio build
    /// their `Handle` without one (a non-callable's TypeError reaches the exception handler).
    checked_by: Option<&'a str>,
    callback: &'a Bound<'py, PyAny>,
    args: CallArgs,
    /// `context=` as given (`None` or Python's `None`: a copy of the current context).
    context: Option<&'a Bound<'py, PyAny>>,
    debug: bool,
    /// Whether the handle goes where the loop visits what it references in its place (the ready
    /// queue, the injector, the timer heap) and so waits untracked by the collector.
    waiting: bool,
}

impl LoopCore {
    /// Whether the loop is in debug mode (asyncio's `get_debug()`), without a Python call.
    pub(crate) fn debug(&self) -> bool {
        self.flags.debug()
    }

    /// A copy of the loop's counters (`enable_metrics()`), for the server's `--metrics`.
    pub(crate) fn loop_stats(&self, py: Python<'_>) -> PyResult<ferroloop_core::LoopStats> {
        Ok(self.state.borrow(py)?.stats)
    }

    /// A handle for Rust threads to hand work to this loop.
    pub fn remote(&self) -> LoopRemote {
        LoopRemote {
            shared: Arc::clone(&self.shared),
        }
    }

    /// `{"loop": self}`, built on first use and reused for every Future and Task the loop
    /// creates (their C `__init__` only reads it).
    fn loop_kwargs<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        Self::cached_kwargs(slf, &slf.get().future_kwargs, false)
    }

    /// The loop's bound method number `index` (`cached_method.rs`), made by `bind` on first use;
    /// a closed loop gets a fresh one each time, so nothing is kept after `close()`.
    pub(crate) fn bound_method(
        slf: &Bound<'_, Self>,
        index: usize,
        bind: impl FnOnce() -> PyResult<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let this = slf.get();
        if let Some(bound) = this
            .bound_methods
            .borrow(py)?
            .get(index)
            .and_then(Option::as_ref)
        {
            return Ok(bound.clone_ref(py));
        }
        let bound = bind()?;
        if !this.flags.closed() {
            if let Some(cached) = this.bound_methods.borrow(py)?.get_mut(index) {
                *cached = Some(bound.clone_ref(py));
            }
        }
        Ok(bound)
    }

    /// Whether `obj` is the bound method number `index` this loop hands out (`bound_method`).
    pub(crate) fn is_bound_method(
        slf: &Bound<'_, Self>,
        index: usize,
        obj: &Bound<'_, PyAny>,
    ) -> bool {
        let cached = slf.get().bound_methods.borrow(slf.py());
        cached.is_ok_and(|c| {
            c.get(index)
                .and_then(Option::as_ref)
                .is_some_and(|b| b.is(obj))
        })
    }

    /// `context_kwargs`, built on first use (`"name"` and `"context"` are `None` between calls;
    /// `name=None` is what `Task` takes as no name).
    fn context_kwargs<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        Self::cached_kwargs(slf, &slf.get().context_kwargs, true)
    }

    /// The dict in `cell`, made on first use as `{"loop": self}` (plus `"name": None` and
    /// `"context": None` when `with_context`).
    fn cached_kwargs<'py>(
        slf: &Bound<'py, Self>,
        cell: &LoopCell<Option<Py<PyDict>>>,
        with_context: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let py = slf.py();
        let mut cached = cell.borrow(py)?;
        if let Some(d) = &*cached {
            return Ok(d.bind(py).clone());
        }
        let d = PyDict::new(py);
        d.set_item(intern!(py, "loop"), slf)?;
        if with_context {
            d.set_item(intern!(py, "name"), py.None())?;
            d.set_item(intern!(py, "context"), py.None())?;
        }
        *cached = Some(d.clone().unbind());
        Ok(d)
    }

    /// The Python implementation of a `sock_*` method (`_sockets.SocketOps`), for sockets and
    /// modes the native path does not take.
    fn python_sock_op<'py>(
        slf: &Bound<'py, Self>,
        name: &str,
        args: (&Bound<'py, PyAny>, &Bound<'py, PyAny>),
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let method = crate::hooks::socket_ops(py)?.getattr(name)?;
        Ok(method.call1((slf, args.0, args.1))?.unbind())
    }

    /// Builds the handle `parts` describe (context copied when not given). A copy the loop
    /// made for a `waiting` handle stays out of the collector's lists with it (see handle.rs's
    /// invariants); any other context is tracked.
    #[allow(
        clippy::inline_always,
        reason = "built in place in its caller's handle: -77 instructions per call_soon under callgrind, with new_handle's"
    )]
    #[inline(always)]
    fn make_handle(slf: &Bound<'_, Self>, parts: HandleParts<'_, '_>) -> PyResult<Handle> {
        let py = slf.py();
        let HandleParts {
            checked_by,
            callback,
            args,
            context,
            debug,
            waiting,
        } = parts;
        let source_traceback = if debug {
            if let Some(method) = checked_by {
                slf.call_method1(intern!(py, "_debug_check_callback"), (callback, method))?;
            }
            Some(crate::hooks::call(py, "extract_stack", ())?.unbind())
        } else {
            // As asyncio: outside debug mode a non-callable is accepted here and its TypeError
            // reaches the exception handler when it runs.
            None
        };
        let (context, own_untracked) = match context {
            Some(c) if !c.is_none() => (c.clone().unbind(), false),
            _ => {
                // The loop's own copy: untracked exactly when the handle waits untracked.
                let (copy, untracked) = current_context(py)?;
                if waiting && !untracked {
                    // SAFETY: the GIL is held; `copy` is a new, tracked `Context` (a GC type)
                    // that only we reference.
                    unsafe { ffi::PyObject_GC_UnTrack(copy.as_ptr().cast()) };
                } else if !waiting && untracked {
                    crate::handle::gc_track(&copy);
                }
                (copy, waiting)
            }
        };
        let handle = Handle::new(
            py,
            callback.clone().unbind(),
            args,
            context,
            slf.clone().into_any().unbind(),
            source_traceback,
        );
        if own_untracked {
            handle.set_context_untracked();
        }
        Ok(handle)
    }

    /// A `Handle` (`make_handle`) built in the handle pool's memory (`handle_alloc`): what
    /// `call_soon`, `call_soon_threadsafe` and `add_reader`/`add_writer` return. A `waiting` one
    /// (for the ready queue or the injector) is not tracked by the collector.
    #[allow(
        clippy::inline_always,
        reason = "the call_soon hot path: as make_handle, built in place in its caller"
    )]
    #[inline(always)]
    fn new_pooled_handle(
        slf: &Bound<'_, Self>,
        parts: HandleParts<'_, '_>,
    ) -> PyResult<Py<Handle>> {
        let track = !parts.waiting;
        let handle = Self::make_handle(slf, parts)?;
        crate::handle_alloc::new_handle(slf.py(), handle, track)
    }

    /// Debug mode: a non-thread-safe method called from a thread other than the running loop's.
    fn check_thread(loop_thread: Option<u64>) -> PyResult<()> {
        match loop_thread {
            Some(tid) if tid != current_thread_ident() => Err(PyRuntimeError::new_err(
                "Non-thread-safe operation invoked on an event loop other than the current one",
            )),
            _ => Ok(()),
        }
    }

    fn schedule_timer(
        slf: &Bound<'_, Self>,
        timer: TimerHandle,
        callback: &Bound<'_, PyAny>,
        args: CallArgs,
        context: Option<&Bound<'_, PyAny>>,
        method: &str,
    ) -> PyResult<Py<TimerHandle>> {
        let py = slf.py();
        let this = slf.get();
        if this.flags.closed() {
            return Err(closed_error());
        }
        let debug = this.flags.debug();
        if debug {
            Self::check_thread(this.state.borrow(py)?.thread_id)?;
        }
        let parts = HandleParts {
            checked_by: Some(method),
            callback,
            args,
            context,
            debug,
            waiting: true,
        };
        let base = Self::make_handle(slf, parts)?;
        let when = timer.deadline();
        let timer = crate::handle_alloc::new_timer_handle(py, base, timer, false)?;
        // A NaN `when` compares false with everything: asyncio's heap then finds it not later
        // than the clock and runs it at the next iteration. In the heap's total order a NaN
        // would sort after +inf and never run, so it is keyed as due at once (`when()` still
        // says NaN).
        let key = if when.is_nan() {
            f64::NEG_INFINITY
        } else {
            when
        };
        let id = this
            .state
            .borrow(py)?
            .timers
            .insert(key, timer.clone_ref(py));
        timer.get().set_timer_id(id.to_bits());
        Ok(timer)
    }

    /// `call_soon`, shared by the PyO3 method and the raw fast-call entry (`fastcall.rs`).
    pub(crate) fn call_soon_impl(
        slf: &Bound<'_, Self>,
        callback: &Bound<'_, PyAny>,
        args: CallArgs,
        context: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<Handle>> {
        let py = slf.py();
        let this = slf.get();
        if this.flags.closed() {
            return Err(closed_error());
        }
        let debug = this.flags.debug();
        if debug {
            Self::check_thread(this.state.borrow(py)?.thread_id)?;
        }
        // A C Task's step (`call_soon(step, context=...)`) or wake-up (`call_soon(wakeup, future,
        // context=...)`), which `_asyncio` schedules and whose handle it drops unread, is queued
        // without a Handle: fewer objects allocated, traversed by the collector and freed per
        // task. Not in debug mode, where handles carry tracebacks and slow-callback reports.
        if !debug {
            if let Some(ctx) = context.filter(|c| !c.is_none()) {
                let is_step = match &args {
                    CallArgs::Empty | CallArgs::Tuple(_) => {
                        args.is_empty(py) && crate::hooks::is_task_step(callback)
                    }
                    CallArgs::One(_) => {
                        crate::hooks::is_task_wakeup(callback)
                            || crate::task::is_native_wakeup(callback)
                    }
                };
                if is_step {
                    // The argument moves into the entry; an empty tuple (a caller's) is
                    // released as a `Bound` (a plain decref; a `Py` drop reads a thread-local
                    // first).
                    let arg = match args {
                        CallArgs::One(a) => Some(a),
                        CallArgs::Empty => None,
                        CallArgs::Tuple(t) => {
                            drop(t.into_bound(py));
                            None
                        }
                    };
                    this.queue_step(py, callback.clone().unbind(), arg, ctx.clone().unbind())?;
                    return crate::handle::detached(py);
                }
            }
        }
        let parts = HandleParts {
            checked_by: Some("call_soon"),
            callback,
            args,
            context,
            debug,
            waiting: true,
        };
        let handle = Self::new_pooled_handle(slf, parts)?;
        // Handles other threads queued earlier go first: asyncio has one FIFO for both.
        this.drain_injector(py)?;
        this.state
            .borrow(py)?
            .ready
            .push(handle.clone_ref(py).into());
        Ok(handle)
    }

    /// Queues `context.run(step, *arg)` as a `Ready::Step` entry, without a `Handle`: a C Task's
    /// step or wake-up (`call_soon_impl`), a `ferroloop.Task`'s done callback (`task.rs`).
    /// Handles other threads queued earlier go first, as for `call_soon`.
    pub(crate) fn queue_step(
        &self,
        py: Python<'_>,
        step: Py<PyAny>,
        arg: Option<Py<PyAny>>,
        context: Py<PyAny>,
    ) -> PyResult<()> {
        self.drain_injector(py)?;
        self.state
            .borrow(py)?
            .ready
            .push(Ready::Step { step, arg, context });
        Ok(())
    }

    /// `call_soon(callback, arg, context=context)` for a caller that drops the handle (a
    /// `ferroloop.Task`'s done callbacks, as asyncio's Future drops its own): queued without a
    /// `Handle` (`queue_step`), except in debug mode, where handles carry tracebacks and
    /// slow-callback reports.
    pub(crate) fn call_soon_unseen(
        slf: &Bound<'_, Self>,
        callback: &Bound<'_, PyAny>,
        arg: &Bound<'_, PyAny>,
        context: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let this = slf.get();
        if this.flags.debug() {
            let args = CallArgs::One(arg.clone().unbind());
            return Self::call_soon_impl(slf, callback, args, Some(context)).map(drop);
        }
        if this.flags.closed() {
            return Err(closed_error());
        }
        let (callback, arg) = (callback.clone().unbind(), arg.clone().unbind());
        this.queue_step(slf.py(), callback, Some(arg), context.clone().unbind())
    }

    /// Whether a task factory is set (`set_task_factory`).
    pub(crate) fn has_task_factory(slf: &Bound<'_, Self>) -> PyResult<bool> {
        Ok(slf.get().task_factory.borrow(slf.py())?.is_some())
    }

    /// `create_task`, making a `ferroloop.Task` when `native` (and no task factory or debug
    /// mode says otherwise), else asyncio's C Task; the server asks for either.
    pub(crate) fn create_task_as(
        slf: &Bound<'_, Self>,
        coro: &Bound<'_, PyAny>,
        name: Option<&Bound<'_, PyAny>>,
        context: Option<&Bound<'_, PyAny>>,
        native_default: bool,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let with_options = |kwargs: &Bound<'_, PyDict>| -> PyResult<()> {
            if let Some(name) = name {
                kwargs.set_item(intern!(py, "name"), name)?;
            }
            if let Some(context) = context {
                kwargs.set_item(intern!(py, "context"), context)?;
            }
            Ok(())
        };
        let (factory_set, native) = match &*this.task_factory.borrow(py)? {
            None => (false, native_default),
            Some(f) => (true, crate::hooks::is_native_task_factory(f.bind(py))),
        };
        if native && !this.flags.debug() && crate::task_base::native_tasks() {
            // A `ferroloop.Task`, made without Python calls.
            if this.flags.closed() {
                return Err(closed_error());
            }
            let task =
                crate::task::Task::create(slf, coro, name.cloned(), context.cloned(), None, true)?;
            return Ok(task.into_any().unbind());
        }
        if this.flags.debug() || factory_set {
            let kwargs = PyDict::new(py);
            with_options(&kwargs)?;
            return Ok(crate::hooks::base_create_task(py)?
                .call((slf, coro), Some(&kwargs))?
                .unbind());
        }
        if this.flags.closed() {
            return Err(closed_error());
        }
        if let Some(context) = context {
            // `Task.__init__` parses its keywords before running any code, so a `create_task`
            // reached from inside it finds the dict back at `None`s, as it must be between calls.
            let kwargs = Self::context_kwargs(slf)?;
            let (context_key, name_key) = (intern!(py, "context"), intern!(py, "name"));
            kwargs.set_item(context_key, context)?;
            if let Some(name) = name {
                kwargs.set_item(name_key, name)?;
            }
            let task = crate::hooks::task_type(py)?.call((coro,), Some(&kwargs));
            kwargs.set_item(context_key, py.None())?;
            if name.is_some() {
                kwargs.set_item(name_key, py.None())?;
            }
            return Ok(task?.unbind());
        }
        let mut kwargs = Self::loop_kwargs(slf)?;
        if name.is_some() || context.is_some() {
            kwargs = kwargs.copy()?;
            with_options(&kwargs)?;
        }
        Ok(crate::hooks::task_type(py)?
            .call((coro,), Some(&kwargs))?
            .unbind())
    }

    /// Queues a `ferroloop.Task` step without a handle (`Ready::Task`). `Ok(false)` in debug
    /// mode, where the task goes through `call_soon` so that its steps get handles (tracebacks,
    /// slow-callback reports).
    pub(crate) fn push_task_step(
        slf: &Bound<'_, Self>,
        task: &Bound<'_, crate::task::Task>,
        throw: Option<Py<PyAny>>,
    ) -> PyResult<bool> {
        Self::push_native(slf, || Ready::Task {
            task: task.clone().unbind(),
            throw,
        })
    }

    /// Whether a ready batch is running, so that a write made now may be held back with
    /// `defer_flush` (outside a batch, say before the loop runs, it must go out at once).
    pub(crate) fn batch_running(&self, py: Python<'_>) -> bool {
        self.state.borrow(py).is_ok_and(|st| st.in_batch)
    }

    /// Holds `target`'s output back until the ready batch now running ends, when `flush(target)`
    /// writes it (targets in the order they were deferred). Write coalescing, as uvloop queues
    /// stream writes for its check phase: the responses of a batch leave together, so a peer
    /// process blocked in `epoll_wait` is woken once per batch instead of once per response,
    /// and several writes of one batch to one socket leave in one `send`. The caller defers
    /// each target once (until its flush runs) and only while `batch_running`; `Ok(false)`
    /// when no batch runs, and the caller writes now.
    pub(crate) fn defer_flush(
        &self,
        py: Python<'_>,
        target: &Bound<'_, PyAny>,
        flush: DeferredFlush,
    ) -> PyResult<bool> {
        let mut st = self.state.borrow(py)?;
        if !st.in_batch {
            return Ok(false);
        }
        st.deferred.push((target.clone().unbind(), flush));
        Ok(true)
    }

    /// Queues native work (`Ready::Call`). `Ok(false)` in debug mode, where the caller runs it
    /// now instead (work queued this way has no handle to time or to report under).
    pub(crate) fn push_call(
        slf: &Bound<'_, Self>,
        target: &Bound<'_, PyAny>,
        run: fn(&Bound<'_, PyAny>) -> PyResult<()>,
    ) -> PyResult<bool> {
        Self::push_native(slf, || Ready::Call {
            target: target.clone().unbind(),
            run,
        })
    }

    /// Queues native work (`Ready::Call`) to run at the end of the ready batch now running,
    /// after its other entries and before its held-back writes (`defer_flush`). When no batch
    /// runs, or the batch's end is running already, it is queued as `push_call` is, so work
    /// that such work queues again waits for the next iteration. `Ok(false)` in debug mode, as
    /// `push_call`.
    ///
    /// The HTTP server starts the app of a request it has read this way: in the iteration that
    /// read it, once every connection ready in that iteration has been read, as uvloop runs
    /// what its I/O callbacks scheduled in the same iteration (its check phase). Queued for the
    /// next iteration instead, the start waited for another poll and another read of every
    /// ready connection, a large body's included (`docs/measurements.md`, 2026-11-28).
    pub(crate) fn push_call_at_batch_end(
        slf: &Bound<'_, Self>,
        target: &Bound<'_, PyAny>,
        run: fn(&Bound<'_, PyAny>) -> PyResult<()>,
    ) -> PyResult<bool> {
        let this = slf.get();
        if !this.flags.closed() && !this.flags.debug() {
            let mut st = this.state.borrow(slf.py())?;
            if st.in_batch && !st.in_batch_end {
                st.batch_end.push(Ready::Call {
                    target: target.clone().unbind(),
                    run,
                });
                return Ok(true);
            }
        }
        Self::push_call(slf, target, run)
    }

    /// Queues an entry made without a `Handle`, unless the loop is in debug mode (`Ok(false)`).
    fn push_native(slf: &Bound<'_, Self>, entry: impl FnOnce() -> Ready) -> PyResult<bool> {
        let py = slf.py();
        let this = slf.get();
        if this.flags.closed() {
            return Err(closed_error());
        }
        if this.flags.debug() {
            return Ok(false);
        }
        // Handles other threads queued earlier go first, as in `call_soon`.
        this.drain_injector(py)?;
        this.state.borrow(py)?.ready.push(entry());
        Ok(true)
    }

    /// `call_later`, shared by the PyO3 method and the fast-call entry (`fastcall.rs`).
    pub(crate) fn call_later_impl(
        slf: &Bound<'_, Self>,
        delay: &Bound<'_, PyAny>,
        callback: &Bound<'_, PyAny>,
        args: CallArgs,
        context: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<TimerHandle>> {
        if delay.is_none() {
            return Err(PyTypeError::new_err("delay must not be None"));
        }
        let now = clock::monotonic();
        let when = if delay.is_instance_of::<PyFloat>() || delay.is_instance_of::<PyInt>() {
            now + delay.extract::<f64>()?
        } else {
            // asyncio computes `self.time() + delay`: a Fraction works, while a Decimal or an
            // object with only `__float__` or `__index__` is a TypeError there, not a float.
            PyFloat::new(slf.py(), now).add(delay)?.extract::<f64>()?
        };
        Self::schedule_timer(
            slf,
            TimerHandle::new(when),
            callback,
            args,
            context,
            "call_later",
        )
    }

    /// `call_at`, shared by the PyO3 method and the fast-call entry (`fastcall.rs`).
    pub(crate) fn call_at_impl(
        slf: &Bound<'_, Self>,
        when: &Bound<'_, PyAny>,
        callback: &Bound<'_, PyAny>,
        args: CallArgs,
        context: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<TimerHandle>> {
        if when.is_none() {
            return Err(PyTypeError::new_err("when cannot be None"));
        }
        // asyncio keeps `when` as given and `when()` returns it: an int stays an int. Only an
        // exact int or bool is kept (a subclass could carry a `__dict__` leading back here).
        let given_int = (when.is_exact_instance_of::<PyInt>()
            || when.is_exact_instance_of::<pyo3::types::PyBool>())
        .then(|| when.clone().unbind());
        let when: f64 = when.extract()?;
        let timer = match given_int {
            Some(given) => TimerHandle::with_given_int(when, given),
            None => TimerHandle::new(when),
        };
        Self::schedule_timer(slf, timer, callback, args, context, "call_at")
    }

    /// Called by `TimerHandle.cancel()`: takes the timer out of the heap at once.
    pub(crate) fn timer_cancelled(&self, py: Python<'_>, bits: u64) -> PyResult<()> {
        if bits == NOT_SCHEDULED {
            return Ok(());
        }
        let removed = self
            .state
            .borrow(py)?
            .timers
            .remove(TimerId::from_bits(bits));
        if let Some(timer) = &removed {
            crate::handle::unscheduled(timer);
        }
        drop(removed);
        Ok(())
    }
}

#[pymethods]
impl LoopCore {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn py_new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let shared = Shared {
            poller: Poller::new()?,
            injector: Injector::new()?,
            futures: FutureTable::default(),
        };
        shared
            .poller
            .add(shared.injector.as_raw_fd(), WAKER_TOKEN, Interest::READ)?;
        Ok(Self {
            state: LoopCell::new(State::default()),
            flags: Flags::default(),
            shared: Arc::new(shared),
            events: Mutex::new(Events::with_capacity(64)),
            injected_tasks: Mutex::new(Vec::new()),
            future_kwargs: LoopCell::new(None),
            context_kwargs: LoopCell::new(None),
            task_factory: LoopCell::new(None),
            native_tasks: std::env::var_os("FERROLOOP_NATIVE_TASKS").is_none_or(|v| v != "0"),
            bound_methods: LoopCell::new(Default::default()),
        })
    }

    #[allow(clippy::unused_self, reason = "a Python method receives the loop")]
    pub(crate) fn time(&self) -> f64 {
        clock::monotonic()
    }

    #[pyo3(signature = (callback, *args, context=None))]
    fn call_soon(
        slf: &Bound<'_, Self>,
        callback: &Bound<'_, PyAny>,
        args: Bound<'_, PyTuple>,
        context: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Py<Handle>> {
        Self::call_soon_impl(slf, callback, CallArgs::from_tuple(args)?, context.as_ref())
    }

    #[pyo3(signature = (callback, *args, context=None))]
    fn call_soon_threadsafe(
        slf: &Bound<'_, Self>,
        callback: &Bound<'_, PyAny>,
        args: Bound<'_, PyTuple>,
        context: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Py<Handle>> {
        let py = slf.py();
        let this = slf.get();
        if this.flags.closed() {
            return Err(closed_error());
        }
        let debug = this.flags.debug();
        let parts = HandleParts {
            checked_by: Some("call_soon_threadsafe"),
            callback,
            args: CallArgs::from_tuple(args)?,
            context: context.as_ref(),
            debug,
            waiting: true,
        };
        let handle = Self::make_handle(slf, parts)?;
        handle.mark_threadsafe();
        let handle = crate::handle_alloc::new_handle(py, handle, false)?;
        let tid = this.state.borrow(py)?.thread_id;
        if tid.is_none_or(|t| t == current_thread_ident()) {
            // On the loop's own thread (or a loop nobody runs) nothing can be asleep in epoll:
            // queue directly, after anything injected earlier, so FIFO holds as in asyncio.
            this.drain_injector(py)?;
            this.state
                .borrow(py)?
                .ready
                .push(handle.clone_ref(py).into());
        } else {
            // Out of the collector's lists while queued (made so), with its own context copy
            // (see handle.rs).
            let queued = Injected::Handle(handle.clone_ref(py));
            let Some(ticket) = this.shared.injector.push_deferred(queued) else {
                return Ok(handle);
            };
            // The loop sleeps in epoll with the GIL released; the eventfd is written without
            // the GIL (as asyncio's self-pipe `send` is), so the woken loop finds it free and
            // runs the callback at once, instead of blocking on it until this thread lets go
            // (on a shared core: a switch back here and a second wake-up). Wake latency p50
            // 13.7 -> 7.0 us in benchmarks/loop/threadsafe.py; a producer pushing a stream keeps
            // its throughput, as only the push that finds the loop asleep writes.
            crate::gil::detach(py, || ticket.wake_and_wait())?;
        }
        Ok(handle)
    }

    #[pyo3(signature = (delay, callback, *args, context=None))]
    fn call_later(
        slf: &Bound<'_, Self>,
        delay: &Bound<'_, PyAny>,
        callback: &Bound<'_, PyAny>,
        args: Bound<'_, PyTuple>,
        context: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Py<TimerHandle>> {
        Self::call_later_impl(
            slf,
            delay,
            callback,
            CallArgs::from_tuple(args)?,
            context.as_ref(),
        )
    }

    #[pyo3(signature = (when, callback, *args, context=None))]
    fn call_at(
        slf: &Bound<'_, Self>,
        when: &Bound<'_, PyAny>,
        callback: &Bound<'_, PyAny>,
        args: Bound<'_, PyTuple>,
        context: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Py<TimerHandle>> {
        Self::call_at_impl(
            slf,
            when,
            callback,
            CallArgs::from_tuple(args)?,
            context.as_ref(),
        )
    }

    /// `asyncio.Future(loop=self)`, without a Python frame in between.
    pub(crate) fn create_future(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let kwargs = Self::loop_kwargs(slf)?;
        let future_type = crate::hooks::future_type(py)?;
        let no_args = PyTuple::empty(py);
        if let Some(made) = construct(future_type, &no_args, &kwargs) {
            return made.map(Bound::unbind);
        }
        // SAFETY: we hold the GIL; the type, the empty tuple and the dict are live for the call.
        // (PyO3's `call` converts its arguments first: about 40 instructions more.)
        unsafe {
            Bound::from_owned_ptr_or_err(
                py,
                ffi::PyObject_Call(future_type.as_ptr(), no_args.as_ptr(), kwargs.as_ptr()),
            )
        }
        .map(Bound::unbind)
    }

    /// A `ferroloop.Task` (`task.rs`), or with `FERROLOOP_NATIVE_TASKS=0`
    /// `asyncio.Task(coro, loop=self, name=name, context=context)`; a task factory (other than
    /// `ferroloop.task_factory`) or debug mode goes through asyncio's own `create_task`. Other
    /// keywords (3.14's `eager_start=`, or any a task factory takes) go to asyncio's own
    /// `create_task` too, which passes them to the factory or the Task (3.14), or refuses them
    /// as the running asyncio does (3.11 to 3.13).
    #[pyo3(signature = (coro, *, name=None, context=None, **kwargs))]
    pub(crate) fn create_task(
        slf: &Bound<'_, Self>,
        coro: &Bound<'_, PyAny>,
        name: Option<&Bound<'_, PyAny>>,
        context: Option<&Bound<'_, PyAny>>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        if let Some(kwargs) = kwargs.filter(|k| !k.is_empty()) {
            let py = slf.py();
            let all = kwargs.copy()?;
            if let Some(name) = name {
                all.set_item(intern!(py, "name"), name)?;
            }
            if let Some(context) = context {
                all.set_item(intern!(py, "context"), context)?;
            }
            return Ok(crate::hooks::base_create_task(py)?
                .call((slf, coro), Some(&all))?
                .unbind());
        }
        Self::create_task_as(slf, coro, name, context, slf.get().native_tasks)
    }

    /// `sock.recv(n)` as an awaitable that finishes without a Future when data is there
    /// (`sock_ops.rs`); other socket types and debug mode use `_sockets.SocketOps`.
    fn sock_recv(
        slf: &Bound<'_, Self>,
        sock: &Bound<'_, PyAny>,
        n: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        if slf.get().flags.debug() || !crate::hooks::is_plain_socket(sock)? {
            return Self::python_sock_op(slf, "sock_recv", (sock, n));
        }
        // Anything but a non-negative int fails inside the coroutine, as in asyncio.
        let Ok(n) = n.extract::<usize>() else {
            return Self::python_sock_op(slf, "sock_recv", (sock, n));
        };
        Ok(SocketOperation::new(py, slf, sock, Kind::Recv { n })?.into_any())
    }

    /// `sock.recv_into(buf)` as an awaitable; see `sock_recv`.
    fn sock_recv_into(
        slf: &Bound<'_, Self>,
        sock: &Bound<'_, PyAny>,
        buf: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        if slf.get().flags.debug() || !crate::hooks::is_plain_socket(sock)? {
            return Self::python_sock_op(slf, "sock_recv_into", (sock, buf));
        }
        match PyUntypedBuffer::get(buf) {
            Ok(view) if !view.readonly() && view.is_c_contiguous() => {
                Ok(SocketOperation::new(py, slf, sock, Kind::RecvInto { buf: view })?.into_any())
            }
            // Read-only or strided buffers: the Python path raises socket's own errors.
            _ => Self::python_sock_op(slf, "sock_recv_into", (sock, buf)),
        }
    }

    /// `sock.sendall(data)` as an awaitable; see `sock_recv`.
    fn sock_sendall(
        slf: &Bound<'_, Self>,
        sock: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        if slf.get().flags.debug() || !crate::hooks::is_plain_socket(sock)? {
            return Self::python_sock_op(slf, "sock_sendall", (sock, data));
        }
        match PyUntypedBuffer::get(data) {
            Ok(view) if view.is_c_contiguous() => {
                let kind = Kind::SendAll {
                    data: view,
                    sent: 0,
                };
                Ok(SocketOperation::new(py, slf, sock, kind)?.into_any())
            }
            _ => Self::python_sock_op(slf, "sock_sendall", (sock, data)),
        }
    }

    /// `add_reader` that returns the handle (asyncio's `_add_reader`); `context=` (asyncio
    /// 3.15's transports pass theirs) is the context the callback runs in.
    #[pyo3(signature = (fd, callback, *args, context=None))]
    fn _add_reader(
        slf: &Bound<'_, Self>,
        fd: &Bound<'_, PyAny>,
        callback: &Bound<'_, PyAny>,
        args: Bound<'_, PyTuple>,
        context: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<Handle>> {
        Self::set_fd_handle_as(slf, fd, callback, args, false, None, context)
    }

    #[pyo3(signature = (fd, callback, *args, context=None))]
    fn _add_writer(
        slf: &Bound<'_, Self>,
        fd: &Bound<'_, PyAny>,
        callback: &Bound<'_, PyAny>,
        args: Bound<'_, PyTuple>,
        context: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<Handle>> {
        Self::set_fd_handle_as(slf, fd, callback, args, true, None, context)
    }

    #[pyo3(signature = (fd, callback, *args))]
    fn add_reader(
        slf: &Bound<'_, Self>,
        fd: &Bound<'_, PyAny>,
        callback: &Bound<'_, PyAny>,
        args: Bound<'_, PyTuple>,
    ) -> PyResult<()> {
        Self::ensure_no_transport(slf, fd)?;
        Self::set_fd_handle(slf, fd, callback, args, false).map(drop)
    }

    #[pyo3(signature = (fd, callback, *args))]
    fn add_writer(
        slf: &Bound<'_, Self>,
        fd: &Bound<'_, PyAny>,
        callback: &Bound<'_, PyAny>,
        args: Bound<'_, PyTuple>,
    ) -> PyResult<()> {
        Self::ensure_no_transport(slf, fd)?;
        Self::set_fd_handle(slf, fd, callback, args, true).map(drop)
    }

    fn remove_reader(slf: &Bound<'_, Self>, fd: &Bound<'_, PyAny>) -> PyResult<bool> {
        Self::ensure_no_transport(slf, fd)?;
        Self::remove_fd_handle(slf, fd, false)
    }

    fn remove_writer(slf: &Bound<'_, Self>, fd: &Bound<'_, PyAny>) -> PyResult<bool> {
        Self::ensure_no_transport(slf, fd)?;
        Self::remove_fd_handle(slf, fd, true)
    }

    /// `remove_reader` without the transport check (asyncio's `_remove_reader`, which transports
    /// call for their own fd).
    fn _remove_reader(slf: &Bound<'_, Self>, fd: &Bound<'_, PyAny>) -> PyResult<bool> {
        Self::remove_fd_handle(slf, fd, false)
    }

    /// `remove_writer` without the transport check.
    fn _remove_writer(slf: &Bound<'_, Self>, fd: &Bound<'_, PyAny>) -> PyResult<bool> {
        Self::remove_fd_handle(slf, fd, true)
    }

    /// Whether `fd` has a reader or writer registered (for tests and `_ensure_fd_no_transport`).
    fn _fd_registered(&self, py: Python<'_>, fd: &Bound<'_, PyAny>) -> PyResult<(bool, bool)> {
        let fd = fileobj_to_fd(fd)?;
        let st = self.state.borrow(py)?;
        Ok(st
            .fds
            .get(&fd)
            .map_or((false, false), |e| (e.reader.is_some(), e.writer.is_some())))
    }

    fn stop(&self) -> PyResult<()> {
        self.flags.stopping.store(true, Ordering::Relaxed);
        // From another thread (not asyncio API, but common): make a sleeping loop notice.
        let _ = self.shared.injector.wake_if_sleeping()?;
        Ok(())
    }

    fn is_running(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.state.borrow(py)?.thread_id.is_some())
    }

    fn is_closed(&self) -> bool {
        self.flags.closed()
    }

    /// asyncio's `get_debug()`. Native because the C `Future.__init__` (so every Future and
    /// Task) calls it: inherited from `BaseEventLoop` it ran a Python frame, about 700
    /// instructions per task under callgrind. `set_debug` stays asyncio's and writes `_debug`.
    fn get_debug(&self) -> bool {
        self.flags.debug()
    }

    /// Starts counting the loop's iterations, polls, busy time and timer lag (`metrics()`);
    /// idempotent. Off by default: a loop nobody measures pays one flag test per iteration.
    fn enable_metrics(&self, py: Python<'_>) -> PyResult<()> {
        metrics::enable(self, py)
    }

    /// A snapshot of the counters `enable_metrics()` started, as a dict (`metrics.rs`).
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        metrics::snapshot(self, py)
    }

    #[getter(_closed)]
    fn attr_closed(&self) -> bool {
        self.flags.closed()
    }

    #[setter(_closed)]
    fn set_attr_closed(&self, value: bool) {
        self.flags.closed.store(value, Ordering::Relaxed);
    }

    #[getter(_stopping)]
    fn attr_stopping(&self) -> bool {
        self.flags.stopping()
    }

    #[setter(_stopping)]
    fn set_attr_stopping(&self, value: bool) {
        self.flags.stopping.store(value, Ordering::Relaxed);
    }

    #[getter(_debug)]
    fn attr_debug(&self) -> bool {
        self.flags.debug()
    }

    /// asyncio's `set_debug(enabled)` stores whatever it is given and tests its truth later
    /// (`set_debug(1)`, `set_debug(os.environ.get(...))`), so any object is taken by its truth.
    #[setter(_debug)]
    fn set_attr_debug(&self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.flags
            .debug
            .store(value.is_truthy()?, Ordering::Relaxed);
        Ok(())
    }

    #[getter(_task_factory)]
    fn attr_task_factory(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let factory = self.task_factory.borrow(py)?;
        Ok(factory
            .as_ref()
            .map_or_else(|| py.None(), |f| f.clone_ref(py)))
    }

    #[setter(_task_factory)]
    fn set_attr_task_factory(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let new = (!value.is_none()).then(|| value.clone().unbind());
        // The old factory is dropped after the borrow ends: dropping it may run Python code.
        let old = std::mem::replace(&mut *self.task_factory.borrow(py)?, new);
        drop(old);
        Ok(())
    }

    #[getter(_thread_id)]
    fn attr_thread_id(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        Ok(self.state.borrow(py)?.thread_id)
    }

    #[setter(_thread_id)]
    fn set_attr_thread_id(&self, py: Python<'_>, value: Option<u64>) -> PyResult<()> {
        self.state.borrow(py)?.thread_id = value;
        Ok(())
    }

    /// Number of handles waiting in the ready queue (asyncio's `len(loop._ready)`).
    fn _ready_count(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.state.borrow(py)?.ready.len())
    }

    /// Number of scheduled (not cancelled, not fired) timers.
    fn _timer_count(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.state.borrow(py)?.timers.len())
    }

    /// One iteration, which always polls for I/O (a test hook, as asyncio's `_run_once`).
    fn _run_once(slf: &Bound<'_, Self>) -> PyResult<()> {
        Self::run_once(slf, false)
    }

    /// The loop proper; the Python `run_forever` sets up and tears down around it.
    fn _run_forever_native(slf: &Bound<'_, Self>) -> PyResult<()> {
        let _counted = crate::gil::LoopThread::enter();
        slf.get().state.borrow(slf.py())?.poll_budget.force();
        loop {
            crate::gil::park_if_exiting(slf.py());
            Self::run_once(slf, true)?;
            if slf.get().flags.stopping() {
                return Ok(());
            }
        }
    }

    /// Drops every queued handle and timer and leaves the poller; the fds themselves belong to
    /// their owners. Called by `Loop.close()`.
    fn _close_native(&self, py: Python<'_>) -> PyResult<()> {
        let (ready, timers, fds) = {
            let mut st = self.state.borrow(py)?;
            self.flags.closed.store(true, Ordering::Relaxed);
            st.parked.clear();
            let fds: Vec<_> = st.fds.drain().collect();
            for (fd, _) in &fds {
                self.shared.poller.delete(*fd)?;
            }
            (st.ready.drain(), st.timers.drain(), fds)
        };
        for t in &timers {
            crate::handle::unscheduled(t);
        }
        drop((ready, timers, fds));
        self.drop_injected();
        // The epoll fd and the eventfd go now, as asyncio's close() closes its selector and
        // self-pipe: a closed loop that stays referenced holds no fd. Nothing polls or
        // registers on a closed loop (every path checks `closed` first).
        let _ = self.shared.poller.delete(self.shared.injector.as_raw_fd());
        self.shared.injector.close();
        self.shared.poller.close();
        let bound = std::mem::take(&mut *self.bound_methods.borrow(py)?);
        drop(bound);
        Ok(())
    }

    /// Test and benchmark probe of the Rust wake path: a Rust thread (no GIL) pushes `n` tasks;
    /// each calls `callback(i, t_push)` on the loop thread, `t_push` being the loop clock when the
    /// task was pushed.
    fn _spawn_rust_producer(&self, callback: Py<PyAny>, n: usize, interval_us: u64) {
        let remote = self.remote();
        let callback = Arc::new(callback);
        std::thread::spawn(move || {
            for i in 0..n {
                let cb = Arc::clone(&callback);
                let pushed = clock::monotonic();
                let _ = remote.spawn(move |py| {
                    cb.call1(py, (i, pushed))?;
                    Ok(())
                });
                if interval_us > 0 {
                    std::thread::sleep(Duration::from_micros(interval_us));
                }
            }
        });
    }

    /// Called by `Loop.close()` before the loop is marked closed: refuses further C API work
    /// and runs what was accepted (native_work.rs).
    fn _close_remotes(slf: &Bound<'_, Self>) -> PyResult<()> {
        Self::close_remotes(slf)
    }

    /// Test probe: how many futures registered through the C API wait for their resolve.
    fn _remote_futures_pending(&self) -> usize {
        self.shared.futures.pending()
    }

    /// Test probe: other threads have queued work the loop has not taken in yet.
    fn _injector_pending(&self) -> bool {
        self.shared.injector.has_pending()
    }

    /// Benchmark and test probe: how long ready work may run between two polls for I/O, in
    /// seconds (`ferroloop_core::poll_budget`; 0 polls on every iteration, as asyncio does).
    /// Returns the previous value.
    fn _set_poll_interval(&self, py: Python<'_>, seconds: f64) -> PyResult<f64> {
        let budget = &mut self.state.borrow(py)?.poll_budget;
        let old = budget.interval();
        budget.set_interval(seconds);
        Ok(old)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        // A running loop is reachable (the frame of its `run_forever` holds it), so nothing its
        // queues hold can be garbage now: the waiting handles and timers, which only this
        // traversal visits (they wait untracked), are skipped, and whatever they reference counts
        // as held from outside, which keeps it alive, never frees it. The flag cannot change
        // during a collection (it changes only with the GIL held, in Python code). A full
        // collection during a burst of `call_soon_threadsafe` visited every queued handle:
        // about a third of each call's instructions on the producing thread (callgrind).
        let mut running = false;
        if let Some(st) = self.state.try_borrow_for_gc() {
            running = st.thread_id.is_some();
            if !running {
                for entry in st.ready.iter() {
                    entry.visit(&visit)?;
                }
                for t in st.timers.iter() {
                    crate::handle::visit_scheduled(t, &visit)?;
                }
            }
            for e in st.fds.values() {
                visit.call(&e.fileobj)?;
                visit.call(&e.reader)?;
                visit.call(&e.writer)?;
                visit.call(&e.owner)?;
            }
            for (target, _) in &st.deferred {
                visit.call(target)?;
            }
        }
        self.shared.futures.traverse(&visit)?;
        if let Some(kw) = self.future_kwargs.try_borrow_for_gc() {
            visit.call(&*kw)?;
        }
        if let Some(kw) = self.context_kwargs.try_borrow_for_gc() {
            visit.call(&*kw)?;
        }
        if let Some(factory) = self.task_factory.try_borrow_for_gc() {
            visit.call(&*factory)?;
        }
        if let Some(bound) = self.bound_methods.try_borrow_for_gc() {
            for method in bound.iter().flatten() {
                visit.call(method)?;
            }
        }
        // Handles queued by other threads but not drained yet belong to the loop too.
        let mut result = Ok(());
        if running {
            return result;
        }
        self.shared.injector.peek_if_free(|queued| {
            for item in queued {
                if let Injected::Handle(h) = item {
                    if let Err(e) = crate::handle::visit_injected(h, &visit) {
                        result = Err(e);
                        return;
                    }
                }
            }
        });
        result
    }

    fn __clear__(&self) {
        let taken = self.state.try_borrow_for_gc().map(|mut st| {
            st.parked.clear();
            let fds: Vec<_> = st.fds.drain().collect();
            for (fd, _) in &fds {
                let _ = self.shared.poller.delete(*fd);
            }
            let deferred = std::mem::take(&mut st.deferred);
            (st.ready.drain(), st.timers.drain(), fds, deferred)
        });
        if let Some((_, timers, _, _)) = &taken {
            for t in timers {
                crate::handle::unscheduled(t);
            }
        }
        drop(taken);
        self.drop_injected();
        let kwargs = self
            .future_kwargs
            .try_borrow_for_gc()
            .and_then(|mut kw| kw.take());
        drop(kwargs);
        let kwargs = self
            .context_kwargs
            .try_borrow_for_gc()
            .and_then(|mut kw| kw.take());
        drop(kwargs);
        let factory = self
            .task_factory
            .try_borrow_for_gc()
            .and_then(|mut f| f.take());
        drop(factory);
        let bound = self
            .bound_methods
            .try_borrow_for_gc()
            .map(|mut b| std::mem::take(&mut *b));
        drop(bound);
    }
}

/// `cls(*args, **kwargs)` for a class whose metaclass is exactly `type`, as `type.__call__` does
/// it (`tp_new`, then `tp_init` if the result is an instance of `cls`), without the generic call
/// path around it (`PyObject_Call`, `type_call`, the result checks: about 80 instructions per
/// `create_future` under callgrind). `None` for any other class: the caller calls it.
fn construct<'py>(
    cls: &Bound<'py, PyAny>,
    args: &Bound<'py, PyTuple>,
    kwargs: &Bound<'py, PyDict>,
) -> Option<PyResult<Bound<'py, PyAny>>> {
    let py = cls.py();
    let tp = cls.as_ptr().cast::<ffi::PyTypeObject>();
    // SAFETY: we hold the GIL; `cls` is alive. Its type is read first, and its slots only once
    // it is known to be a class (its metaclass is `type` itself, so `cls()` is `type_call`).
    let new = unsafe {
        if ffi::Py_TYPE(cls.as_ptr()) != &raw mut ffi::PyType_Type {
            return None;
        }
        (*tp).tp_new?
    };
    // SAFETY: `tp_new` of a live class, with a live tuple and dict borrowed for the call, as
    // `type_call` passes them.
    let obj = unsafe { Bound::from_owned_ptr_or_err(py, new(tp, args.as_ptr(), kwargs.as_ptr())) };
    let obj = match obj {
        Ok(obj) => obj,
        Err(e) => return Some(Err(e)),
    };
    // SAFETY: `obj` is alive; `type_call` initialises only instances of `cls`, with their own
    // type's `tp_init`.
    unsafe {
        if ffi::PyObject_TypeCheck(obj.as_ptr(), tp) == 0 {
            return Some(Ok(obj));
        }
        if let Some(init) = (*ffi::Py_TYPE(obj.as_ptr())).tp_init {
            if init(obj.as_ptr(), args.as_ptr(), kwargs.as_ptr()) < 0 {
                return Some(Err(PyErr::fetch(py)));
            }
        }
    }
    Some(Ok(obj))
}
