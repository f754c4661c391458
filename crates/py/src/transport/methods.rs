//! The stream socket transport's `write(data)` and `is_closing()` as method descriptors of the
//! Python class (`_socket_transport._SelectorSocketTransport`), calling the core directly.
//!
//! Streams call both once per message (`StreamWriter.write` is `self._transport.write(data)`,
//! `StreamWriter.drain` asks `self._transport.is_closing()`). When they were the core's bound
//! methods stored on each instance, the instance attribute shadowed asyncio's class method, so
//! CPython could not specialise the call site (`LOAD_METHOD` does the generic type and instance
//! dict lookups each time), and the call went through PyO3's wrapper and argument extraction.
//! As `METH_O`/`METH_NOARGS` method descriptors of the class, the interpreter specialises both
//! (`LOAD_METHOD_WITH_VALUES`, then `PRECALL_NO_KW_METHOD_DESCRIPTOR_O`/`_NOARGS`, which call the
//! C function directly), and the function finds the core in the class's `_core` slot.
//!
//! Invariants:
//! - The descriptors are made for the class that owns the `_core` slot, so CPython passes as
//!   `self` only instances of that class or of subclasses, whose layout keeps the slot at the
//!   offset read from its member descriptor at installation ([`CORE_OFFSET`]).
//! - Only one class is installed; a second installation must find the slot at the same offset
//!   (it is refused otherwise), so the offset is never wrong for an earlier class.
//! - The slot may be empty (an instance made with `__new__` only) or hold something else (set
//!   from Python): both raise what the core's own method lookup would (`AttributeError`, or
//!   `TypeError` through the Python call of `self._core.write`).

use std::sync::atomic::{AtomicIsize, AtomicPtr, Ordering};

use pyo3::exceptions::{PyAttributeError, PyTypeError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyType};
use pyo3::PyTypeInfo;

use super::StreamCore;
use crate::fastcall::{entry, method_descriptor, MethodDef};

/// The byte offset of the `_core` slot in instances of the installed class (0: none yet).
static CORE_OFFSET: AtomicIsize = AtomicIsize::new(0);

/// `StreamCore`'s type object, read once at installation: PyO3's checked cast looks the type
/// up and tests subclassing (about 25 instructions per call); `StreamCore` cannot be
/// subclassed, so comparing the type pointer is the same test.
static CORE_TYPE: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());

static WRITE: MethodDef = MethodDef::meth_o(
    c"write",
    transport_write,
    c"write(data)\n--\n\nWrite some data bytes to the transport (the native core's write).",
);

static IS_CLOSING: MethodDef = MethodDef::meth_noargs(
    c"is_closing",
    transport_is_closing,
    c"is_closing()\n--\n\nReturn True if the transport is closing or closed.",
);

/// The address of `WRITE`: a bound `transport.write` built from it has the transport as `self`.
pub(super) fn write_def() -> usize {
    std::ptr::addr_of!(WRITE.0) as usize
}

