//! CPython's exported but private functions, found at run time (`dlsym`) rather than linked,
//! each with a public fallback (the `private_functions` loan of `cpython_loans.rs`).
//!
//! A symbol linked by the extension is resolved when CPython loads it: a CPython that dropped
//! one would refuse to import ferroloop ("undefined symbol"). Looked up instead, a missing one
//! only switches its caller to the fallback.
//!
//! Invariants:
//! - `FNS` is set once, by [`install`], while the module is initialised; each pointer is the
//!   process's definition of the named CPython function (whose signature is the one in
//!   `Include/cpython/` of every version from 3.11 to 3.15), or `None`.

use std::sync::OnceLock;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use crate::cpython_loans::{self, Loan};

type TypeLookup =
    unsafe extern "C" fn(*mut ffi::PyTypeObject, *mut ffi::PyObject) -> *mut ffi::PyObject;
type BytesResize = unsafe extern "C" fn(*mut *mut ffi::PyObject, ffi::Py_ssize_t) -> i32;
type GetMethod = unsafe extern "C" fn(
    *mut ffi::PyObject,
    *mut ffi::PyObject,
    *mut *mut ffi::PyObject,
) -> std::ffi::c_int;

struct Fns {
    type_lookup: Option<TypeLookup>,
    bytes_resize: Option<BytesResize>,
    get_method: Option<GetMethod>,
}

static FNS: OnceLock<Fns> = OnceLock::new();

/// The address of the process's `name`, if there is one.
fn symbol(name: &std::ffi::CStr) -> Option<std::ptr::NonNull<std::ffi::c_void>> {
    // SAFETY: `dlsym` with `RTLD_DEFAULT` and a NUL-terminated name only reads; it returns the
    // symbol's address or NULL.
    std::ptr::NonNull::new(unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) })
}

/// Looks the functions up and decides the loan. Called once, at module initialisation.
pub(crate) fn install(py: Python<'_>) {
    let mut found = (None, None, None);
    let used = cpython_loans::take(py, Loan::PrivateFunctions, || {
        let lookup = symbol(c"_PyType_Lookup");
        let resize = symbol(c"_PyBytes_Resize");
        let get_method = symbol(c"_PyObject_GetMethod");
        // SAFETY: each symbol is CPython's function of that name, whose C signature is the type
        // it is cast to (see the invariants).
        found = unsafe {
            (
                lookup
                    .map(|p| std::mem::transmute::<*mut std::ffi::c_void, TypeLookup>(p.as_ptr())),
                resize
                    .map(|p| std::mem::transmute::<*mut std::ffi::c_void, BytesResize>(p.as_ptr())),
                get_method
                    .map(|p| std::mem::transmute::<*mut std::ffi::c_void, GetMethod>(p.as_ptr())),
            )
        };
        match found {
            (Some(_), Some(_), Some(_)) => Ok(()),
            (None, _, _) => Err("_PyType_Lookup not exported".to_owned()),
            (_, None, _) => Err("_PyBytes_Resize not exported".to_owned()),
            (_, _, None) => Err("_PyObject_GetMethod not exported".to_owned()),
        }
    });
    let (type_lookup, bytes_resize, get_method) = if used { found } else { (None, None, None) };
    let _ = FNS.set(Fns {
        type_lookup,
        bytes_resize,
        get_method,
    });
}

/// What `obj.name` is as the interpreter's method load sees it (`_PyObject_GetMethod`):
/// `Some(true)` if it is `descr` itself, found on the type and not shadowed by the instance
/// (which the instance's dict is read for without being made, so that a loop whose attributes
/// are all slots keeps the specialised method loads of CPython 3.12 and 3.13), `Some(false)` if
/// anything else; `None` without the private function (the caller then asks the public API).
///
/// # Safety
/// The GIL is held; `obj`, `name` (a `str`) and `descr` are live.
pub(crate) unsafe fn loads_as_method(
    obj: *mut ffi::PyObject,
    name: *mut ffi::PyObject,
    descr: *mut ffi::PyObject,
) -> Option<bool> {
    let get_method = FNS.get().and_then(|f| f.get_method)?;
    let mut method = std::ptr::null_mut();
    // SAFETY: the caller's contract is the function's; `method` starts NULL, as it requires. It
    // returns 1 with the unbound descriptor, or 0 with the attribute or NULL and an exception
    // set; either result is a new reference, released here.
    unsafe {
        let unbound = get_method(obj, name, &raw mut method) == 1;
        let own = unbound && method == descr;
        if method.is_null() {
            ffi::PyErr_Clear();
        } else {
            ffi::Py_DECREF(method);
        }
        Some(own)
    }
}

