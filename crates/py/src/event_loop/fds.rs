//! The fd table: which handle reads and which writes each registered fd.
//!
//! Invariants:
//! - The table holds handles, not fds: the owner of an fd closes it. An entry exists exactly
//!   while the fd is registered in epoll, with the interest `registered` says: that of its
//!   reader/writer slots, except for a *parked* entry.
//! - Parked: a native socket operation ended and left its entry without handles; it stays in
//!   epoll, listed in `State::parked`, until the next poll (`flush_parked`), so a poll never
//!   reports an fd nobody waits for. Only the same socket object, still open, takes it back
//!   without a syscall; anything else starts it over (its fd may have been closed and reused).
//! - Every registration's epoll token carries a generation (`State::next_token`): an event whose
//!   token no entry has comes from a registration that outlived its fd (closed while parked or
//!   registered, its file kept open by a duplicate), and the loop starts epoll over
//!   (`Poller::reset`), since such a registration can no longer be deleted by its fd.
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
use pyo3::types::{PyDict, PyInt, PyTuple};

use super::{closed_error, LoopCore, State};
use crate::handle::{CallArgs, Handle};
use crate::sock_ops::os_error;

/// One registered fd. `fileobj` is the object first registered for it (as a selector key
/// keeps it), so the registration can still be found by that object after it was closed.
pub(super) struct FdEntry {
    pub(super) fileobj: Py<PyAny>,
    pub(super) reader: Option<Py<Handle>>,
    pub(super) writer: Option<Py<Handle>>,
    /// The interest the kernel has for the fd: that of the slots, except while parked.
    pub(super) registered: Interest,
    /// The socket whose native `sock_*` operation registered the entry (`None` once anything
    /// else registers on it): only such an entry is parked, and only that socket, still open,
    /// takes it back.
    pub(super) owner: Option<Py<PyAny>>,
    /// The epoll token: the fd in the low 32 bits, a generation above (`State::next_token`),
    /// so an event from a registration the table no longer has is told apart.
    pub(super) token: u64,
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
        // `_transports` is a `WeakValueDictionary` keyed by fd: an int fd absent from its `data`
        // dict (the usual case) has no transport, found without its Python `__len__` (about
        // 1,400 instructions per `add_reader`/`remove_reader` pair under callgrind). Anything
        // else goes to asyncio's check.
        let data = fd
            .is_exact_instance_of::<PyInt>()
            .then(|| transports.getattr(intern!(py, "data")).ok())
            .flatten();
        let none_owns = match data.as_ref().and_then(|d| d.cast_exact::<PyDict>().ok()) {
            Some(data) => data.get_item(fd)?.is_none(),
            None => transports.len()? == 0,
        };
        if none_owns {
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
        Self::set_fd_handle_as(slf, fd, callback, args, write, None, None)
    }

