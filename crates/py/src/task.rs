//! `ferroloop.Task`: a native asyncio Task, a port of the C `_asyncio.Task` of CPython 3.11–3.13
//! (`Modules/_asynciomodule.c`: `task_step_impl`, `task_step_handle_result_impl`, `task_wakeup`,
//! `future_cancel`, `create_cancelled_error`), behaving as that class does through its public
//! and semi-private API (`_must_cancel`, `_fut_waiter`, `_asyncio_future_blocking`...).
//!
//! Why it exists: the server runs every request's app in a task, and on a ferroloop loop a C
//! Task costs about 8,000 instructions per request beyond the app's own code (its `__init__`
//! parses keywords and asks the loop for `get_debug()`, its steps and done callbacks each go
//! through `loop.call_soon` as Python calls, its done callback is a further loop entry). This
//! Task queues its steps on the ready queue without a Python call (`Ready::Task`), enters its
//! context directly, and tells the server natively when it is done (`hook`).
//!
//! It is a subclass of `asyncio.Task` whose C part is never used (`task_base.rs`): every name
//! asyncio's `Task` and `Future` define is defined here again, some as plain C functions in the
//! type's dict (`install_task_slots`). What differs from asyncio's Task (documented in
//! docs/usage.md): `eager_start=True` is refused; it cannot be subclassed. Its finalizer
//! (`task_finalize`) makes the C Task's reports: destroyed while pending, exception never
//! retrieved.
//!
//! Invariants:
//! - All mutable state is in `st` (a `LoopCell`): borrowed only for short sections that call no
//!   Python code; objects taken out of it are dropped after the borrow ends.
//! - A task is `Pending` until exactly one of `set_result`/`set_exception`/`cancel_now` moves it
//!   to `Finished` or `Cancelled`; the coroutine is stepped only while `Pending`.
//! - A step runs with the task registered as the loop's current task (`_asyncio._enter_task`)
//!   and in the task's context: `Ready::Task` entries enter it here (`run_queued`); on other
//!   loops, and in debug mode, the loop's handle does (`call_soon(..., context=...)`).
//! - `tp_init`, `tp_finalize`, `tp_traverse`, `tp_clear` and `tp_dealloc` are set by
//!   `install_task_slots` when the module is initialised, before any `Task` exists.
//! - A `Py` dropped while no PyO3 frame is on the stack is only queued in PyO3's pool until
//!   PyO3 is next entered. So the step and wake-up entry points (which another loop's handles
//!   call) run inside PyO3's attach scope, and the C-function methods (`done()`, `result()`,
//!   `add_done_callback()`...) release what they take as `Bound`s.
//! - The `hook` (the server's request cycle) is called once, after the step that finished the
//!   task, with the task already left.

use std::ffi::c_int;

use pyo3::exceptions::asyncio::{CancelledError, InvalidStateError};
use pyo3::exceptions::{
    PyAttributeError, PyKeyboardInterrupt, PyRuntimeError, PySystemExit, PyTypeError, PyValueError,
};
use pyo3::ffi;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyString, PyTuple, PyType};
use pyo3::PyTraverseError;
use smallvec::SmallVec;

use crate::cell::LoopCell;
use crate::event_loop::LoopCore;
use crate::fastcall::{attached_entry, bound_builtin, entry, method_descriptor, MethodDef};
use crate::server::Cycle;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Pending,
    Cancelled,
    Finished,
}

/// Default names: `Task-N` from this counter (asyncio's own counter is private to `_asyncio`).
static NAME_COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Done callbacks and their contexts, in the order they were added. The first is kept inline:
/// most tasks get exactly one (the awaiting task's wake-up, or `gather`'s), and a `Vec` would
/// allocate for it (about 500 instructions per task under callgrind, with the free).
type Callbacks = SmallVec<[(Py<PyAny>, Py<PyAny>); 1]>;

#[allow(clippy::struct_excessive_bools)] // the C Task's flags, one for one
struct State {
    phase: Phase,
    loop_: Option<Py<PyAny>>,
    context: Option<Py<PyAny>>,
    coro: Option<Py<PyAny>>,
    /// `None` until named: `get_name` then formats `Task-{number}`.
    name: Option<Py<PyAny>>,
    number: u64,
    result: Option<Py<PyAny>>,
    exception: Option<Py<PyAny>>,
    exception_tb: Option<Py<PyAny>>,
    log_tb: bool,
    blocking: bool,
    must_cancel: bool,
    cancel_msg: Option<Py<PyAny>>,
    cancelled_exc: Option<Py<PyAny>>,
    num_cancels: i64,
    fut_waiter: Option<Py<PyAny>>,
    callbacks: Callbacks,
    log_destroy_pending: bool,
    /// Where the task was made, in debug mode (`_source_traceback`).
    source_tb: Option<Py<PyAny>>,
    /// The bound wake-up callable, cached while pending (`wakeup_fn`).
    wakeup: Option<Py<PyAny>>,
    /// Set once `start` ran (registered, first step queued).
    started: bool,
    hook: Option<Py<Cycle>>,
}

impl State {
    /// Whether the finalizer reports "Task was destroyed but it is pending!".
    fn reports_pending(&self) -> bool {
        self.phase == Phase::Pending && self.log_destroy_pending && self.started
    }
}

impl Drop for State {
    fn drop(&mut self) {
        // SAFETY: a `State` lives in a `Task`, which is freed by its `tp_dealloc`, with the GIL
        // held. Releasing through `Bound` is a plain decref (a `Py` drop first reads a
        // thread-local GIL counter, through `__tls_get_addr` in a shared library).
        let py = unsafe { Python::assume_attached() };
        let fields = [
            self.loop_.take(),
            self.context.take(),
            self.coro.take(),
            self.name.take(),
            self.result.take(),
            self.exception.take(),
            self.exception_tb.take(),
            self.cancel_msg.take(),
            self.cancelled_exc.take(),
            self.fut_waiter.take(),
            self.source_tb.take(),
            self.wakeup.take(),
        ];
        for field in fields.into_iter().flatten() {
            drop(field.into_bound(py));
        }
        if let Some(hook) = self.hook.take() {
            drop(hook.into_bound(py));
        }
        for (cb, ctx) in std::mem::take(&mut self.callbacks) {
            drop(cb.into_bound(py));
            drop(ctx.into_bound(py));
        }
    }
}

#[pyclass(
    module = "ferroloop._native",
    name = "Task",
    frozen,
    extends = crate::task_base::AsyncioTask
)]
pub struct Task {
    /// The loop's native core when the loop is a ferroloop loop (`Ready::Task` entries).
    core: Option<Py<LoopCore>>,
    st: LoopCell<State>,
}

/// `asyncio.tasks`' `_enter_task`, `_leave_task`, `_register_task`, cached; `current` is the
/// dict those keep the running task of each loop in (`_asyncio._current_tasks`, which the C
/// `current_task()` reads), when they are the C functions: `enter`/`leave` then do their work
/// on it directly, with their checks and messages.
struct Registry {
    enter: Py<PyAny>,
    leave: Py<PyAny>,
    register: Py<PyAny>,
    current: Option<Py<PyDict>>,
    generator: Py<PyAny>,
}

static REGISTRY: PyOnceLock<Registry> = PyOnceLock::new();

fn registry(py: Python<'_>) -> PyResult<&Registry> {
    REGISTRY.get_or_try_init(py, || {
        let tasks = py.import("asyncio.tasks")?;
        let enter = tasks.getattr("_enter_task")?;
        // The `current_tasks_dict` loan (`task_base.rs`): on 3.11 to 3.13 only.
        let current = crate::task_base::current_tasks_dict(py);
        Ok(Registry {
            enter: enter.unbind(),
            leave: tasks.getattr("_leave_task")?.unbind(),
            register: tasks.getattr("_register_task")?.unbind(),
            current,
            generator: py.import("types")?.getattr("GeneratorType")?.unbind(),
        })
    })
}

impl Registry {
    /// `_enter_task(loop, task)`.
    fn enter(&self, loop_: &Bound<'_, PyAny>, task: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = loop_.py();
        let Some(current) = &self.current else {
            return self.enter.bind(py).call1((loop_, task)).map(drop);
        };
        // SAFETY: we hold the GIL; the dict, key and value are live; the result is a borrowed
        // reference to the value now in the dict (`task`, or the one already there), or NULL
        // with an exception set.
        let now =
            unsafe { ffi::PyDict_SetDefault(current.as_ptr(), loop_.as_ptr(), task.as_ptr()) };
        if now.is_null() {
            return Err(PyErr::fetch(py));
        }
        if now != task.as_ptr() {
            // SAFETY: `now` is a live value of the dict, borrowed; a new reference is taken.
            let other = unsafe { Bound::from_borrowed_ptr(py, now) };
            return Err(PyRuntimeError::new_err(format!(
                "Cannot enter into task {} while another task {} is being executed.",
                task.repr()?,
                other.repr()?
            )));
        }
        Ok(())
    }

    /// `_leave_task(loop, task)`.
    fn leave(&self, loop_: &Bound<'_, PyAny>, task: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = loop_.py();
        let Some(current) = &self.current else {
            return self.leave.bind(py).call1((loop_, task)).map(drop);
        };
        // SAFETY: we hold the GIL; the dict and key are live; the result is borrowed (or NULL,
        // with an exception set only on an error) and compared at once.
        let item = unsafe { ffi::PyDict_GetItemWithError(current.as_ptr(), loop_.as_ptr()) };
        if item == task.as_ptr() {
            // SAFETY: as above; the key is there, so this only removes it.
            if unsafe { ffi::PyDict_DelItem(current.as_ptr(), loop_.as_ptr()) } < 0 {
                return Err(PyErr::fetch(py));
            }
            return Ok(());
        }
        if item.is_null() {
            if let Some(e) = PyErr::take(py) {
                return Err(e);
            }
        }
        let item = if item.is_null() {
            py.None().into_bound(py)
        } else {
            // SAFETY: `item` is a live value of the dict, borrowed; a new reference is taken.
            unsafe { Bound::from_borrowed_ptr(py, item) }
        };
        Err(PyRuntimeError::new_err(format!(
            "Leaving task {} does not match the current task {}.",
            task.repr()?,
            item.repr()?
        )))
    }
}

