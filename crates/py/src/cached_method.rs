//! `call_soon` as a method descriptor that binds once per loop.
//!
//! asyncio's C `Future` and `Task` call `loop.call_soon(..., context=ctx)` for every done
//! callback and task step, and fetch the attribute with `PyObject_GetAttr` each time
//! (`_asynciomodule.c: call_soon`). On a plain method descriptor that binds a new method object
//! per call. Python code (`loop.call_soon(cb)`) goes through `LOAD_METHOD` instead, which binds
//! nothing, and which the interpreter specialises when the descriptor's type declares itself a
//! method descriptor and the instance dict does not shadow the name.
//!
//! This type serves both callers. Its `__get__` on a loop returns that loop's one bound method,
//! made on first use and kept in `LoopCore::bound_call_soon`. `Py_TPFLAGS_METHOD_DESCRIPTOR` lets
//! `LOAD_METHOD` call it as `descr(loop, *args)`: with `loop` an instance of exactly `cls` (what
//! `loop.call_soon(cb)` in Python code on a `ferroloop.Loop` is), it calls the method's C function
//! itself, as the plain descriptor would after its checks (about 120 instructions less per call
//! under callgrind: the descriptor's call, its subclass check of `self`, a result check); any
//! other call goes to the plain method descriptor it wraps.
//!
//! Invariants:
//! - `inner` is a method descriptor of `LoopCore` and `cls` a `LoopCore` subclass: owned
//!   references, set at creation, never changed. `direct` is the C function of `inner`'s method
//!   definition. A call with at least one argument whose type is exactly `cls` passes the plain
//!   descriptor's checks (an argument for `self`, an instance of `LoopCore`), so calling `direct`
//!   for it is what the descriptor would do (less CPython's C recursion check, which guards
//!   nothing here: `call_soon` calls no callback); every other call and every bind goes through
//!   `inner`, so argument checks, the `self` type check and error messages are the plain
//!   descriptor's.
//! - The cached bound method refers back to its loop. `LoopCore` visits and clears it in its GC
//!   hooks, and `close()` drops it, so a loop is never kept alive by it.
//! - Instances are made only by [`wrap`], with the GIL held; the type forbids instantiation from
//!   Python.

use std::ffi::{c_char, c_int, c_void};
use std::mem::offset_of;
use std::ptr;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use pyo3::Borrowed;

use crate::event_loop::LoopCore;
use crate::fastcall::{entry, MethodDef};

#[repr(C)]
struct CachedMethod {
    ob_base: ffi::PyObject,
    vectorcall: Option<ffi::vectorcallfunc>,
    inner: *mut ffi::PyObject,
    /// The class the descriptor was installed on (a `LoopCore` subclass; owned): an instance of
    /// exactly this class needs no subclass check.
    cls: *mut ffi::PyTypeObject,
    /// `inner`'s C function, called directly for an instance of exactly `cls`.
    direct: ffi::PyCFunctionFastWithKeywords,
}

/// The inner descriptor of `obj`.
///
/// # Safety
/// `obj` must be a live `CachedMethod`.
unsafe fn inner_of(obj: *mut ffi::PyObject) -> *mut ffi::PyObject {
    // SAFETY: the caller guarantees the layout; `inner` is set by `wrap` and never changed.
    unsafe { (*obj.cast::<CachedMethod>()).inner }
}

unsafe extern "C" fn vectorcall(
    callable: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargsf: usize,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls a vectorcall slot with the GIL held, on a live instance of this type
    // and with the arguments as the protocol passes them. With at least one argument, `args[0]`
    // is live; if its type is exactly `cls`, it is a `LoopCore` instance and `direct` gets the
    // call as the plain descriptor would pass it (`self`, then the rest, `kwnames` unchanged; see
    // the module invariants). Otherwise the arguments are forwarded unchanged.
    unsafe {
        let this = callable.cast::<CachedMethod>();
        let nargs = ffi::PyVectorcall_NARGS(nargsf);
        if nargs >= 1 && ffi::Py_TYPE(*args) == (*this).cls {
            return ((*this).direct)(*args, args.add(1), nargs - 1, kwnames);
        }
        ffi::PyObject_Vectorcall(inner_of(callable), args, nargsf, kwnames)
    }
}

