//! The loop's hot methods as descriptors that bind once per loop and that the interpreter calls
//! directly: `call_soon`, `call_later`, `call_at`, `create_future`, `create_task` and `time`.
//!
//! A method is reached three ways, and each must be fast (issue 29, "every calling shape"):
//! - Python's `loop.call_soon(cb)` goes through `LOAD_METHOD`, which binds nothing when the
//!   descriptor's type declares itself a method descriptor (`Py_TPFLAGS_METHOD_DESCRIPTOR`), and
//!   the call that follows is specialised too: the descriptor is itself a type object (an
//!   instance of `meta_type()`, a subclass of `type`), immutable and with a `tp_vectorcall`,
//!   which CPython 3.11 to 3.13 call straight from the specialised instruction
//!   (`PRECALL_BUILTIN_CLASS`, `CALL_BUILTIN_CLASS`). Any other callable object gets the generic
//!   call path (`PyObject_Vectorcall` and `_Py_CheckFunctionResult`): under callgrind 73
//!   instructions more per `call_soon` callback (1,611 against 1,538 in
//!   `benchmarks/loop/call_soon.py`'s shape). The vectorcall, with the loop as the first
//!   argument, calls the method's C function itself.
//! - An attribute fetch (`getattr(loop, "call_later")`, `functools.partial(loop.time)`,
//!   C code's `PyObject_GetAttr`: asyncio's C `Future` and `Task` fetch `loop.call_soon` for every
//!   done callback and task step, `_asynciomodule.c: call_soon`) would bind a new method object
//!   per fetch on a plain method descriptor. Here `__get__` on a loop returns that loop's one
//!   bound method of that name, made on first use and kept in `LoopCore::bound_methods`, so the
//!   fetch allocates nothing.
//! - A bound method kept in a local (`cs = loop.call_soon`) is that cached method, a built-in
//!   method whose call CPython specialises (`PRECALL_BUILTIN_FAST_WITH_KEYWORDS`,
//!   `PRECALL_NO_KW_BUILTIN_FAST`) into a direct call of the same C function. That is why
//!   `time` and `create_future` are `METH_FASTCALL` functions that take no arguments rather
//!   than `METH_NOARGS` ones: CPython 3.11 to 3.13 specialise no call of a `METH_NOARGS`
//!   built-in method, which then costs about 77 instructions more per call (callgrind).
//!
//! What a user sees of it: `Loop.call_soon` reads as the descriptor, whose `repr`, `__name__`,
//! `__qualname__`, `__doc__`, `__objclass__` and signature are the method's; that it is a type
//! object shows only in `type(Loop.call_soon)` and `isinstance(Loop.call_soon, type)`. It cannot
//! be instantiated or subclassed. `loop.call_soon` is the loop's cached bound method.
//!
//! Invariants:
//! - `meta_type()`'s instances are the `Registered::descr` made by one call of [`wrap_all`] (a
//!   second fails): the type refuses instantiation from Python (`refuse_new`, and `type.__new__`
//!   refuses a type whose `tp_new` is not `type`'s).
//! - Each `descr` is an immutable heap type, not subclassable, whose `tp_new` is NULL and whose
//!   `tp_vectorcall` is `VECTORCALLS[i]` for its index `i` in `Registry::methods` (and in
//!   `LoopCore::bound_methods`); nothing changes them after `wrap_all`.
//! - `inner` is a method descriptor of `LoopCore` and `cls` a `LoopCore` subclass, set once in
//!   `REGISTRY`. `direct` is the C function of `inner`'s method definition, with its calling
//!   convention. A call with at least one argument whose type is exactly `cls` (and, for a
//!   `METH_FASTCALL` method without `METH_KEYWORDS`, no keywords) passes the plain descriptor's
//!   checks (an argument for `self`, an instance of `LoopCore`, no keywords), so calling `direct`
//!   for it is
//!   what the descriptor would do (less CPython's C recursion check, which guards nothing here:
//!   none of these methods calls Python code that could recurse into it); every other call and
//!   every bind goes through `inner`, so argument checks, the `self` type check and error
//!   messages are the plain descriptor's.
//! - A cached bound method refers back to its loop. `LoopCore` visits and clears them in its GC
//!   hooks, and `close()` drops them, so a loop is never kept alive by them.

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

