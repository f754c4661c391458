//! An eventfd that wakes a loop blocked in `epoll_wait`.
//!
//! `wake` may be called from any thread; `drain` only by the loop thread after the poller
//! reported the fd readable. Writes saturate harmlessly: a second `wake` before a `drain` leaves
//! the fd readable, which is all the loop needs to know.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::sys::{cvt, ReleasableFd};

#[derive(Debug)]
pub struct Waker {
    /// -1 once [`Waker::close`] released it.
    fd: ReleasableFd,
}

impl Waker {
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes no pointers; on success it returns a new fd that we own.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        Ok(Self {
            // SAFETY: `fd` was just returned by eventfd and nothing else owns it.
            fd: ReleasableFd::new(unsafe { OwnedFd::from_raw_fd(fd) }),
        })
    }

    /// Makes the eventfd readable. Never blocks (the fd is non-blocking; a full counter already
    /// means "readable").
    pub fn wake(&self) -> io::Result<()> {
        let one: u64 = 1;
        // SAFETY: we pass a pointer to 8 initialised bytes that live across the call.
        let r = cvt(unsafe { libc::write(self.fd.as_raw_fd(), (&raw const one).cast(), 8) });
        match r {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Closes the eventfd now. The caller makes sure no `wake` or `drain` is in progress or
    /// can start writing (see `Injector::close`); a later call fails with `EBADF`.
    pub fn close(&self) {
        self.fd.release();
    }

    /// Resets the eventfd to not readable. Returns whether it was readable.
    pub fn drain(&self) -> io::Result<bool> {
        let mut buf: u64 = 0;
        // SAFETY: `buf` is 8 writable bytes that live across the call.
        let r = cvt(unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut buf).cast(), 8) });
        match r {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl AsRawFd for Waker {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_then_drain() {
        let w = Waker::new().unwrap();
        assert!(!w.drain().unwrap());
        w.wake().unwrap();
        w.wake().unwrap();
        assert!(w.drain().unwrap());
        assert!(!w.drain().unwrap());
    }
}