unsafe extern "C" fn descr_get(
    descr: *mut ffi::PyObject,
    obj: *mut ffi::PyObject,
    owner: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls `tp_descr_get` with the GIL held.
    let py = unsafe { Python::assume_attached() };
    // SAFETY: `descr` is a live instance of this type (it is the slot's owner).
    let inner = unsafe { inner_of(descr) };
    // SAFETY: `inner` is a method descriptor, whose type has `tp_descr_get`.
    let bind = || unsafe {
        let get = (*ffi::Py_TYPE(inner))
            .tp_descr_get
            .expect("a method descriptor has __get__");
        get(inner, obj, owner)
    };
    // SAFETY: `Py_None` is a static object.
    if obj.is_null() || obj == unsafe { ffi::Py_None() } {
        // On the class: the descriptor itself, as a method descriptor returns itself.
        // SAFETY: `descr` is live; the new reference is returned to CPython.
        unsafe { ffi::Py_INCREF(descr) };
        return descr;
    }
    entry(py, || {
        // SAFETY: `obj` is a live object, borrowed for this call.
        let any = unsafe { Borrowed::from_ptr(py, obj) };
        // An instance of exactly the class the descriptor lives on (what every C `Task`/`Future`
        // lookup reaches) needs no subclass check.
        // SAFETY: `descr` is a live instance of this type, and its `cls` a `LoopCore` subclass.
        let core = if unsafe { ffi::Py_TYPE(obj) == (*descr.cast::<CachedMethod>()).cls } {
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

/// `__name__`, `__qualname__`, `__doc__`, `__text_signature__` and `__objclass__`: the inner
/// descriptor's (`closure` is the attribute's name as a C string).
unsafe extern "C" fn get_inner_attr(
    obj: *mut ffi::PyObject,
    closure: *mut c_void,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls getters with the GIL held on a live instance; `closure` is one of
    // the 'static C strings in `INNER_ATTRS`.
    unsafe { ffi::PyObject_GetAttrString(inner_of(obj), closure.cast::<c_char>()) }
}

unsafe extern "C" fn repr(obj: *mut ffi::PyObject) -> *mut ffi::PyObject {
    // SAFETY: CPython calls `tp_repr` with the GIL held on a live instance.
    unsafe { ffi::PyObject_Repr(inner_of(obj)) }
}

unsafe extern "C" fn dealloc(obj: *mut ffi::PyObject) {
    // SAFETY: CPython calls `tp_dealloc` once, with the GIL held, when the last reference goes;
    // `inner` is owned; a heap type's instances hold a reference to their type, released last.
    unsafe {
        let tp = ffi::Py_TYPE(obj);
        ffi::Py_XDECREF(inner_of(obj));
        ffi::Py_XDECREF((*obj.cast::<CachedMethod>()).cls.cast());
        if let Some(free) = (*tp).tp_free {
            free(obj.cast());
        }
        ffi::Py_DECREF(tp.cast());
    }
}

const INNER_ATTRS: [&std::ffi::CStr; 5] = [
    c"__name__",
    c"__qualname__",
    c"__doc__",
    c"__text_signature__",
    c"__objclass__",
];

/// The type, made once per interpreter.
fn cached_method_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    TYPE.get_or_try_init(py, || {
        // CPython keeps pointers into the member and getset tables for the type's lifetime (the
        // process), so they are leaked once.
        let members: &'static mut [ffi::PyMemberDef] = Box::leak(Box::new([
            ffi::PyMemberDef {
                name: c"__vectorcalloffset__".as_ptr(),
                type_code: ffi::Py_T_PYSSIZET,
                offset: offset_of!(CachedMethod, vectorcall) as ffi::Py_ssize_t,
                flags: ffi::Py_READONLY,
                doc: ptr::null(),
            },
            ffi::PyMemberDef::default(),
        ]));
        let mut getsets: Vec<ffi::PyGetSetDef> = INNER_ATTRS
            .iter()
            .map(|name| ffi::PyGetSetDef {
                name: name.as_ptr(),
                get: Some(get_inner_attr),
                set: None,
                doc: ptr::null(),
                closure: name.as_ptr().cast_mut().cast(),
            })
            .collect();
        getsets.push(ffi::PyGetSetDef::default());
        let getsets: &'static mut [ffi::PyGetSetDef] = getsets.leak();
        let slot = |slot: c_int, pfunc: *mut c_void| ffi::PyType_Slot { slot, pfunc };
        let slots: &'static mut [ffi::PyType_Slot] = vec![
            slot(ffi::Py_tp_dealloc, dealloc as *mut c_void),
            slot(ffi::Py_tp_descr_get, descr_get as *mut c_void),
            slot(ffi::Py_tp_call, ffi::PyVectorcall_Call as *mut c_void),
            slot(ffi::Py_tp_repr, repr as *mut c_void),
            slot(ffi::Py_tp_members, members.as_mut_ptr().cast()),
            slot(ffi::Py_tp_getset, getsets.as_mut_ptr().cast()),
            slot(0, ptr::null_mut()),
        ]
        .leak();
        let mut spec = ffi::PyType_Spec {
            name: c"ferroloop._native.cached_method".as_ptr(),
            basicsize: c_int::try_from(size_of::<CachedMethod>()).expect("small struct"),
            itemsize: 0,
            flags: u32::try_from(
                ffi::Py_TPFLAGS_DEFAULT
                    | ffi::Py_TPFLAGS_METHOD_DESCRIPTOR
                    | ffi::Py_TPFLAGS_HAVE_VECTORCALL
                    | ffi::Py_TPFLAGS_IMMUTABLETYPE
                    | ffi::Py_TPFLAGS_DISALLOW_INSTANTIATION,
            )
            .expect("type flags fit in 32 bits"),
            slots: slots.as_mut_ptr(),
        };
        // SAFETY: we hold the GIL; the spec is read during the call, and the tables it points
        // to live for the rest of the process.
        let tp = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyType_FromSpec(&raw mut spec)) }?;
        Ok(tp.cast_into::<PyType>()?.unbind())
    })
    .map(|tp| tp.bind(py))
}

