//! `call_soon` as a descriptor that binds once per loop and that the interpreter calls directly.
//!
//! asyncio's C `Future` and `Task` call `loop.call_soon(..., context=ctx)` for every done
//! callback and task step, and fetch the attribute with `PyObject_GetAttr` each time
//! (`_asynciomodule.c: call_soon`). On a plain method descriptor that binds a new method object
//! per call. Python code (`loop.call_soon(cb)`) goes through `LOAD_METHOD` instead, which binds
//! nothing when the descriptor's type declares itself a method descriptor.
//!
//! The descriptor serves both callers. Its `__get__` on a loop returns that loop's one bound
//! method, made on first use and kept in `LoopCore::bound_call_soon`, so the C `Future`'s lookup
//! allocates nothing. For Python code, `Py_TPFLAGS_METHOD_DESCRIPTOR` lets the interpreter's
//! specialised `LOAD_METHOD` push it unbound, and the call that follows is specialised too:
//! the descriptor is itself a type object (an instance of `meta_type()`, a subclass of `type`),
//! immutable and with a `tp_vectorcall`, which CPython 3.11 to 3.13 call straight from the
//! specialised instruction (`PRECALL_BUILTIN_CLASS`, `CALL_BUILTIN_CLASS`). Any other callable
//! object gets the generic call path (`PyObject_Vectorcall` and `_Py_CheckFunctionResult`).
//! Under callgrind that is 73 instructions less per `call_soon` callback (1,611 -> 1,538 in
//! `benchmarks/loop/call_soon.py`'s shape) than the same descriptor as an ordinary object.
//! The vectorcall, with the loop as the first argument, calls `call_soon`'s C function itself.
//!
//! What a user sees of it: `Loop.call_soon` reads as the descriptor, whose `repr`, `__name__`,
//! `__qualname__`, `__doc__`, `__objclass__` and signature are the method's; that it is a type
//! object shows only in `type(Loop.call_soon)` and `isinstance(Loop.call_soon, type)`. It cannot
//! be instantiated or subclassed. `loop.call_soon` is the loop's cached bound method.
//!
//! Invariants:
//! - `meta_type()` has one instance, `Registered::descr`, made once by [`wrap`] (a second
//!   `wrap` fails): the type refuses instantiation from Python (`refuse_new`, and
//!   `type.__new__` refuses a type whose `tp_new` is not `type`'s).
//! - `descr` is an immutable heap type, not subclassable, whose `tp_new` is NULL and whose
//!   `tp_vectorcall` is `vectorcall`; nothing changes them after `wrap`.
//! - `inner` is a method descriptor of `LoopCore` and `cls` a `LoopCore` subclass, set once in
//!   `REGISTERED`. `direct` is the C function of `inner`'s method definition. A call with at
//!   least one argument whose type is exactly `cls` passes the plain descriptor's checks (an
//!   argument for `self`, an instance of `LoopCore`), so calling `direct` for it is what the
//!   descriptor would do (less CPython's C recursion check, which guards nothing here:
//!   `call_soon` calls no callback); every other call and every bind goes through `inner`, so
//!   argument checks, the `self` type check and error messages are the plain descriptor's.
//! - The cached bound method refers back to its loop. `LoopCore` visits and clears it in its GC
//!   hooks, and `close()` drops it, so a loop is never kept alive by it.

use std::ffi::{c_int, c_ulong, c_void};
use std::mem::offset_of;
use std::ptr;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use pyo3::Borrowed;

use crate::event_loop::LoopCore;
use crate::fastcall::{entry, MethodDef};

/// What the one `call_soon` descriptor made by [`wrap`] serves (see the module invariants).
struct Registered {
    /// The descriptor: a type object whose type is `meta_type()`.
    descr: Py<PyAny>,
    /// A plain method descriptor of `LoopCore` for the same method definition.
    inner: Py<PyAny>,
    /// The class the descriptor was installed on (a `LoopCore` subclass).
    cls: Py<PyType>,
    /// `inner`'s C function, called directly for an instance of exactly `cls`.
    direct: ffi::PyCFunctionFastWithKeywords,
}

