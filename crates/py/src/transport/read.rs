//! The read side: readiness → `recv` (or a pipe's `read`) → `data_received(bytes)`, or `recv`
//! into the buffer a `BufferedProtocol` lends (`get_buffer`/`buffer_updated`), with asyncio's
//! error messages.

use std::cell::RefCell;
use std::io;
use std::sync::atomic::Ordering;

use ferroloop_core::sys::cvt;
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::pybuf::RawBuffer;
use super::{Attached, Kind, StreamCore};
use crate::sock_ops::{os_error, recv_bytes};

/// Bytes asked of each `recv`: asyncio's `_SelectorTransport.max_size`.
pub(super) const MAX_READ: usize = 256 * 1024;

/// Where the receive buffer starts: on a page boundary. The kernel copies a read into it with
/// `rep movsb`, which is fast only when the destination is aligned: on the AMD EPYC used here a
/// 64 KiB pipe read into a buffer 16 bytes past a page boundary (where glibc's `malloc` puts a
/// large block) took 2.4 times as long as into an aligned one (37 µs against 15 µs per 64 KiB
/// write and read; 32-byte alignment was enough, a page costs nothing more).
const READ_BUF_ALIGN: usize = 4096;

/// A socket whose last read returned at least this many bytes reads the next one directly into a
/// new `bytes` object of `DIRECT_READ` bytes, shrunk to what arrived (as asyncio's `sock.recv`
/// does), instead of into the shared buffer and then copying. Small reads keep the shared buffer,
/// where allocating a large block and shrinking it would cost more than copying a few bytes.
/// Pipes always use the shared, page-aligned buffer (see `READ_BUF_ALIGN`: the kernel's copy
/// into an unaligned destination is slow for pipes).
pub(super) const DIRECT_MIN: usize = 32 * 1024;

/// Bytes asked of a direct read: under glibc's default mmap threshold (128 KiB) with the bytes
/// object's header, so the block comes from the heap, warm, and its shrink and release are not
/// syscalls. At `MAX_READ` (asyncio's size) each read cost an `mmap`, an `mremap`, a `munmap`
/// and a page fault per 4 KiB touched (`strace -c`: one of each per 64 KiB message).
const DIRECT_READ: usize = 124 * 1024;

thread_local! {
    /// The receive buffer shared by every transport of this thread's loop. Allocated once: a
    /// fresh 256 KiB block per read would cross glibc's mmap threshold and cost an mmap/munmap
    /// pair each time (benchmarks/README.md). It has `READ_BUF_ALIGN` spare bytes, so that an
    /// aligned `MAX_READ` bytes fit in it.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's receive buffer (`MAX_READ` bytes, starting at a multiple of
/// `READ_BUF_ALIGN`). `f` must not call Python code that could read again on this thread (the
/// buffer is borrowed for the call).
pub(super) fn with_read_buf<R>(f: impl FnOnce(&mut [u8]) -> R) -> R {
    READ_BUF.with_borrow_mut(|buf| {
        if buf.len() < MAX_READ + READ_BUF_ALIGN {
            buf.resize(MAX_READ + READ_BUF_ALIGN, 0);
        }
        let skip = buf.as_ptr().align_offset(READ_BUF_ALIGN);
        f(&mut buf[skip..skip + MAX_READ])
    })
}

/// What one `recv` gave.
enum Received<T> {
    Data(T),
    Eof,
    /// `EAGAIN`/`EINTR`: nothing now (asyncio returns and waits for the next readiness).
    Nothing,
}

fn classify<T>(r: io::Result<isize>, data: impl FnOnce(usize) -> T) -> io::Result<Received<T>> {
    match r {
        Ok(0) => Ok(Received::Eof),
        Ok(n) => Ok(Received::Data(data(n as usize))),
        Err(e) => nothing_or(e),
    }
}

/// A failed read: `EAGAIN`/`EINTR` are `Nothing`, anything else the error.
fn nothing_or<T>(e: io::Error) -> io::Result<Received<T>> {
    if matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    ) {
        Ok(Received::Nothing)
    } else {
        Err(e)
    }
}

impl StreamCore {
    pub(super) fn on_readable(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let (protocol, buffered) = {
            let st = this.state.borrow(py)?;
            if st.gone() {
                return Ok(());
            }
            let Some(protocol) = st.shared.protocol.as_ref() else {
                return Ok(());
            };
            (protocol.clone_ref(py), st.buffered)
        };
        let protocol = protocol.bind(py);
        if buffered {
            this.read_into_protocol(py, protocol)
        } else {
            this.read_bytes(py, protocol)
        }
    }

