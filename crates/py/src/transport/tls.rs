//! `TlsRecords`: the per-record path of ferroloop's TLS protocol, natively.
//!
//! `ferroloop._ssl_protocol.SSLProtocol` is a Python subclass of asyncio's
//! `sslproto.SSLProtocol`: the state machine (handshake, shutdown, timeouts, `_set_state`,
//! `_fatal_error`, flow-control callbacks, extra info) is asyncio's own code. Only the methods
//! that run for every TLS record are replaced, by storing this object's bound methods on the
//! protocol instance (`get_buffer`, `buffer_updated`, `_do_read`, `_do_write`,
//! `_process_outgoing`, `_write_appdata`) and on its app transport (`write`); the three that
//! run for every record, `get_buffer`, `buffer_updated` and `write`, are `METH_O` built-ins
//! over the same methods (`entries.rs`). Each does what
//! asyncio's method of the same name does, reading and writing the protocol's own attributes,
//! and calls the C `_ssl._SSLSocket` and `MemoryBIO` methods directly instead of going through
//! `ssl.SSLObject`'s Python wrappers.
//!
//! Invariants:
//! - **Fast path only in `WRAPPED`.** Every entry point reads `_state` first; in any other state
//!   it calls asyncio's method (`sslproto.SSLProtocol.<name>`) unchanged, so handshake,
//!   flushing, shutdown and unwrapped behave exactly as asyncio's. An `SSLWantReadError` or
//!   `SSLSyscallError` (asyncio's `SSLAgainErrors`) ends a read or write loop as in asyncio;
//!   any other exception goes to the protocol's `_fatal_error` with asyncio's message, and
//!   `KeyboardInterrupt`/`SystemExit` propagate. Close-notify (`read` returning nothing) calls
//!   asyncio's `_call_eof_received` and `_start_shutdown`.
//! - **No state of its own.** The protocol's attributes (`_write_backlog`, `_write_buffer_size`,
//!   `_app_reading_paused`, `_ssl_writing_paused`, the water marks, `_app_protocol`, ...) are
//!   the single copy; they are read afresh wherever asyncio reads them, because the app may
//!   change them from inside `data_received`. The ones read for every record are `__slots__` of
//!   ferroloop's class and are read at their offsets (`slots.rs`). The water-mark checks are
//!   done here and asyncio's `_control_app_writing`/`_control_ssl_reading` are called only when
//!   they would act.
//! - **C calls.** The `_ssl` objects' methods are called through descriptors fetched once from
//!   their types (`ssl_calls.rs`), not by name.
//!   The encrypted records go to `StreamCore::write_impl` directly when the socket transport's
//!   `write` attribute is its core's bound `write` (`StreamCore::call_write`).
//! - **Ownership.** The object holds the protocol, its C `_SSLSocket` and its two `MemoryBIO`s
//!   (none of which asyncio ever replaces) until `_release` (called by the protocol's
//!   `connection_lost` after asyncio's, which also removes the bound methods) or the garbage
//!   collector's `__clear__`; released, every entry point calls asyncio's method on nothing and
//!   so does nothing (the protocol no longer routes calls here).
//! - The Python side installs this only when `_sslobj` is exactly `ssl.SSLObject` (a custom
//!   `sslobject_class` keeps asyncio's code throughout); `_attach` declines (returns `None`)
//!   unless the C objects are exactly `_ssl`'s types and the protocol's class has the slots.