static STEP: MethodDef = MethodDef(ffi::PyMethodDef {
    ml_name: c"task_step".as_ptr(),
    ml_meth: ffi::PyMethodDefPointer {
        PyCFunctionFast: task_step_entry,
    },
    ml_flags: ffi::METH_FASTCALL,
    ml_doc: c"A step of a ferroloop Task (what the loop runs).".as_ptr(),
});

static WAKEUP: MethodDef = MethodDef::meth_o(
    c"task_wakeup",
    task_wakeup_entry,
    c"Resumes a ferroloop Task once the future it awaits is done.",
);

/// Whether `callback` is a ferroloop Task's wake-up (a built-in made from `WAKEUP`).
pub(crate) fn is_native_wakeup(callback: &Bound<'_, PyAny>) -> bool {
    // SAFETY: we hold the GIL (`callback` is bound) and it is alive.
    let exact = unsafe { ffi::PyCFunction_CheckExact(callback.as_ptr()) } != 0;
    // SAFETY: an object whose type is exactly `builtin_function_or_method` is a
    // `PyCFunctionObject`, whose `m_ml` is set at creation and never changed.
    exact
        && std::ptr::eq(
            unsafe { (*callback.as_ptr().cast::<ffi::PyCFunctionObject>()).m_ml }.cast_const(),
            std::ptr::addr_of!(WAKEUP.0),
        )
}

/// `STEP`'s C function: `step()` sends, `step(exc)` throws `exc` into the coroutine.
unsafe extern "C" fn task_step_entry(
    slf: *mut ffi::PyObject,
    args: *mut *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
) -> *mut ffi::PyObject {
    // Called by another loop's handles, where no PyO3 frame may be on the stack.
    attached_entry(|py| {
        // SAFETY: `slf` is the Task `STEP` was bound to (only `schedule` binds it), borrowed.
        let task = unsafe { Borrowed::from_ptr(py, slf).cast_unchecked::<Task>() };
        let exc = match nargs {
            0 => None,
            // SAFETY: CPython passes `nargs` live borrowed arguments.
            1 => Some(unsafe { Borrowed::from_ptr(py, *args) }.to_owned()),
            _ => return Err(PyTypeError::new_err("task_step takes at most 1 argument")),
        };
        Task::step(&task, exc)?;
        Ok(py.None().into_ptr())
    })
}

/// `WAKEUP`'s C function: the awaited future is done.
unsafe extern "C" fn task_wakeup_entry(
    slf: *mut ffi::PyObject,
    fut: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // As in `task_step_entry`: a wake-up run by another loop's handles.
    attached_entry(|py| {
        // SAFETY: `slf` is the Task `WAKEUP` was bound to (only `Task::wakeup_fn` binds it).
        let task = unsafe { Borrowed::from_ptr(py, slf).cast_unchecked::<Task>() };
        // SAFETY: METH_O passes one live borrowed argument.
        let fut = unsafe { Borrowed::from_ptr(py, fut) };
        Task::wakeup(&task, &fut)?;
        Ok(py.None().into_ptr())
    })
}

/// asyncio's Future type (the C one), two of its method descriptors and two of its attribute
/// descriptors: a task waits on such a future through them, the methods called by vectorcall with
/// the future as `self` (which skips the method lookup on the instance, about 100 instructions
/// each), the attributes `_asyncio_future_blocking` and `_loop` read and written through their
/// getset functions (a generic attribute access walks the type's lookup for each: about 150
/// instructions per get or set). Only for an instance of exactly that type, where those
/// descriptors are what attribute access finds (they are data descriptors, so an instance dict
/// cannot shadow them); any other future-like object goes through attribute lookup.
struct FutureMethods {
    ty: Py<PyAny>,
    add_done_callback: Py<PyAny>,
    result: Py<PyAny>,
    /// `result`'s C function when it takes no arguments (`METH_NOARGS`), called directly.
    result_fn: Option<ffi::PyCFunction>,
    blocking: GetSet,
    loop_: GetSet,
}

/// A getset descriptor's functions, taken from its `PyGetSetDef`.
struct GetSet {
    get: ffi::getter,
    set: Option<ffi::setter>,
    closure: *mut std::ffi::c_void,
}

// SAFETY: the functions and the closure belong to a static `PyGetSetDef` of the `_asyncio`
// extension module, which is never unloaded; they are only called with the GIL held.
unsafe impl Send for GetSet {}
// SAFETY: as above; nothing in a `GetSet` is mutated after it is made.
unsafe impl Sync for GetSet {}

impl GetSet {
    /// The functions of `ty.__dict__[name]` if it is a getset descriptor with a getter.
    fn of(ty: &Bound<'_, PyAny>, name: &str) -> Option<Self> {
        let descr = ty.getattr("__dict__").ok()?.get_item(name).ok()?;
        // Only the static type object's address is taken.
        let getset_type = std::ptr::addr_of_mut!(ffi::PyGetSetDescr_Type);
        if !std::ptr::eq(descr.get_type_ptr(), getset_type) {
            return None;
        }
        // SAFETY: `descr` is exactly a getset descriptor, so its layout is
        // `PyGetSetDescrObject` and `d_getset` points to its type's static `PyGetSetDef`.
        let def = unsafe { &*(*descr.as_ptr().cast::<ffi::PyGetSetDescrObject>()).d_getset };
        Some(Self {
            get: def.get?,
            set: def.set,
            closure: def.closure,
        })
    }

    /// `obj.<name>`; `obj` must be an instance of the descriptor's type.
    fn get<'py>(&self, obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: we hold the GIL; `obj` is a live instance of the type the getter belongs to
        // (the caller checked its exact type); a new reference or NULL with an exception set
        // comes back.
        unsafe { Bound::from_owned_ptr_or_err(obj.py(), (self.get)(obj.as_ptr(), self.closure)) }
    }

    /// `obj.<name> = value`; `obj` must be an instance of the descriptor's type.
    fn set(&self, obj: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let Some(set) = self.set else {
            return Err(PyAttributeError::new_err("readonly attribute"));
        };
        // SAFETY: as in `get`; the setter borrows `value` and returns 0, or -1 with an
        // exception set.
        if unsafe { set(obj.as_ptr(), value.as_ptr(), self.closure) } < 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(())
    }
}

/// The C function of `ty.__dict__[name]` if it is a method descriptor of a `METH_NOARGS`
/// method.
fn noargs_fn(ty: &Bound<'_, PyAny>, name: &str) -> Option<ffi::PyCFunction> {
    let descr = ty.getattr("__dict__").ok()?.get_item(name).ok()?;
    // Only the static type object's address is taken.
    let method_type = std::ptr::addr_of_mut!(ffi::PyMethodDescr_Type);
    if !std::ptr::eq(descr.get_type_ptr(), method_type) {
        return None;
    }
    // SAFETY: `descr` is exactly a method descriptor, so its layout is `PyMethodDescrObject`
    // and `d_method` points to its type's static `PyMethodDef`; for `METH_NOARGS` the union
    // holds a `PyCFunction`.
    unsafe {
        let def = &*(*descr.as_ptr().cast::<ffi::PyMethodDescrObject>()).d_method;
        (def.ml_flags == ffi::METH_NOARGS).then_some(def.ml_meth.PyCFunction)
    }
}

impl FutureMethods {
    /// `fut.result()`; `fut` is exactly of the C Future type.
    fn result<'py>(&self, fut: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = fut.py();
        match self.result_fn {
            // SAFETY: we hold the GIL; `fut` is a live instance of the type the method belongs
            // to; a METH_NOARGS function takes `(self, NULL)` and returns a new reference or
            // NULL with an exception set.
            Some(f) => unsafe {
                Bound::from_owned_ptr_or_err(py, f(fut.as_ptr(), std::ptr::null_mut()))
            },
            None => vectorcall(self.result.bind(py), &[fut.as_ptr()], None),
        }
    }
}

static FUTURE_METHODS: PyOnceLock<Option<FutureMethods>> = PyOnceLock::new();

fn future_methods<'py>(py: Python<'py>, fut: &Bound<'py, PyAny>) -> Option<&'py FutureMethods> {
    let methods = FUTURE_METHODS
        .get_or_init(py, || {
            let ty = crate::hooks::future_type(py).ok()?;
            Some(FutureMethods {
                add_done_callback: ty.getattr("add_done_callback").ok()?.unbind(),
                result: ty.getattr("result").ok()?.unbind(),
                result_fn: noargs_fn(ty, "result"),
                blocking: GetSet::of(ty, "_asyncio_future_blocking")?,
                loop_: GetSet::of(ty, "_loop")?,
                ty: ty.clone().unbind(),
            })
        })
        .as_ref()?;
    fut.get_type().is(methods.ty.bind(py)).then_some(methods)
}

/// `method(*args)` by vectorcall (`args[0]` is the future, as `self`), with `kwnames` naming
/// the last arguments.
fn vectorcall<'py>(
    method: &Bound<'py, PyAny>,
    args: &[*mut ffi::PyObject],
    kwnames: Option<&Bound<'py, PyTuple>>,
) -> PyResult<Bound<'py, PyAny>> {
    let nkw = kwnames.map_or(0, PyTupleMethods::len);
    let kw = kwnames.map_or(std::ptr::null_mut(), Bound::as_ptr);
    // SAFETY: we hold the GIL (`method` is bound); every pointer in `args` is a live object
    // borrowed for the call; `nargs + len(kwnames) == args.len()`; a new reference or NULL
    // with an exception set comes back.
    unsafe {
        Bound::from_owned_ptr_or_err(
            method.py(),
            ffi::PyObject_Vectorcall(method.as_ptr(), args.as_ptr(), args.len() - nkw, kw),
        )
    }
}

