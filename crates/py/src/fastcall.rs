//! Raw `METH_FASTCALL | METH_KEYWORDS` entry points for `call_soon`, `call_later` and `call_at`,
//! the loop's hottest methods (every `Future` callback and `Task` step goes through `call_soon`,
//! usually with `context=`; every sleep, timeout and `wait_for` through the timer methods), and
//! `create_task`; `METH_NOARGS` ones for `get_debug`, which the C `Future.__init__` calls for
//! every Future and Task, `create_future` and `time`.
//!
//! PyO3's generated wrapper costs about 320 instructions per call here (trampoline, generic
//! argument extraction, the thread-local GIL counter); these entries handle the common shape
//! (fixed arguments positional, at most `context=` by keyword) directly and call the same
//! `LoopCore::*_impl` functions; any other shape is forwarded to the PyO3 method, so signatures
//! and error messages stay exactly those of the PyO3 methods. The PyO3 methods stay on `LoopCore`
//! (they are what the stubs describe); `_install_fast_methods` puts these descriptors on the Python
//! subclass `ferroloop.Loop`, where attribute lookup finds them first. `MethodDef` and `entry`
//! also serve the server's raw `receive`/`send` (`server/cycle.rs`).
//!
//! Invariants:
//! - CPython calls the function with the GIL held, with `nargs` positional arguments followed by
//!   one value per name in `kwnames`, all borrowed for the duration of the call.
//! - The descriptor is created for the class it is installed on (`ferroloop.Loop`, checked to
//!   be a `LoopCore` subclass), and CPython checks that `self` is an instance of that class
//!   before calling, so `self` is a `LoopCore`. A descriptor of the subclass rather than of
//!   `LoopCore` lets the interpreter specialise `loop.create_future()` (its
//!   `PRECALL_NO_KW_METHOD_DESCRIPTOR_*` forms need `type(self)` to be exactly the descriptor's
//!   class) and spares the method descriptor's subclass walk for the C `Future.__init__`'s
//!   `loop.get_debug()`.
//! - No panic crosses the FFI boundary: the body runs under `catch_unwind`, and a panic becomes
//!   a `PanicException`, as in PyO3's own wrappers.
//! - Semantics and error messages match the PyO3 method; `tests/loop/test_call_soon.py` runs
//!   every case against asyncio's loop.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::panic::PanicException;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyFloat, PyString, PyTuple, PyType};

use crate::event_loop::LoopCore;
use crate::handle::CallArgs;

/// A `PyMethodDef` in a static: CPython only reads it.
pub(crate) struct MethodDef(pub(crate) ffi::PyMethodDef);

// SAFETY: the definition is never mutated after construction, and its pointers refer to
// 'static C strings and a function.
unsafe impl Sync for MethodDef {}

impl MethodDef {
    /// A `METH_O` definition: `func(self, arg)`.
    pub(crate) const fn meth_o(
        name: &'static std::ffi::CStr,
        func: ffi::PyCFunction,
        doc: &'static std::ffi::CStr,
    ) -> Self {
        Self(ffi::PyMethodDef {
            ml_name: name.as_ptr(),
            ml_meth: ffi::PyMethodDefPointer { PyCFunction: func },
            ml_flags: ffi::METH_O,
            ml_doc: doc.as_ptr(),
        })
    }

    /// A `METH_FASTCALL | METH_KEYWORDS` definition: `func(self, args, nargs, kwnames)`.
    pub(crate) const fn fastcall_keywords(
        name: &'static std::ffi::CStr,
        func: ffi::PyCFunctionFastWithKeywords,
        doc: &'static std::ffi::CStr,
    ) -> Self {
        Self(ffi::PyMethodDef {
            ml_name: name.as_ptr(),
            ml_meth: ffi::PyMethodDefPointer {
                PyCFunctionFastWithKeywords: func,
            },
            ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
            ml_doc: doc.as_ptr(),
        })
    }

