//! `get_buffer`, `buffer_updated` and the app transport's `write` as raw `METH_O` built-ins.
//!
//! These three run for every record (the socket transport calls the first two, the app the
//! third). As PyO3 methods each call goes through PyO3's trampoline and its generic argument
//! extraction (about 130 instructions); bound as `METH_O` built-ins (`fastcall::bound_builtin`,
//! `self` being the `TlsRecords`) CPython hands over the one argument directly. They call the
//! same Rust methods as the PyO3 methods, which stay (stubs, and the other entry points).
//!
//! Invariants:
//! - Each function is bound only to a `TlsRecords` (`_fast_methods`), which the built-in keeps
//!   alive; CPython calls it with the GIL held and one borrowed argument.
//! - Errors and panics are raised as by PyO3's wrapper (`fastcall::entry`).

use pyo3::ffi;
use pyo3::prelude::*;

use super::TlsRecords;
use crate::fastcall::{bound_builtin, entry, MethodDef};

macro_rules! meth_o {
    ($func:ident, |$records:ident, $py:ident, $arg:ident| $body:expr) => {
        unsafe extern "C" fn $func(
            slf: *mut ffi::PyObject,
            arg: *mut ffi::PyObject,
        ) -> *mut ffi::PyObject {
            // SAFETY: CPython calls METH_O functions on a thread that holds the GIL.
            let $py = unsafe { Python::assume_attached() };
            entry($py, || {
                // SAFETY: the built-in is bound to a `TlsRecords` (module invariants); it and
                // the argument are borrowed for the call.
                let ($records, $arg) = unsafe {
                    (
                        Bound::ref_from_ptr($py, &slf).cast_unchecked::<TlsRecords>(),
                        Bound::ref_from_ptr($py, &arg).clone(),
                    )
                };
                $body
            })
        }
    };
}

meth_o!(get_buffer, |records, py, n| Ok(records
    .get()
    .get_buffer(py, n)?
    .into_ptr()));
meth_o!(buffer_updated, |records, py, n| {
    records.get().buffer_updated(py, n)?;
    Ok(py.None().into_ptr())
});
meth_o!(app_write, |records, py, data| {
    records.get().app_write(py, data)?;
    Ok(py.None().into_ptr())
});

static GET_BUFFER: MethodDef = MethodDef::meth_o(
    c"get_buffer",
    get_buffer,
    c"get_buffer(n)\n--\n\nasyncio's SSLProtocol.get_buffer (native).",
);
static BUFFER_UPDATED: MethodDef = MethodDef::meth_o(
    c"buffer_updated",
    buffer_updated,
    c"buffer_updated(nbytes)\n--\n\nasyncio's SSLProtocol.buffer_updated (native).",
);
static APP_WRITE: MethodDef = MethodDef::meth_o(
    c"write",
    app_write,
    c"write(data)\n--\n\nasyncio's _SSLProtocolTransport.write (native).",
);

/// `(get_buffer, buffer_updated, app_write)` bound to `records`.
pub(super) fn fast_methods<'py>(
    records: &Bound<'py, TlsRecords>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let slf = records.as_any();
    // SAFETY: the three functions take a `TlsRecords` as `self` (module invariants).
    unsafe {
        Ok((
            bound_builtin(slf, &GET_BUFFER)?,
            bound_builtin(slf, &BUFFER_UPDATED)?,
            bound_builtin(slf, &APP_WRITE)?,
        ))
    }
}
