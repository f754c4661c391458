//! Level-triggered epoll, as asyncio's `selectors.EpollSelector` uses it.
//!
//! Invariants:
//! - One `Poller` belongs to one loop thread; `wait` is the only call that blocks, and the caller
//!   releases the GIL around it.
//! - Readiness is mapped exactly as `selectors` maps it: `EPOLLIN` is readable, `EPOLLOUT` is
//!   writable, and `EPOLLHUP`/`EPOLLERR` wake both directions, so a reader or writer waiting on a
//!   closed peer always runs and sees the error itself.
//! - Timeouts are never rounded down: `epoll_pwait2` takes nanoseconds; where the kernel lacks it
//!   (before 5.11) the timeout is rounded *up* to the next millisecond, so a timer never fires
//!   early and the loop never spins on a zero-millisecond wait.
//! - A wait for a timer more than 50 ms out ends short of it by the kernel's timer slack
//!   (`short_of_slack`), so the timer is not fired up to 0.1% of the wait late.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::sys::{cvt, ReleasableFd};

/// Which directions a registration waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Interest {
    pub readable: bool,
    pub writable: bool,
}

impl Interest {
    pub const READ: Self = Self {
        readable: true,
        writable: false,
    };
    pub const WRITE: Self = Self {
        readable: false,
        writable: true,
    };

    pub fn is_empty(self) -> bool {
        !self.readable && !self.writable
    }

    fn epoll_bits(self) -> u32 {
        let mut bits = 0;
        if self.readable {
            bits |= libc::EPOLLIN as u32;
        }
        if self.writable {
            bits |= libc::EPOLLOUT as u32;
        }
        bits
    }
}

/// What the kernel reported for one registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Readiness {
    pub readable: bool,
    pub writable: bool,
}

impl Readiness {
    fn from_epoll(bits: u32) -> Self {
        // The `selectors` mapping: anything but EPOLLIN alone wakes writers, anything but
        // EPOLLOUT alone wakes readers.
        Self {
            readable: bits & !(libc::EPOLLOUT as u32) != 0,
            writable: bits & !(libc::EPOLLIN as u32) != 0,
        }
    }
}

/// A reusable buffer of events filled by [`Poller::wait`].
pub struct Events {
    buf: Vec<libc::epoll_event>,
    len: usize,
}

impl Events {
    pub fn with_capacity(cap: usize) -> Self {
        Self {
            buf: vec![libc::epoll_event { events: 0, u64: 0 }; cap.max(1)],
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The filled part as `(token, readiness)`.
    pub fn iter(&self) -> impl Iterator<Item = (u64, Readiness)> + '_ {
        self.buf[..self.len].iter().map(|ev| {
            let bits = ev.events;
            let token = ev.u64;
            (token, Readiness::from_epoll(bits))
        })
    }

    /// Doubles the buffer when the last wait filled it, so a busy loop learns its size.
    fn grow_if_full(&mut self) {
        if self.len == self.buf.len() && self.buf.len() < 65536 {
            let n = self.buf.len() * 2;
            self.buf.resize(n, libc::epoll_event { events: 0, u64: 0 });
        }
    }
}

/// What `Poller::modify` found.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Modified {
    /// The registration now has the new interest.
    Changed,
    /// The kernel had dropped the registration (its fd was closed); nothing was registered.
    Gone,
}

#[derive(Debug)]
pub struct Poller {
    /// -1 once [`Poller::close`] released it.
    epfd: ReleasableFd,
    /// Cleared the first time `epoll_pwait2` answers ENOSYS.
    has_pwait2: AtomicBool,
}

