//! The native core of a datagram socket transport (UDP, or Unix `SOCK_DGRAM`).
//!
//! `ferroloop._datagram_transport._SelectorDatagramTransport` is a Python subclass of asyncio's
//! `_SelectorDatagramTransport` holding one `DatagramCore`, the same shape as the stream
//! transport (see the parent module): the core is the fd's reader and writer, and the instance's
//! `sendto` and `get_write_buffer_size` are the core's bound methods.
//!
//! Invariants:
//! - **The fd** belongs to the transport's `socket.socket`, which the core also holds (`sock`)
//!   for the sends it cannot do natively. The fd is open exactly while `sock` is held: asyncio's
//!   `_call_connection_lost` closes the socket and the Python side calls `_release` right after,
//!   which drops `sock`, the transport and the queue. No entry point uses the fd once `sock` is
//!   gone. Reads stop as soon as `conn_lost > 0` (asyncio's `_read_ready` rule); a send on an
//!   unconnected endpoint after `close()` but before `connection_lost` still goes out, as in
//!   asyncio.
//! - **The poller**: the reader is registered by the Python side as asyncio does; the writer is
//!   registered by `sendto` when a datagram is queued and removed when the queue drains, by
//!   `_force_close`, or by `_call_connection_lost` (a queue left by a send after `close()`), so
//!   neither outlives the socket.
//! - **State** (`DatagramState`) is the single copy of `_protocol`, `_conn_lost`, `_closing` (its
//!   `SharedState`, with the accessors every core gets from `core_pymethods!`) and the queue; it
//!   is borrowed only between Python calls.
//! - **Reads**: one `recvfrom` of up to 256 KiB into the per-thread buffer, then one `bytes` and
//!   the address in `socket.recvfrom`'s form (`sockaddr.rs`) go to `datagram_received`; repeated
//!   while datagrams are waiting, up to `READS_PER_EVENT`, and never after `close()` or a loss
//!   (checked before every read). Exceptions from the protocol leave the callback, as in asyncio
//!   (the loop reports them), and end the batch.
//! - **Writes**: with nothing queued, one `send` (connected) or `sendto` (a numeric IP address
//!   parsed natively; anything else through the Python socket's `sendto`, for CPython's exact
//!   conversion and name resolution). A datagram that would block is queued whole as `bytes`
//!   with its address, and the queue is flushed in order when the socket is writable.

use std::collections::VecDeque;
use std::os::fd::RawFd;

use ferroloop_core::sys::{cvt, cvt_retry};
use pyo3::exceptions::{
    PyBlockingIOError, PyInterruptedError, PyOSError, PyRuntimeError, PyValueError,
};
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use pyo3::PyTraverseError;

use super::read::with_read_buf;
use super::read::MAX_READ;
use super::shared::{get_object, OwnObjects, SharedState};
use super::sockaddr::{HostCache, SockAddr};
use super::write::{warn_write_after_lost, Caller, Data, LOG_THRESHOLD_FOR_CONNLOST_WRITES};
use super::Attached;
use crate::cell::LoopCell;
use crate::event_loop::LoopCore;
use crate::sock_ops::os_error;

const WRITE_ERROR: &str = "Fatal write error on datagram transport";
const READ_ERROR: &str = "Fatal read error on datagram transport";

/// A datagram that waits for the socket to become writable.
struct Queued {
    data: Py<PyBytes>,
    /// Where to (`None` on a connected endpoint, which uses `send`).
    addr: Option<Py<PyAny>>,
    /// `addr` parsed natively, when it could be.
    sockaddr: Option<SockAddr>,
}

struct DatagramState {
    /// `_protocol`, `_conn_lost`, `_closing` and the Python transport.
    shared: SharedState,
    /// The `socket.socket`; `None` once it is closed (see the invariants).
    sock: Option<Py<PyAny>>,
    /// asyncio's `_address` (the `remote_addr`), kept only when truthy, as asyncio tests it.
    address: Option<Py<PyAny>>,
    queue: VecDeque<Queued>,
    queued_bytes: usize,
}

impl OwnObjects for DatagramState {
    type Taken = (Option<Py<PyAny>>, Option<Py<PyAny>>, VecDeque<Queued>);