static CONTEXT_KWNAMES: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();

/// `("context",)`, the keyword names of an `add_done_callback(fn, context=ctx)` vectorcall. The
/// name is interned, as the keywords of a C function's argument parser are, so the parser matches
/// it by identity instead of comparing the strings.
fn context_kwnames(py: Python<'_>) -> &Bound<'_, PyTuple> {
    CONTEXT_KWNAMES
        .get_or_init(py, || {
            PyTuple::new(py, [PyString::intern(py, "context")])
                .expect("a one-string tuple")
                .unbind()
        })
        .bind(py)
}

/// The task's context: the one given, or a copy of the current one (as asyncio's `context=None`).
fn context_arg<'py>(
    py: Python<'py>,
    context: Option<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    if let Some(c) = context.filter(|c| !c.is_none()) {
        return Ok(c);
    }
    // The task holds it as a tracked object holds any other.
    let (context, untracked) = crate::event_loop::current_context(py)?;
    if untracked {
        crate::handle::gc_track(&context);
    }
    Ok(context.into_bound(py))
}

/// A task name as the C Task keeps it: a `str` as is, anything else through `str()`.
fn name_arg(name: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    if name.is_exact_instance_of::<PyString>() {
        return Ok(name.clone().unbind());
    }
    Ok(name.str()?.into_any().unbind())
}

/// `obj.<name>(arg, context=context)` by vectorcall, with no keyword dict built (`call_soon` of
/// a loop that is not ferroloop's own, `add_done_callback` of a future-like object).
fn call_with_context<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
    args: &[&Bound<'py, PyAny>],
    context: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    let mut all = Vec::with_capacity(args.len() + 2);
    all.push(obj.as_ptr());
    all.extend(args.iter().map(|a| a.as_ptr()));
    all.push(context.as_ptr());
    // SAFETY: we hold the GIL; every pointer is a live object borrowed for the call: `self`,
    // the positional arguments, then the value of the one keyword in `kwnames`; a new
    // reference or NULL with an exception set comes back.
    unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            ffi::PyObject_VectorcallMethod(
                name.as_ptr(),
                all.as_ptr(),
                all.len() - 1,
                context_kwnames(py).as_ptr(),
            ),
        )
    }
}

/// What the C Task's `__init__` accepts: a coroutine (`asyncio.iscoroutine`).
fn check_coroutine(coro: &Bound<'_, PyAny>) -> PyResult<()> {
    // Only the static type object's address is taken.
    let exact = std::ptr::eq(
        coro.get_type_ptr(),
        std::ptr::addr_of_mut!(ffi::PyCoro_Type),
    );
    if exact || crate::hooks::call(coro.py(), "is_coroutine", (coro,))?.is_truthy()? {
        return Ok(());
    }
    Err(PyTypeError::new_err(format!(
        "a coroutine was expected, got {}",
        coro.repr()?
    )))
}

fn is_cancelled_error(py: Python<'_>, e: &PyErr) -> bool {
    e.is_instance_of::<CancelledError>(py)
}

impl Task {
    fn new_state(
        loop_: Py<PyAny>,
        coro: Py<PyAny>,
        name: Option<Py<PyAny>>,
        context: Py<PyAny>,
        hook: Option<Py<Cycle>>,
    ) -> State {
        let number = if name.is_none() {
            NAME_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
        } else {
            0
        };
        State {
            phase: Phase::Pending,
            loop_: Some(loop_),
            context: Some(context),
            coro: Some(coro),
            name,
            number,
            result: None,
            exception: None,
            exception_tb: None,
            log_tb: false,
            blocking: false,
            must_cancel: false,
            cancel_msg: None,
            cancelled_exc: None,
            num_cancels: 0,
            fut_waiter: None,
            callbacks: Callbacks::new(),
            log_destroy_pending: true,
            source_tb: None,
            wakeup: None,
            started: false,
            hook,
        }
    }

