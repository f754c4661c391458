//! The fd table: which handle reads and which writes each registered fd.
//!
//! Invariants:
//! - The table holds handles, not fds: the owner of an fd closes it. An entry exists exactly
//!   while the fd is registered in epoll, with the interest its reader/writer slots say.
//! - A replaced or removed handle is cancelled after the state borrow ends (cancelling can run
//!   Python code). Handles here are always plain `Handle`s (never timers), so they are cancelled
//!   natively, without a Python method call.
//! - Lookups accept an int or an object with `fileno()`; a closed socket (`fileno() == -1`) is
//!   found by identity with the object it was registered with, as `selectors` does.

use std::os::fd::RawFd;

use ferroloop_core::{Interest, Modified};
use pyo3::exceptions::{PyOverflowError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyTuple};

use super::{closed_error, LoopCore};
use crate::handle::{CallArgs, Handle};
use crate::sock_ops::os_error;

/// One registered fd. `fileobj` is the object first registered for it (as a selector key
/// keeps it), so the registration can still be found by that object after it was closed.
pub(super) struct FdEntry {
    pub(super) fileobj: Py<PyAny>,
    pub(super) reader: Option<Py<Handle>>,
    pub(super) writer: Option<Py<Handle>>,
}

impl FdEntry {
    pub(super) fn interest(&self) -> Interest {
        Interest {
            readable: self.reader.is_some(),
            writable: self.writer.is_some(),
        }
    }
}

/// asyncio's `selectors._fileobj_to_fd`: an int, or an object with `fileno()`. A negative
/// number is a `ValueError`; one above the C `int` range an `OverflowError`, which asyncio
/// gets from `epoll.register` (`remove_*` answer `False` for it: it cannot be registered).
pub(super) fn fileobj_to_fd(obj: &Bound<'_, PyAny>) -> PyResult<RawFd> {
    let n = if obj.is_instance_of::<PyInt>() {
        obj.clone()
    } else {
        let invalid = || {
            let shown = obj.repr().map_or_else(|_| "?".into(), |r| r.to_string());
            PyValueError::new_err(format!("Invalid file object: {shown}"))
        };
        let n = obj
            .call_method0(intern!(obj.py(), "fileno"))
            .map_err(|_| invalid())?;
        if !n.is_instance_of::<PyInt>() {
            return Err(invalid());
        }
        n
    };
    if n.lt(0)? {
        return Err(PyValueError::new_err(format!(
            "Invalid file descriptor: {n}"
        )));
    }
    n.extract::<RawFd>()
        .map_err(|_| PyOverflowError::new_err("Python int too large to convert to C int"))
}

impl LoopCore {
    /// asyncio's public `add_*`/`remove_*` refuse an fd that a live transport owns
    /// (`_ensure_fd_no_transport`, on the Python subclass); the `_`-prefixed internals do not check.
    pub(crate) fn ensure_no_transport(
        slf: &Bound<'_, Self>,
        fd: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let py = slf.py();
        // A bare LoopCore (no Python subclass) has no transports.
        let Ok(transports) = slf.getattr(intern!(py, "_transports")) else {
            return Ok(());
        };
        if transports.len()? == 0 {
            return Ok(());
        }
        slf.call_method1(intern!(py, "_ensure_fd_no_transport"), (fd,))
            .map(drop)
    }

