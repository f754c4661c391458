//! The cross-thread queue into a loop, with a coalesced wake-up.
//!
//! Producers on any thread call [`Injector::push`]; the loop thread calls [`Injector::settle`] and
//! [`Injector::prepare_sleep`] before it blocks in the poller, [`Injector::woke`] after, and
//! [`Injector::drain_into`] to take every queued item in one batch. No GIL is involved: a Rust
//! thread can hand work to the loop.
//!
//! Invariants (a Dekker-style handshake, all on `SeqCst`):
//! - A producer publishes `pending = true` *before* it reads `sleeping`; the loop publishes
//!   `sleeping = true` *before* it reads `pending`. So either the loop sees the item and does not
//!   sleep, or the producer sees the sleeper and writes the eventfd. No wake-up is lost.
//! - `notified` is true from the moment one producer decided to write the eventfd until the loop
//!   has read it back. While it is true no other producer writes, so N producers racing a
//!   sleeping loop cost one `write(2)` and one `read(2)`.
//! - The read is deferred: [`Injector::woke`] only records that the eventfd fired, so the woken
//!   loop runs the queued work first (one syscall less between the producer's write and the
//!   callback), and [`Injector::settle`] reads it before the next poll. The loop calls `settle`
//!   before every poll and before `prepare_sleep`, so the eventfd is never left readable under a
//!   poll, and `notified` is reset only after the read: a push after the reset sees the loop's
//!   next `sleeping = true` (or the loop sees it pending) as above.
//! - [`Injector::push_deferred`] splits a push at the write: the producer that claimed the
//!   wake-up (`notified`) gets a [`WakeTicket`] and writes when it uses or drops it, so it can
//!   first release the GIL; no other producer writes meanwhile, and no wake-up is lost.
//! - Only the loop thread reads the queue; the mutex is held for a `Vec::push` or a swap, never
//!   across a syscall or a call into Python.
//! - [`Injector::close`] closes the eventfd while producers may still run. A producer counts
//!   itself in `writing` before it checks `closed` and writes; `close` sets `closed` before it
//!   waits for `writing` to reach zero (both `SeqCst`). So either the producer sees `closed`
//!   and does not write, or `close` waits for its write: no write can reach a file that reused
//!   the eventfd's number.
//! - [`Injector::seal`] and [`Injector::try_push`] decide under the queue's mutex: once `seal`
//!   has returned, no `try_push` queues anything (it hands the item back), so what the loop
//!   drains after sealing is everything it will ever get from `try_push` callers. Plain `push`
//!   ignores the seal (its callers leave their leftovers to the loop's drop).

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::clock;
use crate::waker::Waker;

/// What a push did, so callers and tests can see the coalescing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum PushOutcome {
    /// The loop was awake (or already being woken): the item waits for the next drain.
    Queued,
    /// The loop was asleep and this push wrote the eventfd.
    Woke,
}

/// The queued items, and whether `try_push` is refused (see the invariants).
#[derive(Debug)]
struct Queue<T> {
    items: Vec<T>,
    sealed: bool,
}

/// What a [`Injector::try_push`] after [`Injector::seal`] gives back: the item, not queued.
#[derive(Debug)]
pub struct Sealed<T>(pub T);

#[derive(Debug)]
pub struct Injector<T> {
    queue: Mutex<Queue<T>>,
    pending: AtomicBool,
    sleeping: AtomicBool,
    notified: AtomicBool,
    /// Loop thread only: the eventfd fired and has not been read yet (see the invariants).
    unread: AtomicBool,
    /// Set by `close`: the eventfd is (being) closed; nobody writes it any more.
    closed: AtomicBool,
    /// Loop clock (f64 bits) when the loop last went to sleep (`prepare_sleep`).
    asleep_since: AtomicU64,
    /// Producers between their `closed` check and the end of their eventfd write.
    writing: AtomicUsize,
    waker: Waker,
}

impl<T> Injector<T> {
    pub fn new() -> io::Result<Self> {
        Ok(Self {
            queue: Mutex::new(Queue {
                items: Vec::new(),
                sealed: false,
            }),
            pending: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            notified: AtomicBool::new(false),
            unread: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            asleep_since: AtomicU64::new(0),
            writing: AtomicUsize::new(0),
            waker: Waker::new()?,
        })
    }

    /// Queues `item` for the loop; writes the eventfd only if the loop sleeps and nobody else
    /// has written it yet.
    pub fn push(&self, item: T) -> io::Result<PushOutcome> {
        match self.push_deferred(item) {
            Some(ticket) => ticket.wake().map(|()| PushOutcome::Woke),
            None => Ok(PushOutcome::Queued),
        }
    }

