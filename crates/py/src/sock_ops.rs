//! Native `sock_recv`, `sock_recv_into` and `sock_sendall`: awaitables that try the syscall at
//! once and finish without a Future or a poller round trip when the socket is ready.
//!
//! A `SocketOperation` speaks the coroutine protocol (`send`, `throw`, `close`, `__await__`,
//! `__next__`; registered as `collections.abc.Coroutine` in Python, so `create_task` accepts it).
//!
//! States (`OpState`), all changed on the loop thread with the GIL:
//! - `Start`: nothing registered. The first `send(None)` runs the syscall; if it completes, the
//!   operation ends at once (`StopIteration(result)`), otherwise it moves to `Waiting`.
//! - `Waiting`: a Future exists, the op's reader/writer handle is registered for its fd, and the
//!   coroutine protocol is delegated to `future.__await__()`. When the fd is ready the handle
//!   calls the op, which retries the syscall and completes the Future.
//! - The registration is kept apart from the state: the Future's done callback (the op again,
//!   called with the Future) takes it exactly once and releases it (parked until the next poll,
//!   `fds.rs`) unless another operation replaced it meanwhile — asyncio's
//!   `_sock_read_done`/`_sock_write_done` rule. Every
//!   way out of `Waiting` (result, error, cancel, `throw`, `close`) completes or cancels the
//!   Future, so the fd always leaves the poller.
//! - `Done`: awaited to the end; awaiting again is a `RuntimeError`, as for a coroutine.
//!
//! `await` on CPython 3.11 goes through the `am_send` slot (`op_am_send`), which returns a
//! finished operation's result as a value; `send`/`__next__`/`throw` raise `StopIteration` as a
//! coroutine does. Both are `send_step`.
//!
//! Only exact `socket.socket` objects take this path (`LoopCore::sock_*` checks); anything else
//! (SSL sockets, wrappers, test doubles) uses the Python implementation in `_sockets.py`.

use std::os::fd::RawFd;

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::ffi;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyTuple};
use pyo3::PyTraverseError;

use crate::cell::LoopCell;
use crate::event_loop::LoopCore;
use crate::handle::Handle;

pub(crate) enum Kind {
    /// `sock.recv(n)`.
    Recv { n: usize },
    /// `sock.recv_into(buf)`.
    RecvInto { buf: PyUntypedBuffer },
    /// `sock.sendall(data)`: `sent` bytes of `data` are out.
    SendAll { data: PyUntypedBuffer, sent: usize },
}

enum OpState {
    Start,
    Waiting { fut: Py<PyAny>, fut_iter: Py<PyAny> },
    Done,
}

/// What one syscall attempt achieved.
enum Attempt {
    Finished(Py<PyAny>),
    /// Not now: wait for the fd (the number the attempt used) to be ready.
    WouldBlock(RawFd),
}

#[pyclass(module = "ferroloop", name = "SocketOperation", frozen)]
pub struct SocketOperation {
    loop_: Py<LoopCore>,
    /// The socket; its fd is read at every attempt, as `sock.recv()` would, so a socket closed
    /// before the await fails with EBADF instead of reaching whatever reused its fd number.
    sock: Py<PyAny>,
    kind: LoopCell<Kind>,
    state: LoopCell<OpState>,
    /// The reader/writer handle and the fd it is registered for; taken exactly once by the
    /// Future's done callback, whatever state the protocol side is in by then.
    registration: LoopCell<Option<(Py<Handle>, RawFd)>>,
}