    /// `set_fd_handle` for a native socket operation on `owner` (the socket object): an entry
    /// the same socket parked (`remove_fd_handle_as`) since the last poll is taken back without
    /// a syscall when the kernel already has the interest it needs.
    pub(crate) fn set_fd_handle_as(
        slf: &Bound<'_, Self>,
        fd: &Bound<'_, PyAny>,
        callback: &Bound<'_, PyAny>,
        args: Bound<'_, PyTuple>,
        write: bool,
        owner: Option<&Bound<'_, PyAny>>,
        context: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<Handle>> {
        let py = slf.py();
        let this = slf.get();
        let fileobj = fd;
        let fd = fileobj_to_fd(fileobj)?;
        if this.flags.closed() {
            return Err(closed_error());
        }
        let debug = this.flags.debug();
        let parts = super::HandleParts {
            checked_by: None,
            callback,
            args: CallArgs::from_tuple(args)?,
            context,
            debug,
            waiting: false,
        };
        let handle = Self::new_pooled_handle(slf, parts)?;
        let (old, stale) = {
            let mut st = this.state.borrow(py)?;
            let existed = st.fds.contains_key(&fd);
            let fresh = st.next_token(fd);
            let entry = st.fds.entry(fd).or_insert_with(|| FdEntry {
                fileobj: fileobj.clone().unbind(),
                reader: None,
                writer: None,
                registered: Interest::default(),
                owner: owner.map(|o| o.clone().unbind()),
                token: fresh,
            });
            // A parked entry (no handle, still in epoll): only the socket that parked it takes it
            // back as it is. For anything else it starts over, and the kernel is asked again
            // below: the fd may have been closed and its number reused meanwhile.
            let parked = existed && entry.interest().is_empty();
            let same_owner =
                matches!((&entry.owner, owner), (Some(a), Some(b)) if a.bind(py).is(b));
            let taken_back = parked && same_owner;
            if parked && !same_owner {
                entry.fileobj = fileobj.clone().unbind();
                entry.owner = owner.map(|o| o.clone().unbind());
            } else if existed && !same_owner {
                entry.owner = None;
            }
            let slot = if write {
                &mut entry.writer
            } else {
                &mut entry.reader
            };
            let old = slot.replace(handle.clone_ref(py));
            let interest = entry.interest();
            let mut stale = None;
            let res = if taken_back && entry.registered == interest {
                Ok(())
            } else if existed {
                match this.shared.poller.modify(fd, entry.token, interest) {
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
                        entry.token = fresh;
                        this.shared.poller.add(fd, fresh, entry.interest())
                    }
                    Err(e) => Err(e),
                }
            } else {
                this.shared.poller.add(fd, fresh, interest)
            };
            if res.is_ok() {
                let entry = st.fds.get_mut(&fd).expect("just inserted");
                entry.registered = entry.interest();
            }
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
        Self::remove_fd_handle_as(slf, fd, write, false)
    }

    /// `remove_fd_handle`; with `park` (a native socket operation ending), an entry of a
    /// socket operation left without handles stays in epoll until the next poll
    /// (`flush_parked`), so the socket's next operation, usually queued by the same task in the
    /// same iteration, costs no `epoll_ctl` pair.
    pub(crate) fn remove_fd_handle_as(
        slf: &Bound<'_, Self>,
        fd: &Bound<'_, PyAny>,
        write: bool,
        park: bool,
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
                if entry.interest().is_empty() {
                    // Parked: asked to remove, it leaves the poller now, so the caller may
                    // close the fd.
                    let parked = st.fds.remove(&fd);
                    let deleted = this.shared.poller.delete(fd);
                    drop(st);
                    drop(parked);
                    deleted.map_err(|e| os_error(py, &e))?;
                }
                return Ok(false);
            }
            let interest = entry.interest();
            let mut stale = None;
            if interest.is_empty() && park && entry.owner.is_some() {
                st.parked.push(fd);
            } else if interest.is_empty() {
                st.fds.remove(&fd);
                this.shared
                    .poller
                    .delete(fd)
                    .map_err(|e| os_error(py, &e))?;
            } else if this
                .shared
                .poller
                .modify(fd, entry.token, interest)
                .map_err(|e| os_error(py, &e))?
                == Modified::Changed
            {
                entry.registered = interest;
            } else {
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

    /// Before a poll: the entries still parked leave epoll, so a poll never reports an fd
    /// nobody waits for, and no socket stays referenced after its operations ended.
    pub(super) fn flush_parked(&self, py: Python<'_>) -> PyResult<()> {
        let mut gone = Vec::new();
        let mut failed = None;
        {
            let mut st = self.state.borrow(py)?;
            if st.parked.is_empty() {
                return Ok(());
            }
            let State { fds, parked, .. } = &mut *st;
            for fd in parked.drain(..) {
                if fds.get(&fd).is_some_and(|e| e.interest().is_empty()) {
                    gone.extend(fds.remove(&fd));
                    if let Err(e) = self.shared.poller.delete(fd) {
                        failed.get_or_insert(e);
                    }
                }
            }
        }
        // The sockets may be the last references: released without the state borrowed.
        drop(gone);
        failed.map_or(Ok(()), |e| Err(os_error(py, &e)))
    }
}