    /// A `METH_FASTCALL` definition: `func(self, args, nargs)`.
    pub(crate) const fn fastcall(
        name: &'static std::ffi::CStr,
        func: ffi::PyCFunctionFast,
        doc: &'static std::ffi::CStr,
    ) -> Self {
        Self(ffi::PyMethodDef {
            ml_name: name.as_ptr(),
            ml_meth: ffi::PyMethodDefPointer {
                PyCFunctionFast: func,
            },
            ml_flags: ffi::METH_FASTCALL,
            ml_doc: doc.as_ptr(),
        })
    }

    /// A `METH_NOARGS` definition: `func(self, NULL)`.
    pub(crate) const fn meth_noargs(
        name: &'static std::ffi::CStr,
        func: ffi::PyCFunction,
        doc: &'static std::ffi::CStr,
    ) -> Self {
        Self(ffi::PyMethodDef {
            ml_name: name.as_ptr(),
            ml_meth: ffi::PyMethodDefPointer { PyCFunction: func },
            ml_flags: ffi::METH_NOARGS,
            ml_doc: doc.as_ptr(),
        })
    }
}

/// Puts `send` in the `am_send` slot of `tp`, a PyO3 class with an `am_await` slot (PyO3 has no
/// way to declare `am_send`).
///
/// # Safety
/// `send` must accept every instance of `tp`; call it with the GIL held, at module
/// initialisation, before any instance exists.
pub(crate) unsafe fn install_am_send(tp: *mut ffi::PyTypeObject, send: ffi::sendfunc) {
    // SAFETY: `tp` is a live heap type created by PyO3 with an `am_await` slot, so `tp_as_async`
    // points into its own `PyHeapTypeObject`, writable and alive as long as the type.
    unsafe {
        let slots = (*tp).tp_as_async;
        if !slots.is_null() {
            (*slots).am_send = Some(send);
        }
    }
}

/// A built-in function made from `def`, bound to `slf` (CPython passes it back as `self`).
///
/// # Safety
/// `def`'s function must accept `slf` as its `self` (the function object keeps its own reference
/// to `slf`, so it stays alive for every call).
pub(crate) unsafe fn bound_builtin<'py>(
    slf: &Bound<'py, PyAny>,
    def: &'static MethodDef,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: we hold the GIL (`slf` is bound); CPython only reads the 'static definition (the
    // `*mut` is an artefact of the C signature); the caller vouches for `self`'s type.
    unsafe {
        Bound::from_owned_ptr_or_err(
            slf.py(),
            ffi::PyCFunction_NewEx(
                std::ptr::addr_of!(def.0).cast_mut(),
                slf.as_ptr(),
                std::ptr::null_mut(),
            ),
        )
    }
}

/// A method descriptor of `ty` made from `def`: CPython checks that `self` is an instance of `ty`
/// before calling the function.
pub(crate) fn method_descriptor<'py>(
    ty: &Bound<'py, PyType>,
    def: &'static MethodDef,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: we hold the GIL; the type pointer is alive (held by `ty`), and CPython only reads
    // the 'static method definition (the `*mut` is an artefact of the C signature).
    unsafe {
        Bound::from_owned_ptr_or_err(
            ty.py(),
            ffi::PyDescr_NewMethod(ty.as_type_ptr(), std::ptr::addr_of!(def.0).cast_mut()),
        )
    }
}

static CALL_SOON: MethodDef = MethodDef::fastcall_keywords(
    c"call_soon",
    call_soon_fast,
    c"call_soon(callback, *args, context=None)\n--\n\nArrange for callback(*args) to be called soon.",
);
static CALL_LATER: MethodDef = MethodDef::fastcall_keywords(
    c"call_later",
    call_later_fast,
    c"call_later(delay, callback, *args, context=None)\n--\n\nCall callback(*args) after delay seconds.",
);
static CALL_AT: MethodDef = MethodDef::fastcall_keywords(
    c"call_at",
    call_at_fast,
    c"call_at(when, callback, *args, context=None)\n--\n\nCall callback(*args) at loop time when.",
);

static CREATE_TASK: MethodDef = MethodDef::fastcall_keywords(
    c"create_task",
    create_task_fast,
    c"create_task(coro, *, name=None, context=None, **kwargs)\n--\n\nSchedule a coroutine object as a Task.",
);

