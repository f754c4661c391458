//! The native core of a byte-stream transport: a plain stream socket (TCP or Unix, no TLS), or
//! one end of a pipe (`connect_read_pipe`/`connect_write_pipe`, and so every subprocess pipe).
//!
//! `ferroloop._socket_transport._SelectorSocketTransport` is a Python subclass of asyncio's
//! `_SelectorSocketTransport` (so `isinstance(t, asyncio.Transport)` holds and every cold path is
//! asyncio's own code); it holds one `StreamCore` in its `_core` slot. Its `write` and
//! `is_closing` are method descriptors of the class that call the core directly (`methods.rs`),
//! and the core's bound `get_write_buffer_size` is stored on the instance, so the hot calls reach
//! Rust without a Python frame. The core is also the fd's reader and writer callback in the loop's fd table:
//! readiness goes poller → `StreamCore.__call__` → `recv` → `protocol.data_received` with no
//! Python in between. `ferroloop._pipe_transport` does the same for asyncio's
//! `_UnixReadPipeTransport` and `_UnixWritePipeTransport` with a core of [`Kind::ReadPipe`] or [`Kind::WritePipe`]: `read`
//! and `writev` instead of `recv` and `sendmsg`, and asyncio's pipe rules where they differ from
//! its socket rules (each difference is a method of `Kind`).
//!
//! Invariants:
//! - **The fd** belongs to the transport's `socket.socket` (`_sock`) or pipe file object
//!   (`_pipe`), which closes it in asyncio's `_call_connection_lost`; right after, the Python
//!   side calls `_release`, which drops the transport. The core only borrows the number. Every
//!   core entry point returns early once `conn_lost > 0` (a socket sets it before
//!   `connection_lost` is scheduled) or the transport is released (a pipe never counts a close in
//!   `conn_lost`; its fd stays open until `_call_connection_lost`), so the core never touches the
//!   number after it is closed (it may belong to another file by then).
//! - **The poller**: reading is registered and removed by the Python side exactly as asyncio does
//!   (connection made, `pause_reading`/`resume_reading`, `close`, EOF). The writer is registered by
//!   the core when a `write` leaves bytes queued and removed when the queue drains, or by the
//!   Python side in `close`/`_force_close` (sockets) and `_close` (pipes). Both leave the poller
//!   before `connection_lost` runs. A write pipe's reader (asyncio's trick for noticing that the
//!   reading end closed) is a Python method; the core removes it when a drain finishes a close.
//! - **`connection_lost`** runs once, through `_call_connection_lost`: scheduled with `call_soon`
//!   by `close()` (empty queue) or `_force_close`/`_close`, or called by the writer callback when
//!   the queue drains after `close()`; then the core drops its transport reference (`_release`),
//!   breaking the transport ↔ core cycle without waiting for the garbage collector.
//! - **State** (`CoreState`) is the single copy of what both sides read: the Python class exposes
//!   `_protocol`, `_conn_lost`, `_closing`, `_eof`, `_empty_waiter`, `_protocol_paused`,
//!   `_high_water` and `_low_water` as properties over it. The first three, with the transport,
//!   are its `SharedState`, whose accessors both cores get from `core_pymethods!` (`shared.rs`).
//!   It is borrowed only between Python calls: decisions are taken under the borrow, the calls
//!   they imply run after it ends.
//! - **Reads** land in one 256 KiB buffer per thread (a thread runs at most one loop at a time),
//!   then become one `bytes` of the size read; a `BufferedProtocol` gets `recv` straight into the
//!   buffer its `get_buffer` returned (sockets only: asyncio's pipes always call `data_received`).
//! - **Writes** are tried with one vectored write when nothing is queued; the rest is copied into
//!   an `OutQueue` (`sendmsg` or `writev`, by kind) and flushed when the fd is writable.

#[macro_use]
mod shared;
mod datagram;
mod methods;
mod pybuf;
mod read;
mod sockaddr;
mod tls;
mod write;

pub use datagram::DatagramCore;
pub use methods::_install_transport_methods;
pub use tls::TlsRecords;

use std::os::fd::RawFd;

use ferroloop_core::{OutQueue, WriteCall};
use pyo3::exceptions::{PyAttributeError, PyValueError};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::PyTraverseError;

use self::shared::{get_object, put_object, Attached, OwnObjects, SharedState};

use crate::cell::LoopCell;
use crate::event_loop::LoopCore;

