//! `wsgi.file_wrapper` (PEP 3333's optional platform file transmission): a response that is a
//! `WsgiFileWrapper` around a regular file with a descriptor goes out with `sendfile(2)` from
//! our own `dup` of its fd, from the file's current position to its end; anything else (a
//! `BytesIO`, a socket, a pipe) is iterated in `blksize` blocks like any response.

use std::os::fd::{OwnedFd, RawFd};

use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::PyTraverseError;

use crate::server::respond::own_copy;

#[pyclass(module = "ferroloop._native", name = "WsgiFileWrapper", frozen)]
pub struct WsgiFileWrapper {
    filelike: Py<PyAny>,
    blksize: usize,
}

#[pymethods]
impl WsgiFileWrapper {
    #[new]
    #[pyo3(signature = (filelike, blksize=8192))]
    fn new(filelike: Py<PyAny>, blksize: usize) -> Self {
        Self {
            filelike,
            blksize: blksize.max(1),
        }
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// The next `blksize` bytes of the file; the end is its first empty read.
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let data = self
            .filelike
            .bind(py)
            .call_method1(intern!(py, "read"), (self.blksize,))?;
        Ok((data.len()? > 0).then_some(data))
    }

    /// Closes the file, if it has a `close()` (PEP 3333).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if let Some(close) = self.filelike.bind(py).getattr_opt(intern!(py, "close"))? {
            close.call0()?;
        }
        Ok(())
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.filelike)
    }
}

impl WsgiFileWrapper {
    /// The rest of the file as our own fd, its offset and the byte count, if the file has a
    /// descriptor and is a regular file; `None` (iterate instead) otherwise.
    pub(super) fn file_body(&self, py: Python<'_>) -> Option<(OwnedFd, u64, u64)> {
        let file = self.filelike.bind(py);
        let raw: RawFd = file
            .call_method0(intern!(py, "fileno"))
            .and_then(|n| n.extract())
            .ok()?;
        let (owned, stat) = own_copy(raw).ok()?;
        if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
            return None;
        }
        // The position the app's file object reports (a buffered reader's OS position may be
        // ahead of it); without `tell()`, the descriptor's.
        let offset: u64 = match file
            .call_method0(intern!(py, "tell"))
            .and_then(|t| t.extract())
        {
            Ok(o) => o,
            // SAFETY: lseek with SEEK_CUR and offset 0 only reads the file position.
            Err(_) => u64::try_from(unsafe { libc::lseek(raw, 0, libc::SEEK_CUR) }).ok()?,
        };
        let size = u64::try_from(stat.st_size).ok()?;
        Some((owned, offset, size.saturating_sub(offset)))
    }
}
