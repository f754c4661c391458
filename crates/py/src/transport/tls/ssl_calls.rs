//! The C methods of `_ssl._SSLSocket` and `_ssl.MemoryBIO` that the record path calls, taken
//! once from the types and called through vectorcall.
//!
//! `sslobj.read(n)` by name looks the method up on the type (`_PyObject_GetMethod`: the type
//! attribute cache, then the instance) for every call; the descriptors fetched here are called
//! directly with the object as their first argument, which is what that lookup ends in for these
//! types (they have no instance dict, and `ssl` does not replace their methods). `MemoryBIO.pending`
//! is a getset descriptor, read through its `__get__`.
//!
//! Invariants:
//! - The descriptors are those of the types in `_ssl`, fetched once per process ([`methods`]).
//! - [`Methods::accepts`] is checked before a `TlsRecords` is made: the SSL object and both BIOs
//!   are exactly of these types (their `__class__` cannot be reassigned: the types are immutable).
//!   The descriptors check `self`'s type again on every call, so a wrong object raises
//!   `TypeError` rather than misbehaving.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyInt, PyType};

pub(super) struct Methods {
    sslsocket: Py<PyType>,
    memorybio: Py<PyType>,
    ssl_read: Py<PyAny>,
    ssl_write: Py<PyAny>,
    ssl_pending: Py<PyAny>,
    bio_read: Py<PyAny>,
    bio_write: Py<PyAny>,
    bio_pending: Py<PyAny>,
}

static METHODS: PyOnceLock<Methods> = PyOnceLock::new();

/// The descriptors, fetched from `_ssl` on first use.
pub(super) fn methods(py: Python<'_>) -> PyResult<&'static Methods> {
    METHODS.get_or_try_init(py, || {
        let m = py.import("_ssl")?;
        let sslsocket = m.getattr("_SSLSocket")?.cast_into::<PyType>()?;
        let memorybio = m.getattr("MemoryBIO")?.cast_into::<PyType>()?;
        let get = |tp: &Bound<'_, PyType>, name: &str| -> PyResult<Py<PyAny>> {
            // From the type's own dict: the descriptor itself, not a bound method.
            Ok(tp.getattr("__dict__")?.get_item(name)?.unbind())
        };
        Ok(Methods {
            ssl_read: get(&sslsocket, "read")?,
            ssl_write: get(&sslsocket, "write")?,
            ssl_pending: get(&sslsocket, "pending")?,
            bio_read: get(&memorybio, "read")?,
            bio_write: get(&memorybio, "write")?,
            bio_pending: get(&memorybio, "pending")?,
            sslsocket: sslsocket.unbind(),
            memorybio: memorybio.unbind(),
        })
    })
}

/// `descr(slf, *args)` through vectorcall.
fn call<'py>(
    descr: &Py<PyAny>,
    slf: &Bound<'py, PyAny>,
    args: &[&Bound<'py, PyAny>],
) -> PyResult<Bound<'py, PyAny>> {
    let mut all = [std::ptr::null_mut::<ffi::PyObject>(); 3];
    all[0] = slf.as_ptr();
    for (to, arg) in all[1..].iter_mut().zip(args) {
        *to = arg.as_ptr();
    }
    let n = 1 + args.len().min(2);
    // SAFETY: we hold the GIL (`slf` is bound); `all[..n]` are live objects borrowed for the
    // call; the descriptor is a method descriptor, which checks `slf`'s type itself.
    unsafe {
        Bound::from_owned_ptr_or_err(
            slf.py(),
            ffi::PyObject_Vectorcall(descr.as_ptr(), all.as_ptr(), n, std::ptr::null_mut()),
        )
    }
}

/// The value of an exact `int` that fits in `isize`, read without PyO3's generic extraction;
/// `None` for anything else.
pub(super) fn small_int(value: &Bound<'_, PyAny>) -> Option<isize> {
    if !value.is_exact_instance_of::<PyInt>() {
        return None;
    }
    // SAFETY: we hold the GIL and `value` is a live exact `int`.
    let n = unsafe { ffi::PyLong_AsSsize_t(value.as_ptr()) };
    if n == -1 && PyErr::occurred(value.py()) {
        // Too large: the overflow error is dropped, the caller takes the general path.
        drop(PyErr::take(value.py()));
        return None;
    }
    Some(n)
}

/// A count returned by a C method (an `int`, `>= 0`).
fn count(value: &Bound<'_, PyAny>) -> PyResult<usize> {
    match small_int(value).map(usize::try_from) {
        Some(Ok(n)) => Ok(n),
        _ => value.extract(),
    }
}

impl Methods {
    /// Whether the SSL object and the BIOs are exactly `_ssl`'s types.
    pub(super) fn accepts(
        &self,
        sslobj: &Bound<'_, PyAny>,
        incoming: &Bound<'_, PyAny>,
        outgoing: &Bound<'_, PyAny>,
    ) -> bool {
        sslobj.get_type().is(self.sslsocket.bind(sslobj.py()))
            && [incoming, outgoing]
                .iter()
                .all(|bio| bio.get_type().is(self.memorybio.bind(bio.py())))
    }

    /// `sslobj.read(*args)`: `(len,)` or `(len, buffer)`.
    pub(super) fn ssl_read<'py>(
        &self,
        sslobj: &Bound<'py, PyAny>,
        args: &[&Bound<'py, PyAny>],
    ) -> PyResult<Bound<'py, PyAny>> {
        call(&self.ssl_read, sslobj, args)
    }

    /// `sslobj.write(data)`: the bytes taken.
    pub(super) fn ssl_write<'py>(
        &self,
        sslobj: &Bound<'py, PyAny>,
        data: &Bound<'py, PyAny>,
    ) -> PyResult<usize> {
        count(&call(&self.ssl_write, sslobj, &[data])?)
    }

    /// `sslobj.pending()`: decrypted bytes held by the SSL object.
    pub(super) fn ssl_pending(&self, sslobj: &Bound<'_, PyAny>) -> PyResult<usize> {
        count(&call(&self.ssl_pending, sslobj, &[])?)
    }

    /// `bio.read()`: everything in the BIO.
    pub(super) fn bio_read<'py>(&self, bio: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        call(&self.bio_read, bio, &[])
    }

    /// `bio.write(data)`.
    pub(super) fn bio_write(
        &self,
        bio: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        call(&self.bio_write, bio, &[data]).map(drop)
    }

    /// `bio.pending`: the bytes in the BIO.
    pub(super) fn bio_pending(&self, bio: &Bound<'_, PyAny>) -> PyResult<usize> {
        let descr = self.bio_pending.as_ptr();
        // SAFETY: we hold the GIL (`bio` is bound); `descr` is a getset descriptor (its type has
        // `tp_descr_get`, which checks `bio`'s type), both live for the call.
        let value = unsafe {
            let get = (*ffi::Py_TYPE(descr))
                .tp_descr_get
                .expect("a getset descriptor has __get__");
            Bound::from_owned_ptr_or_err(
                bio.py(),
                get(descr, bio.as_ptr(), ffi::Py_TYPE(bio.as_ptr()).cast()),
            )?
        };
        count(&value)
    }
}