use pyo3::exceptions::{PyException, PyTypeError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyMemoryView, PySlice, PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use super::StreamCore;
use crate::cell::LoopCell;

mod entries;
mod slots;
mod ssl_calls;

use slots::{Attr, Slots};
use ssl_calls::{methods, small_int, Methods};

struct Refs {
    proto: Py<PyAny>,
    sslobj: Py<PyAny>,
    incoming: Py<PyAny>,
    outgoing: Py<PyAny>,
}

/// The objects one call works on, bound for its duration.
struct Bound4<'a, 'py> {
    slots: &'a Slots,
    ssl: &'a Methods,
    proto: Bound<'py, PyAny>,
    sslobj: Bound<'py, PyAny>,
    incoming: Bound<'py, PyAny>,
    outgoing: Bound<'py, PyAny>,
}

#[pyclass(module = "ferroloop._native", name = "TlsRecords", frozen)]
pub struct TlsRecords {
    /// Where the protocol's class keeps the per-record attributes (fixed at `_attach`).
    slots: Slots,
    refs: LoopCell<Option<Refs>>,
}

/// asyncio's names, fetched once from `asyncio.sslproto`.
struct Asyncio {
    wrapped: Py<PyAny>,
    again: Py<PyAny>,
    base: Py<PyAny>,
}

static ASYNCIO: PyOnceLock<Asyncio> = PyOnceLock::new();

fn asyncio(py: Python<'_>) -> PyResult<&Asyncio> {
    ASYNCIO.get_or_try_init(py, || {
        let m = py.import("asyncio.sslproto")?;
        Ok(Asyncio {
            wrapped: m.getattr("SSLProtocolState")?.getattr("WRAPPED")?.unbind(),
            again: m.getattr("SSLAgainErrors")?.unbind(),
            base: m.getattr("SSLProtocol")?.unbind(),
        })
    })
}

/// What a read or write loop does with an exception from the C SSL object.
enum Again {
    /// `SSLWantReadError`/`SSLSyscallError`: stop the loop, as asyncio's `except SSLAgainErrors`.
    Stop,
    /// Anything else: leave the loop with the error.
    Raise(PyErr),
}

fn classify(py: Python<'_>, err: PyErr) -> PyResult<Again> {
    let again = asyncio(py)?.again.bind(py);
    Ok(if err.value(py).is_instance(again)? {
        Again::Stop
    } else {
        Again::Raise(err)
    })
}

/// The protocol attributes of one of asyncio's flow-control rules: act when an unpaused size
/// reaches `high`, or a paused one falls to `low`.
struct WaterMarks<'a> {
    paused: Attr,
    low: Attr,
    high: Attr,
    /// asyncio's method that applies the rule (pauses or resumes, with its error reporting).
    control: &'a Bound<'a, PyString>,
}

impl WaterMarks<'_> {
    /// Calls asyncio's `control` method only when the rule would act; otherwise does nothing,
    /// as that method would.
    fn apply(&self, py: Python<'_>, b: &Bound4<'_, '_>, size: &SizeOf<'_>) -> PyResult<()> {
        let proto = &b.proto;
        let acts = if b.slots.flag(proto, self.paused)? {
            size.compare(&b.slots.get(proto, self.low)?, false)?
        } else {
            size.compare(&b.slots.get(proto, self.high)?, true)?
        };
        if acts {
            TlsRecords::base(py, proto, self.control, &[])?;
        }
        Ok(())
    }
}

/// A buffer size as asyncio computes it (`outgoing.pending + _write_buffer_size`): a count, or
/// the Python sum when `_write_buffer_size` is not an int that fits.
enum SizeOf<'py> {
    Count(usize),
    Object(Bound<'py, PyAny>),
}

impl<'py> SizeOf<'py> {
    /// `size >= mark` (`at_least`) or `size <= mark`, as Python compares them (ints natively).
    fn compare(&self, mark: &Bound<'py, PyAny>, at_least: bool) -> PyResult<bool> {
        let py = mark.py();
        match self {
            Self::Count(n) => {
                if let Some(m) = small_int(mark) {
                    let (n, m) = (i128::from(*n as u64), m as i128);
                    return Ok(if at_least { n >= m } else { n <= m });
                }
                Self::Object(n.into_pyobject(py)?.into_any()).compare(mark, at_least)
            }
            Self::Object(o) if at_least => o.ge(mark),
            Self::Object(o) => o.le(mark),
        }
    }
}

impl TlsRecords {
    fn bound<'a, 'py>(&'a self, py: Python<'py>) -> PyResult<Option<Bound4<'a, 'py>>> {
        let refs = self.refs.borrow(py)?;
        let ssl = methods(py)?;
        Ok(refs.as_ref().map(|r| Bound4 {
            slots: &self.slots,
            ssl,
            proto: r.proto.bind(py).clone(),
            sslobj: r.sslobj.bind(py).clone(),
            incoming: r.incoming.bind(py).clone(),
            outgoing: r.outgoing.bind(py).clone(),
        }))
    }