/// asyncio's default write-buffer limits (`_FlowControlMixin._set_write_buffer_limits`).
const DEFAULT_HIGH_WATER: usize = 64 * 1024;

/// A write-buffer limit as asyncio stores it: an int, or whatever number the caller passed to
/// `set_write_buffer_limits` (a float works there, and so does an int beyond `usize`), handed
/// back as given. For a byte count `n`, `n > limit` exactly when `n > floor(limit)` (saturated
/// to `usize`), so the hot path compares integers.
pub(crate) struct Limit {
    pub(crate) bytes: usize,
    /// The object as given, when `bytes` alone cannot say it (not an int that fits `usize`).
    given: Option<Py<PyAny>>,
}

impl Limit {
    const fn bytes(bytes: usize) -> Self {
        Self { bytes, given: None }
    }

    fn from_python(value: &Bound<'_, PyAny>) -> PyResult<Self> {
        if let Ok(bytes) = value.extract::<usize>() {
            return Ok(Self::bytes(bytes));
        }
        let bytes = if value.is_instance_of::<pyo3::types::PyInt>() {
            // Beyond usize (a negative one is refused by asyncio before it gets here).
            if value.lt(0)? {
                0
            } else {
                usize::MAX
            }
        } else {
            // Saturating: negative limits are refused by asyncio before they get here.
            value.extract::<f64>()?.floor() as usize
        };
        Ok(Self {
            bytes,
            given: Some(value.clone().unbind()),
        })
    }

    fn to_python(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match &self.given {
            Some(given) => given.clone_ref(py),
            None => self.bytes.into_pyobject(py)?.into_any().unbind(),
        })
    }
}

#[allow(clippy::struct_excessive_bools)] // asyncio's independent flags, each a transport attribute
pub(crate) struct CoreState {
    /// `_protocol`, `_conn_lost`, `_closing` and the Python transport.
    shared: SharedState,
    /// The protocol is a `BufferedProtocol` (decided by the Python side in `set_protocol`).
    buffered: bool,
    out: OutQueue,
    eof: bool,
    protocol_paused: bool,
    high_water: Limit,
    low_water: Limit,
    empty_waiter: Option<Py<PyAny>>,
}

/// What the core's fd is. asyncio's socket and pipe transports differ in their syscalls, their
/// messages and a few rules; each difference is one method here, so the read and write paths
/// are shared and the differences can be read side by side.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A stream socket: asyncio's `selector_events._SelectorSocketTransport`.
    Socket,
    /// A pipe, character device or socket given to `connect_read_pipe`: asyncio's
    /// `unix_events._UnixReadPipeTransport` (`os.read`). The core only reads.
    ReadPipe,
    /// The same given to `connect_write_pipe`: asyncio's `_UnixWritePipeTransport`
    /// (`os.write`). The core only writes.
    WritePipe,
}

impl Kind {
    fn is_pipe(self) -> bool {
        self != Self::Socket
    }

