//! The write side: `write()` tries one vectored write (`sendmsg`, or `writev` on a pipe) at once
//! when nothing is queued, queues the rest and registers the writer; the writer flushes the
//! queue. Flow control (`pause_writing`/`resume_writing`) and finishing a close or `write_eof`
//! follow asyncio's `_SelectorSocketTransport.write`/`_write_ready` step by step, and
//! `_UnixWritePipeTransport.write`/`_write_ready` where a pipe differs (see `Kind`).

use pyo3::exceptions::{PyAssertionError, PyRuntimeError, PyTypeError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyMemoryView};

use ferroloop_core::sys::cvt;
use pyo3::ffi;

use super::pybuf::RawBuffer;
use super::{Attached, StreamCore};
use crate::event_loop::LoopCore;
use crate::hooks::method_def_of;
use crate::sock_ops::os_error;

/// asyncio's `constants.LOG_THRESHOLD_FOR_CONNLOST_WRITES`.
pub(super) const LOG_THRESHOLD_FOR_CONNLOST_WRITES: u64 = 5;

static ASYNCIO_LOGGER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// asyncio's warning for writes to a lost connection (past `LOG_THRESHOLD_FOR_CONNLOST_WRITES`).
pub(super) fn warn_write_after_lost(py: Python<'_>, message: &str) -> PyResult<()> {
    let logger = ASYNCIO_LOGGER.get_or_try_init(py, || {
        py.import("asyncio.log")?
            .getattr("logger")
            .map(Bound::unbind)
    })?;
    logger
        .bind(py)
        .call_method1(intern!(py, "warning"), (message,))
        .map(drop)
}

/// What `write()` decided under the state borrow; carried out after it ends.
#[must_use]
enum WriteOutcome {
    Done,
    /// Written to the connection-lost count (logged past asyncio's threshold).
    Dropped {
        warn: bool,
    },
    /// Bytes were queued: register the writer if the queue was empty, maybe pause the protocol.
    Queued {
        register: bool,
        pause: bool,
    },
    Failed(std::io::Error),
}

/// The bytes of a `bytes`, `bytearray` or `memoryview` (asyncio accepts exactly these, and
/// their subclasses).
pub(super) enum Data<'a, 'py> {
    Bytes(&'a Bound<'py, PyBytes>),
    ByteArray(&'a Bound<'py, PyByteArray>),
    View(RawBuffer),
    /// A memoryview that cannot be exported as contiguous bytes: `socket.send` would raise
    /// `err` (asyncio makes that a fatal error), `bytearray.extend` a `TypeError`.
    Unexported {
        err: PyErr,
        empty: bool,
    },
}

/// Whose rejection of another type `Data::new` words: asyncio 3.14 reworded the stream
/// transports' (`_SelectorSocketTransport.write`), not the datagram transports' `sendto`.
#[derive(Clone, Copy)]
pub(super) enum Caller {
    StreamWrite,
    Sendto,
}

impl<'a, 'py> Data<'a, 'py> {
    pub(super) fn new(data: &'a Bound<'py, PyAny>, caller: Caller) -> PyResult<Self> {
        if let Ok(b) = data.cast::<PyBytes>() {
            Ok(Self::Bytes(b))
        } else if let Ok(b) = data.cast::<PyByteArray>() {
            Ok(Self::ByteArray(b))
        } else if data.is_instance_of::<PyMemoryView>() {
            match RawBuffer::get(data, pyo3::ffi::PyBUF_SIMPLE) {
                Ok(view) => Ok(Self::View(view)),
                Err(err) => Ok(Self::Unexported {
                    err,
                    empty: !data.is_truthy()?,
                }),
            }
        } else {
            let expected = match caller {
                Caller::StreamWrite if data.py().version_info() >= (3, 14) => {
                    "a bytes, bytearray, or memoryview object"
                }
                Caller::StreamWrite | Caller::Sendto => "a bytes-like object",
            };
            Err(PyTypeError::new_err(format!(
                "data argument must be {expected}, not '{}'",
                data.get_type().name()?
            )))
        }
    }

    /// The bytes; no Python code runs while the slice is held.
    pub(super) fn as_slice(&self) -> &[u8] {
        match self {
            Self::Bytes(b) => b.as_bytes(),
            // SAFETY: no Python code runs while the slice lives (see above), so the bytearray
            // cannot be resized or freed under it.
            Self::ByteArray(b) => unsafe { b.as_bytes() },
            Self::View(v) => v.as_slice(),
            Self::Unexported { .. } => &[],
        }
    }
}