    /// Calls asyncio's own `SSLProtocol.<name>(proto, *args)`.
    fn base<'py>(
        py: Python<'py>,
        proto: &Bound<'py, PyAny>,
        name: &Bound<'py, PyString>,
        args: &[Bound<'py, PyAny>],
    ) -> PyResult<Bound<'py, PyAny>> {
        let method = asyncio(py)?.base.bind(py).getattr(name)?;
        let mut all = Vec::with_capacity(args.len() + 1);
        all.push(proto.clone());
        all.extend(args.iter().cloned());
        method.call1(PyTuple::new(py, all)?)
    }

    fn is_wrapped(py: Python<'_>, b: &Bound4<'_, '_>) -> PyResult<bool> {
        let state = b.slots.get(&b.proto, Attr::State)?;
        Ok(state.is(asyncio(py)?.wrapped.bind(py)))
    }

    /// asyncio's `except Exception as ex: self._fatal_error(ex, 'Fatal error on SSL protocol')`.
    fn fatal_on_exception(py: Python<'_>, proto: &Bound<'_, PyAny>, err: PyErr) -> PyResult<()> {
        if !err.is_instance_of::<PyException>(py) {
            return Err(err);
        }
        proto
            .call_method1(
                intern!(py, "_fatal_error"),
                (err.into_value(py), "Fatal error on SSL protocol"),
            )
            .map(drop)
    }

    /// asyncio's `_do_read` body in `WRAPPED`, without its `try`.
    fn read_wrapped(py: Python<'_>, b: &Bound4<'_, '_>) -> PyResult<()> {
        let proto = &b.proto;
        if !b.slots.flag(proto, Attr::AppReadingPaused)? {
            if b.slots.flag(proto, Attr::AppProtocolIsBuffer)? {
                Self::read_buffered(py, b)?;
            } else {
                Self::read_copied(py, b)?;
            }
            if b.slots.get(proto, Attr::WriteBacklog)?.is_truthy()? {
                Self::write_backlog(py, b)?;
            } else {
                Self::outgoing(py, b)?;
            }
        }
        Self::control_ssl_reading(py, b)
    }

    /// `sslobj.read(*args)`, or `None` where asyncio's `except SSLAgainErrors` would end the
    /// read loop. When the incoming BIO is empty and the SSL object holds no decrypted bytes
    /// (`SSL_pending`), the read cannot return anything but `SSLWantReadError` (OpenSSL reads
    /// records from the BIO only as it needs them, and asyncio never marks that BIO's EOF), so
    /// the call, and the exception it would build, is skipped.
    fn ssl_read<'py>(
        py: Python<'py>,
        b: &Bound4<'_, 'py>,
        args: &[&Bound<'py, PyAny>],
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        if b.ssl.bio_pending(&b.incoming)? == 0 && b.ssl.ssl_pending(&b.sslobj)? == 0 {
            return Ok(None);
        }
        match b.ssl.ssl_read(&b.sslobj, args) {
            Ok(v) => Ok(Some(v)),
            Err(e) => match classify(py, e)? {
                Again::Stop => Ok(None),
                Again::Raise(e) => Err(e),
            },
        }
    }

    /// asyncio's `_do_read__copied`: decrypt everything available, one `data_received`.
    fn read_copied(py: Python<'_>, b: &Bound4<'_, '_>) -> PyResult<()> {
        let max_size = b.proto.getattr(intern!(py, "max_size"))?;
        // The usual read yields one chunk: it is kept apart, so no Vec is allocated for it.
        let mut first: Option<Bound<'_, PyAny>> = None;
        let mut more: Vec<Bound<'_, PyAny>> = Vec::new();
        let mut eof = false;
        while let Some(chunk) = Self::ssl_read(py, b, &[&max_size])? {
            if !chunk.is_truthy()? {
                eof = true;
                break;
            }
            if first.is_none() {
                first = Some(chunk);
            } else {
                more.push(chunk);
            }
        }
        if let Some(first) = first {
            let data = if more.is_empty() {
                first
            } else {
                more.insert(0, first);
                PyBytes::new(py, b"").call_method1(intern!(py, "join"), (more,))?
            };
            b.slots
                .get(&b.proto, Attr::AppProtocol)?
                .call_method1(intern!(py, "data_received"), (data,))?;
        }
        if eof {
            Self::close_notify(py, &b.proto)?;
        }
        Ok(())
    }

    /// asyncio's `_do_read__buffered`: decrypt into the app's buffer, one `buffer_updated`.
    /// `count` is the last read's result (1 before any, as in asyncio), 0 meaning close-notify.
    fn read_buffered(py: Python<'_>, b: &Bound4<'_, '_>) -> PyResult<()> {
        let proto = &b.proto;
        let pending = b.ssl.bio_pending(&b.incoming)?;
        let buf = proto.call_method1(intern!(py, "_app_protocol_get_buffer"), (pending,))?;
        let wants = buf.len()?;
        let mut offset = 0usize;
        let mut count = 1usize;
        let wants_obj = wants.into_pyobject(py)?.into_any();
        if let Some(n) = Self::ssl_read(py, b, &[&wants_obj, &buf])? {
            count = n.extract()?;
            if count > 0 {
                offset = count;
                // asyncio's `while offset < wants: ... else: call_soon(_do_read)`: the buffer
                // filled up, so more may be waiting.
                let mut filled = true;
                while offset < wants {
                    let rest = buf.get_item(PySlice::new(py, offset.try_into()?, isize::MAX, 1))?;
                    let left = (wants - offset).into_pyobject(py)?.into_any();
                    let Some(n) = Self::ssl_read(py, b, &[&left, &rest])? else {
                        filled = false;
                        break;
                    };
                    count = n.extract()?;
                    if count == 0 {
                        filled = false;
                        break;
                    }
                    offset += count;
                }
                if filled {
                    let again = proto.getattr(intern!(py, "_do_read"))?;
                    proto
                        .getattr(intern!(py, "_loop"))?
                        .call_method1(intern!(py, "call_soon"), (again,))?;
                }
            }
        }
        if offset > 0 {
            proto.call_method1(intern!(py, "_app_protocol_buffer_updated"), (offset,))?;
        }
        if count == 0 {
            Self::close_notify(py, proto)?;
        }
        Ok(())
    }

    fn close_notify(py: Python<'_>, proto: &Bound<'_, PyAny>) -> PyResult<()> {
        proto.call_method0(intern!(py, "_call_eof_received"))?;
        proto.call_method0(intern!(py, "_start_shutdown"))?;
        Ok(())
    }

    /// asyncio's `_do_write`: encrypt the backlog, then `_process_outgoing`.
    fn write_backlog(py: Python<'_>, b: &Bound4<'_, '_>) -> PyResult<()> {
        let proto = &b.proto;
        let backlog = b.slots.get(proto, Attr::WriteBacklog)?;
        while backlog.is_truthy()? {
            let data = backlog.get_item(0)?;
            match b.ssl.ssl_write(&b.sslobj, &data) {
                Ok(count) => {
                    let data_len = data.len()?;
                    let size = b.slots.get(proto, Attr::WriteBufferSize)?;
                    if count < data_len {
                        let rest =
                            data.get_item(PySlice::new(py, count.try_into()?, isize::MAX, 1))?;
                        backlog.set_item(0, rest)?;
                        Slots::set(proto, Attr::WriteBufferSize, size.sub(count)?)?;
                    } else {
                        backlog.call_method0(intern!(py, "popleft"))?;
                        Slots::set(proto, Attr::WriteBufferSize, size.sub(data_len)?)?;
                    }
                }
                Err(e) => match classify(py, e)? {
                    Again::Stop => break,
                    Again::Raise(e) => return Err(e),
                },
            }
        }
        Self::outgoing(py, b)
    }

    /// asyncio's `_process_outgoing`: the outgoing BIO's bytes to the socket transport. An
    /// empty BIO is not read (its `read()` would return `b""`, which asyncio does not send).
    fn outgoing(py: Python<'_>, b: &Bound4<'_, '_>) -> PyResult<()> {
        let proto = &b.proto;
        let mut pending = b.ssl.bio_pending(&b.outgoing)?;
        if pending > 0 && !b.slots.flag(proto, Attr::SslWritingPaused)? {
            let data = b.ssl.bio_read(&b.outgoing)?;
            let write = b
                .slots
                .get(proto, Attr::Transport)?
                .getattr(intern!(py, "write"))?;
            StreamCore::call_write(&write, &data)?;
            // `write` may have run Python code (flow-control callbacks).
            pending = b.ssl.bio_pending(&b.outgoing)?;
        }
        Self::control_app_writing(py, b, pending)
    }

    /// asyncio's `_control_app_writing`, called only when it would pause or resume the app;
    /// `pending` is the outgoing BIO's size.
    fn control_app_writing(py: Python<'_>, b: &Bound4<'_, '_>, pending: usize) -> PyResult<()> {
        let queued = b.slots.get(&b.proto, Attr::WriteBufferSize)?;
        let size = match queued
            .extract::<usize>()
            .ok()
            .and_then(|q| q.checked_add(pending))
        {
            Some(n) => SizeOf::Count(n),
            None => SizeOf::Object(pending.into_pyobject(py)?.add(queued)?),
        };
        let marks = WaterMarks {
            paused: Attr::AppWritingPaused,
            low: Attr::OutgoingLowWater,
            high: Attr::OutgoingHighWater,
            control: intern!(py, "_control_app_writing"),
        };
        marks.apply(py, b, &size)
    }

    /// asyncio's `_control_ssl_reading`, called only when it would pause or resume the socket.
    fn control_ssl_reading(py: Python<'_>, b: &Bound4<'_, '_>) -> PyResult<()> {
        let size = SizeOf::Count(b.ssl.bio_pending(&b.incoming)?);
        let marks = WaterMarks {
            paused: Attr::SslReadingPaused,
            low: Attr::IncomingLowWater,
            high: Attr::IncomingHighWater,
            control: intern!(py, "_control_ssl_reading"),
        };
        marks.apply(py, b, &size)
    }

    /// Encrypts one item given to `_write_appdata` with an empty backlog, leaving the backlog
    /// and `_write_buffer_size` as asyncio's append-then-`_do_write` would, then sends.
    fn write_one(
        py: Python<'_>,
        b: &Bound4<'_, '_>,
        data: &Bound<'_, PyAny>,
        data_len: usize,
    ) -> PyResult<()> {
        let proto = &b.proto;
        let queued = match b.ssl.ssl_write(&b.sslobj, data) {
            Ok(count) => {
                if count >= data_len {
                    return Self::outgoing(py, b);
                }
                let rest = data.get_item(PySlice::new(py, count.try_into()?, isize::MAX, 1))?;
                (rest, data_len - count)
            }
            Err(e) => match classify(py, e)? {
                Again::Stop => (data.clone(), data_len),
                Again::Raise(e) => return Err(e),
            },
        };
        b.slots
            .get(proto, Attr::WriteBacklog)?
            .call_method1(intern!(py, "append"), (queued.0,))?;
        let size = b.slots.get(proto, Attr::WriteBufferSize)?;
        Slots::set(proto, Attr::WriteBufferSize, size.add(queued.1)?)?;
        Self::write_backlog(py, b)
    }

    /// `_write_appdata((data,))` in `WRAPPED` with an empty `backlog`.
    fn write_single(
        py: Python<'_>,
        b: &Bound4<'_, '_>,
        backlog: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let data_len = match data.len() {
            Ok(n) => n,
            Err(e) => {
                // asyncio appended the item before its len() raised.
                backlog.call_method1(intern!(py, "append"), (data,))?;
                return Err(e);
            }
        };
        Self::write_one(py, b, data, data_len)
            .or_else(|e| Self::fatal_on_exception(py, &b.proto, e))
    }

    /// `_write_appdata` in `WRAPPED`. As in asyncio, errors while queueing (`len()` of a
    /// non-buffer) leave the call; errors while encrypting and sending go to `_fatal_error`.
    fn write_wrapped(py: Python<'_>, b: &Bound4<'_, '_>, items: &Bound<'_, PyAny>) -> PyResult<()> {
        let proto = &b.proto;
        let backlog = b.slots.get(proto, Attr::WriteBacklog)?;
        if let Ok(tuple) = items.cast::<PyTuple>() {
            if tuple.len() == 1 && !backlog.is_truthy()? {
                return Self::write_single(py, b, &backlog, &tuple.get_item(0)?);
            }
        }
        for data in items.try_iter()? {
            let data = data?;
            backlog.call_method1(intern!(py, "append"), (&data,))?;
            let size = b.slots.get(proto, Attr::WriteBufferSize)?;
            Slots::set(proto, Attr::WriteBufferSize, size.add(data.len()?)?)?;
        }
        Self::write_backlog(py, b).or_else(|e| Self::fatal_on_exception(py, proto, e))
    }
}