/// `recv(fd, n)` into a new bytes object of `n` bytes, shrunk to what arrived, as CPython's
/// `socket.recv` does (empty at EOF). `Err` only if the object cannot be made; the inner error is
/// the `recv`'s.
pub(crate) fn recv_bytes(
    py: Python<'_>,
    fd: RawFd,
    n: usize,
) -> PyResult<std::io::Result<Bound<'_, PyBytes>>> {
    // SAFETY: a NULL source asks for an uninitialised bytes object of `n` bytes: a new
    // reference, or NULL with an exception set.
    let raw = unsafe { ffi::PyBytes_FromStringAndSize(std::ptr::null(), n as _) };
    if raw.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `raw` is a bytes object with `n` writable bytes that nobody else has seen yet;
    // `fd` is the caller's open socket.
    let r = unsafe { libc::recv(fd, ffi::PyBytes_AsString(raw).cast(), n, 0) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: we own the only reference to `raw`.
        unsafe { ffi::Py_DECREF(raw) };
        return Ok(Err(e));
    }
    if r as usize == n {
        // SAFETY: `raw` is an owned, valid bytes object.
        return Ok(Ok(unsafe {
            Bound::from_owned_ptr(py, raw).cast_into_unchecked()
        }));
    }
    // Shrunk to what arrived, as `socket.recv` does (`_PyBytes_Resize`, or a copy).
    // SAFETY: `raw` is owned, unshared and `n >= r` bytes long.
    unsafe { crate::private_fn::bytes_shrink(py, raw, r as usize) }.map(Ok)
}

/// The current `errno` as the matching `OSError` subclass, exactly as `socket` raises it.
fn last_os_error(py: Python<'_>) -> PyErr {
    // SAFETY: we hold the GIL and errno was set by the failed syscall just before.
    unsafe { ffi::PyErr_SetFromErrno(ffi::PyExc_OSError) };
    PyErr::fetch(py)
}

/// An `io::Error` from a syscall as the matching `OSError` subclass, with `errno` and
/// `strerror` as `socket` would give them.
pub(crate) fn os_error(py: Python<'_>, err: &std::io::Error) -> PyErr {
    match err.raw_os_error() {
        Some(errno) => {
            // SAFETY: __errno_location always returns this thread's valid errno slot.
            unsafe { *libc::__errno_location() = errno };
            last_os_error(py)
        }
        None => PyErr::from(std::io::Error::new(err.kind(), err.to_string())),
    }
}

fn would_block(errno: i32) -> bool {
    errno == libc::EAGAIN || errno == libc::EWOULDBLOCK
}