    /// Creates, registers and schedules a task on the ferroloop loop `loop_core`, as
    /// `ferroloop.Task(coro, loop=..., name=..., context=...)` does but without parsing
    /// arguments; `hook` (the server's request cycle) is told when it is done.
    ///
    /// `start: false` leaves it unstarted, for `run_first_step`.
    pub(crate) fn create<'py>(
        loop_core: &Bound<'py, LoopCore>,
        coro: &Bound<'py, PyAny>,
        name: Option<Bound<'py, PyAny>>,
        context: Option<Bound<'py, PyAny>>,
        hook: Option<Py<Cycle>>,
        start: bool,
    ) -> PyResult<Bound<'py, Task>> {
        let py = loop_core.py();
        check_coroutine(coro)?;
        let context = context_arg(py, context)?;
        let name = name
            .filter(|n| !n.is_none())
            .map(|n| name_arg(&n))
            .transpose()?;
        let task = Bound::new(
            py,
            Task {
                core: Some(loop_core.clone().unbind()),
                st: LoopCell::new(Self::new_state(
                    loop_core.clone().into_any().unbind(),
                    coro.clone().unbind(),
                    name,
                    context.unbind(),
                    hook,
                )),
            },
        )?;
        if start {
            Self::start(&task)?;
        }
        Ok(task)
    }

    /// Starts a task made by `create(..., start: false)`: registers it and runs its first step
    /// now, as the ready queue would run it. The caller is itself a ready-queue entry, outside
    /// any task. A failing step is reported to the loop's exception handler; only
    /// KeyboardInterrupt and SystemExit come back as `Err`.
    pub(crate) fn run_first_step(
        slf: &Bound<'_, Self>,
        loop_core: &Bound<'_, LoopCore>,
    ) -> PyResult<()> {
        if Self::mark_started(slf)? {
            Self::register(slf)?;
            crate::handle::Ready::run_task(loop_core.as_any(), slf, None)?;
        }
        Ok(())
    }

    /// Registers the task (`asyncio.all_tasks()`) and queues its first step.
    fn start(slf: &Bound<'_, Self>) -> PyResult<()> {
        if Self::mark_started(slf)? {
            Self::schedule(slf, None)?;
            Self::register(slf)?;
        }
        Ok(())
    }

    /// Marks the task started; `false` if it already was.
    fn mark_started(slf: &Bound<'_, Self>) -> PyResult<bool> {
        let mut st = slf.get().st.borrow(slf.py())?;
        Ok(!std::mem::replace(&mut st.started, true))
    }

    /// Adds the task to asyncio's registry (`asyncio.all_tasks()`).
    fn register(slf: &Bound<'_, Self>) -> PyResult<()> {
        if !crate::task_registry::register(slf.as_any())? {
            registry(slf.py())?.register.bind(slf.py()).call1((slf,))?;
        }
        Ok(())
    }

    fn loop_of<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let st = self.st.borrow(py)?;
        Ok(st
            .loop_
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("uninitialized Task object"))?
            .bind(py)
            .clone())
    }

    fn context_of<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let st = self.st.borrow(py)?;
        Ok(st
            .context
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("uninitialized Task object"))?
            .bind(py)
            .clone())
    }

    /// Queues a step: on a ferroloop loop (not in debug mode) as a `Ready::Task` entry, else
    /// with `loop.call_soon(step, [exc], context=...)` as the C Task does.
    fn schedule(slf: &Bound<'_, Self>, exc: Option<Bound<'_, PyAny>>) -> PyResult<()> {
        let py = slf.py();
        if let Some(core) = &slf.get().core {
            let core = core.bind(py);
            if crate::cached_method::own_call_soon(core.as_any()) {
                let throw = exc.as_ref().map(|e| e.clone().unbind());
                if LoopCore::push_task_step(core, slf, throw)? {
                    return Ok(());
                }
            }
        }
        let loop_ = slf.get().loop_of(py)?;
        let context = slf.get().context_of(py)?;
        let step = Self::step_callable(slf)?;
        let call_soon = intern!(py, "call_soon");
        match &exc {
            None => call_with_context(&loop_, call_soon, &[&step], &context)?,
            Some(e) => call_with_context(&loop_, call_soon, &[&step, e], &context)?,
        };
        Ok(())
    }

    /// Runs a `Ready::Task` entry: the step, in the task's context.
    pub(crate) fn run_queued(slf: &Bound<'_, Self>, throw: Option<Py<PyAny>>) -> PyResult<()> {
        let py = slf.py();
        let context = slf.get().context_of(py)?;
        let ctx = context.as_ptr();
        // SAFETY: we hold the GIL; `ctx` is kept alive by `context`. PyContext_Enter type-checks
        // it and fails cleanly if it is already entered.
        if unsafe { ffi::PyContext_Enter(ctx) } < 0 {
            return Err(PyErr::fetch(py));
        }
        let r = Self::step(slf, throw.map(|e| e.into_bound(py)));
        // SAFETY: entered just above on this thread, with the GIL still held: it is the current
        // context, so exiting cannot fail.
        unsafe { ffi::PyContext_Exit(ctx) };
        r
    }

    /// The task's step as a callable: what a loop's `call_soon` is given, and what
    /// `run_queued`'s failures are reported under (cold paths).
    pub(crate) fn step_callable<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: `task_step_entry` takes a Task as `self`.
        unsafe { bound_builtin(slf.as_any(), &STEP) }
    }

    /// The task's wake-up callable, made on its first wait and kept until it is done (it refers
    /// back to the task: the cycle lasts only while the task is pending).
    fn wakeup_fn<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        if let Some(w) = &slf.get().st.borrow(py)?.wakeup {
            return Ok(w.bind(py).clone());
        }
        // SAFETY: `task_wakeup_entry` takes a Task as `self`.
        let wakeup = unsafe { bound_builtin(slf.as_any(), &WAKEUP) }?;
        let mut st = slf.get().st.borrow(py)?;
        if st.phase == Phase::Pending {
            st.wakeup = Some(wakeup.clone().unbind());
        }
        Ok(wakeup)
    }

    /// `task_wakeup`: the awaited future is done; its result decides between send and throw.
    fn wakeup(slf: &Bound<'_, Self>, fut: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = slf.py();
        // Exact casts: `Task` cannot be subclassed, and a failed exact check costs no MRO walk.
        let exc = if let Ok(other) = fut.cast_exact::<Task>() {
            other.get().result_impl(py).err()
        } else if let Some(m) = future_methods(py, fut) {
            m.result(fut).err()
        } else {
            fut.call_method0(intern!(py, "result")).err()
        };
        Self::step(slf, exc.map(|e| e.into_value(py).into_bound(py).into_any()))
    }

    /// `task_step`: the step between `_enter_task` and `_leave_task`, then the hook.
    fn step(slf: &Bound<'_, Self>, exc: Option<Bound<'_, PyAny>>) -> PyResult<()> {
        let py = slf.py();
        let reg = registry(py)?;
        let loop_ = slf.get().loop_of(py)?;
        reg.enter(&loop_, slf)?;
        let r = Self::step_impl(slf, exc);
        let left = reg.leave(&loop_, slf);
        // The step's own error wins over the leave's.
        let r = r.and(left);
        let finished = {
            let mut st = slf.get().st.borrow(py)?;
            match st.hook.take() {
                Some(hook) if st.phase != Phase::Pending => {
                    // The hook reads the exception: it counts as retrieved.
                    st.log_tb = false;
                    Some((
                        hook,
                        st.exception.as_ref().map(|e| e.clone_ref(py)),
                        st.phase == Phase::Cancelled,
                    ))
                }
                hook => {
                    st.hook = hook;
                    None
                }
            }
        };
        if let Some((hook, exc, cancelled)) = finished {
            let done = hook.bind(py).get().task_finished(
                py,
                slf.as_any(),
                exc.as_ref().map(|e| e.bind(py)),
                cancelled,
            );
            r?;
            return done;
        }
        r
    }

    fn make_cancelled_error<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (taken, msg) = {
            let mut st = self.st.borrow(py)?;
            (
                st.cancelled_exc.take(),
                st.cancel_msg.as_ref().map(|m| m.clone_ref(py)),
            )
        };
        if let Some(exc) = taken {
            return Ok(exc.into_bound(py));
        }
        let ty = py.get_type::<CancelledError>();
        match msg {
            Some(m) if !m.is_none(py) => ty.call1((m,)),
            _ => ty.call0(),
        }
    }

    fn step_impl(slf: &Bound<'_, Self>, exc: Option<Bound<'_, PyAny>>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let (pending, must_cancel) = {
            let st = this.st.borrow(py)?;
            (st.phase == Phase::Pending, st.must_cancel)
        };
        if !pending {
            let what = exc.unwrap_or_else(|| py.None().into_bound(py));
            return Err(InvalidStateError::new_err(format!(
                "_step(): already done: {} {}",
                slf.repr()?,
                what.repr()?
            )));
        }
        let mut exc = exc;
        if must_cancel {
            let is_cancel = match &exc {
                Some(e) => e.is_instance(&py.get_type::<CancelledError>())?,
                None => false,
            };
            if !is_cancel {
                exc = Some(this.make_cancelled_error(py)?);
            }
            this.st.borrow(py)?.must_cancel = false;
        }
        let (waiter, coro) = {
            let mut st = this.st.borrow(py)?;
            (
                st.fut_waiter.take(),
                st.coro
                    .as_ref()
                    .map(|c| c.clone_ref(py))
                    .ok_or_else(|| PyRuntimeError::new_err("uninitialized Task object"))?,
            )
        };
        drop(waiter);
        let coro = coro.into_bound(py);
        let outcome = match exc {
            None => send(&coro),
            Some(e) => throw(&coro, &e),
        };
        match outcome {
            Outcome::Return(value) => {
                let cancel = {
                    let mut st = this.st.borrow(py)?;
                    std::mem::replace(&mut st.must_cancel, false)
                };
                if cancel {
                    let msg = this
                        .st
                        .borrow(py)?
                        .cancel_msg
                        .as_ref()
                        .map(|m| m.clone_ref(py));
                    Self::cancel_now(slf, msg)?;
                } else {
                    Self::finish(slf, Some(value), None)?;
                }
                Ok(())
            }
            Outcome::Error(e) if is_cancelled_error(py, &e) => {
                this.st.borrow(py)?.cancelled_exc = Some(e.into_value(py).into_any());
                Self::cancel_now(slf, None)?;
                Ok(())
            }
            Outcome::Error(e) => {
                let fatal = e.is_instance_of::<PyKeyboardInterrupt>(py)
                    || e.is_instance_of::<PySystemExit>(py);
                // `into_value` attaches the traceback to the exception (on 3.11 it travels
                // beside it).
                let value = e.into_value(py).into_bound(py).into_any();
                Self::finish(slf, None, Some(value.clone()))?;
                if fatal {
                    return Err(PyErr::from_value(value));
                }
                Ok(())
            }
            Outcome::Yield(result) => Self::handle_yield(slf, result),
        }
    }

    /// `task_step_handle_result_impl`: what the coroutine yielded.
    fn handle_yield(slf: &Bound<'_, Self>, result: Bound<'_, PyAny>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        if result.is(slf) {
            let msg = format!("Task cannot await on itself: {}", slf.repr()?);
            return Self::error_soon(slf, &msg);
        }
        let loop_ = this.loop_of(py)?;
        if let Ok(other) = result.cast_exact::<Task>() {
            if !other.get().loop_of(py)?.is(&loop_) {
                return Self::different_loop(slf, &result);
            }
            let blocking = {
                let mut st = other.get().st.borrow(py)?;
                std::mem::replace(&mut st.blocking, false)
            };
            if !blocking {
                return Self::yield_instead_of_yf(slf, &result);
            }
            let wakeup = Self::wakeup_fn(slf)?;
            let context = this.context_of(py)?;
            Self::add_callback(other, wakeup, Some(context))?;
            return Self::waiting_on(slf, result);
        }
        if result.is_none() {
            return Self::schedule(slf, None);
        }
        let c_future = future_methods(py, &result);
        let blocking = match c_future {
            Some(m) => Some(m.blocking.get(&result)?),
            None => match result.getattr(intern!(py, "_asyncio_future_blocking")) {
                Ok(b) => Some(b),
                Err(e) if e.is_instance_of::<PyAttributeError>(py) => None,
                Err(e) => return Err(e),
            },
        };
        if let Some(blocking) = blocking.filter(|b| !b.is_none()) {
            let blocking = blocking.is_truthy()?;
            let fut_loop = match c_future {
                // The C Task compares the future's loop field the same way.
                Some(m) => m.loop_.get(&result)?,
                None => match result.call_method0(intern!(py, "get_loop")) {
                    Ok(l) => l,
                    Err(e) if e.is_instance_of::<PyAttributeError>(py) => {
                        result.getattr(intern!(py, "_loop"))?
                    }
                    Err(e) => return Err(e),
                },
            };
            if !fut_loop.is(&loop_) {
                return Self::different_loop(slf, &result);
            }
            if !blocking {
                return Self::yield_instead_of_yf(slf, &result);
            }
            let no = PyBool::new(py, false);
            match c_future {
                Some(m) => m.blocking.set(&result, &no)?,
                None => result.setattr(intern!(py, "_asyncio_future_blocking"), no)?,
            }
            let wakeup = Self::wakeup_fn(slf)?;
            let context = this.context_of(py)?;
            // `result.add_done_callback(wakeup, context=context)`, by vectorcall: no keyword
            // dict built and unpacked.
            let added = match c_future {
                Some(m) => vectorcall(
                    m.add_done_callback.bind(py),
                    &[result.as_ptr(), wakeup.as_ptr(), context.as_ptr()],
                    Some(context_kwnames(py)),
                ),
                None => call_with_context(
                    &result,
                    intern!(py, "add_done_callback"),
                    &[&wakeup],
                    &context,
                ),
            };
            drop(added?);
            return Self::waiting_on(slf, result);
        }
        if result.is_instance(registry(py)?.generator.bind(py))? {
            let msg = format!(
                "yield was used instead of yield from for generator in task {} with {}",
                slf.repr()?,
                result.repr()?
            );
            return Self::error_soon(slf, &msg);
        }
        let msg = format!("Task got bad yield: {}", result.repr()?);
        Self::error_soon(slf, &msg)
    }

    /// The task now waits for `fut`; a pending `cancel()` goes to it.
    fn waiting_on(slf: &Bound<'_, Self>, fut: Bound<'_, PyAny>) -> PyResult<()> {
        let py = slf.py();
        let (must_cancel, msg) = {
            let mut st = slf.get().st.borrow(py)?;
            st.fut_waiter = Some(fut.clone().unbind());
            (
                st.must_cancel,
                st.cancel_msg.as_ref().map(|m| m.clone_ref(py)),
            )
        };
        if must_cancel {
            let msg = msg.unwrap_or_else(|| py.None());
            let cancelled = match fut.cast::<Task>() {
                Ok(other) => Self::cancel_impl(other, msg.bind(py))?,
                Err(_) => fut
                    .call_method1(intern!(py, "cancel"), (msg,))?
                    .is_truthy()?,
            };
            if cancelled {
                slf.get().st.borrow(py)?.must_cancel = false;
            }
        }
        Ok(())
    }

    fn different_loop(slf: &Bound<'_, Self>, fut: &Bound<'_, PyAny>) -> PyResult<()> {
        let msg = format!(
            "Task {} got Future {} attached to a different loop",
            slf.repr()?,
            fut.repr()?
        );
        Self::error_soon(slf, &msg)
    }

    fn yield_instead_of_yf(slf: &Bound<'_, Self>, fut: &Bound<'_, PyAny>) -> PyResult<()> {
        let msg = format!(
            "yield was used instead of yield from in task {} with {}",
            slf.repr()?,
            fut.repr()?
        );
        Self::error_soon(slf, &msg)
    }

    /// `task_set_error_soon`: the next step throws a `RuntimeError(msg)` into the coroutine.
    fn error_soon(slf: &Bound<'_, Self>, msg: &str) -> PyResult<()> {
        let exc = PyRuntimeError::new_err(msg.to_owned()).into_value(slf.py());
        Self::schedule(slf, Some(exc.into_bound(slf.py()).into_any()))
    }

    /// `future_set_result` / `future_set_exception` for the step's outcome.
    fn finish(
        slf: &Bound<'_, Self>,
        result: Option<Bound<'_, PyAny>>,
        exception: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let py = slf.py();
        {
            let mut st = slf.get().st.borrow(py)?;
            if st.phase != Phase::Pending {
                return Err(InvalidStateError::new_err("invalid state"));
            }
            st.phase = Phase::Finished;
            if let Some(e) = &exception {
                // SAFETY: we hold the GIL; `e` is a live exception instance (a step's raised
                // exception); PyException_GetTraceback returns a new reference or NULL.
                let tb = unsafe { ffi::PyException_GetTraceback(e.as_ptr()) };
                // SAFETY: `tb` is NULL or a new reference, owned from here.
                st.exception_tb =
                    unsafe { Bound::from_owned_ptr_or_opt(py, tb) }.map(Bound::unbind);
                st.exception = Some(e.clone().unbind());
                st.log_tb = true;
            } else {
                st.result = result.map(Bound::unbind);
            }
        }
        Self::schedule_callbacks(slf)
    }

    /// `future_cancel`: moves a pending task to `Cancelled` (False if it was done).
    fn cancel_now(slf: &Bound<'_, Self>, msg: Option<Py<PyAny>>) -> PyResult<bool> {
        let py = slf.py();
        let old = {
            let mut st = slf.get().st.borrow(py)?;
            st.log_tb = false;
            if st.phase != Phase::Pending {
                return Ok(false);
            }
            st.phase = Phase::Cancelled;
            std::mem::replace(&mut st.cancel_msg, msg)
        };
        drop(old);
        Self::schedule_callbacks(slf)?;
        Ok(true)
    }

    /// Every done callback goes to `loop.call_soon(callback, task, context=...)`, in order.
    /// Called once, when the task is done: the cached wake-up is released too.
    fn schedule_callbacks(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let (callbacks, wakeup) = {
            let mut st = slf.get().st.borrow(py)?;
            (std::mem::take(&mut st.callbacks), st.wakeup.take())
        };
        // Released as `Bound`s: a plain decref (see `State`'s `Drop`).
        drop(wakeup.map(|w| w.into_bound(py)));
        if callbacks.is_empty() {
            return Ok(());
        }
        let loop_ = slf.get().loop_of(py)?;
        for (cb, ctx) in callbacks {
            let (cb, ctx) = (cb.into_bound(py), ctx.into_bound(py));
            call_soon(&loop_, slf.get().core.as_ref(), &cb, slf.as_any(), &ctx)?;
        }
        Ok(())
    }

    fn add_callback(
        slf: &Bound<'_, Self>,
        callback: Bound<'_, PyAny>,
        context: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let py = slf.py();
        let context = context_arg(py, context)?;
        {
            let mut st = slf.get().st.borrow(py)?;
            if st.phase == Phase::Pending {
                st.callbacks.push((callback.unbind(), context.unbind()));
                return Ok(());
            }
        }
        let loop_ = slf.get().loop_of(py)?;
        call_soon(
            &loop_,
            slf.get().core.as_ref(),
            &callback,
            slf.as_any(),
            &context,
        )
    }

    /// `exception()`.
    fn exception_impl<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (phase, exc) = {
            let mut st = self.st.borrow(py)?;
            if st.phase == Phase::Finished {
                st.log_tb = false;
            }
            (st.phase, st.exception.as_ref().map(|e| e.clone_ref(py)))
        };
        match phase {
            Phase::Cancelled => Err(PyErr::from_value(self.make_cancelled_error(py)?)),
            Phase::Pending => Err(InvalidStateError::new_err("Exception is not set.")),
            Phase::Finished => {
                Ok(exc.map_or_else(|| py.None().into_bound(py), |e| e.into_bound(py)))
            }
        }
    }

    /// `result()`.
    fn result_impl<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (phase, exc, tb, result) = {
            let mut st = self.st.borrow(py)?;
            if st.phase == Phase::Finished {
                st.log_tb = false;
            }
            (
                st.phase,
                st.exception.as_ref().map(|e| e.clone_ref(py)),
                st.exception_tb.take(),
                st.result.as_ref().map(|r| r.clone_ref(py)),
            )
        };
        match phase {
            Phase::Cancelled => Err(PyErr::from_value(self.make_cancelled_error(py)?)),
            Phase::Pending => Err(InvalidStateError::new_err("Result is not set.")),
            Phase::Finished => {
                if let Some(exc) = exc {
                    let exc = exc.into_bound(py);
                    // A `Bound`, released with a plain decref even where no PyO3 frame is on
                    // the stack (`result()` is a C function: see the module invariants).
                    let tb = tb.map_or_else(|| py.None().into_bound(py), |t| t.into_bound(py));
                    // SAFETY: we hold the GIL; `exc` is an exception instance and `tb` a
                    // traceback or None (what `PyException_SetTraceback` accepts).
                    if unsafe { ffi::PyException_SetTraceback(exc.as_ptr(), tb.as_ptr()) } < 0 {
                        return Err(PyErr::fetch(py));
                    }
                    return Err(PyErr::from_value(exc));
                }
                Ok(result.map_or_else(|| py.None().into_bound(py), |r| r.into_bound(py)))
            }
        }
    }

    /// `Task.cancel(msg)`.
    fn cancel_impl(slf: &Bound<'_, Self>, msg: &Bound<'_, PyAny>) -> PyResult<bool> {
        let py = slf.py();
        let waiter = {
            let mut st = slf.get().st.borrow(py)?;
            st.log_tb = false;
            if st.phase != Phase::Pending {
                return Ok(false);
            }
            st.num_cancels += 1;
            st.fut_waiter.as_ref().map(|w| w.clone_ref(py))
        };
        if let Some(waiter) = waiter {
            let waiter = waiter.into_bound(py);
            let done = match waiter.cast::<Task>() {
                Ok(other) => Self::cancel_impl(other, msg)?,
                Err(_) => waiter
                    .call_method1(intern!(py, "cancel"), (msg,))?
                    .is_truthy()?,
            };
            if done {
                return Ok(true);
            }
        }
        let old = {
            let mut st = slf.get().st.borrow(py)?;
            st.must_cancel = true;
            st.cancel_msg.replace(msg.clone().unbind())
        };
        drop(old);
        Ok(true)
    }
}