impl Poller {
    pub fn new() -> io::Result<Self> {
        // SAFETY: epoll_create1 takes no pointers; on success it returns a new fd that we own.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        Ok(Self {
            // SAFETY: `fd` was just returned by epoll_create1 and nothing else owns it.
            epfd: ReleasableFd::new(unsafe { OwnedFd::from_raw_fd(fd) }),
            has_pwait2: AtomicBool::new(true),
        })
    }

    /// Closes the epoll fd now; every later call fails with `EBADF`. Only the thread that
    /// owns the poller may call it (no `wait` or `ctl` can be in progress elsewhere).
    pub fn close(&self) {
        self.epfd.release();
    }

    /// Replaces the epoll instance with an empty one under the same fd number (`dup3`), which
    /// drops every registration, including one the kernel keeps for a file that was closed while
    /// registered but lives on in a duplicate elsewhere (a forked child's copy, `dup`): such a
    /// registration can no longer be named to `delete` it, and level-triggered it would be
    /// reported on every wait. The caller registers again what it still watches. Same thread
    /// rule as `close`.
    pub fn reset(&self) -> io::Result<()> {
        // SAFETY: epoll_create1 takes no pointers; on success it returns a new fd that we own.
        let fresh = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: `fresh` was just returned by epoll_create1 and nothing else owns it.
        let fresh = unsafe { OwnedFd::from_raw_fd(fresh) };
        // SAFETY: both are fds this poller owns; dup3 atomically closes the old instance's fd
        // number and makes it name the fresh instance, so no other file can take the number.
        cvt(unsafe { libc::dup3(fresh.as_raw_fd(), self.epfd.as_raw_fd(), libc::O_CLOEXEC) })?;
        // `fresh` closes here; the instance lives on under the old number.
        Ok(())
    }

    fn ctl(&self, op: i32, fd: RawFd, token: u64, interest: Interest) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: interest.epoll_bits(),
            u64: token,
        };
        // SAFETY: `ev` is a valid epoll_event for the duration of the call (the kernel copies it).
        cvt(unsafe { libc::epoll_ctl(self.epfd.as_raw_fd(), op, fd, &raw mut ev) })?;
        Ok(())
    }

    /// Registers `fd`. Fails with the kernel's error (EPERM for regular files, EBADF...).
    pub fn add(&self, fd: RawFd, token: u64, interest: Interest) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, token, interest)
    }

    /// Changes a registration. `Modified::Gone` if the kernel no longer has it (ENOENT: the fd
    /// was closed, which drops its registration, and the number now names another file); the
    /// caller decides what of the old registration still applies and `add`s that.
    pub fn modify(&self, fd: RawFd, token: u64, interest: Interest) -> io::Result<Modified> {
        match self.ctl(libc::EPOLL_CTL_MOD, fd, token, interest) {
            Ok(()) => Ok(Modified::Changed),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(Modified::Gone),
            Err(e) => Err(e),
        }
    }

    /// Removes a registration. An fd the kernel already dropped (closed: EBADF, or never
    /// registered: ENOENT) counts as removed.
    pub fn delete(&self, fd: RawFd) -> io::Result<()> {
        match self.ctl(libc::EPOLL_CTL_DEL, fd, 0, Interest::default()) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EBADF | libc::ENOENT)) => Ok(()),
            other => other,
        }
    }

    /// Waits for events. `None` waits forever. Returns the number of events; an interrupted wait
    /// (a signal arrived) returns `ErrorKind::Interrupted` so the caller can run signal handlers.
    pub fn wait(&self, events: &mut Events, timeout: Option<Duration>) -> io::Result<usize> {
        events.len = 0;
        let max = events.buf.len() as i32;
        let ptr = events.buf.as_mut_ptr();
        let n = match timeout {
            Some(t) if !t.is_zero() && self.has_pwait2.load(Ordering::Relaxed) => {
                let ts = libc::timespec {
                    tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
                    tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
                };
                // SAFETY: `ptr` points to `max` writable epoll_events owned by `events`, `ts` is
                // a valid timespec, and a null sigmask means "do not change the mask".
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_epoll_pwait2,
                        self.epfd.as_raw_fd(),
                        ptr,
                        max,
                        &raw const ts,
                        std::ptr::null::<libc::sigset_t>(),
                        0usize,
                    )
                };
                match cvt(r) {
                    Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                        self.has_pwait2.store(false, Ordering::Relaxed);
                        return self.wait(events, timeout);
                    }
                    other => other? as usize,
                }
            }
            _ => {
                let ms = match timeout {
                    None => -1,
                    Some(t) => {
                        // Round up so we never wake before the deadline.
                        let ms = t.as_nanos().div_ceil(1_000_000);
                        ms.min(i32::MAX as u128) as i32
                    }
                };
                // SAFETY: `ptr` points to `max` writable epoll_events owned by `events`.
                let r = unsafe { libc::epoll_wait(self.epfd.as_raw_fd(), ptr, max, ms) };
                cvt(r)? as usize
            }
        };
        events.len = n;
        events.grow_if_full();
        Ok(n)
    }
}