static REGISTERED: PyOnceLock<Registered> = PyOnceLock::new();

/// Whether the `cached_call_soon` loan was taken (`cpython_loans.rs`): set once, by
/// [`install`], at module initialisation.
static ENABLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Decides the `cached_call_soon` loan (only its speed is borrowed: nothing to check, off only
/// with `FERROLOOP_PORTABLE=1`). Called once, at module initialisation.
pub(crate) fn install(py: Python<'_>) {
    let taken =
        crate::cpython_loans::take(py, crate::cpython_loans::Loan::CachedCallSoon, || Ok(()));
    ENABLED.store(taken, std::sync::atomic::Ordering::Relaxed);
}

/// Whether `wrap` may be used for `call_soon` (else a plain method descriptor is).
pub(crate) fn enabled() -> bool {
    ENABLED.load(std::sync::atomic::Ordering::Relaxed)
}

unsafe extern "C" fn vectorcall(
    _callable: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargsf: usize,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls a vectorcall slot with the GIL held.
    let py = unsafe { Python::assume_attached() };
    // Not through `entry`/`registered`: its unwinding guard and `PyResult` cost 12 instructions
    // per `call_soon` here (callgrind), and nothing below can panic.
    let Some(reg) = REGISTERED.get(py) else {
        // SAFETY: the GIL is held; the message is a static C string.
        unsafe {
            ffi::PyErr_SetString(
                ffi::PyExc_TypeError,
                c"cached_method: not installed".as_ptr(),
            );
        }
        return ptr::null_mut();
    };
    // SAFETY: CPython calls a vectorcall slot on a live object with the arguments as the protocol
    // passes them. With at least one argument, `args[0]` is live; if its type is exactly `cls`, it
    // is a `LoopCore` instance and `direct` gets the call as the plain descriptor would pass it
    // (`self`, then the rest, `kwnames` unchanged; see the module invariants). Otherwise the
    // arguments are forwarded unchanged.
    unsafe {
        let nargs = ffi::PyVectorcall_NARGS(nargsf);
        if nargs >= 1 && ffi::Py_TYPE(*args) == reg.cls.as_ptr().cast() {
            return (reg.direct)(*args, args.add(1), nargs - 1, kwnames);
        }
        ffi::PyObject_Vectorcall(reg.inner.as_ptr(), args, nargsf, kwnames)
    }
}

unsafe extern "C" fn descr_get(
    descr: *mut ffi::PyObject,
    obj: *mut ffi::PyObject,
    owner: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls `tp_descr_get` with the GIL held.
    let py = unsafe { Python::assume_attached() };
    // SAFETY: `Py_None` is a static object.
    if obj.is_null() || obj == unsafe { ffi::Py_None() } {
        // On the class: the descriptor itself, as a method descriptor returns itself.
        // SAFETY: `descr` is live; the new reference is returned to CPython.
        unsafe { ffi::Py_INCREF(descr) };
        return descr;
    }
    entry(py, || {
        let reg = registered(py)?;
        let inner = reg.inner.as_ptr();
        // SAFETY: `inner` is a method descriptor, whose type has `tp_descr_get`.
        let bind = || unsafe {
            let get = (*ffi::Py_TYPE(inner))
                .tp_descr_get
                .expect("a method descriptor has __get__");
            get(inner, obj, owner)
        };
        // SAFETY: `obj` is a live object, borrowed for this call.
        let any = unsafe { Borrowed::from_ptr(py, obj) };
        // An instance of exactly the class the descriptor lives on (what every C `Task`/`Future`
        // lookup reaches) needs no subclass check.
        // SAFETY: `cls` is a `LoopCore` subclass.
        let core = if unsafe { ffi::Py_TYPE(obj) == reg.cls.as_ptr().cast() } {
            // SAFETY: as just said, `obj` is a `LoopCore` instance.
            unsafe { any.cast_unchecked::<LoopCore>() }
        } else if let Ok(core) = any.cast::<LoopCore>() {
            core
        } else {
            // Not a loop: the plain descriptor raises its usual TypeError.
            return Ok(bind());
        };
        LoopCore::bound_call_soon(&core, || {
            // SAFETY: `bind` returns a new reference or NULL with an exception set.
            unsafe { Bound::from_owned_ptr_or_err(py, bind()) }.map(Bound::unbind)
        })
        .map(Py::into_ptr)
    })
}

fn registered(py: Python<'_>) -> PyResult<&Registered> {
    REGISTERED
        .get(py)
        .ok_or_else(|| pyo3::exceptions::PyTypeError::new_err("cached_method: not installed"))
}

unsafe extern "C" fn repr(_obj: *mut ffi::PyObject) -> *mut ffi::PyObject {
    // SAFETY: CPython calls `tp_repr` with the GIL held.
    let py = unsafe { Python::assume_attached() };
    entry(py, || {
        let reg = registered(py)?;
        // SAFETY: the GIL is held; `inner` is live.
        Ok(unsafe { ffi::PyObject_Repr(reg.inner.as_ptr()) })
    })
}

unsafe extern "C" fn refuse_new(
    _tp: *mut ffi::PyTypeObject,
    _args: *mut ffi::PyObject,
    _kwds: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls `tp_new` with the GIL held; the message is a static C string.
    unsafe {
        ffi::PyErr_SetString(
            ffi::PyExc_TypeError,
            c"cannot create 'ferroloop._native.cached_method' instances".as_ptr(),
        );
    }
    ptr::null_mut()
}

/// The descriptors' type (a subclass of `type`), made once per interpreter.
fn meta_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    TYPE.get_or_try_init(py, || {
        // CPython keeps pointers into the member and slot tables for the type's lifetime (the
        // process), so they are leaked once. `__vectorcalloffset__` points at a type object's own
        // `tp_vectorcall`, which `wrap` sets on the one instance.
        let members: &'static mut [ffi::PyMemberDef] = Box::leak(Box::new([
            ffi::PyMemberDef {
                name: c"__vectorcalloffset__".as_ptr(),
                type_code: ffi::Py_T_PYSSIZET,
                offset: offset_of!(ffi::PyTypeObject, tp_vectorcall) as ffi::Py_ssize_t,
                flags: ffi::Py_READONLY,
                doc: ptr::null(),
            },
            ffi::PyMemberDef::default(),
        ]));
        let slot = |slot: c_int, pfunc: *mut c_void| ffi::PyType_Slot { slot, pfunc };
        let slots: &'static mut [ffi::PyType_Slot] = vec![
            slot(ffi::Py_tp_descr_get, descr_get as *mut c_void),
            slot(ffi::Py_tp_call, ffi::PyVectorcall_Call as *mut c_void),
            slot(ffi::Py_tp_repr, repr as *mut c_void),
            slot(ffi::Py_tp_new, refuse_new as *mut c_void),
            slot(ffi::Py_tp_members, members.as_mut_ptr().cast()),
            slot(0, ptr::null_mut()),
        ]
        .leak();
        let mut spec = ffi::PyType_Spec {
            name: c"ferroloop._native.cached_method".as_ptr(),
            basicsize: 0,
            itemsize: 0,
            flags: u32::try_from(
                ffi::Py_TPFLAGS_DEFAULT
                    | ffi::Py_TPFLAGS_METHOD_DESCRIPTOR
                    | ffi::Py_TPFLAGS_HAVE_VECTORCALL
                    | ffi::Py_TPFLAGS_IMMUTABLETYPE,
            )
            .expect("type flags fit in 32 bits"),
            slots: slots.as_mut_ptr(),
        };
        let bases = PyTuple::new(py, [py.get_type::<PyType>()])?;
        // SAFETY: we hold the GIL; the spec is read during the call, and the tables it points
        // to live for the rest of the process.
        let tp = unsafe {
            Bound::from_owned_ptr_or_err(
                py,
                ffi::PyType_FromSpecWithBases(&raw mut spec, bases.as_ptr()),
            )
        }?;
        Ok(tp.cast_into::<PyType>()?.unbind())
    })
    .map(|tp| tp.bind(py))
}