    fn traverse_own(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        // `sock` is not visited: it is an exact `socket.socket` (`native_capable`), whose
        // instances have no `__dict__` and so cannot lead back here. Visited, it joined the
        // transport's garbage cycle, and the collector could finalize it before the
        // transport's `__del__`: an extra "unclosed <socket.socket ...>" ResourceWarning that
        // asyncio does not give (its `__del__` warns for the transport and closes the socket).
        visit.call(&self.address)?;
        for q in &self.queue {
            visit.call(&q.addr)?;
        }
        Ok(())
    }

    fn take_own(&mut self) -> Self::Taken {
        self.queued_bytes = 0;
        (
            self.sock.take(),
            self.address.take(),
            std::mem::take(&mut self.queue),
        )
    }
}

#[pyclass(module = "ferroloop._native", name = "DatagramCore", frozen)]
pub struct DatagramCore {
    loop_: Py<LoopCore>,
    fd: RawFd,
    family: i32,
    /// The socket had a peer name when the transport was made: sends use `send` (asyncio tests
    /// `self._extra['peername']`).
    connected: bool,
    state: LoopCell<DatagramState>,
    /// The last IPv4 peer's host `str` (`sockaddr::HostCache`); holds only a `str`, which cannot
    /// be part of a reference cycle, so the collector need not see it.
    hosts: LoopCell<HostCache>,
}

/// Datagrams read per readiness event at most. asyncio reads one, so every datagram costs an
/// `epoll_wait` as well as its `recvfrom`; reading on while more are waiting (libuv reads up to
/// 32) saves those, and the bound keeps a flood on one socket from holding up the rest of the
/// loop.
const READS_PER_EVENT: usize = 16;

/// How one send attempt ended.
enum Sent {
    Done,
    WouldBlock,
    /// An `OSError`: for `protocol.error_received`.
    Refused(PyErr),
    /// Anything else: `_fatal_error` (or re-raised, for `KeyboardInterrupt`/`SystemExit`).
    Failed(PyErr),
}

impl Sent {
    fn from_native(r: std::io::Result<isize>, py: Python<'_>) -> Self {
        match r {
            Ok(_) => Self::Done,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Self::WouldBlock,
            Err(e) => Self::Refused(os_error(py, &e)),
        }
    }

    fn from_python(r: PyResult<Bound<'_, PyAny>>, py: Python<'_>) -> Self {
        match r {
            Ok(_) => Self::Done,
            Err(e)
                if e.is_instance_of::<PyBlockingIOError>(py)
                    || e.is_instance_of::<PyInterruptedError>(py) =>
            {
                Self::WouldBlock
            }
            Err(e) if e.is_instance_of::<PyOSError>(py) => Self::Refused(e),
            Err(e) => Self::Failed(e),
        }
    }
}

impl DatagramCore {
    /// The protocol's `error_received(exc)`; its own exceptions leave the callback.
    fn error_received(&self, py: Python<'_>, err: PyErr) -> PyResult<()> {
        let protocol = self
            .state
            .borrow(py)?
            .shared
            .protocol
            .as_ref()
            .map(|p| p.clone_ref(py));
        match protocol {
            Some(p) => p
                .bind(py)
                .call_method1(intern!(py, "error_received"), (err.into_value(py),))
                .map(drop),
            // asyncio calls `None.error_received(...)`: an AttributeError.
            None => Err(pyo3::exceptions::PyAttributeError::new_err(
                "'NoneType' object has no attribute 'error_received'",
            )),
        }
    }

    /// What a failed send means: asyncio's `except OSError` / `except BaseException` arms.
    fn send_failed(&self, py: Python<'_>, sent: Sent) -> PyResult<()> {
        match sent {
            Sent::Refused(e) => self.error_received(py, e),
            Sent::Failed(e) => self.fatal(py, e, WRITE_ERROR),
            Sent::Done | Sent::WouldBlock => Ok(()),
        }
    }