static CREATE_FUTURE: MethodDef = MethodDef::fastcall(
    c"create_future",
    create_future_fast,
    c"create_future()\n--\n\nCreate a Future object attached to the loop.",
);

static TIME: MethodDef = MethodDef::fastcall(
    c"time",
    time_fast,
    c"time()\n--\n\nThe loop's clock: seconds, monotonic.",
);

static GET_DEBUG: MethodDef = MethodDef::meth_noargs(
    c"get_debug",
    get_debug_fast,
    c"get_debug()\n--\n\nWhether the loop is in debug mode.",
);

/// The hot methods, each bound once per loop and called directly (`cached_method.rs`).
const CACHED: [(&str, &MethodDef); crate::cached_method::CACHED_METHODS] = [
    ("call_soon", &CALL_SOON),
    ("call_later", &CALL_LATER),
    ("call_at", &CALL_AT),
    ("create_future", &CREATE_FUTURE),
    ("create_task", &CREATE_TASK),
    ("time", &TIME),
];

/// Puts the fast `call_soon`, `call_later`, `call_at`, `create_future`, `create_task`, `time`
/// and `get_debug` on `cls` (a subclass of `LoopCore`).
#[pyfunction]
pub fn _install_fast_methods(cls: &Bound<'_, PyAny>) -> PyResult<()> {
    let cls: &Bound<'_, PyType> = cls.cast()?;
    if !cls.is_subclass_of::<LoopCore>()? {
        return Err(PyTypeError::new_err(
            "_install_fast_methods() takes a subclass of LoopCore",
        ));
    }
    // The hot methods bind once per loop and call their functions directly
    // (`cached_method.rs`), unless the fallbacks are forced (`cpython_loans.rs`).
    if crate::cached_method::enabled() {
        let defs = CACHED.map(|(_, def)| def);
        let descrs = crate::cached_method::wrap_all(&defs, cls)?;
        for ((name, _), descr) in CACHED.iter().zip(descrs) {
            cls.setattr(*name, descr)?;
        }
    } else {
        for (name, def) in CACHED {
            cls.setattr(name, method_descriptor(cls, def)?)?;
        }
    }
    cls.setattr("get_debug", method_descriptor(cls, &GET_DEBUG)?)?;
    Ok(())
}

/// Which method an entry point serves, and its leading argument before `callback`.
#[derive(Clone, Copy)]
enum Method {
    Soon,
    Later,
    At,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Self::Soon => "call_soon",
            Self::Later => "call_later",
            Self::At => "call_at",
        }
    }

    /// Positional arguments before `*args`: `callback`, preceded by `delay`/`when`.
    fn fixed(self) -> usize {
        match self {
            Self::Soon => 1,
            Self::Later | Self::At => 2,
        }
    }
}

/// Runs `body` as a C entry point: errors become a raised exception, a panic a `PanicException`.
pub(crate) fn entry(
    py: Python<'_>,
    body: impl FnOnce() -> PyResult<*mut ffi::PyObject>,
) -> *mut ffi::PyObject {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(obj)) => obj,
        Ok(Err(err)) => {
            err.restore(py);
            std::ptr::null_mut()
        }
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|m| (*m).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic in a ferroloop loop method".to_owned());
            PanicException::new_err(msg).restore(py);
            std::ptr::null_mut()
        }
    }
}

macro_rules! fast_entry {
    ($func:ident, $method:expr) => {
        unsafe extern "C" fn $func(
            slf: *mut ffi::PyObject,
            args: *const *mut ffi::PyObject,
            nargsf: ffi::Py_ssize_t,
            kwnames: *mut ffi::PyObject,
        ) -> *mut ffi::PyObject {
            // SAFETY: CPython calls METH_FASTCALL functions on a thread that holds the GIL.
            let py = unsafe { Python::assume_attached() };
            // SAFETY: see the module invariants: a live LoopCore instance and
            // `nargs + len(kwnames)` borrowed argument pointers.
            entry(py, || unsafe {
                dispatch(py, $method, slf, args, nargsf, kwnames)
            })
        }
    };
}