#[pymethods]
impl TlsRecords {
    #[new]
    fn py_new() -> PyResult<Self> {
        Err(PyTypeError::new_err(
            "TlsRecords cannot be created directly; ferroloop's SSLProtocol attaches one",
        ))
    }

    /// The records path of `protocol`, whose `_sslobj` is an `ssl.SSLObject` wrapping `sslobj`
    /// (the C `_ssl._SSLSocket`) over the BIOs `incoming` and `outgoing`; `None` (asyncio's
    /// code throughout) unless those are exactly `_ssl`'s types and the protocol's class has
    /// the `_SLOTS` as `__slots__`.
    #[staticmethod]
    fn _attach(
        protocol: Bound<'_, PyAny>,
        sslobj: Bound<'_, PyAny>,
        incoming: Bound<'_, PyAny>,
        outgoing: Bound<'_, PyAny>,
    ) -> PyResult<Option<Self>> {
        if !methods(protocol.py())?.accepts(&sslobj, &incoming, &outgoing) {
            return Ok(None);
        }
        let Some(slots) = Slots::find(&protocol) else {
            return Ok(None);
        };
        Ok(Some(Self {
            slots,
            refs: LoopCell::new(Some(Refs {
                proto: protocol.unbind(),
                sslobj: sslobj.unbind(),
                incoming: incoming.unbind(),
                outgoing: outgoing.unbind(),
            })),
        }))
    }