    fn sock<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let st = self.state.borrow(py)?;
        match st.sock.as_ref() {
            Some(s) => Ok(s.bind(py).clone()),
            None => Err(PyRuntimeError::new_err(
                "the datagram transport is closed (its socket is gone)",
            )),
        }
    }

    /// One send of `bytes` (or, for a buffer the core cannot read, of `obj` by the Python
    /// socket) to `addr`: `send` when connected, `sendto` otherwise.
    fn send_once(
        &self,
        py: Python<'_>,
        bytes: Option<&[u8]>,
        obj: &Bound<'_, PyAny>,
        addr: Option<&Bound<'_, PyAny>>,
        sockaddr: Option<&SockAddr>,
    ) -> PyResult<Sent> {
        let sock = self.sock(py)?; // also proves the fd is open
        let fd = self.fd;
        Ok(match (bytes, self.connected, sockaddr) {
            (Some(b), true, _) => Sent::from_native(
                // SAFETY: `b` is valid for its length; `fd` is open (`sock` is held).
                cvt_retry(|| unsafe { libc::send(fd, b.as_ptr().cast(), b.len(), 0) }),
                py,
            ),
            (Some(b), false, Some(sa)) => Sent::from_native(
                // SAFETY: as above; `sa` is a valid sockaddr of `sa.len()` bytes.
                cvt_retry(|| unsafe {
                    libc::sendto(fd, b.as_ptr().cast(), b.len(), 0, sa.as_ptr(), sa.len())
                }),
                py,
            ),
            (_, true, _) => Sent::from_python(sock.call_method1(intern!(py, "send"), (obj,)), py),
            (_, false, _) => {
                let addr = addr.map_or_else(|| py.None().into_bound(py), Clone::clone);
                Sent::from_python(sock.call_method1(intern!(py, "sendto"), (obj, addr)), py)
            }
        })
    }

    /// Registers (`on`) or removes the core's `_sendto_ready` as the fd's writer (a bound
    /// method, so the loop's messages name it as asyncio's name its `_sendto_ready`).
    fn set_writer(slf: &Bound<'_, Self>, on: bool) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let loop_ = this.loop_.bind(py);
        if !on {
            return LoopCore::set_native_callback(loop_, this.fd, slf.as_any(), true, false);
        }
        let callback = slf.getattr(intern!(py, "_sendto_ready"))?;
        let fd = pyo3::types::PyInt::new(py, this.fd);
        LoopCore::set_fd_handle(loop_, fd.as_any(), &callback, PyTuple::empty(py), true).map(drop)
    }

    /// asyncio's `_read_ready`, repeated while datagrams are waiting (up to `READS_PER_EVENT`).
    fn on_readable(&self, py: Python<'_>) -> PyResult<()> {
        for _ in 0..READS_PER_EVENT {
            if !self.read_one(py)? {
                break;
            }
        }
        Ok(())
    }

    /// One `recvfrom` and its delivery; `true` if a datagram reached the protocol, so the next
    /// may be read now.
    fn read_one(&self, py: Python<'_>) -> PyResult<bool> {
        let protocol = {
            let st = self.state.borrow(py)?;
            // `close()` (which sets `closing`) or an abort in a callback ends the reading, as
            // asyncio's removal of the reader does.
            if st.shared.conn_lost > 0 || st.shared.closing || st.sock.is_none() {
                return Ok(false);
            }
            // A protocol set to None is called all the same, as asyncio does: the datagram is
            // read and the AttributeError reaches the exception handler. Not reading it would
            // leave the socket readable and the loop spinning on it.
            get_object(py, st.shared.protocol.as_ref()).unwrap_or_else(|| py.None())
        };
        let fd = self.fd;
        let mut from = SockAddr::empty();
        let received = with_read_buf(|buf| {
            let len = buf.len().min(MAX_READ);
            // SAFETY: `buf` has `len` writable bytes, `from` is a sockaddr_storage and its length;
            // `fd` is open (`sock` is held, checked above).
            let r = cvt(unsafe {
                libc::recvfrom(
                    fd,
                    buf.as_mut_ptr().cast(),
                    len,
                    0,
                    from.as_mut_ptr(),
                    from.len_mut(),
                )
            });
            r.map(|n| PyBytes::new(py, &buf[..n as usize]))
        });
        let data = match received {
            Ok(data) => data,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) =>
            {
                return Ok(false)
            }
            Err(e) => return self.error_received(py, os_error(py, &e)).map(|()| false),
        };
        // The cache's borrow ends before any Python code (`error_received`) can run.
        let converted = from.to_python(py, &mut *self.hosts.borrow(py)?);
        let addr = match converted {
            Ok(addr) => addr,
            Err(e) if e.is_instance_of::<PyOSError>(py) => {
                return self.error_received(py, e).map(|()| false)
            }
            Err(e) => return self.fatal(py, e, READ_ERROR).map(|()| false),
        };
        protocol
            .bind(py)
            .call_method1(intern!(py, "datagram_received"), (data, addr))
            .map(|_| true)
    }

    /// The socket is writable: asyncio's `_sendto_ready`.
    fn on_writable(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        loop {
            let item = {
                let mut st = this.state.borrow(py)?;
                if st.sock.is_none() {
                    return Ok(());
                }
                let Some(item) = st.queue.pop_front() else {
                    break;
                };
                st.queued_bytes -= item.data.bind(py).as_bytes().len();
                item
            };
            let data = item.data.bind(py);
            let addr = item.addr.as_ref().map(|a| a.bind(py).clone());
            let sent = this.send_once(
                py,
                Some(data.as_bytes()),
                data.as_any(),
                addr.as_ref(),
                item.sockaddr.as_ref(),
            )?;
            match sent {
                Sent::Done => {}
                Sent::WouldBlock => {
                    let mut st = this.state.borrow(py)?;
                    st.queued_bytes += data.as_bytes().len();
                    st.queue.push_front(item);
                    break;
                }
                failed => return this.send_failed(py, failed),
            }
        }
        this.call_transport(py, intern!(py, "_maybe_resume_protocol"), ())?; // may queue more
        let (drained, closing) = {
            let st = this.state.borrow(py)?;
            (st.queue.is_empty(), st.shared.closing)
        };
        if drained {
            Self::set_writer(slf, false)?;
            if closing {
                this.call_transport(py, intern!(py, "_call_connection_lost"), (py.None(),))?;
            }
        }
        Ok(())
    }

    /// asyncio's `sendto`.
    fn sendto_impl(
        slf: &Bound<'_, Self>,
        obj: &Bound<'_, PyAny>,
        addr: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let data = Data::new(obj, Caller::Sendto)?;
        let empty = match &data {
            Data::Unexported { empty, .. } => *empty,
            d => d.as_slice().is_empty(),
        };
        if empty {
            return Ok(());
        }
        let (address, conn_lost, queued) = {
            let st = this.state.borrow(py)?;
            (
                st.address.as_ref().map(|a| a.clone_ref(py)),
                st.shared.conn_lost,
                !st.queue.is_empty(),
            )
        };
        let addr = match address {
            Some(address) => {
                let address = address.into_bound(py);
                if let Some(addr) = addr {
                    if !(addr.is_none() || addr.is(&address) || address.eq(addr)?) {
                        return Err(PyValueError::new_err(format!(
                            "Invalid address: must be None or {}",
                            address.str()?
                        )));
                    }
                }
                if conn_lost > 0 {
                    if conn_lost >= LOG_THRESHOLD_FOR_CONNLOST_WRITES {
                        warn_write_after_lost(py, "socket.send() raised exception.")?;
                    }
                    this.state.borrow(py)?.shared.conn_lost += 1;
                    return Ok(());
                }
                Some(address)
            }
            None => addr.cloned(),
        };
        let sockaddr = if this.connected {
            None
        } else {
            let hosts = this.hosts.borrow(py)?;
            addr.as_ref()
                .and_then(|a| SockAddr::from_python(this.family, a, &hosts))
        };
        if !queued {
            let bytes = match &data {
                Data::Unexported { .. } => None,
                d => Some(d.as_slice()),
            };
            match this.send_once(py, bytes, obj, addr.as_ref(), sockaddr.as_ref())? {
                Sent::Done => return Ok(()),
                Sent::WouldBlock => Self::set_writer(slf, true)?,
                failed => return this.send_failed(py, failed),
            }
        }
        // Queue a copy (asyncio's `bytes(data)`: an exact bytes object is kept as it is).
        let copy = match &data {
            Data::Bytes(b) if b.is_exact_instance_of::<PyBytes>() => (*b).clone(),
            Data::Unexported { .. } => py
                .get_type::<PyBytes>()
                .call1((obj,))?
                .cast_into::<PyBytes>()?,
            d => PyBytes::new(py, d.as_slice()),
        };
        drop(data);
        {
            let mut st = this.state.borrow(py)?;
            st.queued_bytes += copy.as_bytes().len();
            st.queue.push_back(Queued {
                data: copy.unbind(),
                addr: addr.map(Bound::unbind),
                sockaddr,
            });
        }
        this.call_transport(py, intern!(py, "_maybe_pause_protocol"), ())
    }
}

