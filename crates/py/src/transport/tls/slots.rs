//! The protocol's per-record attributes, read from their `__slots__` without attribute lookup.
//!
//! `ferroloop._ssl_protocol.SSLProtocol` declares the attributes that the record path reads for
//! every message as `__slots__` ([`NAMES`], in this order; a test checks the two lists agree).
//! asyncio's own code reads and writes them as before (`self._state = ...` goes through the slot's
//! member descriptor); the native path reads the object pointer stored at the slot's offset
//! instead of a `PyObject_GetAttr` (type lookup, instance dict lookup: about 150 instructions
//! each, some 30 per echoed message).
//!
//! Invariants:
//! - **Layout.** [`Slots::find`] accepts a protocol only when, for every name, the attribute its
//!   type resolves to is a writable object member descriptor (what `__slots__` creates) with an
//!   absolute, pointer-aligned offset, of a class the protocol is an instance of. The type is kept (a strong
//!   reference), and every read first checks that the protocol's type is still exactly that one
//!   (`__class__` can be reassigned): only then is the offset read, otherwise the attribute is
//!   looked up as Python would.
//! - **Same answers as `getattr`.** A member descriptor is a data descriptor, so `getattr` would
//!   return the slot's value too; an empty slot (never set, or deleted) is looked up the Python
//!   way, which raises asyncio's `AttributeError`. This holds as long as nobody replaces the
//!   class's descriptors after the connection is made (the class is ferroloop's own).
//! - Writes (rare: only when records queue up) go through `setattr`, never to the offset.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyString, PyType};

/// The slot names, in [`Attr`] order; `ferroloop._ssl_protocol.SSLProtocol.__slots__` lists the
/// same names.
pub(crate) const NAMES: [&str; 16] = [
    "_state",
    "_write_backlog",
    "_write_buffer_size",
    "_app_reading_paused",
    "_ssl_writing_paused",
    "_app_writing_paused",
    "_ssl_reading_paused",
    "_incoming_high_water",
    "_incoming_low_water",
    "_outgoing_high_water",
    "_outgoing_low_water",
    "_app_protocol",
    "_app_protocol_is_buffer",
    "_transport",
    "_ssl_buffer",
    "_ssl_buffer_view",
];

/// One of [`NAMES`].
#[derive(Clone, Copy)]
pub(super) enum Attr {
    State,
    WriteBacklog,
    WriteBufferSize,
    AppReadingPaused,
    SslWritingPaused,
    AppWritingPaused,
    SslReadingPaused,
    IncomingHighWater,
    IncomingLowWater,
    OutgoingHighWater,
    OutgoingLowWater,
    AppProtocol,
    AppProtocolIsBuffer,
    Transport,
    SslBuffer,
    SslBufferView,
}

/// The interned names, made once.
fn interned(py: Python<'_>) -> &[Py<PyString>; 16] {
    static NAMES_PY: PyOnceLock<[Py<PyString>; 16]> = PyOnceLock::new();
    NAMES_PY.get_or_init(py, || NAMES.map(|n| PyString::intern(py, n).unbind()))
}

/// Where one protocol class keeps the slots.
pub(super) struct Slots {
    ty: Py<PyType>,
    offsets: [isize; 16],
}

impl Slots {
    /// The slots of `proto`'s type, or `None` if any name is not a plain object slot there.
    pub(super) fn find(proto: &Bound<'_, PyAny>) -> Option<Self> {
        let py = proto.py();
        let tp = proto.get_type_ptr();
        let mut offsets = [0isize; 16];
        for (offset, name) in offsets.iter_mut().zip(interned(py)) {
            // SAFETY: we hold the GIL; the type (held by `proto`) and the name are live; the
            // result is borrowed from a dict of the MRO and read at once, before any Python code.
            unsafe {
                let descr = crate::private_fn::type_lookup(tp, name.as_ptr());
                if descr.is_null() || ffi::Py_TYPE(descr) != &raw mut ffi::PyMemberDescr_Type {
                    return None;
                }
                let descr = descr.cast::<ffi::PyMemberDescrObject>();
                let member = &*(*descr).d_member;
                let rejected = ffi::Py_READONLY | ffi::Py_RELATIVE_OFFSET;
                let word = isize::try_from(size_of::<*mut ffi::PyObject>()).unwrap_or(isize::MAX);
                if member.type_code != ffi::Py_T_OBJECT_EX
                    || member.flags & rejected != 0
                    || member.offset <= 0
                    || member.offset % word != 0
                    || ffi::PyObject_TypeCheck(proto.as_ptr(), (*descr).d_common.d_type) == 0
                {
                    return None;
                }
                *offset = member.offset;
            }
        }
        Some(Self {
            ty: proto.get_type().unbind(),
            offsets,
        })
    }

    /// `getattr(proto, name)`: the slot's value when `proto` has the layout found by `find`.
    pub(super) fn get<'py>(
        &self,
        proto: &Bound<'py, PyAny>,
        attr: Attr,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = proto.py();
        if proto.get_type_ptr() == self.ty.as_ptr().cast() {
            // SAFETY: the protocol's type is the one `find` checked, whose member descriptor
            // stores an object pointer (or NULL) at this absolute, aligned offset inside each
            // instance;
            // the protocol is alive (bound), and the pointer is read with the GIL held.
            let value = unsafe {
                proto
                    .as_ptr()
                    .cast::<*mut ffi::PyObject>()
                    .byte_offset(self.offsets[attr as usize])
                    .read()
            };
            if !value.is_null() {
                // SAFETY: a live object owned by the slot; the new reference is ours.
                return Ok(unsafe { Bound::from_borrowed_ptr(py, value) });
            }
        }
        proto.getattr(interned(py)[attr as usize].bind(py))
    }

    /// `bool(getattr(proto, name))`, without a call for `True` and `False`.
    pub(super) fn flag(&self, proto: &Bound<'_, PyAny>, attr: Attr) -> PyResult<bool> {
        let value = self.get(proto, attr)?;
        // SAFETY: `Py_True`/`Py_False` are static objects, compared by address only.
        let (yes, no) = unsafe { (ffi::Py_True(), ffi::Py_False()) };
        if value.as_ptr() == yes {
            Ok(true)
        } else if value.as_ptr() == no {
            Ok(false)
        } else {
            value.is_truthy()
        }
    }

    /// `setattr(proto, name, value)`.
    pub(super) fn set<'py>(
        proto: &Bound<'py, PyAny>,
        attr: Attr,
        value: impl IntoPyObject<'py>,
    ) -> PyResult<()> {
        let py = proto.py();
        proto.setattr(interned(py)[attr as usize].bind(py), value)
    }

    /// The type, for the garbage collector.
    pub(super) fn ty(&self) -> &Py<PyType> {
        &self.ty
    }
}
