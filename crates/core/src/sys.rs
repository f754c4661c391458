//! The one place where a libc return value becomes an `io::Result`.
//!
//! Every syscall in the crate goes through [`cvt`]: `-1` means "look at errno", anything else is
//! the call's result. Callers keep their own `unsafe` block (and its `SAFETY:` comment), so the
//! reason each call is sound stays next to the call. [`ReleasableFd`] is the owned fd that
//! can be closed early through a shared reference (a loop's epoll fd and eventfd at `close()`).

use std::io;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

/// Integer results of libc calls, where `-1` signals an error in `errno`.
pub trait IsMinusOne: Copy {
    fn is_minus_one(self) -> bool;
}

macro_rules! impl_is_minus_one {
    ($($t:ty),*) => {$(
        impl IsMinusOne for $t {
            fn is_minus_one(self) -> bool { self == -1 }
        }
    )*};
}
impl_is_minus_one!(i32, i64, isize);

/// Turns a libc return value into `Ok(value)` or the `errno` error.
pub fn cvt<T: IsMinusOne>(ret: T) -> io::Result<T> {
    if ret.is_minus_one() {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Like [`cvt`], but retries while the call fails with `EINTR`.
pub fn cvt_retry<T: IsMinusOne>(mut f: impl FnMut() -> T) -> io::Result<T> {
    loop {
        match cvt(f()) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minus_one_reads_errno() {
        // SAFETY: closing an fd number that is certainly not open only sets errno (EBADF).
        let err = cvt(unsafe { libc::close(-5) }).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF));
        assert_eq!(cvt(3_i32).unwrap(), 3);
    }
}

/// An owned fd that can be closed through a shared reference, before its owner is dropped: a
/// loop's epoll fd and eventfd are closed by `close()`, as asyncio closes its selector and
/// self-pipe, while the loop object may live on. After [`ReleasableFd::release`] the raw fd is
/// -1, so a later call fails with `EBADF` instead of reaching a file that reused the number.
/// The caller guarantees that no other thread is inside a call on the fd when it releases it.
#[derive(Debug)]
pub struct ReleasableFd(AtomicI32);

impl ReleasableFd {
    pub fn new(fd: OwnedFd) -> Self {
        Self(AtomicI32::new(fd.into_raw_fd()))
    }

    /// Closes the fd now (once; later calls do nothing).
    pub fn release(&self) {
        let fd = self.0.swap(-1, Ordering::AcqRel);
        if fd >= 0 {
            // SAFETY: `fd` came from an `OwnedFd` and the swap took it out, so it is closed once.
            unsafe { libc::close(fd) };
        }
    }
}

impl AsRawFd for ReleasableFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.load(Ordering::Acquire)
    }
}

impl Drop for ReleasableFd {
    fn drop(&mut self) {
        self.release();
    }
}