/// Whether `loop_.call_soon` is ferroloop's own (this descriptor, not shadowed by the instance),
/// so that a task may queue its steps and done callbacks without calling it: a subclass's
/// override, a replacement set on the class later, or one set on the instance
/// (`mock.patch.object`) must see them, as under asyncio's C Task, which looks `call_soon` up for
/// each of them. Answered from the type attribute cache and the instance dict, without the
/// attribute lookup and binding (about 600 instructions).
pub(crate) fn own_call_soon(loop_: &Bound<'_, PyAny>) -> bool {
    let py = loop_.py();
    let Some(reg) = REGISTERED.get(py) else {
        return false;
    };
    let name = pyo3::intern!(py, "call_soon");
    let obj = loop_.as_ptr();
    // SAFETY: we hold the GIL; the type and the interned name are live; the result is borrowed
    // and only its type is read, at once.
    let found = unsafe { crate::private_fn::type_lookup(ffi::Py_TYPE(obj), name.as_ptr()) };
    // SAFETY: `found` is NULL or a live object (borrowed from a dict of the type's MRO).
    if found != reg.descr.as_ptr() {
        return false;
    }
    // The instance dict (made from the inline attribute values the first time, then reused):
    // a new reference, or NULL with an exception set for an object without one.
    // SAFETY: we hold the GIL and `obj` is live.
    let dict = unsafe { ffi::PyObject_GenericGetDict(obj, ptr::null_mut()) };
    if dict.is_null() {
        drop(PyErr::take(py));
        return true;
    }
    // SAFETY: `dict` is a new reference to a dict, owned here; the item is borrowed and only
    // compared with NULL.
    let shadowed = unsafe {
        let dict = Bound::from_owned_ptr(py, dict);
        let item = ffi::PyDict_GetItemWithError(dict.as_ptr(), name.as_ptr());
        // NULL without an exception is the usual answer (not in the dict): no `PyErr::take`
        // (a fetch of the error state, about 70 instructions) unless there is one to clear.
        if item.is_null() && !ffi::PyErr_Occurred().is_null() {
            ffi::PyErr_Clear();
        }
        !item.is_null()
    };
    !shadowed
}