/// How `direct` is called: the method definition's calling convention.
#[derive(Clone, Copy)]
enum Direct {
    /// `METH_FASTCALL | METH_KEYWORDS`: `f(self, args, nargs, kwnames)`.
    Keywords(ffi::PyCFunctionFastWithKeywords),
    /// `METH_FASTCALL`: `f(self, args, nargs)`.
    Fast(ffi::PyCFunctionFast),
}

/// What one descriptor made by [`wrap_all`] serves (see the module invariants).
struct Registered {
    /// The descriptor: a type object whose type is `meta_type()`.
    descr: Py<PyAny>,
    /// A plain method descriptor of `LoopCore` for the same method definition.
    inner: Py<PyAny>,
    /// `inner`'s C function, called directly for an instance of exactly `cls`.
    direct: Direct,
}

/// Every descriptor made by [`wrap_all`], at its index in `LoopCore::bound_methods`.
struct Registry {
    /// The class the descriptors were installed on (a `LoopCore` subclass).
    cls: Py<PyType>,
    methods: Vec<Registered>,
    /// The index of `call_soon`, if it is one of them (for [`own_call_soon`]).
    call_soon: Option<usize>,
}

impl Registry {
    /// The index of the descriptor `descr`.
    fn index_of(&self, descr: *mut ffi::PyObject) -> Option<usize> {
        self.methods.iter().position(|m| m.descr.as_ptr() == descr)
    }
}

static REGISTRY: PyOnceLock<Registry> = PyOnceLock::new();

/// How many methods a loop caches a bound method for: `LoopCore::bound_methods`' length.
pub(crate) const CACHED_METHODS: usize = 6;

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