    /// Queues `item` as [`Injector::push`] does, but when the loop sleeps the eventfd write is
    /// left to the returned ticket, so that the caller can first let go of a lock the woken loop
    /// will want (Python's GIL). The ticket writes when it is used or dropped, so the wake-up is
    /// never lost; until then no other producer writes (`notified` is set).
    pub fn push_deferred(&self, item: T) -> Option<WakeTicket<'_, T>> {
        self.lock().items.push(item);
        self.after_push()
    }

    /// Queues `item` as [`Injector::push`] does, unless [`Injector::seal`] was called: then the
    /// item comes back untouched.
    pub fn try_push(&self, item: T) -> Result<io::Result<PushOutcome>, Sealed<T>> {
        {
            let mut q = self.lock();
            if q.sealed {
                return Err(Sealed(item));
            }
            q.items.push(item);
        }
        Ok(match self.after_push() {
            Some(ticket) => ticket.wake().map(|()| PushOutcome::Woke),
            None => Ok(PushOutcome::Queued),
        })
    }

    /// Refuses every later [`Injector::try_push`]; returns whether it was already sealed.
    pub fn seal(&self) -> bool {
        std::mem::replace(&mut self.lock().sealed, true)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue<T>> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// After an item went into the queue: publishes it and claims the wake-up if the loop sleeps.
    fn after_push(&self) -> Option<WakeTicket<'_, T>> {
        self.pending.store(true, Ordering::SeqCst);
        // `then`, not `then_some`: a ticket built and dropped would write the eventfd.
        self.claim_wake().then(|| WakeTicket { injector: self })
    }

    /// Wakes the loop if it sleeps, without queueing anything (used for `stop()` from another
    /// thread, or by a signal).
    pub fn wake_if_sleeping(&self) -> io::Result<PushOutcome> {
        if self.claim_wake() {
            self.write_eventfd()?;
            return Ok(PushOutcome::Woke);
        }
        Ok(PushOutcome::Queued)
    }

    /// Whether this producer is the one to write the eventfd: the loop sleeps and nobody has
    /// written since it last read the eventfd back.
    fn claim_wake(&self) -> bool {
        self.sleeping.load(Ordering::SeqCst) && !self.notified.swap(true, Ordering::SeqCst)
    }

    /// The write of a producer that claimed the wake-up, unless the injector is closed.
    fn write_eventfd(&self) -> io::Result<()> {
        self.writing.fetch_add(1, Ordering::SeqCst);
        let woke = if self.closed.load(Ordering::SeqCst) {
            Ok(())
        } else {
            self.waker.wake()
        };
        self.writing.fetch_sub(1, Ordering::SeqCst);
        woke
    }

    /// Loop thread, once the loop is closed: closes the eventfd now (after deregistering it from
    /// the poller), waiting for a producer that is writing it (see the invariants). Items pushed
    /// afterwards are queued and never woken for.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        while self.writing.load(Ordering::SeqCst) != 0 {
            std::hint::spin_loop();
        }
        self.waker.close();
    }

    /// Loop thread, before a blocking poll: announces the sleep. Returns `false` if work is
    /// already queued, in which case the caller must poll with a zero timeout.
    pub fn prepare_sleep(&self) -> bool {
        self.asleep_since
            .store(clock::monotonic().to_bits(), Ordering::SeqCst);
        self.sleeping.store(true, Ordering::SeqCst);
        if self.pending.load(Ordering::SeqCst) {
            self.sleeping.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Loop thread, after the poll returned. `waker_fired`: the poller reported the eventfd,
    /// which [`Injector::settle`] reads before the next poll.
    pub fn woke(&self, waker_fired: bool) {
        self.sleeping.store(false, Ordering::SeqCst);
        if waker_fired {
            self.unread.store(true, Ordering::Relaxed);
        }
    }

    /// Loop thread, before every poll: reads the eventfd if it fired since the last call, and
    /// lets producers write it again.
    pub fn settle(&self) -> io::Result<()> {
        if self.unread.swap(false, Ordering::Relaxed) {
            self.waker.drain()?;
            self.notified.store(false, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Whether anything is queued (a hint; exact once producers have stopped).
    pub fn has_pending(&self) -> bool {
        self.pending.load(Ordering::SeqCst)
    }

    /// Loop thread: moves every queued item into `out`, in push order. Returns how many.
    pub fn drain_into(&self, out: &mut Vec<T>) -> usize {
        if !self.pending.swap(false, Ordering::SeqCst) {
            return 0;
        }
        let mut q = self.lock();
        let n = q.items.len();
        if out.is_empty() {
            std::mem::swap(&mut q.items, out);
        } else {
            out.append(&mut q.items);
        }
        n
    }
}

/// The eventfd write a [`Injector::push_deferred`] claimed: done by [`WakeTicket::wake`], or
/// when the ticket is dropped (errors then ignored).
#[must_use = "the loop sleeps until the ticket writes the eventfd"]
pub struct WakeTicket<'a, T> {
    injector: &'a Injector<T>,
}

impl<T> WakeTicket<'_, T> {
    /// Writes the eventfd now.
    pub fn wake(self) -> io::Result<()> {
        let r = self.injector.write_eventfd();
        std::mem::forget(self);
        r
    }

    /// Writes the eventfd; then, if the loop had been asleep for at least [`HANDOFF_IDLE`],
    /// gives the CPU away (`sched_yield`) until the loop has woken up ([`Injector::woke`], which
    /// the loop calls once it holds the GIL again) or [`HANDOFF_PATIENCE`] has passed. For a
    /// producer that released the GIL to write: were it to take the GIL straight back, the
    /// woken loop would find it held and sleep a second time, until the producer lets go of it
    /// again. A loop that fell asleep only just now is not waited for: that is a producer
    /// pushing a stream faster than the loop drains it, which keeps the GIL and hands over
    /// batches (waiting there turned a burst into one hand-over per callback).
    pub fn wake_and_wait(self) -> io::Result<()> {
        let injector = self.injector;
        let asleep_since = f64::from_bits(injector.asleep_since.load(Ordering::SeqCst));
        self.wake()?;
        if clock::monotonic() - asleep_since < HANDOFF_IDLE.as_secs_f64() {
            return Ok(());
        }
        let start = Instant::now();
        while injector.sleeping.load(Ordering::SeqCst) && start.elapsed() < HANDOFF_PATIENCE {
            std::thread::yield_now();
        }
        Ok(())
    }
}

/// How long a producer that woke the loop waits for it to take the GIL
/// ([`WakeTicket::wake_and_wait`]): a few times the wake-up itself (3.6-6.5 µs measured in C on
/// this machine, `benchmarks/loop/wake_floor.c`), so a loop that is slow to be scheduled costs
/// the producer at most this much.
pub const HANDOFF_PATIENCE: Duration = Duration::from_micros(50);

/// How long the loop must have been asleep for a waking producer to wait for it
/// ([`WakeTicket::wake_and_wait`]): longer than the loop sleeps between the batches of a
/// producer pushing back to back (a few µs), shorter than the gaps of a thread handing over
/// results one at a time.
pub const HANDOFF_IDLE: Duration = Duration::from_micros(100);

impl<T> Drop for WakeTicket<'_, T> {
    fn drop(&mut self) {
        let _ = self.injector.write_eventfd();
    }
}

impl<T> Injector<T> {
    /// Calls `f` with the queued items if no producer holds the queue right now (for a garbage
    /// collector's traversal, which must not block). Returns whether `f` ran.
    pub fn peek_if_free(&self, f: impl FnOnce(&[T])) -> bool {
        match self.queue.try_lock() {
            Ok(q) => {
                f(&q.items);
                true
            }
            Err(std::sync::TryLockError::Poisoned(p)) => {
                f(&p.into_inner().items);
                true
            }
            Err(std::sync::TryLockError::WouldBlock) => false,
        }
    }
}

impl<T> AsRawFd for Injector<T> {
    /// The eventfd to register in the loop's poller.
    fn as_raw_fd(&self) -> RawFd {
        self.waker.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::poller::{Events, Interest, Poller};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn push_while_awake_does_not_write() {
        let inj = Injector::new().unwrap();
        assert_eq!(inj.push(1).unwrap(), PushOutcome::Queued);
        assert_eq!(inj.push(2).unwrap(), PushOutcome::Queued);
        let mut out = Vec::new();
        assert_eq!(inj.drain_into(&mut out), 2);
        assert_eq!(out, vec![1, 2]);
        assert_eq!(inj.drain_into(&mut out), 0);
    }

    #[test]
    fn close_releases_the_eventfd_and_later_pushes_do_not_write() {
        let inj = Injector::new().unwrap();
        let fd = inj.as_raw_fd();
        inj.close();
        assert_eq!(inj.as_raw_fd(), -1);
        // SAFETY: fcntl(F_GETFD) on a plain integer fd reads no memory.
        assert_eq!(unsafe { libc::fcntl(fd, libc::F_GETFD) }, -1);
        assert!(inj.prepare_sleep());
        assert_eq!(inj.push(1).unwrap(), PushOutcome::Woke);
        let mut out = Vec::new();
        assert_eq!(inj.drain_into(&mut out), 1);
    }

    #[test]
    fn try_push_after_seal_hands_the_item_back_and_queues_nothing() {
        let inj = Injector::new().unwrap();
        assert_eq!(inj.try_push(1).unwrap().unwrap(), PushOutcome::Queued);
        assert!(!inj.seal());
        assert!(matches!(inj.try_push(2), Err(Sealed(2))));
        assert!(inj.seal());
        // Plain pushes still queue (their callers rely on the loop's drop for leftovers).
        assert_eq!(inj.push(3).unwrap(), PushOutcome::Queued);
        let mut out = Vec::new();
        assert_eq!(inj.drain_into(&mut out), 2);
        assert_eq!(out, vec![1, 3]);
    }

    /// Producers racing `seal`: every item is either drained after the seal or handed back,
    /// never both, never lost.
    #[test]
    fn seal_racing_producers_loses_nothing() {
        const THREADS: usize = 4;
        const PER_THREAD: usize = 5_000;
        let inj = Arc::new(Injector::new().unwrap());
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let inj = Arc::clone(&inj);
                std::thread::spawn(move || {
                    let mut refused = Vec::new();
                    for i in 0..PER_THREAD {
                        if let Err(Sealed(item)) = inj.try_push(t * PER_THREAD + i) {
                            refused.push(item);
                        }
                    }
                    refused
                })
            })
            .collect();
        std::thread::sleep(Duration::from_micros(200));
        let _ = inj.seal();
        let mut got = Vec::new();
        inj.drain_into(&mut got);
        for h in handles {
            got.extend(h.join().unwrap());
        }
        got.sort_unstable();
        assert!(got.iter().copied().eq(0..THREADS * PER_THREAD));
    }

    /// Whether the eventfd is readable now (a zero-timeout poll).
    fn eventfd_readable(inj: &Injector<i32>) -> bool {
        let poller = Poller::new().unwrap();
        poller.add(inj.as_raw_fd(), 0, Interest::READ).unwrap();
        let mut events = Events::with_capacity(4);
        poller.wait(&mut events, Some(Duration::ZERO)).unwrap() == 1
    }

    #[test]
    fn deferred_push_to_an_awake_loop_gives_no_ticket_and_writes_nothing() {
        let inj = Injector::new().unwrap();
        assert!(inj.push_deferred(1).is_none());
        assert!(inj.push_deferred(2).is_none());
        assert!(!eventfd_readable(&inj));
        let mut out = Vec::new();
        assert_eq!(inj.drain_into(&mut out), 2);
        assert_eq!(out, vec![1, 2]);
    }

    #[test]
    fn deferred_push_to_a_sleeper_writes_when_the_ticket_is_used() {
        let inj = Injector::new().unwrap();
        assert!(inj.prepare_sleep());
        let ticket = inj
            .push_deferred(1)
            .expect("the loop sleeps: this push must wake it");
        // Queued at once, written only by the ticket; a second producer meanwhile gets none.
        assert!(!eventfd_readable(&inj));
        assert!(inj.push_deferred(2).is_none());
        ticket.wake().unwrap();
        assert!(eventfd_readable(&inj));
        inj.woke(true);
        let mut out = Vec::new();
        assert_eq!(inj.drain_into(&mut out), 2);
        inj.settle().unwrap();
        assert!(!eventfd_readable(&inj));
    }

    #[test]
    fn wake_and_wait_writes_and_returns_though_the_loop_never_wakes() {
        let inj = Injector::new().unwrap();
        // Asleep long enough for the producer to wait for the loop, which never comes.
        assert!(inj.prepare_sleep());
        inj.asleep_since.store(0f64.to_bits(), Ordering::SeqCst);
        let ticket = inj
            .push_deferred(1)
            .expect("the loop sleeps: this push wakes it");
        ticket.wake_and_wait().unwrap();
        assert!(eventfd_readable(&inj));
    }

    #[test]
    fn wake_and_wait_returns_once_the_loop_has_woken() {
        let inj = std::sync::Arc::new(Injector::new().unwrap());
        assert!(inj.prepare_sleep());
        inj.asleep_since.store(0f64.to_bits(), Ordering::SeqCst);
        let ticket = inj.push_deferred(1).expect("the loop sleeps");
        let loop_thread = {
            let inj = std::sync::Arc::clone(&inj);
            std::thread::spawn(move || inj.woke(true))
        };
        ticket.wake_and_wait().unwrap();
        loop_thread.join().unwrap();
        assert!(!inj.sleeping.load(Ordering::SeqCst));
    }

    #[test]
    fn a_dropped_ticket_still_wakes_the_loop() {
        let inj = Injector::new().unwrap();
        assert!(inj.prepare_sleep());
        drop(inj.push_deferred(1));
        assert!(eventfd_readable(&inj));
    }

    #[test]
    fn peek_sees_queued_items_without_taking_them() {
        let inj = Injector::new().unwrap();
        let _ = inj.push(7).unwrap();
        let mut seen = Vec::new();
        assert!(inj.peek_if_free(|q| seen.extend_from_slice(q)));
        assert_eq!(seen, vec![7]);
        let mut out = Vec::new();
        assert_eq!(inj.drain_into(&mut out), 1);
    }

    #[test]
    fn prepare_sleep_refuses_when_work_is_queued() {
        let inj = Injector::new().unwrap();
        let _ = inj.push(1).unwrap();
        assert!(!inj.prepare_sleep());
        let mut out = Vec::new();
        inj.drain_into(&mut out);
        assert!(inj.prepare_sleep());
    }

    #[test]
    fn many_producers_against_a_sleeper_write_once() {
        let inj = Injector::new().unwrap();
        assert!(inj.prepare_sleep());
        let outcomes: Vec<_> = (0..10).map(|i| inj.push(i).unwrap()).collect();
        assert_eq!(
            outcomes.iter().filter(|o| **o == PushOutcome::Woke).count(),
            1
        );
        inj.woke(true);
        let mut out = Vec::new();
        assert_eq!(inj.drain_into(&mut out), 10);
        // Until the loop has read the eventfd back, a sleeping loop needs no second write.
        assert!(inj.prepare_sleep());
        assert_eq!(inj.push(10).unwrap(), PushOutcome::Queued);
        inj.woke(false);
        inj.drain_into(&mut out);
        inj.settle().unwrap();
        assert!(inj.prepare_sleep());
        assert_eq!(inj.push(11).unwrap(), PushOutcome::Woke);
    }

    #[test]
    fn settle_reads_the_eventfd_so_the_next_poll_does_not_see_it() {
        let inj = Injector::new().unwrap();
        let poller = Poller::new().unwrap();
        poller.add(inj.as_raw_fd(), 0, Interest::READ).unwrap();
        let mut events = Events::with_capacity(4);
        assert!(inj.prepare_sleep());
        assert_eq!(inj.push(1).unwrap(), PushOutcome::Woke);
        assert_eq!(poller.wait(&mut events, Some(Duration::ZERO)).unwrap(), 1);
        inj.woke(true);
        // Not read yet: still readable.
        assert_eq!(poller.wait(&mut events, Some(Duration::ZERO)).unwrap(), 1);
        inj.settle().unwrap();
        assert_eq!(poller.wait(&mut events, Some(Duration::ZERO)).unwrap(), 0);
    }

    /// Threads push while the loop sleeps and wakes; every item arrives and the loop never
    /// blocks past its (generous) timeout with items queued.
    #[test]
    fn no_lost_wakeups_under_contention() {
        const PER_THREAD: usize = 20_000;
        const THREADS: usize = 4;
        let inj = Arc::new(Injector::new().unwrap());
        let poller = Poller::new().unwrap();
        poller.add(inj.as_raw_fd(), 0, Interest::READ).unwrap();
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let inj = Arc::clone(&inj);
                std::thread::spawn(move || {
                    for i in 0..PER_THREAD {
                        let _ = inj.push(t * PER_THREAD + i).unwrap();
                    }
                })
            })
            .collect();
        let mut events = Events::with_capacity(4);
        let mut got = Vec::new();
        let mut batch = Vec::new();
        while got.len() < PER_THREAD * THREADS {
            inj.settle().unwrap();
            let timeout = if inj.prepare_sleep() {
                Duration::from_secs(10)
            } else {
                Duration::ZERO
            };
            let n = poller.wait(&mut events, Some(timeout)).unwrap();
            assert!(
                n > 0 || timeout.is_zero(),
                "slept through a push: lost wake-up"
            );
            inj.woke(!events.is_empty());
            inj.drain_into(&mut batch);
            got.append(&mut batch);
        }
        for h in handles {
            h.join().unwrap();
        }
        got.sort_unstable();
        assert!(got.iter().copied().eq(0..PER_THREAD * THREADS));
    }
}