    /// The protocol attributes the record path reads for every message, which ferroloop's
    /// `SSLProtocol` declares as `__slots__`.
    #[classattr]
    #[allow(
        non_snake_case,
        reason = "a class constant, named as Python names constants"
    )]
    fn _SLOTS(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
        PyTuple::new(py, slots::NAMES)
    }

    /// asyncio's `get_buffer`: the protocol's `_ssl_buffer_view` (grown by asyncio's method).
    fn get_buffer<'py>(
        &self,
        py: Python<'py>,
        n: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let Some(b) = self.bound(py)? else {
            return Ok(py.None().into_bound(py));
        };
        let proto = &b.proto;
        let buffer = b.slots.get(proto, Attr::SslBuffer)?;
        let max_size: isize = proto.getattr(intern!(py, "max_size"))?.extract()?;
        let want: Option<isize> = n.extract().ok();
        let fits = match want {
            Some(w) if w > 0 && w <= max_size => buffer.len()? >= w.unsigned_abs(),
            Some(_) => buffer.len()? >= max_size.unsigned_abs(),
            None => false,
        };
        if fits {
            return b.slots.get(proto, Attr::SslBufferView);
        }
        Self::base(py, proto, intern!(py, "get_buffer"), &[n])
    }

    /// asyncio's `buffer_updated`: feed the incoming BIO, then read in `WRAPPED` (asyncio's
    /// method for every other state).
    fn buffer_updated(&self, py: Python<'_>, nbytes: Bound<'_, PyAny>) -> PyResult<()> {
        let Some(b) = self.bound(py)? else {
            return Ok(());
        };
        if !Self::is_wrapped(py, &b)? {
            return Self::base(py, &b.proto, intern!(py, "buffer_updated"), &[nbytes]).map(drop);
        }
        let view = b.slots.get(&b.proto, Attr::SslBufferView)?;
        let n: isize = nbytes.extract()?;
        let chunk = view.get_item(PySlice::new(py, 0, n, 1))?;
        b.ssl.bio_write(&b.incoming, &chunk)?;
        // Still `WRAPPED`: only C code ran since the check.
        Self::read_wrapped(py, &b).or_else(|e| Self::fatal_on_exception(py, &b.proto, e))
    }

    /// asyncio's `_do_read`.
    fn do_read(&self, py: Python<'_>) -> PyResult<()> {
        let Some(b) = self.bound(py)? else {
            return Ok(());
        };
        Self::do_read_bound(py, &b)
    }

    /// asyncio's `_do_write`.
    fn do_write(&self, py: Python<'_>) -> PyResult<()> {
        let Some(b) = self.bound(py)? else {
            return Ok(());
        };
        Self::write_backlog(py, &b)
    }

    /// asyncio's `_process_outgoing`.
    fn process_outgoing(&self, py: Python<'_>) -> PyResult<()> {
        let Some(b) = self.bound(py)? else {
            return Ok(());
        };
        Self::outgoing(py, &b)
    }

    /// asyncio's `_write_appdata(list_of_data)`.
    fn write_appdata(&self, py: Python<'_>, list_of_data: Bound<'_, PyAny>) -> PyResult<()> {
        let Some(b) = self.bound(py)? else {
            return Ok(());
        };
        if !Self::is_wrapped(py, &b)? {
            return Self::base(py, &b.proto, intern!(py, "_write_appdata"), &[list_of_data])
                .map(drop);
        }
        Self::write_wrapped(py, &b, &list_of_data)
    }

    /// asyncio's `_SSLProtocolTransport.write(data)`.
    fn app_write(&self, py: Python<'_>, data: Bound<'_, PyAny>) -> PyResult<()> {
        if !(data.is_instance_of::<PyBytes>()
            || data.is_instance_of::<PyByteArray>()
            || data.is_instance_of::<PyMemoryView>())
        {
            let name = data.get_type().name()?;
            return Err(PyTypeError::new_err(format!(
                "data: expecting a bytes-like instance, got {name}"
            )));
        }
        if !data.is_truthy()? {
            return Ok(());
        }
        // The common case, one write while nothing is queued, without the `(data,)` tuple
        // asyncio's `write` passes to `_write_appdata`.
        if let Some(b) = self.bound(py)? {
            if Self::is_wrapped(py, &b)? {
                let backlog = b.slots.get(&b.proto, Attr::WriteBacklog)?;
                if !backlog.is_truthy()? {
                    return Self::write_single(py, &b, &backlog, &data);
                }
            }
        }
        let items = PyTuple::new(py, [data])?;
        self.write_appdata(py, items.into_any())
    }

    /// `(get_buffer, buffer_updated, app_write)` as `METH_O` built-ins bound to this object:
    /// the same methods without PyO3's argument handling (`tls/entries.rs`).
    fn _fast_methods<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        entries::fast_methods(slf)
    }

    /// Lets go of the protocol and its SSL objects (the protocol's `connection_lost`).
    fn _release(&self, py: Python<'_>) -> PyResult<()> {
        let dropped = self.refs.borrow(py)?.take();
        drop(dropped);
        Ok(())
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(self.slots.ty())?;
        if let Some(refs) = self.refs.try_borrow_for_gc() {
            if let Some(r) = refs.as_ref() {
                visit.call(&r.proto)?;
                visit.call(&r.sslobj)?;
                visit.call(&r.incoming)?;
                visit.call(&r.outgoing)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        let dropped = self.refs.try_borrow_for_gc().and_then(|mut r| r.take());
        drop(dropped);
    }
}

impl TlsRecords {
    fn do_read_bound(py: Python<'_>, b: &Bound4<'_, '_>) -> PyResult<()> {
        if !Self::is_wrapped(py, b)? {
            return Self::base(py, &b.proto, intern!(py, "_do_read"), &[]).map(drop);
        }
        Self::read_wrapped(py, b).or_else(|e| Self::fatal_on_exception(py, &b.proto, e))
    }
}