/// The address of the `PyMethodDef` of `StreamCore.write` (0 if it could not be found), which
/// every bound `core.write` points to.
static WRITE_DEF: PyOnceLock<usize> = PyOnceLock::new();

fn write_def(py: Python<'_>) -> usize {
    *WRITE_DEF.get_or_init(py, || {
        let Ok(descr) = py
            .get_type::<StreamCore>()
            .getattr(intern!(py, "__dict__"))
            .and_then(|d| d.get_item("write"))
        else {
            return 0;
        };
        // SAFETY: we hold the GIL; a `method_descriptor` is a `PyMethodDescrObject`, whose
        // `d_method` is set at creation and never changed.
        unsafe {
            if ffi::Py_TYPE(descr.as_ptr()) == &raw mut ffi::PyMethodDescr_Type {
                (*descr.as_ptr().cast::<ffi::PyMethodDescrObject>()).d_method as usize
            } else {
                0
            }
        }
    })
}

impl StreamCore {
    /// `write(data)`, where `write` is a transport's `write` attribute. The socket transport's
    /// bound `write` (`methods.rs`) and a `StreamCore`'s own bound `write` (what the pipe
    /// transports keep on the instance) run `write_impl`
    /// directly, without the call through PyO3's argument handling (about 250 instructions);
    /// anything else is called.
    pub(super) fn call_write(write: &Bound<'_, PyAny>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = write.py();
        let def = write_def(py);
        let found = method_def_of(write);
        if found == Some(super::methods::write_def()) {
            // SAFETY: `write` is exactly a built-in function (checked by `method_def_of`) made
            // from the transport class's `write` descriptor, so its `m_self` is an instance of
            // that class (or a subclass), kept alive by `write`.
            let transport = unsafe {
                Bound::from_borrowed_ptr(
                    py,
                    (*write.as_ptr().cast::<ffi::PyCFunctionObject>()).m_self,
                )
            };
            // SAFETY: as above: an instance of the class the descriptor was installed on.
            let core = unsafe { super::methods::core_of(&transport) }?;
            return Self::write_impl(core, data);
        }
        if def != 0 && found == Some(def) {
            // SAFETY: `write` is exactly a built-in function (checked by `method_def_of`), so a
            // `PyCFunctionObject`, whose `m_self` is set at creation and kept alive by it.
            let slf = unsafe {
                Bound::from_borrowed_ptr(
                    py,
                    (*write.as_ptr().cast::<ffi::PyCFunctionObject>()).m_self,
                )
            };
            if let Ok(core) = slf.cast::<StreamCore>() {
                return Self::write_impl(core, data);
            }
        }
        write.call1((data,)).map(drop)
    }

    /// asyncio's `_SelectorSocketTransport.write`, or `_UnixWritePipeTransport.write`.
    pub(super) fn write_impl(slf: &Bound<'_, Self>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let kind = this.kind;
        let data = match Data::new(data, Caller::StreamWrite) {
            Ok(data) => data,
            // asyncio's pipe asserts the type: `assert isinstance(data, (bytes, ...)), repr(data)`.
            Err(_) if kind.is_pipe() => {
                return Err(PyAssertionError::new_err(data.repr()?.unbind()));
            }
            Err(e) => return Err(e),
        };
        let outcome = {
            let mut st = this.state.borrow(py)?;
            if st.eof {
                return Err(PyRuntimeError::new_err(
                    "Cannot call write() after write_eof()",
                ));
            }
            if st.empty_waiter.is_some() {
                return Err(PyRuntimeError::new_err(
                    "unable to write; sendfile is in progress",
                ));
            }
            let bytes = data.as_slice();
            let unexported = match &data {
                Data::Unexported { empty, .. } => Some(*empty),
                _ => None,
            };
            if bytes.is_empty() && unexported != Some(false) {
                WriteOutcome::Done
            } else if st.shared.conn_lost > 0
                || (st.shared.closing && kind.drops_writes_when_closing())
            {
                let warn = st.shared.conn_lost >= LOG_THRESHOLD_FOR_CONNLOST_WRITES;
                st.shared.conn_lost += 1;
                WriteOutcome::Dropped { warn }
            } else if unexported.is_some() {
                let queued = !st.out.is_empty();
                drop(st);
                let Data::Unexported { err, .. } = data else {
                    unreachable!("checked above")
                };
                if queued {
                    return Err(PyTypeError::new_err(
                        "can't set bytearray slice from memoryview",
                    ));
                }
                this.count_write_error(py)?;
                return this.fatal(py, err, kind.write_error());
            } else if st.out.is_empty() {
                // Nothing queued: try to send now.
                match st.out.flush_with(this.fd, bytes) {
                    Ok(n) if n == bytes.len() => WriteOutcome::Done,
                    Ok(n) => {
                        st.out.push(&bytes[n..]);
                        WriteOutcome::Queued {
                            register: true,
                            pause: st.out.pending() > st.high_water.bytes && !st.protocol_paused,
                        }
                    }
                    Err(e) => WriteOutcome::Failed(e),
                }
            } else {
                st.out.push(bytes);
                WriteOutcome::Queued {
                    register: false,
                    pause: st.out.pending() > st.high_water.bytes && !st.protocol_paused,
                }
            }
        };
        drop(data);
        match outcome {
            WriteOutcome::Done => Ok(()),
            WriteOutcome::Dropped { warn } => {
                if warn {
                    warn_write_after_lost(py, kind.lost_warning())?;
                }
                Ok(())
            }
            WriteOutcome::Failed(e) => {
                this.count_write_error(py)?;
                this.fatal(py, os_error(py, &e), kind.write_error())
            }
            WriteOutcome::Queued { register, pause } => {
                if register {
                    Self::set_writer(slf, true)?;
                }
                if pause {
                    this.call_transport(py, intern!(py, "_maybe_pause_protocol"), ())?;
                }
                Ok(())
            }
        }
    }