/// Puts `write` and `is_closing` on `cls`, whose `__slots__` hold `_core`.
#[pyfunction]
pub fn _install_transport_methods(cls: &Bound<'_, PyType>) -> PyResult<()> {
    let py = cls.py();
    let slot = cls
        .getattr(intern!(py, "__dict__"))?
        .get_item(intern!(py, "_core"))?;
    // SAFETY: we hold the GIL; `PyMemberDescr_Type` is a static type object.
    let is_member = unsafe { ffi::Py_TYPE(slot.as_ptr()) == &raw mut ffi::PyMemberDescr_Type };
    if !is_member {
        return Err(PyTypeError::new_err(
            "_core must be a __slots__ member of the class",
        ));
    }
    // SAFETY: an object of type `member_descriptor` is a `PyMemberDescrObject`; its `d_member`
    // points at the class's member definition, alive as long as the class.
    let (offset, kind) = unsafe {
        let member = (*slot.as_ptr().cast::<ffi::PyMemberDescrObject>()).d_member;
        ((*member).offset, (*member).type_code)
    };
    let aligned = offset.unsigned_abs() % std::mem::align_of::<*mut ffi::PyObject>() == 0;
    if kind != ffi::Py_T_OBJECT_EX || offset <= 0 || !aligned {
        return Err(PyTypeError::new_err("_core must be an object slot"));
    }
    if let Err(old) = CORE_OFFSET.compare_exchange(0, offset, Ordering::Relaxed, Ordering::Relaxed)
    {
        if old != offset {
            return Err(PyTypeError::new_err(
                "transport methods are installed on another class layout",
            ));
        }
    }
    CORE_TYPE.store(StreamCore::type_object_raw(py), Ordering::Relaxed);
    for (name, def) in [("write", &WRITE), ("is_closing", &IS_CLOSING)] {
        cls.setattr(name, method_descriptor(cls, def)?)?;
    }
    Ok(())
}

/// The core in `transport`'s `_core` slot, or the error reading `transport._core` would raise.
///
/// # Safety
/// `transport` must be an instance of the installed class or a subclass (see the invariants).
pub(super) unsafe fn core_of<'a, 'py>(
    transport: &'a Bound<'py, PyAny>,
) -> PyResult<&'a Bound<'py, StreamCore>> {
    let offset = CORE_OFFSET.load(Ordering::Relaxed);
    // SAFETY: the caller's contract: the slot lies at `offset` (pointer-aligned, checked at
    // installation) in `transport`'s layout, and holds a reference owned by the transport, or
    // NULL.
    let slot = unsafe {
        &*transport
            .as_ptr()
            .cast::<*mut ffi::PyObject>()
            .byte_offset(offset)
    };
    if slot.is_null() {
        return Err(PyAttributeError::new_err("_core"));
    }
    // SAFETY: a non-NULL slot is a live object owned by the transport, which outlives `'a`.
    let core = unsafe { Bound::ref_from_ptr(transport.py(), slot) };
    // SAFETY: `core` is a live object; only its type pointer is read.
    if unsafe { ffi::Py_TYPE(core.as_ptr()) } == CORE_TYPE.load(Ordering::Relaxed) {
        // SAFETY: exactly a `StreamCore` (the class is final: see `CORE_TYPE`).
        return Ok(unsafe { core.cast_unchecked::<StreamCore>() });
    }
    Ok(core.cast::<StreamCore>()?)
}

unsafe extern "C" fn transport_write(
    slf: *mut ffi::PyObject,
    data: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls METH_O functions on a thread that holds the GIL.
    let py = unsafe { Python::assume_attached() };
    entry(py, || {
        // SAFETY: CPython's method descriptor checked that `slf` is an instance of the class
        // (or a subclass); both arguments are borrowed for the call.
        let (transport, data) = unsafe {
            (
                Bound::ref_from_ptr(py, &slf),
                Bound::ref_from_ptr(py, &data),
            )
        };
        // SAFETY: as above: an instance of the installed class.
        let core = unsafe { core_of(transport) }?;
        StreamCore::write_impl(core, data)?;
        Ok(py.None().into_ptr())
    })
}

unsafe extern "C" fn transport_is_closing(
    slf: *mut ffi::PyObject,
    _noargs: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls METH_NOARGS functions on a thread that holds the GIL.
    let py = unsafe { Python::assume_attached() };
    entry(py, || {
        // SAFETY: CPython's method descriptor checked that `slf` is an instance of the class
        // (or a subclass), borrowed for the call.
        let transport = unsafe { Bound::ref_from_ptr(py, &slf) };
        // SAFETY: as above.
        let core = unsafe { core_of(transport) }?;
        let closing = core.get().state.borrow(py)?.shared.closing;
        Ok(PyBool::new(py, closing).to_owned().into_ptr())
    })
}