    pub(crate) fn set_fd_handle(
        slf: &Bound<'_, Self>,
        fd: &Bound<'_, PyAny>,
        callback: &Bound<'_, PyAny>,
        args: Bound<'_, PyTuple>,
        write: bool,
    ) -> PyResult<Py<Handle>> {
        let py = slf.py();
        let this = slf.get();
        let fileobj = fd;
        let fd = fileobj_to_fd(fileobj)?;
        if this.flags.closed() {
            return Err(closed_error());
        }
        let debug = this.flags.debug();
        let handle = Py::new(
            py,
            Self::make_handle(
                slf,
                None,
                callback,
                CallArgs::from_tuple(args)?,
                None,
                debug,
            )?,
        )?;
        let (old, stale) = {
            let mut st = this.state.borrow(py)?;
            let existed = st.fds.contains_key(&fd);
            let entry = st.fds.entry(fd).or_insert_with(|| FdEntry {
                fileobj: fileobj.clone().unbind(),
                reader: None,
                writer: None,
            });
            let slot = if write {
                &mut entry.writer
            } else {
                &mut entry.reader
            };
            let old = slot.replace(handle.clone_ref(py));
            let interest = entry.interest();
            let mut stale = None;
            let res = if existed {
                match this.shared.poller.modify(fd, fd as u64, interest) {
                    Ok(Modified::Changed) => Ok(()),
                    Ok(Modified::Gone) => {
                        // The fd was closed while registered and its number reused: the entry's
                        // other direction belongs to the closed file and must not follow the new
                        // one (its callback would run for this file's readiness).
                        stale = if write {
                            entry.reader.take()
                        } else {
                            entry.writer.take()
                        };
                        entry.fileobj = fileobj.clone().unbind();
                        this.shared.poller.add(fd, fd as u64, entry.interest())
                    }
                    Err(e) => Err(e),
                }
            } else {
                this.shared.poller.add(fd, fd as u64, interest)
            };
            if let Err(e) = res {
                // Undo: the fd is not watched, so the table must not claim it is.
                let entry = st.fds.get_mut(&fd).expect("just inserted");
                let slot = if write {
                    &mut entry.writer
                } else {
                    &mut entry.reader
                };
                let ours = std::mem::replace(slot, old);
                if !existed || stale.is_some() {
                    st.fds.remove(&fd);
                }
                drop(st);
                drop(ours);
                drop(stale);
                return Err(os_error(py, &e));
            }
            (old, stale)
        };
        for old in [old, stale].into_iter().flatten() {
            Handle::cancel(old.bind(py))?;
        }
        Ok(handle)
    }

    /// Registers (`on`) or removes a native object as `fd`'s reader or writer (`write`); it is
    /// called with one argument, `write`, when the fd is ready.
    pub(crate) fn set_native_callback(
        slf: &Bound<'_, Self>,
        fd: RawFd,
        callback: &Bound<'_, PyAny>,
        write: bool,
        on: bool,
    ) -> PyResult<()> {
        let py = slf.py();
        let fd = PyInt::new(py, fd);
        if on {
            let args = PyTuple::new(py, [write])?;
            Self::set_fd_handle(slf, fd.as_any(), callback, args, write).map(drop)
        } else {
            Self::remove_fd_handle(slf, fd.as_any(), write).map(drop)
        }
    }

    pub(crate) fn remove_fd_handle(
        slf: &Bound<'_, Self>,
        fd: &Bound<'_, PyAny>,
        write: bool,
    ) -> PyResult<bool> {
        let py = slf.py();
        let this = slf.get();
        if this.flags.closed() {
            return Ok(false);
        }
        let (old, stale) = {
            let mut st = this.state.borrow(py)?;
            let fd = match fileobj_to_fd(fd) {
                Ok(n) => n,
                Err(e) if e.is_instance_of::<PyOverflowError>(py) => return Ok(false),
                // A closed socket says fileno() == -1: find its registration by identity, as
                // `selectors` does, so it can still be removed.
                Err(e) => match st.fds.iter().find(|(_, en)| en.fileobj.bind(py).is(fd)) {
                    Some((&n, _)) => n,
                    None => return Err(e),
                },
            };
            let Some(entry) = st.fds.get_mut(&fd) else {
                return Ok(false);
            };
            let old = if write {
                entry.writer.take()
            } else {
                entry.reader.take()
            };
            if old.is_none() {
                return Ok(false);
            }
            let interest = entry.interest();
            let mut stale = None;
            if interest.is_empty() {
                st.fds.remove(&fd);
                this.shared
                    .poller
                    .delete(fd)
                    .map_err(|e| os_error(py, &e))?;
            } else if this
                .shared
                .poller
                .modify(fd, fd as u64, interest)
                .map_err(|e| os_error(py, &e))?
                == Modified::Gone
            {
                // The fd was closed while registered and its number reused: what is left of the
                // entry belongs to the closed file; it must not be registered for the new one.
                stale = st.fds.remove(&fd);
            }
            (old, stale)
        };
        if let Some(old) = old {
            Handle::cancel(old.bind(py))?;
        }
        if let Some(entry) = stale {
            for h in [entry.reader, entry.writer].into_iter().flatten() {
                Handle::cancel(h.bind(py))?;
            }
        }
        Ok(true)
    }
}