// `DatagramCore.__call__()` (the socket is readable), called directly by the loop
// (`native_call.rs`).
crate::native_call::native_call!(DatagramCore, |slf, arg| arg
    .is_none()
    .then(|| slf.get().on_readable(slf.py())));

core_pymethods! {
    impl DatagramCore {
        /// The core of `transport`, a datagram transport on `loop` for `sock` (family `family`);
        /// `address` is asyncio's `_address`, `connected` whether the socket has a peer name.
        #[staticmethod]
        fn _attach(
            r#loop: &Bound<'_, LoopCore>,
            transport: &Bound<'_, PyAny>,
            sock: &Bound<'_, PyAny>,
            fd: RawFd,
            family: i32,
            address: &Bound<'_, PyAny>,
            connected: bool,
        ) -> PyResult<Py<Self>> {
            let address = if address.is_truthy()? {
                Some(address.clone().unbind())
            } else {
                None
            };
            Py::new(
                r#loop.py(),
                Self {
                    loop_: r#loop.clone().unbind(),
                    fd,
                    family,
                    connected,
                    state: LoopCell::new(DatagramState {
                        shared: SharedState::new(transport),
                        sock: Some(sock.clone().unbind()),
                        address,
                        queue: VecDeque::new(),
                        queued_bytes: 0,
                    }),
                    hosts: LoopCell::new(HostCache::default()),
                },
            )
        }

        /// The socket is readable (the core is the fd's reader, asyncio's `_read_ready`).
        fn __call__(&self, py: Python<'_>) -> PyResult<()> {
            self.on_readable(py)
        }

        /// The socket is writable (the fd's writer while datagrams are queued).
        fn _sendto_ready(slf: &Bound<'_, Self>) -> PyResult<()> {
            Self::on_writable(slf)
        }

        /// The reader's name in the loop's messages ("Exception in callback ..."), as asyncio's.
        #[getter(__qualname__)]
        #[allow(clippy::unused_self)] // a getter: PyO3 passes the instance
        fn qualname(&self) -> &'static str {
            "_SelectorDatagramTransport._read_ready"
        }

        #[pyo3(signature = (data, addr = None))]
        fn sendto(
            slf: &Bound<'_, Self>,
            data: &Bound<'_, PyAny>,
            addr: Option<&Bound<'_, PyAny>>,
        ) -> PyResult<()> {
            Self::sendto_impl(slf, data, addr)
        }

        fn get_write_buffer_size(&self, py: Python<'_>) -> PyResult<usize> {
            Ok(self.state.borrow(py)?.queued_bytes)
        }

        /// The queued `(data, addr)` pairs, oldest first (asyncio's `_buffer`, as a copy).
        fn _queued<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
            let items: Vec<(Py<PyBytes>, Py<PyAny>)> = self
                .state
                .borrow(py)?
                .queue
                .iter()
                .map(|q| {
                    (
                        q.data.clone_ref(py),
                        q.addr
                            .as_ref()
                            .map_or_else(|| py.None(), |a| a.clone_ref(py)),
                    )
                })
                .collect();
            PyList::new(py, items)
        }

        /// Drops the queued datagrams (`_force_close`); returns whether there were any.
        fn _discard_buffer(&self, py: Python<'_>) -> PyResult<bool> {
            let dropped = {
                let mut st = self.state.borrow(py)?;
                st.queued_bytes = 0;
                std::mem::take(&mut st.queue)
            };
            Ok(!dropped.is_empty())
        }

        /// After `connection_lost` closed the socket: the core lets go of it, the transport and
        /// the queue, and never uses the fd again.
        fn _release(&self, py: Python<'_>) -> PyResult<()> {
            let dropped = {
                let mut st = self.state.borrow(py)?;
                st.queued_bytes = 0;
                (
                    st.shared.transport.take(),
                    st.sock.take(),
                    std::mem::take(&mut st.queue),
                )
            };
            drop(dropped);
            Ok(())
        }
    }
}