/// `_PyType_Lookup(tp, name)`: the attribute `name` of the type `tp` as found along its MRO,
/// without calling descriptors; a borrowed reference, or NULL (no exception set) if none.
/// Without the private function, the MRO's `__dict__`s are searched through the public API:
/// the result is then kept alive by the class dict it came from, as the private function's is.
///
/// # Safety
/// The GIL is held; `tp` and `name` (a `str`) are live. The result is borrowed from a class
/// dict: use it before running any Python code.
pub(crate) unsafe fn type_lookup(
    tp: *mut ffi::PyTypeObject,
    name: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    if let Some(f) = FNS.get().and_then(|f| f.type_lookup) {
        // SAFETY: the caller's contract is the function's.
        return unsafe { f(tp, name) };
    }
    // SAFETY: the GIL is held (the caller's contract).
    let py = unsafe { Python::assume_attached() };
    // SAFETY: `tp` is a live type object; a borrowed pointer becomes a new reference.
    let ty = unsafe { Bound::from_borrowed_ptr(py, tp.cast()) };
    // SAFETY: `name` is live.
    let name = unsafe { Bound::from_borrowed_ptr(py, name) };
    mro_lookup(&ty, &name).unwrap_or(std::ptr::null_mut())
}

/// The public fallback of `type_lookup`: each class of `type(obj).__mro__`, in order, and its
/// own `__dict__` (the class's real dict, read through `PyType_GetDict`'s equivalent, the
/// mapping proxy, whose items are the dict's own objects).
fn mro_lookup(ty: &Bound<'_, PyAny>, name: &Bound<'_, PyAny>) -> Option<*mut ffi::PyObject> {
    let mro = ty.getattr("__mro__").ok()?;
    let mro = mro.cast::<PyTuple>().ok()?;
    for cls in mro.iter() {
        let Ok(dict) = cls.getattr("__dict__") else {
            continue;
        };
        let found = match dict.cast::<PyDict>() {
            Ok(d) => d.get_item(name).ok().flatten(),
            Err(_) => dict.get_item(name).ok(),
        };
        if let Some(value) = found {
            // The value stays referenced by the class dict after this `Bound` is dropped, so a
            // borrowed pointer is what the private function would have returned.
            return Some(value.as_ptr());
        }
    }
    None
}

/// A bytes object of the first `len` bytes of `obj` (a bytes object that only the caller
/// references, at least `len` long), which it consumes: shrunk in place by `_PyBytes_Resize`,
/// or copied.
///
/// # Safety
/// The GIL is held; `obj` is an owned reference to an unshared bytes object of at least `len`
/// bytes.
pub(crate) unsafe fn bytes_shrink(
    py: Python<'_>,
    obj: *mut ffi::PyObject,
    len: usize,
) -> PyResult<Bound<'_, PyBytes>> {
    if let Some(resize) = FNS.get().and_then(|f| f.bytes_resize) {
        let mut obj = obj;
        // SAFETY: the caller's contract; on failure the object is freed, `obj` is NULL and an
        // exception is set.
        if unsafe { resize(&raw mut obj, len as ffi::Py_ssize_t) } < 0 {
            return Err(PyErr::fetch(py));
        }
        // SAFETY: `obj` is an owned, valid bytes object.
        return Ok(unsafe { Bound::from_owned_ptr(py, obj).cast_into_unchecked() });
    }
    // SAFETY: the caller's contract: an owned bytes object of at least `len` bytes.
    let owned = unsafe { Bound::from_owned_ptr(py, obj) };
    // SAFETY: as above; the pointer and length describe its first `len` bytes.
    let copy = unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            ffi::PyBytes_FromStringAndSize(ffi::PyBytes_AsString(owned.as_ptr()), len as _),
        )
    }?;
    // SAFETY: `PyBytes_FromStringAndSize` made a bytes object.
    Ok(unsafe { copy.cast_into_unchecked() })
}