    /// asyncio's `_read_ready__data_received` (sockets) or `_UnixReadPipeTransport._read_ready`.
    fn read_bytes(&self, py: Python<'_>, protocol: &Bound<'_, PyAny>) -> PyResult<()> {
        let (fd, kind) = (self.fd, self.kind);
        let received = if kind == Kind::Socket && self.large_reads.load(Ordering::Relaxed) {
            match recv_bytes(py, fd, DIRECT_READ)? {
                Ok(bytes) if bytes.as_bytes().is_empty() => Ok(Received::Eof),
                Ok(bytes) => Ok(Received::Data(bytes)),
                Err(e) => nothing_or(e),
            }
        } else {
            with_read_buf(|buf| {
                // SAFETY: `buf` is `buf.len()` initialised, writable bytes; `fd` is the
                // transport's open fd (module invariant: the core is not `gone`).
                let r = cvt(unsafe { kind.read(fd, buf.as_mut_ptr(), buf.len()) });
                // Creating a bytes object runs no Python code (bytes are not GC-tracked).
                classify(r, |n| PyBytes::new(py, &buf[..n]))
            })
        };
        if let Ok(Received::Data(data)) = &received {
            self.large_reads
                .store(data.as_bytes().len() >= DIRECT_MIN, Ordering::Relaxed);
        }
        match received {
            Err(e) => self.fatal(py, os_error(py, &e), kind.read_error()),
            Ok(Received::Nothing) => Ok(()),
            Ok(Received::Eof) => self.on_eof(py),
            Ok(Received::Data(data)) => {
                match protocol.call_method1(intern!(py, "data_received"), (data,)) {
                    Ok(_) => Ok(()),
                    Err(e) if kind.protocol_errors_are_fatal() => {
                        self.fatal(py, e, "Fatal error: protocol.data_received() call failed.")
                    }
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// asyncio's `_read_ready__get_buffer`.
    fn read_into_protocol(&self, py: Python<'_>, protocol: &Bound<'_, PyAny>) -> PyResult<()> {
        let lent = protocol
            .call_method1(intern!(py, "get_buffer"), (-1,))
            .and_then(|buf| match buf.len() {
                Ok(0) => Err(PyRuntimeError::new_err(
                    "get_buffer() returned an empty buffer",
                )),
                Ok(_) => Ok(buf),
                Err(e) => Err(e),
            });
        let buf = match lent {
            Ok(buf) => buf,
            Err(e) => {
                return self.fatal(py, e, "Fatal error: protocol.get_buffer() call failed.");
            }
        };
        let received = RawBuffer::get(&buf, pyo3::ffi::PyBUF_WRITABLE)
            .map_err(|_| {
                // What `sock.recv_into` says about such an argument.
                let name = buf
                    .get_type()
                    .name()
                    .map_or_else(|_| "?".to_owned(), |n| n.to_string());
                PyTypeError::new_err(format!(
                    "recv_into() argument 1 must be read-write bytes-like object, not {name}"
                ))
            })
            .and_then(|view| {
                // SAFETY: `view` is a writable, contiguous buffer of `view.len()` bytes, exported
                // until `view` drops; `fd` is the transport's open socket.
                let r =
                    cvt(unsafe { libc::recv(self.fd, view.as_mut_ptr().cast(), view.len(), 0) });
                classify(r, |n| n).map_err(|e| os_error(py, &e))
            });
        match received {
            Err(e) => self.fatal(py, e, "Fatal read error on socket transport"),
            Ok(Received::Nothing) => Ok(()),
            Ok(Received::Eof) => self.on_eof(py),
            Ok(Received::Data(n)) => {
                match protocol.call_method1(intern!(py, "buffer_updated"), (n,)) {
                    Ok(_) => Ok(()),
                    Err(e) => {
                        self.fatal(py, e, "Fatal error: protocol.buffer_updated() call failed.")
                    }
                }
            }
        }
    }

    /// The peer closed its side: asyncio's `_read_ready__on_eof` (debug log, `eof_received()`,
    /// keep the connection half-open or close it; a pipe transport always closes), a cold path
    /// left in Python.
    fn on_eof(&self, py: Python<'_>) -> PyResult<()> {
        self.call_transport(py, intern!(py, "_read_ready__on_eof"), ())
    }
}