/// Ends the coroutine protocol with `StopIteration(value)`.
pub(crate) fn stop_iteration(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyErr {
    // A tuple would be taken as StopIteration's args; results here are bytes, int or None.
    debug_assert!(!value.is_instance_of::<PyTuple>());
    // SAFETY: we hold the GIL; both pointers are live objects.
    unsafe { ffi::PyErr_SetObject(ffi::PyExc_StopIteration, value.as_ptr()) };
    PyErr::fetch(py)
}

/// Where one step of the coroutine protocol left the operation.
pub(crate) enum Step {
    /// Suspended: the value to hand to whoever drives the await (the Future, to the Task).
    Yield(Py<PyAny>),
    /// Finished with this result.
    Return(Py<PyAny>),
}

impl Step {
    /// As the Python-level `send`/`__next__`/`throw` return it: a yield as the value, the end
    /// as `StopIteration(result)`.
    fn into_python(self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        match self {
            Self::Yield(v) => Ok(Some(v)),
            Self::Return(v) => Err(stop_iteration(py, v.bind(py))),
        }
    }
}

/// `PyIter_Send`: one step of `it` (the Future's `__await__` iterator) with `value` sent in, its
/// end returned as a value rather than raised as `StopIteration` (the C Future's iterator has
/// an `am_send` slot; for others CPython calls `__next__`/`send` and takes the exception apart).
fn iter_send(it: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<Step> {
    let py = it.py();
    let mut out: *mut ffi::PyObject = std::ptr::null_mut();
    // SAFETY: we hold the GIL; `it` and `value` are live; `out` is a valid slot for the result.
    let res = unsafe { ffi::PyIter_Send(it.as_ptr(), value.as_ptr(), &raw mut out) };
    match res {
        ffi::PySendResult::PYGEN_NEXT => {
            // SAFETY: on NEXT, `out` holds a new reference.
            Ok(Step::Yield(
                unsafe { Bound::from_owned_ptr(py, out) }.unbind(),
            ))
        }
        ffi::PySendResult::PYGEN_RETURN => {
            // SAFETY: on RETURN, `out` holds a new reference.
            Ok(Step::Return(
                unsafe { Bound::from_owned_ptr(py, out) }.unbind(),
            ))
        }
        ffi::PySendResult::PYGEN_ERROR => Err(PyErr::fetch(py)),
    }
}

/// `SocketOperation`'s `am_send`: `await op` in a coroutine is CPython's `SEND`, which in 3.11
/// calls this slot when the type has one; otherwise (and in interpreters that call `__next__`
/// for `await`) the result travels in a `StopIteration` created, raised, caught and freed on
/// every await that finishes.
///
/// # Safety
/// Called by CPython only, with the GIL held, on an instance of `SocketOperation` (the slot is
/// on that type, which cannot be subclassed); `result` points to where the value goes.
unsafe extern "C" fn op_am_send(
    slf: *mut ffi::PyObject,
    arg: *mut ffi::PyObject,
    result: *mut *mut ffi::PyObject,
) -> ffi::PySendResult {
    // Inside PyO3's attach scope: a coroutine may drive the operation where no PyO3 frame is on
    // the stack, and a dropped `Py` must be released at once there, not queued.
    Python::attach(|py| {
        // SAFETY: `slf` is a live, borrowed `SocketOperation` and `arg` a live, borrowed object
        // (see the function's contract).
        let (op, arg) = unsafe {
            (
                Borrowed::from_ptr(py, slf).cast_unchecked::<SocketOperation>(),
                Borrowed::from_ptr(py, arg),
            )
        };
        let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            SocketOperation::send_step(&op, &arg)
        }))
        .unwrap_or_else(|_| {
            Err(pyo3::panic::PanicException::new_err(
                "panic in a ferroloop socket operation",
            ))
        });
        let (value, status) = match stepped {
            Ok(Step::Yield(v)) => (v.into_ptr(), ffi::PySendResult::PYGEN_NEXT),
            Ok(Step::Return(v)) => (v.into_ptr(), ffi::PySendResult::PYGEN_RETURN),
            Err(e) => {
                e.restore(py);
                (std::ptr::null_mut(), ffi::PySendResult::PYGEN_ERROR)
            }
        };
        // SAFETY: `result` is valid for a write; a new reference (or NULL on error) goes there.
        unsafe { *result = value };
        status
    })
}

/// Puts `op_am_send` in `SocketOperation`'s async slots.
pub fn install_op_am_send(py: Python<'_>) {
    let tp = <SocketOperation as pyo3::PyTypeInfo>::type_object_raw(py);
    // SAFETY: `op_am_send` takes any `SocketOperation`; this runs during module initialisation
    // with the GIL held, before any instance exists.
    unsafe { crate::fastcall::install_am_send(tp, op_am_send) };
}

/// What `throw(typ, val)` raises on an awaitable that is not suspended: `val` if given, else
/// `typ`, instantiated if it is a class.
pub(crate) fn thrown(typ: &Bound<'_, PyAny>, val: Option<&Bound<'_, PyAny>>) -> PyErr {
    let exc = match val {
        Some(v) if !v.is_none() => v.clone(),
        _ => typ.clone(),
    };
    if exc.is_instance_of::<pyo3::types::PyType>() {
        return match exc.call0() {
            Ok(e) => PyErr::from_value(e),
            Err(e) => e,
        };
    }
    PyErr::from_value(exc)
}

impl SocketOperation {
    pub(crate) fn new(
        py: Python<'_>,
        loop_: &Bound<'_, LoopCore>,
        sock: &Bound<'_, PyAny>,
        kind: Kind,
    ) -> PyResult<Py<Self>> {
        Py::new(
            py,
            Self {
                loop_: loop_.clone().unbind(),
                sock: sock.clone().unbind(),
                kind: LoopCell::new(kind),
                state: LoopCell::new(OpState::Start),
                registration: LoopCell::new(None),
            },
        )
    }