/// The descriptor for `def` (a `METH_FASTCALL | METH_KEYWORDS` method of `LoopCore`), to be
/// installed on `cls` (a subclass of `LoopCore`): binding it to a loop returns the loop's cached
/// bound method (see the module documentation). Made once per process.
pub(crate) fn wrap<'py>(
    def: &'static MethodDef,
    cls: &Bound<'py, PyType>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    if REGISTERED.get(py).is_some() {
        return Err(pyo3::exceptions::PyRuntimeError::new_err(
            "cached_method: installed once only",
        ));
    }
    if !cls.is_subclass_of::<LoopCore>()? {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "cached_method: the class must be a LoopCore subclass",
        ));
    }
    if def.0.ml_flags != ffi::METH_FASTCALL | ffi::METH_KEYWORDS {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "cached_method: the method must be METH_FASTCALL | METH_KEYWORDS",
        ));
    }
    // SAFETY: with those flags, CPython reads the union as this member too.
    let direct = unsafe { def.0.ml_meth.PyCFunctionFastWithKeywords };
    let core = py.get_type::<LoopCore>();
    // SAFETY: we hold the GIL; the type pointer is alive (held by `core`), and CPython only
    // reads the 'static method definition (the `*mut` is an artefact of the C signature).
    let inner = unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            ffi::PyDescr_NewMethod(core.as_type_ptr(), ptr::addr_of!(def.0).cast_mut()),
        )
    }?;
    let meta = meta_type(py)?;
    // SAFETY: the definition is 'static, and its name and doc are 'static C strings.
    let (name, raw_doc) = unsafe {
        (
            std::ffi::CStr::from_ptr(def.0.ml_name).to_str(),
            std::ffi::CStr::from_ptr(def.0.ml_doc).to_str(),
        )
    };
    let (Ok(name), Ok(raw_doc)) = (name, raw_doc) else {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "cached_method: the method's name and doc must be UTF-8",
        ));
    };
    // The raw doc starts with the text signature (`call_soon(callback, ...)\n--\n\n`): the type
    // keeps it as its `tp_doc`, from which `__text_signature__` (and so `inspect.signature`) is
    // read; `__doc__` is then replaced by the method's own, without it.
    let namespace = PyDict::new(py);
    namespace.set_item("__doc__", raw_doc)?;
    namespace.set_item("__module__", cls.getattr("__module__")?)?;
    namespace.set_item("__qualname__", format!("{}.{name}", cls.qualname()?))?;
    namespace.set_item("__objclass__", inner.getattr("__objclass__")?)?;
    let args = (name, PyTuple::empty(py), namespace).into_pyobject(py)?;
    // SAFETY: we hold the GIL. `type.__new__(meta, name, (), namespace)` makes a heap type whose
    // type is `meta` (a subclass of `type`): a new reference, or NULL with an exception set.
    let descr = unsafe {
        let type_new = ffi::PyType_Type.tp_new.expect("type has tp_new");
        Bound::from_owned_ptr_or_err(
            py,
            type_new(meta.as_type_ptr(), args.as_ptr(), ptr::null_mut()),
        )
    }?;
    // SAFETY: `descr` is a live heap type made just above, which nothing else references yet
    // and no code has called; its slots and flags are set before it is handed out, and the
    // type's caches are told (`PyType_Modified`). Its dict is a dict, written with the GIL held.
    unsafe {
        let tp = descr.as_ptr().cast::<ffi::PyTypeObject>();
        (*tp).tp_vectorcall = Some(vectorcall);
        (*tp).tp_new = None;
        change_flags(tp, ffi::Py_TPFLAGS_IMMUTABLETYPE, ffi::Py_TPFLAGS_BASETYPE);
        let doc = inner.getattr("__doc__")?;
        if ffi::PyDict_SetItemString((*tp).tp_dict, c"__doc__".as_ptr(), doc.as_ptr()) < 0 {
            return Err(PyErr::fetch(py));
        }
        ffi::PyType_Modified(tp);
    }
    let registered = Registered {
        descr: descr.clone().unbind(),
        inner: inner.unbind(),
        cls: cls.clone().unbind(),
        direct,
    };
    if REGISTERED.set(py, registered).is_err() {
        return Err(pyo3::exceptions::PyRuntimeError::new_err(
            "cached_method: installed once only",
        ));
    }
    Ok(descr)
}

/// Sets the flags `set` and clears the flags `clear` of the type `tp` (its `tp_flags` is an
/// atomic on free-threaded builds).
///
/// # Safety
/// `tp` is a live type that no other code uses yet.
unsafe fn change_flags(tp: *mut ffi::PyTypeObject, set: c_ulong, clear: c_ulong) {
    // SAFETY: the caller's contract: nothing else reads or writes the flags meanwhile.
    #[cfg(not(Py_GIL_DISABLED))]
    unsafe {
        (*tp).tp_flags = ((*tp).tp_flags | set) & !clear;
    }
    // SAFETY: as above; the atomic is only accessed through its methods.
    #[cfg(Py_GIL_DISABLED)]
    unsafe {
        let flags = &(*tp).tp_flags;
        flags.fetch_or(set, std::sync::atomic::Ordering::Relaxed);
        flags.fetch_and(!clear, std::sync::atomic::Ordering::Relaxed);
    }
}