/// `loop.call_soon(callback, arg, context=context)`, natively on a ferroloop loop.
fn call_soon(
    loop_: &Bound<'_, PyAny>,
    core: Option<&Py<LoopCore>>,
    callback: &Bound<'_, PyAny>,
    arg: &Bound<'_, PyAny>,
    context: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let py = loop_.py();
    if let Some(core) = core.filter(|_| crate::cached_method::own_call_soon(loop_)) {
        return LoopCore::call_soon_unseen(core.bind(py), callback, arg, context);
    }
    call_with_context(loop_, intern!(py, "call_soon"), &[callback, arg], context)?;
    Ok(())
}

enum Outcome<'py> {
    Return(Bound<'py, PyAny>),
    Yield(Bound<'py, PyAny>),
    Error(PyErr),
}

/// `coro.send(None)` through `PyIter_Send`.
fn send<'py>(coro: &Bound<'py, PyAny>) -> Outcome<'py> {
    let py = coro.py();
    let mut result: *mut ffi::PyObject = std::ptr::null_mut();
    // SAFETY: we hold the GIL; `coro` is live; `result` receives a new reference unless the
    // status is PYGEN_ERROR.
    let status = unsafe { ffi::PyIter_Send(coro.as_ptr(), ffi::Py_None(), &raw mut result) };
    match status {
        ffi::PySendResult::PYGEN_RETURN => {
            // SAFETY: PYGEN_RETURN hands over a new reference in `result`.
            Outcome::Return(unsafe { Bound::from_owned_ptr(py, result) })
        }
        ffi::PySendResult::PYGEN_NEXT => {
            // SAFETY: PYGEN_NEXT hands over a new reference in `result`.
            Outcome::Yield(unsafe { Bound::from_owned_ptr(py, result) })
        }
        ffi::PySendResult::PYGEN_ERROR => Outcome::Error(PyErr::fetch(py)),
    }
}

/// `coro.throw(exc)`: a `StopIteration` is the coroutine's return.
fn throw<'py>(coro: &Bound<'py, PyAny>, exc: &Bound<'py, PyAny>) -> Outcome<'py> {
    let py = coro.py();
    match coro.call_method1(intern!(py, "throw"), (exc,)) {
        Ok(v) => Outcome::Yield(v),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyStopIteration>(py) => {
            match e.value(py).getattr(intern!(py, "value")) {
                Ok(v) => Outcome::Return(v),
                Err(e) => Outcome::Error(e),
            }
        }
        Err(e) => Outcome::Error(e),
    }
}

/// A boolean attribute's new value (`del` is refused, as on the C Task).
fn flag_value(value: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
    value
        .ok_or_else(|| PyAttributeError::new_err("cannot delete attribute"))?
        .is_truthy()
}

fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Pending => "PENDING",
        Phase::Cancelled => "CANCELLED",
        Phase::Finished => "FINISHED",
    }
}

#[pymethods]
impl Task {
    #[new]
    #[pyo3(signature = (coro, *, r#loop=None, name=None, context=None, eager_start=None))]
    fn py_new(
        py: Python<'_>,
        coro: &Bound<'_, PyAny>,
        r#loop: Option<&Bound<'_, PyAny>>,
        name: Option<&Bound<'_, PyAny>>,
        context: Option<&Bound<'_, PyAny>>,
        eager_start: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        // Any object, taken for its truth (the C Task's `bool` argument; 3.14 passes None).
        let eager_start = eager_start.map(PyAnyMethods::is_truthy).transpose()?;
        check_coroutine(coro)?;
        if eager_start == Some(true) {
            return Err(PyTypeError::new_err(
                "ferroloop.Task does not support eager_start=True",
            ));
        }
        let loop_ = match r#loop.filter(|l| !l.is_none()) {
            Some(l) => l.clone(),
            None => py
                .import("asyncio.events")?
                .call_method0(intern!(py, "get_event_loop"))?,
        };
        let context = context_arg(py, context.cloned())?;
        let name = name.filter(|n| !n.is_none()).map(name_arg).transpose()?;
        // In debug mode, where it was made (the frames of the Python code that called us), as
        // asyncio's Future records it.
        let source_tb = if loop_.call_method0(intern!(py, "get_debug"))?.is_truthy()? {
            Some(crate::hooks::call(py, "extract_stack", ())?.unbind())
        } else {
            None
        };
        let native = loop_.cast::<LoopCore>().ok().map(|c| c.clone().unbind());
        let mut state = Self::new_state(
            loop_.unbind(),
            coro.clone().unbind(),
            name,
            context.unbind(),
            None,
        );
        state.source_tb = source_tb;
        Ok(Task {
            core: native,
            st: LoopCell::new(state),
        })
    }

    fn remove_done_callback(&self, py: Python<'_>, fn_: &Bound<'_, PyAny>) -> PyResult<usize> {
        let callbacks = std::mem::take(&mut self.st.borrow(py)?.callbacks);
        let mut kept = Callbacks::with_capacity(callbacks.len());
        let mut removed = 0;
        let mut failure = None;
        for (cb, ctx) in callbacks {
            if failure.is_none() {
                match cb.bind(py).eq(fn_) {
                    Ok(true) => {
                        removed += 1;
                        continue;
                    }
                    Ok(false) => {}
                    Err(e) => failure = Some(e),
                }
            }
            kept.push((cb, ctx));
        }
        let mut st = self.st.borrow(py)?;
        // Callbacks added while comparing (by an `__eq__`) go after the kept ones.
        let added = std::mem::replace(&mut st.callbacks, kept);
        st.callbacks.extend(added);
        drop(st);
        match failure {
            Some(e) => Err(e),
            None => Ok(removed),
        }
    }

    #[pyo3(signature = (msg=None))]
    fn cancel(slf: &Bound<'_, Self>, msg: Option<Bound<'_, PyAny>>) -> PyResult<bool> {
        let py = slf.py();
        let msg = msg.unwrap_or_else(|| py.None().into_bound(py));
        Self::cancel_impl(slf, &msg)
    }

    fn cancelling(&self, py: Python<'_>) -> PyResult<i64> {
        Ok(self.st.borrow(py)?.num_cancels)
    }

    fn uncancel(&self, py: Python<'_>) -> PyResult<i64> {
        let clears = py.version_info() >= (3, 13);
        let mut st = self.st.borrow(py)?;
        if st.num_cancels > 0 {
            st.num_cancels -= 1;
            if clears && st.num_cancels == 0 {
                st.must_cancel = false;
            }
        }
        Ok(st.num_cancels)
    }

    fn _make_cancelled_error<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.make_cancelled_error(py)
    }

    fn get_coro(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        Ok(self.st.borrow(py)?.coro.as_ref().map(|c| c.clone_ref(py)))
    }

    fn get_context<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.context_of(py)
    }

    fn get_loop<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.loop_of(py)
    }

    fn get_name(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let mut st = self.st.borrow(py)?;
        if let Some(name) = &st.name {
            return Ok(name.clone_ref(py));
        }
        let name = PyString::new(py, &format!("Task-{}", st.number))
            .into_any()
            .unbind();
        st.name = Some(name.clone_ref(py));
        Ok(name)
    }

    fn set_name(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let name = name_arg(value)?;
        let old = self.st.borrow(py)?.name.replace(name);
        drop(old);
        Ok(())
    }

    #[pyo3(signature = (*, limit=None))]
    fn get_stack<'py>(
        slf: &Bound<'py, Self>,
        limit: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let limit = limit.unwrap_or_else(|| py.None().into_bound(py));
        py.import("asyncio.base_tasks")?
            .call_method1(intern!(py, "_task_get_stack"), (slf, limit))
    }

    #[pyo3(signature = (*, limit=None, file=None))]
    fn print_stack<'py>(
        slf: &Bound<'py, Self>,
        limit: Option<Bound<'py, PyAny>>,
        file: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let limit = limit.unwrap_or_else(|| py.None().into_bound(py));
        let file = file.unwrap_or_else(|| py.None().into_bound(py));
        py.import("asyncio.base_tasks")?
            .call_method1(intern!(py, "_task_print_stack"), (slf, limit, file))
    }

    fn set_result(_slf: &Bound<'_, Self>, _result: &Bound<'_, PyAny>) -> PyResult<()> {
        Err(PyRuntimeError::new_err(
            "Task does not support set_result operation",
        ))
    }

    fn set_exception(_slf: &Bound<'_, Self>, _exception: &Bound<'_, PyAny>) -> PyResult<()> {
        Err(PyRuntimeError::new_err(
            "Task does not support set_exception operation",
        ))
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        Ok(crate::hooks::call(slf.py(), "task_repr", (slf,))?.unbind())
    }

    fn __await__(slf: Bound<'_, Self>) -> TaskAwait {
        TaskAwait {
            task: slf.unbind(),
            yielded: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn __iter__(slf: Bound<'_, Self>) -> TaskAwait {
        Self::__await__(slf)
    }

    #[classmethod]
    fn __class_getitem__<'py>(
        cls: &Bound<'py, PyType>,
        item: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = cls.py();
        py.import("types")?
            .getattr("GenericAlias")?
            .call1((cls, item))
    }

    #[getter]
    fn _asyncio_future_blocking(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.st.borrow(py)?.blocking)
    }

    #[setter(_asyncio_future_blocking)]
    fn set_asyncio_future_blocking(
        &self,
        py: Python<'_>,
        value: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let value = flag_value(value)?;
        self.st.borrow(py)?.blocking = value;
        Ok(())
    }

    #[getter]
    fn _log_traceback(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.st.borrow(py)?.log_tb)
    }

    #[setter(_log_traceback)]
    fn set_log_traceback(&self, py: Python<'_>, value: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let value = flag_value(value)?;
        if value {
            return Err(PyValueError::new_err(
                "_log_traceback can only be set to False",
            ));
        }
        self.st.borrow(py)?.log_tb = false;
        Ok(())
    }

    #[getter]
    fn _log_destroy_pending(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.st.borrow(py)?.log_destroy_pending)
    }

    #[setter(_log_destroy_pending)]
    fn set_log_destroy_pending(
        &self,
        py: Python<'_>,
        value: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let value = flag_value(value)?;
        self.st.borrow(py)?.log_destroy_pending = value;
        Ok(())
    }

    #[getter]
    fn _must_cancel(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.st.borrow(py)?.must_cancel)
    }

    #[getter]
    fn _fut_waiter(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        Ok(self
            .st
            .borrow(py)?
            .fut_waiter
            .as_ref()
            .map(|w| w.clone_ref(py)))
    }

    #[getter]
    fn _coro(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.get_coro(py)
    }

    #[getter]
    fn _loop<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.loop_of(py)
    }

    #[getter]
    fn _state(&self, py: Python<'_>) -> PyResult<&'static str> {
        Ok(phase_name(self.st.borrow(py)?.phase))
    }

    #[getter]
    fn _result(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        Ok(self.st.borrow(py)?.result.as_ref().map(|r| r.clone_ref(py)))
    }

    #[getter]
    fn _exception(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        Ok(self
            .st
            .borrow(py)?
            .exception
            .as_ref()
            .map(|e| e.clone_ref(py)))
    }

    #[getter]
    fn _cancel_message(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        Ok(self
            .st
            .borrow(py)?
            .cancel_msg
            .as_ref()
            .map(|m| m.clone_ref(py)))
    }

    #[setter(_cancel_message)]
    fn set_cancel_message(&self, py: Python<'_>, value: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let value = value.ok_or_else(|| PyAttributeError::new_err("cannot delete attribute"))?;
        let old = self
            .st
            .borrow(py)?
            .cancel_msg
            .replace(value.clone().unbind());
        drop(old);
        Ok(())
    }

    #[getter]
    fn _source_traceback(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        Ok(self
            .st
            .borrow(py)?
            .source_tb
            .as_ref()
            .map(|t| t.clone_ref(py)))
    }

    #[getter]
    fn _callbacks<'py>(&self, py: Python<'py>) -> PyResult<Option<Vec<Bound<'py, PyTuple>>>> {
        let st = self.st.borrow(py)?;
        if st.callbacks.is_empty() {
            return Ok(None);
        }
        let pairs: Vec<(Py<PyAny>, Py<PyAny>)> = st
            .callbacks
            .iter()
            .map(|(c, x)| (c.clone_ref(py), x.clone_ref(py)))
            .collect();
        drop(st);
        pairs
            .into_iter()
            .map(|(c, x)| PyTuple::new(py, [c, x]))
            .collect::<PyResult<Vec<_>>>()
            .map(Some)
    }
}