    fn writes(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(matches!(&*self.kind.borrow(py)?, Kind::SendAll { .. }))
    }

    /// The socket's fd now (-1 once closed: the syscall then fails with EBADF, as in Python).
    fn fd(&self, py: Python<'_>) -> PyResult<RawFd> {
        self.sock
            .bind(py)
            .call_method0(intern!(py, "fileno"))?
            .extract()
    }

    /// One non-blocking syscall.
    fn attempt(&self, py: Python<'_>) -> PyResult<Attempt> {
        let fd = self.fd(py)?;
        let mut kind = self.kind.borrow(py)?;
        loop {
            let (ret, errno) = match &mut *kind {
                // As CPython's socket module: a zero-length read returns at once, without a
                // syscall (one would report "would block" on an empty socket).
                Kind::Recv { n: 0 } => {
                    return Ok(Attempt::Finished(PyBytes::new(py, b"").into_any().unbind()));
                }
                Kind::RecvInto { buf } if buf.len_bytes() == 0 => {
                    return Ok(Attempt::Finished(PyInt::new(py, 0).into_any().unbind()));
                }
                Kind::Recv { n } => match recv_bytes(py, fd, *n)? {
                    Ok(bytes) => return Ok(Attempt::Finished(bytes.into_any().unbind())),
                    Err(e) => (-1, e.raw_os_error().unwrap_or(0)),
                },
                Kind::RecvInto { buf } => {
                    // SAFETY: the buffer is writable and C-contiguous (checked when the op was
                    // built) and stays exported while `buf` lives.
                    let r = unsafe { libc::recv(fd, buf.buf_ptr(), buf.len_bytes(), 0) };
                    if r >= 0 {
                        let n = PyInt::new(py, r).into_any().unbind();
                        return Ok(Attempt::Finished(n));
                    }
                    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                    (r, errno)
                }
                Kind::SendAll { data, sent } => {
                    let total = data.len_bytes();
                    if *sent >= total {
                        return Ok(Attempt::Finished(py.None()));
                    }
                    // SAFETY: `data` is a C-contiguous exported buffer of `total` bytes and
                    // `*sent < total`, so the range is inside it.
                    let r = unsafe {
                        libc::send(
                            fd,
                            data.buf_ptr().cast::<u8>().add(*sent).cast(),
                            total - *sent,
                            0,
                        )
                    };
                    if r >= 0 {
                        *sent += r as usize;
                        if *sent >= total {
                            return Ok(Attempt::Finished(py.None()));
                        }
                        continue;
                    }
                    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                    (r, errno)
                }
            };
            debug_assert!(ret < 0);
            if errno == libc::EINTR {
                continue;
            }
            if would_block(errno) {
                return Ok(Attempt::WouldBlock(fd));
            }
            // Restore errno for PyErr_SetFromErrno.
            // SAFETY: __errno_location always returns this thread's valid errno slot.
            unsafe { *libc::__errno_location() = errno };
            drop(kind);
            return Err(last_os_error(py));
        }
    }