    /// The name of the callback asyncio registers for the fd, for the loop's messages
    /// ("Exception in callback _UnixReadPipeTransport._read_ready()"). A socket core is both
    /// reader and writer, so it has none (the message shows the core's repr).
    fn callback_name(self) -> Option<&'static str> {
        match self {
            Self::Socket => None,
            Self::ReadPipe => Some("_UnixReadPipeTransport._read_ready"),
            Self::WritePipe => Some("_UnixWritePipeTransport._write_ready"),
        }
    }

    /// The vectored write: `sendmsg(MSG_NOSIGNAL)` for sockets, `writev` for pipes.
    fn write_call(self) -> WriteCall {
        match self {
            Self::Socket => WriteCall::SendMsg,
            Self::ReadPipe | Self::WritePipe => WriteCall::WriteV,
        }
    }

    /// `recv(fd, buf, len, 0)` or `read(fd, buf, len)`.
    ///
    /// # Safety
    /// `buf` must be valid for writes of `len` bytes, and `fd` open.
    unsafe fn read(self, fd: RawFd, buf: *mut u8, len: usize) -> isize {
        match self {
            // SAFETY: the caller's contract.
            Self::Socket => unsafe { libc::recv(fd, buf.cast(), len, 0) },
            // SAFETY: the caller's contract.
            Self::ReadPipe | Self::WritePipe => unsafe { libc::read(fd, buf.cast(), len) },
        }
    }

    fn read_error(self) -> &'static str {
        match self {
            Self::Socket => "Fatal read error on socket transport",
            Self::ReadPipe | Self::WritePipe => "Fatal read error on pipe transport",
        }
    }

    fn write_error(self) -> &'static str {
        match self {
            Self::Socket => "Fatal write error on socket transport",
            Self::ReadPipe | Self::WritePipe => "Fatal write error on pipe transport",
        }
    }

    /// The warning logged for writes past `LOG_THRESHOLD_FOR_CONNLOST_WRITES` on a lost
    /// connection.
    fn lost_warning(self) -> &'static str {
        match self {
            Self::Socket => "socket.send() raised exception.",
            Self::ReadPipe | Self::WritePipe => {
                "pipe closed by peer or os.write(pipe, data) raised exception."
            }
        }
    }

    /// Whether an exception from `data_received` goes to `_fatal_error` (sockets) or leaves the
    /// callback for the loop's exception handler (pipes: asyncio's `_read_ready` does not catch
    /// it).
    fn protocol_errors_are_fatal(self) -> bool {
        self == Self::Socket
    }

    /// Whether `write()` after `close()` is dropped and counted like a write to a lost
    /// connection (pipes); a socket still queues it until the close finishes.
    fn drops_writes_when_closing(self) -> bool {
        self.is_pipe()
    }

    /// Whether a failed write counts in `_conn_lost` before `_fatal_error` (pipes: their
    /// `_close` does not count it, a socket's `_force_close` does).
    fn counts_write_errors(self) -> bool {
        self.is_pipe()
    }

    /// Whether the protocol may resume writing after a flush that leaves bytes queued
    /// (sockets); asyncio's pipe resumes it only when the queue is empty.
    fn resumes_before_drained(self) -> bool {
        self == Self::Socket
    }
}

impl CoreState {
    /// The fd may be closed already: a socket counted the close, or a pipe's transport let go
    /// of the core (see the module invariants). No syscall on the fd once this holds.
    fn gone(&self) -> bool {
        self.shared.conn_lost > 0 || self.shared.transport.is_none()
    }
}

impl OwnObjects for CoreState {
    type Taken = Option<Py<PyAny>>;

    fn traverse_own(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.high_water.given)?;
        visit.call(&self.low_water.given)?;
        visit.call(&self.empty_waiter)
    }

    fn take_own(&mut self) -> Self::Taken {
        self.empty_waiter.take()
    }
}

#[pyclass(module = "ferroloop._native", name = "StreamCore", frozen)]
pub struct StreamCore {
    loop_: Py<LoopCore>,
    fd: RawFd,
    kind: Kind,
    /// The last read was large (`read::DIRECT_MIN` bytes or more): the next one goes straight
    /// into a new `bytes` object (`read.rs`). Only the loop thread touches it.
    large_reads: std::sync::atomic::AtomicBool,
    state: LoopCell<CoreState>,
}

// `StreamCore.__call__(writable=False)`, called directly by the loop (`native_call.rs`).
crate::native_call::native_call!(StreamCore, |slf, arg| {
    let writable = match arg {
        None => false,
        Some(a) => a.cast::<pyo3::types::PyBool>().ok()?.is_true(),
    };
    Some(if writable {
        Self::on_writable(slf)
    } else {
        Self::on_readable(slf)
    })
});