extern "C" {
    /// CPython's MRO lookup through the type attribute cache (exported by 3.11 to 3.13, not
    /// declared by pyo3-ffi): a borrowed reference, or NULL without an exception set.
    pub(crate) fn _PyType_Lookup(
        tp: *mut ffi::PyTypeObject,
        name: *mut ffi::PyObject,
    ) -> *mut ffi::PyObject;
}

/// Whether `loop_.call_soon` is ferroloop's own (this descriptor, not shadowed by the instance),
/// so that a task may queue its steps and done callbacks without calling it: a subclass's
/// override, a replacement set on the class later, or one set on the instance
/// (`mock.patch.object`) must see them, as under asyncio's C Task, which looks `call_soon` up for
/// each of them. Answered from the type attribute cache and the instance dict, without the
/// attribute lookup and binding (about 600 instructions).
pub(crate) fn own_call_soon(loop_: &Bound<'_, PyAny>) -> bool {
    let py = loop_.py();
    let Ok(ty) = cached_method_type(py) else {
        return false;
    };
    let name = pyo3::intern!(py, "call_soon");
    let obj = loop_.as_ptr();
    // SAFETY: we hold the GIL; the type and the interned name are live; the result is borrowed
    // and only its type is read, at once.
    let found = unsafe { _PyType_Lookup(ffi::Py_TYPE(obj), name.as_ptr()) };
    // SAFETY: `found` is NULL or a live object (borrowed from a dict of the type's MRO).
    if found.is_null() || unsafe { ffi::Py_TYPE(found) } != ty.as_type_ptr() {
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

/// A method descriptor of `LoopCore` for `def` (a `METH_FASTCALL | METH_KEYWORDS` method),
/// wrapped to be installed on `cls` (a subclass of `LoopCore`), so that binding it to a loop
/// returns the loop's cached bound method.
pub(crate) fn wrap<'py>(
    def: &'static MethodDef,
    cls: &Bound<'py, PyType>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
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
    let tp = cached_method_type(py)?;
    // SAFETY: we hold the GIL; `tp` is this module's type, whose `tp_alloc` returns a zeroed
    // instance of `CachedMethod`'s size (or NULL with an exception set), which is initialised
    // (through raw field pointers: a zeroed `direct` is no valid value to assign over) before
    // it is handed out.
    unsafe {
        let raw = tp.as_type_ptr();
        let alloc = (*raw).tp_alloc.unwrap_or(ffi::PyType_GenericAlloc);
        let obj = Bound::from_owned_ptr_or_err(py, alloc(raw, 0))?;
        let this = obj.as_ptr().cast::<CachedMethod>();
        ptr::addr_of_mut!((*this).vectorcall).write(Some(vectorcall));
        ptr::addr_of_mut!((*this).inner).write(inner.into_ptr());
        ptr::addr_of_mut!((*this).cls).write(cls.clone().into_ptr().cast());
        ptr::addr_of_mut!((*this).direct).write(direct);
        Ok(obj)
    }
}
