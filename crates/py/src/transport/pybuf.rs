//! A contiguous view of any object that exports the buffer protocol, whatever its item format
//! (`socket.send` and `recv_into` accept a memoryview of `'i'` items; PyO3's typed `PyBuffer<u8>`
//! does not).

use pyo3::ffi;
use pyo3::prelude::*;

/// An exported buffer, released on drop. The GIL is held for its whole life (it is created from
/// a `Bound` and never leaves the call that made it).
pub(super) struct RawBuffer {
    // Boxed: the exporter may keep pointers into the `Py_buffer` it filled.
    view: Box<ffi::Py_buffer>,
}

impl RawBuffer {
    /// `PyObject_GetBuffer(obj, flags)`; `flags` is `PyBUF_SIMPLE` (read) or `PyBUF_WRITABLE`.
    /// Both ask for a C-contiguous buffer, as `socket.send`/`recv_into` do.
    pub(super) fn get(obj: &Bound<'_, PyAny>, flags: i32) -> PyResult<Self> {
        // Zeroed after a plain allocation: `Box::new(zeroed())` becomes a `calloc`, about 300
        // instructions more than `malloc` and an 80-byte memset, for every read into a
        // `BufferedProtocol`'s buffer (`black_box` keeps the optimiser from fusing them again).
        let mut view = Box::<ffi::Py_buffer>::new_uninit();
        let ptr = std::hint::black_box(view.as_mut_ptr());
        // SAFETY: `ptr` is the box's own, writable allocation for one `Py_buffer`; all-zero is
        // that plain-data struct's documented "empty" state, so it is initialised after this.
        let mut view = unsafe {
            ptr.write_bytes(0, 1);
            view.assume_init()
        };
        // SAFETY: we hold the GIL, `obj` is alive and `view` is a valid out-pointer.
        let r = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &raw mut *view, flags) };
        if r < 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(Self { view })
    }

    pub(super) fn len(&self) -> usize {
        self.view.len as usize
    }

    pub(super) fn as_mut_ptr(&self) -> *mut u8 {
        self.view.buf.cast()
    }

    /// The bytes. The caller runs no Python code while it holds the slice (a `bytearray` could
    /// otherwise be resized under it).
    pub(super) fn as_slice(&self) -> &[u8] {
        if self.len() == 0 {
            return &[];
        }
        // SAFETY: a successful PyObject_GetBuffer without PyBUF_STRIDES etc. yields `len`
        // contiguous bytes at `buf`, valid until PyBuffer_Release.
        unsafe { std::slice::from_raw_parts(self.view.buf.cast::<u8>(), self.len()) }
    }
}

impl Drop for RawBuffer {
    fn drop(&mut self) {
        // SAFETY: the view was filled by a successful PyObject_GetBuffer and is released once;
        // the GIL is held (see the type's comment).
        unsafe { ffi::PyBuffer_Release(&raw mut *self.view) };
    }
}