/// Whether `wrap_all` may be used (else plain method descriptors are).
pub(crate) fn enabled() -> bool {
    ENABLED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Each descriptor's `tp_vectorcall`, by index (see the module invariants).
const VECTORCALLS: [ffi::vectorcallfunc; CACHED_METHODS] = [
    vectorcall::<0>,
    vectorcall::<1>,
    vectorcall::<2>,
    vectorcall::<3>,
    vectorcall::<4>,
    vectorcall::<5>,
];

unsafe extern "C" fn vectorcall<const I: usize>(
    _callable: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargsf: usize,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls a vectorcall slot with the GIL held.
    let py = unsafe { Python::assume_attached() };
    // Not through `entry`/`registered`: its unwinding guard and `PyResult` cost 12 instructions
    // per `call_soon` here (callgrind), and nothing below can panic.
    let Some((reg, method)) = REGISTRY
        .get(py)
        .and_then(|reg| Some((reg, reg.methods.get(I)?)))
    else {
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
    // (`self`, then the rest, `kwnames` unchanged; for `METH_FASTCALL`, only without keywords;
    // see the module invariants). Otherwise the arguments are forwarded unchanged.
    unsafe {
        let nargs = ffi::PyVectorcall_NARGS(nargsf);
        if nargs >= 1 && ffi::Py_TYPE(*args) == reg.cls.as_ptr().cast() {
            match method.direct {
                Direct::Keywords(f) => return f(*args, args.add(1), nargs - 1, kwnames),
                Direct::Fast(f) if kwnames.is_null() => {
                    return f(*args, args.add(1).cast_mut(), nargs - 1);
                }
                Direct::Fast(_) => {}
            }
        }
        ffi::PyObject_Vectorcall(method.inner.as_ptr(), args, nargsf, kwnames)
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
        let (reg, index, method) = registered(py, descr)?;
        let inner = method.inner.as_ptr();
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
        LoopCore::bound_method(&core, index, || {
            // SAFETY: `bind` returns a new reference or NULL with an exception set.
            unsafe { Bound::from_owned_ptr_or_err(py, bind()) }.map(Bound::unbind)
        })
        .map(Py::into_ptr)
    })
}

/// The registry, the index of the descriptor `descr` and what it serves.
fn registered(
    py: Python<'_>,
    descr: *mut ffi::PyObject,
) -> PyResult<(&Registry, usize, &Registered)> {
    let reg = REGISTRY
        .get(py)
        .ok_or_else(|| pyo3::exceptions::PyTypeError::new_err("cached_method: not installed"))?;
    let index = reg
        .index_of(descr)
        .ok_or_else(|| pyo3::exceptions::PyTypeError::new_err("cached_method: unknown"))?;
    Ok((reg, index, &reg.methods[index]))
}

unsafe extern "C" fn repr(descr: *mut ffi::PyObject) -> *mut ffi::PyObject {
    // SAFETY: CPython calls `tp_repr` with the GIL held.
    let py = unsafe { Python::assume_attached() };
    entry(py, || {
        let (_, _, method) = registered(py, descr)?;
        // SAFETY: the GIL is held; `inner` is live.
        Ok(unsafe { ffi::PyObject_Repr(method.inner.as_ptr()) })
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
/// each of them. Answered as the interpreter's method load would (`_PyObject_GetMethod`: the
/// type attribute cache, then the instance's attributes), without binding. The instance dict is
/// never made here: on CPython 3.12 and 3.13 a loop whose dict was made loses the specialised
/// method loads of every `loop.method(...)` written in Python (`_loop.py`, `__slots__`).
pub(crate) fn own_call_soon(loop_: &Bound<'_, PyAny>) -> bool {
    let py = loop_.py();
    let Some((index, method)) = REGISTRY
        .get(py)
        .and_then(|reg| Some((reg.call_soon?, &reg.methods[reg.call_soon?])))
    else {
        return false;
    };
    let name = pyo3::intern!(py, "call_soon");
    let obj = loop_.as_ptr();
    let descr = method.descr.as_ptr();
    // SAFETY: we hold the GIL; the loop, the interned name and the descriptor are live.
    if let Some(own) = unsafe { crate::private_fn::loads_as_method(obj, name.as_ptr(), descr) } {
        return own;
    }
    // Without the private function: the attribute as Python code would get it, ours if it is
    // this loop's cached bound `call_soon` (what `descr_get` hands out for an unshadowed one).
    let Ok(found) = loop_.getattr(name) else {
        return false;
    };
    let Ok(core) = loop_.cast::<LoopCore>() else {
        return false;
    };
    LoopCore::is_bound_method(core, index, &found)
}

/// The descriptors for `defs` (methods of `LoopCore`, `METH_FASTCALL`, with or without
/// `METH_KEYWORDS`), in order, to be installed on `cls` (a subclass of `LoopCore`) under their
/// names: binding one to a loop returns the loop's cached bound method (see the module
/// documentation). Made once per process.
pub(crate) fn wrap_all<'py>(
    defs: &[&'static MethodDef],
    cls: &Bound<'py, PyType>,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let py = cls.py();
    if REGISTRY.get(py).is_some() {
        return Err(pyo3::exceptions::PyRuntimeError::new_err(
            "cached_method: installed once only",
        ));
    }
    if !cls.is_subclass_of::<LoopCore>()? {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "cached_method: the class must be a LoopCore subclass",
        ));
    }
    if defs.len() > CACHED_METHODS {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "cached_method: more methods than LoopCore caches",
        ));
    }
    let mut descrs = Vec::with_capacity(defs.len());
    let mut methods = Vec::with_capacity(defs.len());
    let mut call_soon = None;
    for (index, def) in defs.iter().enumerate() {
        let (descr, registered, name) = make_descr(cls, def, VECTORCALLS[index])?;
        if name == "call_soon" {
            call_soon = Some(index);
        }
        descrs.push(descr);
        methods.push(registered);
    }
    let registry = Registry {
        cls: cls.clone().unbind(),
        methods,
        call_soon,
    };
    if REGISTRY.set(py, registry).is_err() {
        return Err(pyo3::exceptions::PyRuntimeError::new_err(
            "cached_method: installed once only",
        ));
    }
    Ok(descrs)
}

/// One descriptor (see [`wrap_all`]), what it serves, and the method's name.
fn make_descr<'py>(
    cls: &Bound<'py, PyType>,
    def: &'static MethodDef,
    vectorcall: ffi::vectorcallfunc,
) -> PyResult<(Bound<'py, PyAny>, Registered, &'static str)> {
    let py = cls.py();
    // SAFETY: with these flags, CPython reads the union as this member too.
    let direct = unsafe {
        match def.0.ml_flags {
            f if f == ffi::METH_FASTCALL | ffi::METH_KEYWORDS => {
                Direct::Keywords(def.0.ml_meth.PyCFunctionFastWithKeywords)
            }
            ffi::METH_FASTCALL => Direct::Fast(def.0.ml_meth.PyCFunctionFast),
            _ => {
                return Err(pyo3::exceptions::PyTypeError::new_err(
                    "cached_method: a method must be METH_FASTCALL (| METH_KEYWORDS)",
                ))
            }
        }
    };
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
        direct,
    };
    Ok((descr, registered, name))
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