    /// A pipe's `self._conn_lost += 1` before `_fatal_error` on a failed write.
    fn count_write_error(&self, py: Python<'_>) -> PyResult<()> {
        if self.kind.counts_write_errors() {
            self.state.borrow(py)?.shared.conn_lost += 1;
        }
        Ok(())
    }

    /// Registers (`on`) or removes the core as the fd's writer.
    fn set_writer(slf: &Bound<'_, Self>, on: bool) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        LoopCore::set_native_callback(this.loop_.bind(py), this.fd, slf.as_any(), true, on)
    }

    /// The fd is writable: asyncio's `_write_ready`.
    pub(super) fn on_writable(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let kind = this.kind;
        let flushed = {
            let mut st = this.state.borrow(py)?;
            if st.gone() {
                return Ok(());
            }
            match st.out.flush(this.fd) {
                Ok(_) => Ok(st.protocol_paused
                    && st.out.pending() <= st.low_water.bytes
                    && (kind.resumes_before_drained() || st.out.is_empty())),
                Err(e) => {
                    st.out.clear();
                    Err((e, st.empty_waiter.as_ref().map(|w| w.clone_ref(py))))
                }
            }
        };
        let resume = match flushed {
            Ok(resume) => resume,
            Err((e, waiter)) => {
                this.count_write_error(py)?;
                Self::set_writer(slf, false)?;
                let err = os_error(py, &e);
                let exc = err.value(py).clone();
                this.fatal(py, err, kind.write_error())?;
                if let Some(waiter) = waiter {
                    waiter
                        .bind(py)
                        .call_method1(intern!(py, "set_exception"), (exc,))?;
                }
                return Ok(());
            }
        };
        if resume {
            // May write more (the protocol's resume_writing can call write()).
            this.call_transport(py, intern!(py, "_maybe_resume_protocol"), ())?;
        }
        let (drained, waiter, closing, eof) = {
            let st = this.state.borrow(py)?;
            (
                st.out.is_empty(),
                st.empty_waiter.as_ref().map(|w| w.clone_ref(py)),
                st.shared.closing,
                st.eof,
            )
        };
        if !drained {
            return Ok(());
        }
        Self::set_writer(slf, false)?;
        if let Some(waiter) = waiter {
            waiter
                .bind(py)
                .call_method1(intern!(py, "set_result"), (py.None(),))?;
        }
        if closing {
            if kind.is_pipe() {
                // asyncio's pipe stops watching for the reader's close first.
                LoopCore::set_native_callback(
                    this.loop_.bind(py),
                    this.fd,
                    slf.as_any(),
                    false,
                    false,
                )?;
            }
            this.call_transport(py, intern!(py, "_call_connection_lost"), (py.None(),))?;
        } else if eof {
            // SAFETY: shutdown of the transport's open socket (conn_lost was 0 above and nothing
            // since has scheduled connection_lost, or `closing` would be set).
            cvt(unsafe { libc::shutdown(this.fd, libc::SHUT_WR) }).map_err(|e| os_error(py, &e))?;
        }
        Ok(())
    }
}