/// Waits longer than this are cut short by [`short_of_slack`]: at 50 ms the kernel's slack
/// (0.1% of the wait) reaches its floor, the thread's `timer_slack_ns` (50 µs by default).
const SLACK_SPLIT: Duration = Duration::from_millis(50);

/// How long to wait for a timer due in `t`. The kernel lets an epoll wait of `t` end up to
/// `t / 1000` late (`select_estimate_accuracy`, for a thread of nice 0), and never less than the
/// thread's timer slack: a loop asleep for 10 s until a timer may wake 10 ms after it (measured
/// here: a timer 0.5 s out fired 589-703 µs late). A wait longer than [`SLACK_SPLIT`] is cut
/// short by twice that slack instead; the loop wakes before the timer, finds nothing due, and
/// waits again for the rest, which is short enough to get only the floor. One extra wake-up per
/// long wait; a timer never fires early either way (the loop only fires timers that are due).
pub fn short_of_slack(t: Duration) -> Duration {
    if t > SLACK_SPLIT {
        t.saturating_sub(t / 500)
    } else {
        t
    }
}

impl AsRawFd for Poller {
    fn as_raw_fd(&self) -> RawFd {
        self.epfd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::time::Instant;

    #[test]
    fn reports_readable_and_writable() {
        let p = Poller::new().unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        p.add(a.as_raw_fd(), 7, Interest::READ).unwrap();
        let mut ev = Events::with_capacity(4);
        assert_eq!(p.wait(&mut ev, Some(Duration::ZERO)).unwrap(), 0);
        std::io::Write::write_all(&mut &b, b"x").unwrap();
        assert_eq!(p.wait(&mut ev, Some(Duration::from_secs(1))).unwrap(), 1);
        let (tok, r) = ev.iter().next().unwrap();
        assert_eq!(tok, 7);
        assert!(r.readable && !r.writable);
        assert_eq!(
            p.modify(a.as_raw_fd(), 8, Interest::WRITE).unwrap(),
            Modified::Changed
        );
        p.wait(&mut ev, Some(Duration::ZERO)).unwrap();
        let (tok, r) = ev.iter().next().unwrap();
        assert_eq!(tok, 8);
        assert!(r.writable && !r.readable);
        p.delete(a.as_raw_fd()).unwrap();
        assert_eq!(p.wait(&mut ev, Some(Duration::ZERO)).unwrap(), 0);
    }

    #[test]
    fn reset_drops_a_registration_that_outlived_its_fd() {
        // A registered fd closed while a duplicate keeps its file open: the registration stays
        // and, level-triggered, is reported on every wait; `delete` can no longer name it.
        let p = Poller::new().unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        let (c, _d) = UnixStream::pair().unwrap();
        let dup = a.try_clone().unwrap();
        let raw = a.as_raw_fd();
        p.add(raw, 5, Interest::READ).unwrap();
        p.add(c.as_raw_fd(), 6, Interest::WRITE).unwrap();
        drop(a);
        std::io::Write::write_all(&mut &b, b"x").unwrap();
        let mut ev = Events::with_capacity(4);
        p.wait(&mut ev, Some(Duration::ZERO)).unwrap();
        assert!(ev.iter().any(|(tok, _)| tok == 5));
        p.delete(raw).unwrap(); // EBADF: counted as removed, but the kernel keeps it
        p.wait(&mut ev, Some(Duration::ZERO)).unwrap();
        assert!(ev.iter().any(|(tok, _)| tok == 5));
        let epfd = p.epfd.as_raw_fd();
        p.reset().unwrap();
        assert_eq!(p.epfd.as_raw_fd(), epfd);
        assert_eq!(p.wait(&mut ev, Some(Duration::ZERO)).unwrap(), 0);
        // The poller works as before; what is registered again is reported again.
        p.add(c.as_raw_fd(), 6, Interest::WRITE).unwrap();
        assert_eq!(p.wait(&mut ev, Some(Duration::ZERO)).unwrap(), 1);
        assert_eq!(ev.iter().next().unwrap().0, 6);
        drop(dup);
    }

    #[test]
    fn modify_of_a_registration_the_kernel_dropped_is_gone() {
        // Closing an fd drops its registration; its number, reused, names an unregistered file.
        // An fd that is open but not registered is the same case to epoll (ENOENT).
        let p = Poller::new().unwrap();
        let (a, _b) = UnixStream::pair().unwrap();
        p.add(a.as_raw_fd(), 1, Interest::READ).unwrap();
        p.delete(a.as_raw_fd()).unwrap();
        assert_eq!(
            p.modify(a.as_raw_fd(), 1, Interest::WRITE).unwrap(),
            Modified::Gone
        );
        let mut ev = Events::with_capacity(1);
        assert_eq!(p.wait(&mut ev, Some(Duration::ZERO)).unwrap(), 0);
    }

    #[test]
    fn hangup_wakes_both_directions() {
        let p = Poller::new().unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        p.add(a.as_raw_fd(), 1, Interest::READ).unwrap();
        drop(b);
        let mut ev = Events::with_capacity(1);
        p.wait(&mut ev, Some(Duration::from_secs(1))).unwrap();
        let (_, r) = ev.iter().next().unwrap();
        assert!(r.readable);
    }

    #[test]
    fn timeout_is_not_early() {
        let p = Poller::new().unwrap();
        let mut ev = Events::with_capacity(1);
        for us in [300_u64, 1500, 5000] {
            let t = Duration::from_micros(us);
            let start = Instant::now();
            p.wait(&mut ev, Some(t)).unwrap();
            assert!(start.elapsed() >= t, "woke before {t:?}");
        }
    }

    #[test]
    fn long_waits_end_short_of_the_kernel_slack_and_short_ones_are_kept() {
        use super::short_of_slack;
        for ms in [0_u64, 1, 10, 50] {
            let t = Duration::from_millis(ms);
            assert_eq!(short_of_slack(t), t);
        }
        let t = Duration::from_secs(10);
        let first = short_of_slack(t);
        assert_eq!(first, Duration::from_millis(9980));
        // The rest (20 ms) is below the split: waited for in one go, with the 50 µs floor.
        let rest = t.saturating_sub(first);
        assert_eq!(short_of_slack(rest), rest);
    }

    #[test]
    fn delete_of_unknown_fd_is_ok() {
        let p = Poller::new().unwrap();
        p.delete(12345).unwrap();
    }

    #[test]
    fn events_buffer_grows_when_full() {
        let p = Poller::new().unwrap();
        let pairs: Vec<_> = (0..3).map(|_| UnixStream::pair().unwrap()).collect();
        for (i, (a, _)) in pairs.iter().enumerate() {
            p.add(a.as_raw_fd(), i as u64, Interest::WRITE).unwrap();
        }
        let mut ev = Events::with_capacity(1);
        assert_eq!(p.wait(&mut ev, Some(Duration::ZERO)).unwrap(), 1);
        assert_eq!(p.wait(&mut ev, Some(Duration::ZERO)).unwrap(), 2);
        assert_eq!(p.wait(&mut ev, Some(Duration::ZERO)).unwrap(), 3);
    }
}