/// `entry` inside PyO3's attach scope, for entry points that Python code calls where no PyO3
/// frame may be on the stack (another loop's handles): there a dropped `Py` is only queued in
/// PyO3's pool until PyO3 is next entered, here it is released at once. The scope costs a
/// thread-local counter update when a PyO3 frame is already there, `PyGILState_Ensure` when not,
/// so the loop's own hot entry points use `entry`.
pub(crate) fn attached_entry(
    body: impl FnOnce(Python<'_>) -> PyResult<*mut ffi::PyObject>,
) -> *mut ffi::PyObject {
    Python::attach(|py| entry(py, || body(py)))
}

/// A `METH_NOARGS` entry point of the pyclass `$ty`: `$body` sees the instance as `$obj`
/// (`&Bound<$ty>`, borrowed for the call).
macro_rules! noargs_entry {
    ($(#[$attr:meta])* $func:ident, $ty:ty, |$obj:ident| $body:expr) => {
        $(#[$attr])*
        unsafe extern "C" fn $func(
            slf: *mut ffi::PyObject,
            _noargs: *mut ffi::PyObject,
        ) -> *mut ffi::PyObject {
            // SAFETY: CPython calls METH_NOARGS functions on a thread that holds the GIL.
            let py = unsafe { Python::assume_attached() };
            $crate::fastcall::entry(py, || {
                // SAFETY: CPython's method descriptor checked that `slf` is an instance of the
                // type it was made for, `$ty`, borrowed for the call.
                let $obj = unsafe { Bound::ref_from_ptr(py, &slf).cast_unchecked::<$ty>() };
                $body
            })
        }
    };
}
pub(crate) use noargs_entry;

noargs_entry!(
    /// `get_debug()`: the same flag as the `LoopCore.get_debug` pymethod, without PyO3's wrapper.
    get_debug_fast,
    LoopCore,
    |core| Ok(PyBool::new(core.py(), core.get().debug()).to_owned().into_ptr())
);

/// A `METH_FASTCALL` entry point of a `LoopCore` method that takes no arguments: `$body` sees
/// the loop as `$obj`. `METH_FASTCALL` rather than `METH_NOARGS`, so that CPython specialises a
/// call of the bound method (`cached_method.rs`); any argument is refused with `METH_NOARGS`'s
/// message (CPython itself refuses keywords to a `METH_FASTCALL` function).
macro_rules! nullary_entry {
    ($(#[$attr:meta])* $func:ident, $name:literal, |$obj:ident| $body:expr) => {
        $(#[$attr])*
        unsafe extern "C" fn $func(
            slf: *mut ffi::PyObject,
            _args: *mut *mut ffi::PyObject,
            nargs: ffi::Py_ssize_t,
        ) -> *mut ffi::PyObject {
            // SAFETY: CPython calls METH_FASTCALL functions on a thread that holds the GIL.
            let py = unsafe { Python::assume_attached() };
            entry(py, || {
                if nargs != 0 {
                    return Err(PyTypeError::new_err(format!(
                        "{}() takes no arguments ({nargs} given)",
                        $name
                    )));
                }
                // SAFETY: CPython's method descriptor (or `cached_method.rs`'s exact type check)
                // made sure `slf` is a `LoopCore` instance, borrowed for the call.
                let $obj = unsafe { Bound::ref_from_ptr(py, &slf).cast_unchecked::<LoopCore>() };
                $body
            })
        }
    };
}

nullary_entry!(
    /// `time()`: the `LoopCore.time` pymethod without PyO3's wrapper (every `call_later`
    /// written in Python as `loop.call_at(loop.time() + delay, ...)`, every timeout's deadline).
    time_fast,
    "time",
    |core| Ok(PyFloat::new(core.py(), LoopCore::time(core.get())).into_ptr())
);

nullary_entry!(
    /// `create_future()`: the `LoopCore.create_future` pymethod without PyO3's wrapper (every
    /// awaited `sock_*` operation, transport waiter and user future goes through it).
    create_future_fast,
    "create_future",
    |core| Ok(LoopCore::create_future(core)?.into_ptr())
);

/// The keyword names (if any) and the `nargs` positional plus keyword argument pointers of a
/// vectorcall, as a slice.
///
/// # Safety
/// `args`, `nargs` and `kwnames` must be as CPython passes them to a `METH_FASTCALL |
/// METH_KEYWORDS` function, with the GIL held; the result borrows them for the call.
#[allow(
    clippy::inline_always,
    reason = "part of `dispatch`, which is specialised per entry point on the call_soon hot path"
)]
#[inline(always)]
pub(crate) unsafe fn vector_args<'a, 'py>(
    py: Python<'py>,
    args: *const *mut ffi::PyObject,
    nargs: usize,
    kwnames: &'a *mut ffi::PyObject,
) -> (Option<&'a Bound<'py, PyTuple>>, &'a [*mut ffi::PyObject]) {
    let kwnames = if kwnames.is_null() {
        None
    } else {
        // SAFETY: a non-NULL `kwnames` is a tuple of str borrowed for the call.
        Some(unsafe { Bound::ref_from_ptr(py, kwnames).cast_unchecked::<PyTuple>() })
    };
    let nkw = kwnames.map_or(0, PyTupleMethods::len);
    let raw: &[*mut ffi::PyObject] = if nargs + nkw == 0 {
        &[]
    } else {
        // SAFETY: CPython passes `nargs + nkw` valid, borrowed pointers at `args`.
        unsafe { std::slice::from_raw_parts(args, nargs + nkw) }
    };
    (kwnames, raw)
}

/// `create_task(coro)`: the common shape (what `ensure_future`, `gather` and `TaskGroup` pass)
/// goes straight to `LoopCore::create_task`; any other is forwarded to the PyO3 method.
unsafe extern "C" fn create_task_fast(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargsf: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls METH_FASTCALL functions on a thread that holds the GIL.
    let py = unsafe { Python::assume_attached() };
    entry(py, || {
        // SAFETY: `nargsf` comes from CPython's vectorcall protocol.
        let nargs = unsafe { ffi::PyVectorcall_NARGS(nargsf as usize) } as usize;
        // SAFETY: CPython's method descriptor checked that `slf` is a LoopCore instance,
        // borrowed for the call (as in `dispatch`, no reference count changes).
        let lp = unsafe { Bound::ref_from_ptr(py, &slf).cast_unchecked::<LoopCore>() };
        if nargs == 1 && kwnames.is_null() {
            // SAFETY: one positional argument, a live object borrowed for this call.
            let coro = unsafe { Bound::ref_from_ptr(py, &*args) };
            return Ok(LoopCore::create_task(lp, coro, None, None, None)?.into_ptr());
        }
        // SAFETY: as CPython passes them to this METH_FASTCALL | METH_KEYWORDS method.
        let (kwnames, raw) = unsafe { vector_args(py, args, nargs, &kwnames) };
        // SAFETY: every pointer in `raw` is a live object borrowed for this call.
        let all: Vec<_> = raw
            .iter()
            .map(|&p| unsafe { Bound::from_borrowed_ptr(py, p) })
            .collect();
        slow_path(lp, "create_task", &all[..nargs], kwnames, &all[nargs..])
    })
}

fast_entry!(call_soon_fast, Method::Soon);
fast_entry!(call_later_fast, Method::Later);
fast_entry!(call_at_fast, Method::At);

/// # Safety
/// The arguments must be as CPython passes them to a `METH_FASTCALL | METH_KEYWORDS` method of
/// `LoopCore` (see the module invariants), with the GIL held.
#[allow(
    clippy::inline_always,
    reason = "specialised per entry point: -40 instructions per call_soon under callgrind"
)]
#[inline(always)]
unsafe fn dispatch(
    py: Python<'_>,
    method: Method,
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargsf: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> PyResult<*mut ffi::PyObject> {
    // SAFETY: `nargsf` comes from CPython's vectorcall protocol.
    let nargs = unsafe { ffi::PyVectorcall_NARGS(nargsf as usize) } as usize;
    // SAFETY: the caller passes the arguments as CPython gave them.
    let (kwnames, raw) = unsafe { vector_args(py, args, nargs, &kwnames) };
    let nkw = raw.len() - nargs;
    // Borrowed, not Bound: every argument is alive for the call, so no reference count changes
    // (about 30 instructions per call).
    // SAFETY: every pointer in `raw` is a live object borrowed for this call.
    let arg = |i: usize| unsafe { Bound::ref_from_ptr(py, &raw[i]) };
    // SAFETY: CPython's method descriptor checked that `slf` is a LoopCore instance, borrowed for
    // the call.
    let core = unsafe { Bound::ref_from_ptr(py, &slf).cast_unchecked::<LoopCore>() };

    // The fast shape: every fixed argument positional, at most `context=` by keyword.
    let context_only = match &kwnames {
        None => true,
        Some(names) if names.len() == 1 => {
            // SAFETY: a one-item tuple; the item is borrowed from it for the call.
            let name = unsafe { names.get_borrowed_item_unchecked(0) };
            is_context_name(&name)
        }
        Some(_) => false,
    };
    let fixed = method.fixed();
    if nargs < fixed || !context_only {
        let positional: Vec<_> = (0..nargs).map(|i| arg(i).clone()).collect();
        let kwvalues: Vec<_> = (nargs..nargs + nkw).map(|i| arg(i).clone()).collect();
        return slow_path(core, method.name(), &positional, kwnames, &kwvalues);
    }
    let context = (nkw == 1).then(|| arg(nargs));
    let rest = match nargs - fixed {
        0 => CallArgs::Empty,
        1 => CallArgs::One(arg(fixed).clone().unbind()),
        _ => CallArgs::Tuple(PyTuple::new(py, (fixed..nargs).map(arg))?.unbind()),
    };
    let callback = arg(fixed - 1);
    let handle: Py<PyAny> = match method {
        Method::Soon => LoopCore::call_soon_impl(core, callback, rest, context)?.into_any(),
        Method::Later => {
            LoopCore::call_later_impl(core, arg(0), callback, rest, context)?.into_any()
        }
        Method::At => LoopCore::call_at_impl(core, arg(0), callback, rest, context)?.into_any(),
    };
    Ok(handle.into_ptr())
}

/// The `"context"` object CPython's `_asyncio` passes as the keyword name (its static
/// `_Py_ID(context)`, which 3.11 does not intern, so it is not `intern!`'s object): kept once
/// seen, so that the usual case is a pointer comparison rather than a UTF-8 conversion and a
/// string comparison (about 40 instructions per call_soon under callgrind).
static C_CONTEXT_NAME: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Whether a keyword name is `context`: by identity with the names seen before, else by value.
pub(crate) fn is_context_name(name: &Bound<'_, PyAny>) -> bool {
    let py = name.py();
    if name.is(intern!(py, "context")) || C_CONTEXT_NAME.get(py).is_some_and(|n| name.is(n)) {
        return true;
    }
    let matches = name
        .cast::<PyString>()
        .is_ok_and(|n| n.to_str().is_ok_and(|t| t == "context"));
    if matches {
        // The first such name is kept (a strong reference, so its address is never reused).
        let _ = C_CONTEXT_NAME.set(py, name.clone().unbind());
    }
    matches
}

/// Any other call shape (keywords for the fixed arguments, unknown keywords, missing
/// arguments) goes to the PyO3 method on `LoopCore`, which has the exact signature and errors.
fn slow_path(
    core: &Bound<'_, LoopCore>,
    method: &str,
    positional: &[Bound<'_, PyAny>],
    kwnames: Option<&Bound<'_, PyTuple>>,
    kwvalues: &[Bound<'_, PyAny>],
) -> PyResult<*mut ffi::PyObject> {
    let py = core.py();
    let kwargs = PyDict::new(py);
    if let Some(names) = kwnames {
        for (name, value) in names.iter().zip(kwvalues) {
            kwargs.set_item(name, value)?;
        }
    }
    let mut all = vec![core.clone().into_any()];
    all.extend(positional.iter().cloned());
    let unbound = py.get_type::<LoopCore>().getattr(method)?;
    Ok(unbound
        .call(PyTuple::new(py, all)?, Some(&kwargs))?
        .into_ptr())
}
