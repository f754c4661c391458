//! Native callables that the loop calls without CPython's call machinery.
//!
//! The loop's fd callbacks for native objects (the server's listener and connections, the stream
//! and datagram transport cores, a waiting `sock_*` operation, which is also its Future's done
//! callback) and the server's task done callback (`RequestCycle`) are PyO3
//! classes with `__call__`. Called through Python, each call builds an argument tuple
//! (`_PyObject_MakeTpCall`, since a PyO3 class has no vectorcall slot), goes through PyO3's
//! trampoline and its generic argument extraction, and frees the tuple: under callgrind about 600
//! instructions for a call with one argument (a connection's `writable`, the done callback's
//! task), about 130 for one without (a transport core's reader). A handle whose callback is one of
//! these types gets, when it is made, the type's `NativeCall`, and `Handle::run` calls that
//! function directly (in the handle's context, with the same error handling).
//!
//! Invariants:
//! - Each registered function does exactly what calling the object from Python with the same
//!   arguments does: the arguments it does not take the fast way (another count, a value of the
//!   wrong type) go to the object's Python `__call__`, so errors are the same.
//! - Types are compared exactly; the registered classes cannot be subclassed (none is
//!   `subclass`), so an exact match is the same as `isinstance`.
//! - The table is filled once, at module initialisation, before any handle exists, with PyO3
//!   classes only (heap types: `lookup` skips the scan for a callback of a static type).

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::{PyClass, PyTypeInfo};

use crate::handle::CallArgs;
use crate::server::{Conn, Cycle, H2Conn, HttpServer};
use crate::sock_ops::SocketOperation;
use crate::transport::{DatagramCore, StreamCore};

/// `callback(*args)` for a native type, with the handle's arguments: none, or one.
pub(crate) type NativeCall =
    for<'py> fn(&Bound<'py, PyAny>, Option<&Bound<'py, PyAny>>) -> PyResult<()>;

static TABLE: PyOnceLock<Vec<(usize, NativeCall)>> = PyOnceLock::new();

/// The native callable types and their direct calls.
pub(crate) fn init(py: Python<'_>) {
    let table: Vec<(*mut ffi::PyTypeObject, NativeCall)> = vec![
        (Conn::type_object_raw(py), Conn::native_call),
        (H2Conn::type_object_raw(py), H2Conn::native_call),
        (StreamCore::type_object_raw(py), StreamCore::native_call),
        (Cycle::type_object_raw(py), Cycle::native_call),
        (HttpServer::type_object_raw(py), HttpServer::native_call),
        (DatagramCore::type_object_raw(py), DatagramCore::native_call),
        (
            SocketOperation::type_object_raw(py),
            SocketOperation::native_call,
        ),
    ];
    let table = table.into_iter().map(|(t, f)| (t as usize, f)).collect();
    let _ = TABLE.set(py, table);
}

/// The direct call for `callback(*args)`, if `callback` is of a registered type and `args` is
/// empty or one value.
pub(crate) fn lookup(callback: &Bound<'_, PyAny>, args: &CallArgs) -> Option<NativeCall> {
    if let CallArgs::Tuple(t) = args {
        if !t.bind(callback.py()).is_empty() {
            return None;
        }
    }
    let ty = callback.get_type_ptr();
    // The registered types are PyO3 classes, which are heap types; the usual callbacks
    // (functions, bound methods, builtins) are of static types, ruled out without the scan.
    // SAFETY: `ty` is the live type of a live object; only its flags are read.
    if unsafe { ffi::PyType_HasFeature(ty, ffi::Py_TPFLAGS_HEAPTYPE) } == 0 {
        return None;
    }
    let ty = ty as usize;
    TABLE
        .get(callback.py())?
        .iter()
        .find(|(t, _)| *t == ty)
        .map(|&(_, f)| f)
}

/// A `NativeCall` body: `direct` on `obj` as a `T`, unless `obj` is not one or `direct` does not
/// take these arguments (returns `None`); then the Python call, whose errors are the reference.
pub(crate) fn dispatch<'py, T: PyClass>(
    obj: &Bound<'py, PyAny>,
    arg: Option<&Bound<'py, PyAny>>,
    direct: impl FnOnce(&Bound<'py, T>, Option<&Bound<'py, PyAny>>) -> Option<PyResult<()>>,
) -> PyResult<()> {
    if let Ok(slf) = obj.cast::<T>() {
        if let Some(result) = direct(slf, arg) {
            return result;
        }
    }
    call_python(obj, arg)
}

/// `native_call!(Type, |slf, arg| direct)` defines `Type::native_call`, the type's `NativeCall`:
/// `dispatch` with `direct` (which returns `None` for arguments it does not take).
macro_rules! native_call {
    ($ty:ty, |$slf:ident, $arg:ident| $direct:expr) => {
        impl $ty {
            pub(crate) fn native_call(
                obj: &Bound<'_, PyAny>,
                arg: Option<&Bound<'_, PyAny>>,
            ) -> PyResult<()> {
                $crate::native_call::dispatch::<Self>(obj, arg, |$slf, $arg| $direct)
            }
        }
    };
}
pub(crate) use native_call;

/// The Python call, for argument shapes a direct call does not take.
fn call_python(callback: &Bound<'_, PyAny>, arg: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    match arg {
        None => callback.call0().map(drop),
        Some(a) => callback.call1((a,)).map(drop),
    }
}