/// What `await task` iterates: yields the task once while it is pending (with
/// `_asyncio_future_blocking` set, as `Future.__await__` does), then returns its result.
#[pyclass(module = "ferroloop._native", name = "TaskAwait", frozen)]
pub struct TaskAwait {
    task: Py<Task>,
    yielded: std::sync::atomic::AtomicBool,
}

#[pymethods]
impl TaskAwait {
    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let task = self.task.bind(py);
        let done = task.get().st.borrow(py)?.phase != Phase::Pending;
        if !done {
            if self
                .yielded
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                return Err(PyRuntimeError::new_err("await wasn't used with future"));
            }
            task.get().st.borrow(py)?.blocking = true;
            return Ok(task.clone().into_any());
        }
        let value = task.get().result_impl(py)?;
        // Made with the value as its one argument: `stop_iteration` would unpack a tuple.
        Err(pyo3::exceptions::PyStopIteration::new_err(
            (value.unbind(),),
        ))
    }

    fn send<'py>(
        &self,
        py: Python<'py>,
        _value: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.__next__(py)
    }

    #[pyo3(signature = (typ, val=None, _tb=None))]
    fn throw(
        _slf: &Bound<'_, Self>,
        typ: &Bound<'_, PyAny>,
        val: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        Err(crate::sock_ops::thrown(typ, val))
    }

    fn close(_slf: &Bound<'_, Self>) {}

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.task)
    }
}

/// `ferroloop.Task(...)`'s `tp_init`: `__new__` built the task; this registers it and queues
/// its first step, once (`__init__` called again does nothing, the C Task would re-initialise).
///
/// # Safety
/// Called by CPython's `type_call` with the GIL held, on an instance of `Task`.
unsafe extern "C" fn task_init(
    slf: *mut ffi::PyObject,
    _args: *mut ffi::PyObject,
    _kwargs: *mut ffi::PyObject,
) -> std::os::raw::c_int {
    // SAFETY: CPython holds the GIL while it calls a type slot.
    let py = unsafe { Python::assume_attached() };
    // SAFETY: `slf` is a live, borrowed instance of `Task` (the slot is on that type, which
    // cannot be subclassed).
    let task = unsafe { Borrowed::from_ptr(py, slf).cast_unchecked::<Task>() };
    // A second `__init__`: CPython 3.15's C Task refuses it (`future_init`), earlier ones
    // initialise again; this one has nothing to redo.
    let again = || -> PyResult<()> {
        if py.version_info() >= (3, 15) && task.get().st.borrow(py)?.started {
            let name = task.get_type().fully_qualified_name()?;
            return Err(PyRuntimeError::new_err(format!(
                "{name} object is already initialized"
            )));
        }
        Task::start(&task)
    };
    match again() {
        Ok(()) => 0,
        Err(e) => {
            e.restore(py);
            -1
        }
    }
}

/// A `METH_NOARGS` method of `Task` as a C function (`fastcall::noargs_entry`) and its
/// definition `$def`: the methods asyncio calls on every task (`gather`'s done callback asks
/// `cancelled()`, `exception()` and `result()` of each child) without PyO3's trampoline and
/// argument handling, about 70 instructions a call.
macro_rules! task_noargs {
    ($def:ident, $func:ident, $name:literal, $doc:literal, |$task:ident| $body:expr) => {
        crate::fastcall::noargs_entry!($func, Task, |$task| $body);

        static $def: MethodDef = MethodDef::meth_noargs($name, $func, $doc);
    };
}

task_noargs!(
    DONE,
    task_done,
    c"done",
    c"done($self, /)\n--\n\nReturn True if the future is done.",
    |task| Ok(
        PyBool::new(task.py(), task.get().phase(task.py())? != Phase::Pending)
            .to_owned()
            .into_ptr()
    )
);
task_noargs!(
    CANCELLED,
    task_cancelled,
    c"cancelled",
    c"cancelled($self, /)\n--\n\nReturn True if the future was cancelled.",
    |task| Ok(
        PyBool::new(task.py(), task.get().phase(task.py())? == Phase::Cancelled)
            .to_owned()
            .into_ptr()
    )
);
task_noargs!(
    RESULT,
    task_result,
    c"result",
    c"result($self, /)\n--\n\nReturn the result this future represents.",
    |task| Ok(task.get().result_impl(task.py())?.into_ptr())
);
task_noargs!(
    EXCEPTION,
    task_exception,
    c"exception",
    c"exception($self, /)\n--\n\nReturn the exception that was set on this future.",
    |task| Ok(task.get().exception_impl(task.py())?.into_ptr())
);

/// `add_done_callback(fn, /, *, context=None)`.
unsafe extern "C" fn task_add_done_callback(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargsf: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls METH_FASTCALL functions with the GIL held.
    let py = unsafe { Python::assume_attached() };
    entry(py, || {
        // SAFETY: `nargsf` comes from CPython's vectorcall protocol.
        let nargs = unsafe { ffi::PyVectorcall_NARGS(nargsf as usize) } as usize;
        if nargs != 1 {
            return Err(PyTypeError::new_err(format!(
                "add_done_callback() takes exactly 1 positional argument ({nargs} given)"
            )));
        }
        // SAFETY: as CPython passes them to this METH_FASTCALL | METH_KEYWORDS method.
        let (kwnames, raw) = unsafe { crate::fastcall::vector_args(py, args, nargs, &kwnames) };
        let mut context = None;
        for (name, &value) in kwnames.into_iter().flatten().zip(&raw[1..]) {
            if !crate::fastcall::is_context_name(&name) {
                return Err(PyTypeError::new_err(format!(
                    "add_done_callback() got an unexpected keyword argument '{name}'"
                )));
            }
            // SAFETY: a keyword value, a live object borrowed for the call.
            context = Some(unsafe { Borrowed::from_ptr(py, value) }.to_owned());
        }
        // SAFETY: the descriptor checked `slf`'s type; `raw[0]` is the one positional argument,
        // borrowed.
        let (task, callback) = unsafe {
            (
                Borrowed::from_ptr(py, slf).cast_unchecked::<Task>(),
                Borrowed::from_ptr(py, raw[0]).to_owned(),
            )
        };
        Task::add_callback(&task, callback, context)?;
        Ok(py.None().into_ptr())
    })
}

static ADD_DONE_CALLBACK: MethodDef = MethodDef::fastcall_keywords(
    c"add_done_callback",
    task_add_done_callback,
    c"add_done_callback($self, fn, /, *, context=None)\n--\n\nAdd a callback to be run when \
      the future becomes done.",
);

/// `ferroloop.Task.__init__`: what `tp_init` does (`task_init`), for an explicit call. Without
/// it the name would find `asyncio.Task.__init__`, which would initialise the C Task's unused
/// part of the object (`task_base`).
unsafe extern "C" fn task_init_method(
    slf: *mut ffi::PyObject,
    _args: *const *mut ffi::PyObject,
    _nargs: ffi::Py_ssize_t,
    _kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls a method with the GIL held, with `slf` a live instance of `Task`
    // (the method descriptor checked its type); `task_init` ignores its arguments.
    let status = unsafe { task_init(slf, std::ptr::null_mut(), std::ptr::null_mut()) };
    if status < 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: the GIL is held; `None` is immortal or reference counted as any object.
    unsafe { Python::assume_attached() }.None().into_ptr()
}

static INIT: MethodDef = MethodDef::fastcall_keywords(
    c"__init__",
    task_init_method,
    c"__init__($self, /, *args, **kwargs)\n--\n\nInitialize self.  See help(type(self)) for \
      accurate signature.",
);

/// `ferroloop.Task.__del__`: the finalizer (`task_finalize`), for an explicit call; without it
/// the name would find the C Task's, which reads the C Task's unused part of the object.
unsafe extern "C" fn task_del_method(
    slf: *mut ffi::PyObject,
    _unused: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: as in `task_init_method`; the finalizer keeps any exception being raised.
    unsafe { task_finalize(slf) };
    // SAFETY: the GIL is held.
    unsafe { Python::assume_attached() }.None().into_ptr()
}

static DEL: MethodDef = MethodDef::meth_noargs(
    c"__del__",
    task_del_method,
    c"__del__($self, /)\n--\n\nCalled when the instance is about to be destroyed.",
);

/// PyO3's `tp_dealloc` for `Task`, which `task_dealloc` runs after the finalizer.
static PYO3_DEALLOC: std::sync::OnceLock<unsafe extern "C" fn(*mut ffi::PyObject)> =
    std::sync::OnceLock::new();

/// Whether `asyncio.Task`'s `tp_dealloc` releases the instance's reference to its type
/// (`task_base::base_releases_type`), set with `PYO3_DEALLOC`.
static BASE_RELEASES_TYPE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// `Task`'s `tp_dealloc`: the finalizer first (it may resurrect the task), then PyO3's, which
/// drops the Rust state and calls `asyncio.Task`'s `tp_dealloc` to free the object.
///
/// # Safety
/// Called by CPython when a `Task`'s reference count drops to zero, with the GIL held.
unsafe extern "C" fn task_dealloc(obj: *mut ffi::PyObject) {
    // SAFETY: `obj` is a `Task` whose last reference is gone (see the function's contract);
    // this is what a `tp_dealloc` with a `tp_finalize` does first.
    if unsafe { ffi::PyObject_CallFinalizerFromDealloc(obj) } < 0 {
        return; // resurrected by the finalizer
    }
    if let Some(dealloc) = PYO3_DEALLOC.get() {
        if BASE_RELEASES_TYPE.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: the instance holds a reference to its (heap) type, which PyO3's
            // `tp_dealloc` releases after the base's `tp_dealloc` released it too: one more
            // reference keeps the count right (CPython's `subtype_dealloc` releases it only
            // when the base does not).
            unsafe { ffi::Py_INCREF(ffi::Py_TYPE(obj).cast()) };
        }
        // SAFETY: PyO3's own `tp_dealloc` for this type, on the object it was made for.
        unsafe { dealloc(obj) };
    }
}