    /// First step: the syscall at once, or register interest and delegate to a Future.
    fn start(slf: &Bound<'_, Self>) -> PyResult<Step> {
        let py = slf.py();
        let this = slf.get();
        let attempt = this.attempt(py);
        match attempt {
            Ok(Attempt::Finished(v)) => {
                *this.state.borrow(py)? = OpState::Done;
                Ok(Step::Return(v))
            }
            Err(e) => {
                *this.state.borrow(py)? = OpState::Done;
                Err(e)
            }
            Ok(Attempt::WouldBlock(fd)) => {
                let lp = this.loop_.bind(py);
                let fut = lp.call_method0(intern!(py, "create_future"))?;
                let fd_obj = PyInt::new(py, fd);
                // As asyncio: waiting on a socket that a transport owns is an error.
                LoopCore::ensure_no_transport(lp, fd_obj.as_any())?;
                let handle = LoopCore::set_fd_handle_as(
                    lp,
                    fd_obj.as_any(),
                    slf.as_any(),
                    PyTuple::empty(py),
                    this.writes(py)?,
                    Some(this.sock.bind(py)),
                    None,
                )?;
                *this.registration.borrow(py)? = Some((handle, fd));
                fut.call_method1(intern!(py, "add_done_callback"), (slf,))?;
                let fut_iter = fut.call_method0(intern!(py, "__await__"))?;
                let first = match iter_send(&fut_iter, &py.None().into_bound(py))? {
                    Step::Yield(first) => first,
                    // A Future that is done at once (a subclass's create_future): no wait.
                    Step::Return(v) => {
                        *this.state.borrow(py)? = OpState::Done;
                        return Ok(Step::Return(v));
                    }
                };
                *this.state.borrow(py)? = OpState::Waiting {
                    fut: fut.unbind(),
                    fut_iter: fut_iter.unbind(),
                };
                Ok(Step::Yield(first))
            }
        }
    }

    /// Delegates one protocol step to the Future's iterator; marks the op done when it ends.
    fn delegate<'py>(
        slf: &Bound<'py, Self>,
        step: impl FnOnce(&Bound<'py, PyAny>) -> PyResult<Step>,
    ) -> PyResult<Step> {
        let py = slf.py();
        let fut_iter = match &*slf.get().state.borrow(py)? {
            OpState::Waiting { fut_iter, .. } => fut_iter.clone_ref(py),
            _ => unreachable!("delegate is only called while waiting"),
        };
        let fut_iter = fut_iter.into_bound(py);
        let stepped = step(&fut_iter);
        if !matches!(stepped, Ok(Step::Yield(_))) {
            let finished = std::mem::replace(&mut *slf.get().state.borrow(py)?, OpState::Done);
            drop(finished);
        }
        stepped
    }

    /// One step of the coroutine protocol with `value` sent in: what `send` and the `am_send`
    /// slot share.
    fn send_step(slf: &Bound<'_, Self>, value: &Bound<'_, PyAny>) -> PyResult<Step> {
        let py = slf.py();
        let starting = match &*slf.get().state.borrow(py)? {
            OpState::Start => true,
            OpState::Waiting { .. } => false,
            OpState::Done => {
                return Err(PyRuntimeError::new_err(
                    "cannot reuse already awaited coroutine",
                ))
            }
        };
        if starting {
            if !value.is_none() {
                return Err(PyTypeError::new_err(
                    "can't send non-None value to a just-started coroutine",
                ));
            }
            return Self::start(slf);
        }
        Self::delegate(slf, |it| iter_send(it, value))
    }

    /// The reader/writer handle fired: retry, and complete the Future unless it would block.
    fn on_ready(&self, py: Python<'_>) -> PyResult<()> {
        let fut = match &*self.state.borrow(py)? {
            OpState::Waiting { fut, .. } => fut.clone_ref(py),
            _ => return Ok(()),
        };
        let fut = fut.bind(py);
        if fut.call_method0(intern!(py, "done"))?.is_truthy()? {
            return Ok(());
        }
        match self.attempt(py) {
            Ok(Attempt::WouldBlock(_)) => Ok(()),
            Ok(Attempt::Finished(v)) => fut.call_method1(intern!(py, "set_result"), (v,)).map(drop),
            Err(e) => fut
                .call_method1(intern!(py, "set_exception"), (e.into_value(py),))
                .map(drop),
        }
    }

    /// The Future is done (result, error or cancel): leave the poller, unless another
    /// operation has replaced our registration since.
    fn on_done(&self, py: Python<'_>) -> PyResult<()> {
        let Some((handle, fd)) = self.registration.borrow(py)?.take() else {
            return Ok(());
        };
        if handle.get().is_cancelled() {
            return Ok(());
        }
        let lp = self.loop_.bind(py);
        let fd = PyInt::new(py, fd);
        LoopCore::remove_fd_handle_as(lp, fd.as_any(), self.writes(py)?, true).map(drop)
    }
}