core_pymethods! {
    impl StreamCore {
        /// The core of `transport`, a stream transport on `loop` for socket `fd`, or a pipe
        /// transport for `fd` that reads (`pipe="read"`) or writes (`pipe="write"`).
        #[staticmethod]
        #[pyo3(signature = (r#loop, transport, fd, *, pipe = None))]
        fn _attach(
            r#loop: &Bound<'_, LoopCore>,
            transport: &Bound<'_, PyAny>,
            fd: RawFd,
            pipe: Option<&str>,
        ) -> PyResult<Py<Self>> {
            let kind = match pipe {
                None => Kind::Socket,
                Some("read") => Kind::ReadPipe,
                Some("write") => Kind::WritePipe,
                Some(other) => {
                    return Err(PyValueError::new_err(format!(
                        "pipe must be 'read' or 'write', not {other:?}"
                    )))
                }
            };
            Py::new(
                r#loop.py(),
                Self {
                    loop_: r#loop.clone().unbind(),
                    fd,
                    kind,
                    large_reads: std::sync::atomic::AtomicBool::new(false),
                    state: LoopCell::new(CoreState {
                        shared: SharedState::new(transport),
                        buffered: false,
                        out: OutQueue::with_call(kind.write_call()),
                        eof: false,
                        protocol_paused: false,
                        high_water: Limit::bytes(DEFAULT_HIGH_WATER),
                        low_water: Limit::bytes(DEFAULT_HIGH_WATER / 4),
                        empty_waiter: None,
                    }),
                },
            )
        }

        /// Readiness of the socket: the reader is called without arguments, the writer with `True`.
        #[pyo3(signature = (writable = false))]
        fn __call__(slf: &Bound<'_, Self>, writable: bool) -> PyResult<()> {
            if writable {
                Self::on_writable(slf)
            } else {
                Self::on_readable(slf)
            }
        }

        /// A pipe core's name in the loop's messages, as asyncio's callback (see `Kind`).
        #[getter(__qualname__)]
        fn qualname(&self) -> PyResult<&'static str> {
            self.kind
                .callback_name()
                .ok_or_else(|| PyAttributeError::new_err("__qualname__"))
        }

        /// `set_protocol`: `buffered` says whether reads go through `get_buffer`/`buffer_updated`.
        fn set_protocol(
            &self,
            py: Python<'_>,
            protocol: Py<PyAny>,
            buffered: bool,
        ) -> PyResult<()> {
            let old = {
                let mut st = self.state.borrow(py)?;
                st.buffered = buffered;
                st.shared.protocol.replace(protocol)
            };
            drop(old);
            Ok(())
        }

        fn write(slf: &Bound<'_, Self>, data: &Bound<'_, PyAny>) -> PyResult<()> {
            Self::write_impl(slf, data)
        }

        fn get_write_buffer_size(&self, py: Python<'_>) -> PyResult<usize> {
            Ok(self.state.borrow(py)?.out.pending())
        }

        fn is_closing(&self, py: Python<'_>) -> PyResult<bool> {
            Ok(self.state.borrow(py)?.shared.closing)
        }

        /// Drops the queued bytes (`_force_close`); returns whether there were any.
        fn _discard_buffer(&self, py: Python<'_>) -> PyResult<bool> {
            let mut st = self.state.borrow(py)?;
            let had = !st.out.is_empty();
            st.out.clear();
            Ok(had)
        }

        /// After `connection_lost`: the transport is done with the core.
        fn _release(&self, py: Python<'_>) -> PyResult<()> {
            let dropped = self.state.borrow(py)?.shared.transport.take();
            drop(dropped);
            Ok(())
        }

        #[getter(_empty_waiter)]
        fn empty_waiter(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
            Ok(get_object(py, self.state.borrow(py)?.empty_waiter.as_ref()))
        }

        #[setter(_empty_waiter)]
        fn set_empty_waiter(&self, py: Python<'_>, value: Option<Py<PyAny>>) -> PyResult<()> {
            let old = put_object(py, &mut self.state.borrow(py)?.empty_waiter, value);
            drop(old);
            Ok(())
        }

        #[getter(_eof)]
        fn eof(&self, py: Python<'_>) -> PyResult<bool> {
            Ok(self.state.borrow(py)?.eof)
        }

        #[setter(_eof)]
        fn set_eof(&self, py: Python<'_>, value: bool) -> PyResult<()> {
            self.state.borrow(py)?.eof = value;
            Ok(())
        }

        #[getter(_protocol_paused)]
        fn protocol_paused(&self, py: Python<'_>) -> PyResult<bool> {
            Ok(self.state.borrow(py)?.protocol_paused)
        }

        #[setter(_protocol_paused)]
        fn set_protocol_paused(&self, py: Python<'_>, value: bool) -> PyResult<()> {
            self.state.borrow(py)?.protocol_paused = value;
            Ok(())
        }

        #[getter(_high_water)]
        fn high_water(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
            self.state.borrow(py)?.high_water.to_python(py)
        }

        #[setter(_high_water)]
        fn set_high_water(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<()> {
            let limit = Limit::from_python(value)?;
            let old = std::mem::replace(&mut self.state.borrow(py)?.high_water, limit);
            drop(old);
            Ok(())
        }

        #[getter(_low_water)]
        fn low_water(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
            self.state.borrow(py)?.low_water.to_python(py)
        }

        #[setter(_low_water)]
        fn set_low_water(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<()> {
            let limit = Limit::from_python(value)?;
            let old = std::mem::replace(&mut self.state.borrow(py)?.low_water, limit);
            drop(old);
            Ok(())
        }}
}