/// `Task`'s `tp_finalize`: the reports the C Task's finalizer makes, through the loop's
/// exception handler: "Task was destroyed but it is pending!" and "Task exception was never
/// retrieved". The exception being raised, if any, is kept.
///
/// # Safety
/// Called by CPython (from `task_dealloc` or the garbage collector) with the GIL held, on a
/// live `Task`.
unsafe extern "C" fn task_finalize(obj: *mut ffi::PyObject) {
    // SAFETY: CPython holds the GIL while it calls a type slot.
    let py = unsafe { Python::assume_attached() };
    // SAFETY: `obj` is a live `Task` (see the function's contract), borrowed for the call.
    let task = unsafe { Borrowed::from_ptr(py, obj).cast_unchecked::<Task>() };
    if !task.get().has_report() {
        return; // the usual case: finished and its outcome retrieved
    }
    let saved = PyErr::take(py);
    if let Err(e) = Task::finalize(&task) {
        e.write_unraisable(py, Some(task.as_any()));
    }
    if let Some(e) = saved {
        e.restore(py);
    }
}

impl Task {
    /// The task's phase (`done()`, `cancelled()`).
    fn phase(&self, py: Python<'_>) -> PyResult<Phase> {
        Ok(self.st.borrow(py)?.phase)
    }

    /// Whether `finalize` has something to report: the same tests, without taking anything.
    fn has_report(&self) -> bool {
        self.st.try_borrow_for_gc().is_some_and(|st| {
            st.loop_.is_some() && (st.reports_pending() || (st.log_tb && st.exception.is_some()))
        })
    }

    /// Visits every reference the task holds (see `task_traverse`) with `visit(obj, arg)`,
    /// returning the first non-zero result. The state is skipped while it is borrowed (skipping
    /// only keeps objects alive).
    fn visit_refs(&self, visit: ffi::visitproc, arg: *mut std::ffi::c_void) -> c_int {
        macro_rules! visit {
            ($field:expr) => {
                if let Some(obj) = &$field {
                    // SAFETY: the collector's `visit` and `arg`, with a live object the task
                    // holds a reference to.
                    let ret = unsafe { visit(obj.as_ptr().cast(), arg) };
                    if ret != 0 {
                        return ret;
                    }
                }
            };
        }
        visit!(self.core);
        let Some(st) = self.st.try_borrow_for_gc() else {
            return 0;
        };
        visit!(st.loop_);
        visit!(st.context);
        visit!(st.coro);
        visit!(st.name);
        visit!(st.result);
        visit!(st.exception);
        visit!(st.exception_tb);
        visit!(st.cancel_msg);
        visit!(st.cancelled_exc);
        visit!(st.fut_waiter);
        visit!(st.source_tb);
        visit!(st.wakeup);
        visit!(st.hook);
        for (cb, ctx) in &st.callbacks {
            visit!(Some(cb));
            visit!(Some(ctx));
        }
        0
    }

    /// What the collector's `tp_clear` (`task_clear`) drops to break a cycle.
    fn clear_refs(&self, py: Python<'_>) {
        let taken = self.st.borrow(py).ok().map(|mut st| {
            (
                st.loop_.take(),
                st.context.take(),
                st.coro.take(),
                st.result.take(),
                st.exception.take(),
                st.exception_tb.take(),
                st.fut_waiter.take(),
                st.hook.take(),
                st.wakeup.take(),
                std::mem::take(&mut st.callbacks),
            )
        });
        drop(taken);
    }

    /// What `task_finalize` reports, if anything.
    fn finalize(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let (pending, unretrieved, loop_, source_tb) = {
            let Some(mut st) = slf.get().st.try_borrow_for_gc() else {
                return Ok(());
            };
            let pending = st.reports_pending();
            let unretrieved = if st.log_tb {
                st.log_tb = false;
                st.exception.as_ref().map(|e| e.clone_ref(py))
            } else {
                None
            };
            (
                pending,
                unretrieved,
                st.loop_.as_ref().map(|l| l.clone_ref(py)),
                st.source_tb.as_ref().map(|t| t.clone_ref(py)),
            )
        };
        let Some(loop_) = loop_ else {
            return Ok(());
        };
        let loop_ = loop_.bind(py);
        if pending {
            let context = PyDict::new(py);
            context.set_item("message", "Task was destroyed but it is pending!")?;
            context.set_item("task", slf)?;
            if let Some(tb) = &source_tb {
                context.set_item("source_traceback", tb)?;
            }
            loop_.call_method1(intern!(py, "call_exception_handler"), (context,))?;
        }
        if let Some(exc) = unretrieved {
            let context = PyDict::new(py);
            context.set_item("message", "Task exception was never retrieved")?;
            context.set_item("exception", exc)?;
            context.set_item("future", slf)?;
            if let Some(tb) = &source_tb {
                context.set_item("source_traceback", tb)?;
            }
            loop_.call_method1(intern!(py, "call_exception_handler"), (context,))?;
        }
        Ok(())
    }
}

/// `Task`'s `tp_traverse`, in place of PyO3's: the instance's type, its dict (the base class's,
/// `task_base::visit_base`) and what the task holds (`Task::visit_refs`). PyO3's wraps a
/// `__traverse__` in a panic guard and thread-local writes, then searches the base types and calls
/// `asyncio.Task`'s, which visits the C Task's fields, all unset on a `ferroloop.Task`: about
/// 800 instructions per task visit against about 250.
///
/// # Safety
/// Called by the collector with the GIL held, on a live `Task`.
unsafe extern "C" fn task_traverse(
    obj: *mut ffi::PyObject,
    visit: ffi::visitproc,
    arg: *mut std::ffi::c_void,
) -> c_int {
    // SAFETY: the collector runs with the GIL held; the token is used for a pointer conversion
    // only. `obj` is a live `Task`, which is frozen, so a shared reference is all PyO3 would give
    // `__traverse__`.
    let task: &Task = unsafe {
        Borrowed::from_ptr(Python::assume_attached(), obj)
            .cast_unchecked::<Task>()
            .get()
    };
    // SAFETY: `obj` is a live instance of a subclass of `asyncio.Task` (see the contract);
    // `visit` and `arg` are the collector's. The type, the instance dict and the C part.
    let ret = unsafe { crate::task_base::visit_base(obj, visit, arg) };
    if ret != 0 {
        return ret;
    }
    task.visit_refs(visit, arg)
}

/// `Task`'s `tp_clear`, which PyO3 would only make together with its own `tp_traverse`: drops
/// the state's references (`Task::clear_refs`), the instance dict and the C part's.
///
/// # Safety
/// Called by the collector with the GIL held, on a live `Task`.
unsafe extern "C" fn task_clear(obj: *mut ffi::PyObject) -> c_int {
    // Inside PyO3's attach scope: the collector calls this with no PyO3 frame on the stack,
    // where the references `clear_refs` drops would only be queued in PyO3's pool, the cycle
    // left unbroken and the cleared task alive (and, on 3.14, still in the thread's list of
    // tasks that `asyncio.all_tasks()` walks).
    Python::attach(|py| {
        // SAFETY: CPython holds the GIL while it calls a type slot; `obj` is a live `Task`,
        // borrowed for the call.
        let task = unsafe { Borrowed::from_ptr(py, obj).cast_unchecked::<Task>() };
        task.get().clear_refs(py);
        // SAFETY: `obj` is a live instance of a subclass of `asyncio.Task`, GIL held.
        unsafe { crate::task_base::clear_base(obj) };
    });
    0
}

/// Installs `Task`'s `tp_init` (`task_init`), `tp_finalize`, `tp_traverse` (`task_traverse`),
/// `tp_clear` (`task_clear`) and `tp_dealloc` (PyO3 has no way to declare the first two, and its
/// `tp_dealloc` does not run a finalizer), and, in its dict, `__init__` and `__del__` (so that
/// those names find ours and not `asyncio.Task`'s) and the C-function methods above.
pub fn install_task_slots(py: Python<'_>) -> PyResult<()> {
    let ty = py.get_type::<Task>();
    let tp = ty.as_type_ptr();
    BASE_RELEASES_TYPE.store(
        crate::task_base::base_releases_type(py),
        std::sync::atomic::Ordering::Relaxed,
    );
    // SAFETY: `Task` is a heap type created by PyO3; its slots are ours to set before any
    // instance exists (this runs during module initialisation, with the GIL held). The previous
    // `tp_dealloc` is kept and called by `task_dealloc`.
    unsafe {
        (*tp).tp_init = Some(task_init);
        (*tp).tp_finalize = Some(task_finalize);
        (*tp).tp_traverse = Some(task_traverse);
        (*tp).tp_clear = Some(task_clear);
        if let Some(dealloc) = (*tp).tp_dealloc {
            if PYO3_DEALLOC.set(dealloc).is_ok() {
                (*tp).tp_dealloc = Some(task_dealloc);
            }
        }
    }
    for def in [
        &INIT,
        &DEL,
        &DONE,
        &CANCELLED,
        &RESULT,
        &EXCEPTION,
        &ADD_DONE_CALLBACK,
    ] {
        let descr = method_descriptor(&ty, def)?;
        // SAFETY: the type's own dict, written directly: `setattr` on the type would also
        // replace the slot with one that looks the name up on every call. The name is a
        // 'static C string; the dict takes its own references.
        let status =
            unsafe { ffi::PyDict_SetItemString((*tp).tp_dict, def.0.ml_name, descr.as_ptr()) };
        if status < 0 {
            return Err(PyErr::fetch(py));
        }
    }
    // SAFETY: the GIL is held; the type's lookup cache is told its dict changed.
    unsafe { ffi::PyType_Modified(tp) };
    Ok(())
}