// The loop calls a waiting operation directly (`native_call.rs`): with no argument when its fd
// is ready, with its Future when that is done, as `__call__` below.
crate::native_call::native_call!(SocketOperation, |slf, arg| Some(match arg {
    None => slf.get().on_ready(slf.py()),
    Some(_) => slf.get().on_done(slf.py()),
}));

#[pymethods]
impl SocketOperation {
    fn __await__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__(slf: &Bound<'_, Self>) -> PyResult<Option<Py<PyAny>>> {
        Self::send(slf, &slf.py().None().into_bound(slf.py()))
    }

    fn send(slf: &Bound<'_, Self>, value: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
        Self::send_step(slf, value)?.into_python(slf.py())
    }

    #[pyo3(signature = (typ, val=None, tb=None))]
    fn throw(
        slf: &Bound<'_, Self>,
        typ: &Bound<'_, PyAny>,
        val: Option<&Bound<'_, PyAny>>,
        tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<PyAny>>> {
        let py = slf.py();
        let waiting = match &*slf.get().state.borrow(py)? {
            OpState::Waiting { fut, .. } => Some(fut.clone_ref(py)),
            _ => None,
        };
        let Some(fut) = waiting else {
            // Not started (or finished): raise the exception here, as a fresh coroutine does.
            *slf.get().state.borrow(py)? = OpState::Done;
            let err = match val {
                Some(v) if !v.is_none() => PyErr::from_value(v.clone()),
                _ => PyErr::from_value(typ.clone()),
            };
            return Err(err);
        };
        // The exception goes into the Future's iterator (which re-raises it); the Future is then
        // cancelled so the fd leaves the poller.
        let result = Self::delegate(slf, |it| {
            let given: Vec<&Bound<'_, PyAny>> =
                [Some(typ), val, tb].into_iter().flatten().collect();
            let args = PyTuple::new(py, given)?;
            it.call_method1(intern!(py, "throw"), args)
                .map(|v| Step::Yield(v.unbind()))
        });
        fut.bind(py).call_method0(intern!(py, "cancel"))?;
        result?.into_python(py)
    }

    fn close(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let previous = std::mem::replace(&mut *slf.get().state.borrow(py)?, OpState::Done);
        if let OpState::Waiting { fut, .. } = &previous {
            // The done callback then takes the registration out of the poller.
            fut.bind(py).call_method0(intern!(py, "cancel"))?;
        }
        drop(previous);
        Ok(())
    }

    /// Called by the loop: with no argument when the fd is ready, with the Future when it is
    /// done.
    #[pyo3(signature = (fut=None))]
    fn __call__(&self, py: Python<'_>, fut: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        match fut {
            None => self.on_ready(py),
            Some(_) => self.on_done(py),
        }
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let what = match &*self.kind.borrow(py)? {
            Kind::Recv { .. } => "sock_recv",
            Kind::RecvInto { .. } => "sock_recv_into",
            Kind::SendAll { .. } => "sock_sendall",
        };
        Ok(format!(
            "<ferroloop.SocketOperation {what} {}>",
            self.sock.bind(py).repr()?
        ))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.loop_)?;
        visit.call(&self.sock)?;
        if let Some(st) = self.state.try_borrow_for_gc() {
            if let OpState::Waiting { fut, fut_iter } = &*st {
                visit.call(fut)?;
                visit.call(fut_iter)?;
            }
        }
        if let Some(reg) = self.registration.try_borrow_for_gc() {
            if let Some((handle, _)) = &*reg {
                visit.call(handle)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        let taken = self
            .state
            .try_borrow_for_gc()
            .map(|mut st| std::mem::replace(&mut *st, OpState::Done));
        let registration = self
            .registration
            .try_borrow_for_gc()
            .and_then(|mut r| r.take());
        drop((taken, registration));
    }
}
