//! The front's board: the state of each worker behind the front and the front's own counts, in
//! memory shared with every process forked after the board is made. The supervisor makes it
//! before it forks the front, so the supervisor (and anything it forks, such as a metrics
//! exporter) reads what the front writes, with no message between the processes.
//!
//! What a worker's slot says is what the front knows of it: the connections handed to it and
//! not back yet (a request being served, or a keep-alive connection the worker kept for its
//! next requests), how many of those carry bulk work, since when the oldest was handed, whether
//! bulk work runs there (the worker's own `BULK_STARTED`/`BULK_ENDED`), whether it is leaving,
//! and how many connections it was handed in all.
//!
//! Each worker also writes a seat of its own ([`Board::seat_open`], [`Board::seat_task`]): its
//! app tasks running (a request's, or a WebSocket session's), since when it has had at least
//! one, and how many it started. That is what only the worker knows: a connection it keeps
//! between requests is handed to it in the front's eyes, whether a request runs or not.
//!
//! Invariants:
//! - One writer for the front's part: the front's thread ([`Board::publish`]); one writer per
//!   seat: the worker the supervisor gave it to. Readers in other processes only load.
//! - Every field is an `AtomicU64` of a fixed `#[repr(C)]` layout in one `MAP_SHARED` mapping,
//!   so each field is read whole; a snapshot is consistent as a whole too: the writer makes
//!   `seq` odd while it writes and even after, and [`Board::snapshot`] retries until it read
//!   the same even `seq` before and after (a sequence lock).
//! - Worker slots past `workers` are stale and not read. A worker beyond the capacity is left
//!   off the board and counted in `unlisted`.
//! - A seat is read field by field (no sequence lock: one worker's few counters, each whole);
//!   a seat whose `pid` is 0 is free.

use std::io;

use super::loop_counts::{LoopCounts, LoopTotals};
use super::request_counts::{RequestCounts, RequestTotals};
use crate::loop_stats::LoopStats;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// The front-wide fields.
#[repr(C)]
struct Header {
    seq: AtomicU64,
    capacity: AtomicU64,
    /// Monotonic nanoseconds of the last publish: a reader can tell a front that stopped.
    updated_ns: AtomicU64,
    accepted: AtomicU64,
    dispatched: AtomicU64,
    returned: AtomicU64,
    lost_with_worker: AtomicU64,
    /// Idle connections the front holds.
    held: AtomicU64,
    /// Requests with a whole head waiting for a worker that may take them, small and bulk.
    pending_small: AtomicU64,
    pending_bulk: AtomicU64,
    draining: AtomicU64,
    workers: AtomicU64,
    unlisted: AtomicU64,
}

/// One worker's fields.
#[repr(C)]
struct Slot {
    id: AtomicU64,
    /// 0 general, 1 fast.
    lane: AtomicU64,
    in_flight: AtomicU64,
    bulk_in_flight: AtomicU64,
    /// Monotonic nanoseconds when the oldest connection in flight was handed; 0 with none.
    oldest_ns: AtomicU64,
    handed_total: AtomicU64,
    /// Bit 0: leaving; bit 1: bulk work running there.
    flags: AtomicU64,
}

/// One worker's own fields (its seat).
#[repr(C)]
struct Seat {
    pid: AtomicU64,
    tasks_running: AtomicU64,
    /// Monotonic nanoseconds since which at least one task has run; 0 with none.
    busy_since_ns: AtomicU64,
    tasks_started: AtomicU64,
    requests: RequestCounts,
    /// The worker's loop counters, with `--metrics` (`loop_counts`).
    loop_counts: LoopCounts,
}

/// What a worker publishes about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SeatState {
    pub seat: usize,
    pub pid: u32,
    pub tasks_running: u64,
    pub busy_since_ns: u64,
    pub tasks_started: u64,
    pub requests: RequestTotals,
}

/// Why the supervisor replaced a worker ([`Board::count_restart`]), in label order: it exited
/// unasked (a signal, a failure exit, an exit of its own), it reached `--limit-max-requests`, it left a health check
/// unanswered and was killed, or a signal asked for new workers (SIGHUP).
pub const RESTART_REASONS: [&str; 4] = ["crash", "max_requests", "healthcheck", "signal"];

/// The counts of workers that are gone, so that the sums stay monotonic when a worker is
/// replaced: written by the process that gives seats (`Board::seat_retire`), the requests
/// under `seq`; and how many workers were replaced, by [`RESTART_REASONS`] (each whole).
#[repr(C)]
struct Retired {
    seq: AtomicU64,
    requests: RequestCounts,
    loop_counts: LoopCounts,
    restarts: [AtomicU64; RESTART_REASONS.len()],
}

const LEAVING: u64 = 1;
const BULK_RUNNING: u64 = 2;

/// What the front publishes about one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkerState {
    pub id: u32,
    pub fast_lane: bool,
    pub in_flight: u64,
    pub bulk_in_flight: u64,
    pub oldest_ns: u64,
    pub handed_total: u64,
    pub leaving: bool,
    pub bulk_running: bool,
}

/// What the front publishes about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FrontState {
    pub updated_ns: u64,
    pub accepted: u64,
    pub dispatched: u64,
    pub returned: u64,
    pub lost_with_worker: u64,
    pub held: u64,
    pub pending_small: u64,
    pub pending_bulk: u64,
    pub draining: bool,
    /// Workers the board had no slot for.
    pub unlisted: u64,
}

/// A board for up to `capacity` workers (see the module's documentation).
#[derive(Debug)]
pub struct Board {
    base: NonNull<u8>,
    len: usize,
    capacity: usize,
}

// SAFETY: the mapping is only accessed through atomics (`Header`, `Slot`), and `Board` owns it
// (unmapped once, in `drop`); sharing or moving it between threads is what atomics allow.
unsafe impl Send for Board {}
// SAFETY: as above.
unsafe impl Sync for Board {}

impl Board {
    /// Maps a zeroed board (shared with processes forked from now on).
    pub fn new(capacity: usize) -> io::Result<Self> {
        let len = std::mem::size_of::<Header>()
            + capacity * (std::mem::size_of::<Slot>() + std::mem::size_of::<Seat>())
            + std::mem::size_of::<Retired>();
        // SAFETY: an anonymous mapping at an address the kernel picks; no memory of ours is
        // touched. The result is checked against MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(base.cast::<u8>()).ok_or_else(io::Error::last_os_error)?;
        let board = Self {
            base,
            len,
            capacity,
        };
        board
            .header()
            .capacity
            .store(capacity as u64, Ordering::Relaxed);
        Ok(board)
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    // The mapping is page-aligned (`mmap`), so aligned for `Header`.
    #[allow(clippy::cast_ptr_alignment)]
    fn header(&self) -> &Header {
        // SAFETY: the mapping starts with a `Header` (page-aligned, so aligned for it), is
        // zero-initialised by the kernel (a valid `AtomicU64` bit pattern) and lives as long
        // as `self`.
        unsafe { &*self.base.as_ptr().cast::<Header>() }
    }

    // The slots start 8-aligned: the mapping is page-aligned and `Header`'s size is a multiple
    // of 8.
    #[allow(clippy::cast_ptr_alignment)]
    fn slot(&self, i: usize) -> &Slot {
        assert!(i < self.capacity);
        // SAFETY: `capacity` slots follow the header inside the mapping (`new`); both sizes
        // are multiples of 8, so each slot is aligned. Zeroed atomics, valid as in `header`.
        unsafe {
            &*self
                .base
                .as_ptr()
                .add(std::mem::size_of::<Header>())
                .cast::<Slot>()
                .add(i)
        }
    }

    // The seats follow the slots; all sizes are multiples of 8, so each seat is aligned.
    #[allow(clippy::cast_ptr_alignment)]
    fn seat(&self, i: usize) -> &Seat {
        assert!(i < self.capacity);
        // SAFETY: `capacity` seats follow the slots inside the mapping (`new`); zeroed
        // atomics, valid as in `header`.
        unsafe {
            &*self
                .base
                .as_ptr()
                .add(std::mem::size_of::<Header>() + self.capacity * std::mem::size_of::<Slot>())
                .cast::<Seat>()
                .add(i)
        }
    }

    // The retired counts follow the seats; sizes are multiples of 8, so it is aligned.
    #[allow(clippy::cast_ptr_alignment)]
    fn retired(&self) -> &Retired {
        let offset = std::mem::size_of::<Header>()
            + self.capacity * (std::mem::size_of::<Slot>() + std::mem::size_of::<Seat>());
        // SAFETY: one `Retired` follows the seats inside the mapping (`new`); zeroed atomics,
        // valid as in `header`.
        unsafe { &*self.base.as_ptr().add(offset).cast::<Retired>() }
    }

    /// Seat `i`'s worker is gone: its request counts join the retired ones and the seat is
    /// freed, in one step for readers of [`Board::request_totals`] (the process that gives
    /// seats only, after the worker exited).
    pub fn seat_retire(&self, i: usize) {
        let r = self.retired();
        let seq = r.seq.load(Ordering::Relaxed);
        r.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        let s = self.seat(i);
        if s.pid.load(Ordering::Relaxed) != 0 {
            r.requests.add(&s.requests.read());
            r.loop_counts.add(&s.loop_counts.read());
        }
        s.pid.store(0, Ordering::Relaxed);
        r.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// `sum` of the retired part and the seats in use, retried until no retirement ran
    /// meanwhile (the retired part's `seq`): a retiring worker's counts are neither missed nor
    /// counted twice.
    fn consistent_sum<T>(&self, sum: impl Fn(&Retired) -> T) -> T {
        let r = self.retired();
        loop {
            let before = r.seq.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let total = sum(r);
            fence(Ordering::Acquire);
            if r.seq.load(Ordering::Relaxed) == before {
                return total;
            }
        }
    }

    /// Every loop counted on the board: the seats in use and the retired workers'.
    pub fn loop_totals(&self) -> LoopTotals {
        self.consistent_sum(|r| {
            let mut total = r.loop_counts.read();
            for i in 0..self.capacity {
                let s = self.seat(i);
                if s.pid.load(Ordering::Acquire) != 0 {
                    total.add(&s.loop_counts.read());
                }
            }
            total
        })
    }

    /// Seat `i`'s worker copies its loop's counters there (its only writer).
    pub fn seat_loop(&self, i: usize, stats: &LoopStats) {
        self.seat(i).loop_counts.store(&LoopTotals::from(stats));
    }

    /// A worker was replaced, for `RESTART_REASONS[reason]` (the process that gives seats
    /// only: one writer).
    pub fn count_restart(&self, reason: usize) {
        let c = &self.retired().restarts[reason];
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// Workers replaced so far, by [`RESTART_REASONS`].
    pub fn restarts(&self) -> [u64; RESTART_REASONS.len()] {
        std::array::from_fn(|i| self.retired().restarts[i].load(Ordering::Relaxed))
    }

    /// Every request counted on the board: the seats in use and the retired workers'.
    pub fn request_totals(&self) -> RequestTotals {
        self.consistent_sum(|r| {
            let mut total = r.requests.read();
            for s in self.seats() {
                total.add(&s.requests);
            }
            total
        })
    }

    /// Seat `i` now belongs to worker `pid` (or is free with 0), its counts from zero. The
    /// supervisor gives seats; `i` must be under the capacity.
    pub fn seat_open(&self, i: usize, pid: u32) {
        let s = self.seat(i);
        let r = Ordering::Relaxed;
        s.pid.store(0, r);
        s.tasks_running.store(0, r);
        s.busy_since_ns.store(0, r);
        s.tasks_started.store(0, r);
        s.requests.reset();
        s.loop_counts.store(&LoopTotals::default());
        s.pid.store(u64::from(pid), Ordering::Release);
    }

    /// A request answered on seat `i`'s worker (its only writer): `method` an index of
    /// `request_counts::METHODS`, its status, and how long it took.
    pub fn seat_request(&self, i: usize, method: usize, status: u16, duration_ns: u64) {
        self.seat(i).requests.record(method, status, duration_ns);
    }

    /// A task started (`true`, at `now_ns`) or ended (`now_ns` unused) on seat `i`'s worker
    /// (its only writer).
    pub fn seat_task(&self, i: usize, started: bool, now_ns: u64) {
        let s = self.seat(i);
        let r = Ordering::Relaxed;
        let running = s.tasks_running.load(r);
        if started {
            if running == 0 {
                s.busy_since_ns.store(now_ns.max(1), r);
            }
            s.tasks_running.store(running + 1, r);
            s.tasks_started.store(s.tasks_started.load(r) + 1, r);
        } else {
            let left = running.saturating_sub(1);
            s.tasks_running.store(left, r);
            if left == 0 {
                s.busy_since_ns.store(0, r);
            }
        }
    }

    /// The seats in use.
    pub fn seats(&self) -> Vec<SeatState> {
        (0..self.capacity)
            .filter_map(|i| {
                let s = self.seat(i);
                let pid = s.pid.load(Ordering::Acquire);
                (pid != 0).then(|| SeatState {
                    seat: i,
                    pid: pid as u32,
                    tasks_running: s.tasks_running.load(Ordering::Relaxed),
                    busy_since_ns: s.busy_since_ns.load(Ordering::Relaxed),
                    tasks_started: s.tasks_started.load(Ordering::Relaxed),
                    requests: s.requests.read(),
                })
            })
            .collect()
    }

    /// Writes a new state (the front's thread only: one writer).
    pub fn publish(&self, now_ns: u64, front: &FrontState, workers: &[WorkerState]) {
        let h = self.header();
        let seq = h.seq.load(Ordering::Relaxed);
        h.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        // The odd `seq` is visible before any field written after it.
        fence(Ordering::Release);
        let r = Ordering::Relaxed;
        h.updated_ns.store(now_ns, r);
        h.accepted.store(front.accepted, r);
        h.dispatched.store(front.dispatched, r);
        h.returned.store(front.returned, r);
        h.lost_with_worker.store(front.lost_with_worker, r);
        h.held.store(front.held, r);
        h.pending_small.store(front.pending_small, r);
        h.pending_bulk.store(front.pending_bulk, r);
        h.draining.store(u64::from(front.draining), r);
        let listed = workers.len().min(self.capacity);
        h.workers.store(listed as u64, r);
        h.unlisted.store((workers.len() - listed) as u64, r);
        for (i, w) in workers.iter().take(listed).enumerate() {
            let s = self.slot(i);
            s.id.store(u64::from(w.id), r);
            s.lane.store(u64::from(w.fast_lane), r);
            s.in_flight.store(w.in_flight, r);
            s.bulk_in_flight.store(w.bulk_in_flight, r);
            s.oldest_ns.store(w.oldest_ns, r);
            s.handed_total.store(w.handed_total, r);
            let flags =
                if w.leaving { LEAVING } else { 0 } | if w.bulk_running { BULK_RUNNING } else { 0 };
            s.flags.store(flags, r);
        }
        h.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// A consistent copy of the last state published (all zeros before the first).
    pub fn snapshot(&self) -> (FrontState, Vec<WorkerState>) {
        let h = self.header();
        let r = Ordering::Relaxed;
        loop {
            let before = h.seq.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let front = FrontState {
                updated_ns: h.updated_ns.load(r),
                accepted: h.accepted.load(r),
                dispatched: h.dispatched.load(r),
                returned: h.returned.load(r),
                lost_with_worker: h.lost_with_worker.load(r),
                held: h.held.load(r),
                pending_small: h.pending_small.load(r),
                pending_bulk: h.pending_bulk.load(r),
                draining: h.draining.load(r) != 0,
                unlisted: h.unlisted.load(r),
            };
            let listed = (h.workers.load(r) as usize).min(self.capacity);
            let workers = (0..listed)
                .map(|i| {
                    let s = self.slot(i);
                    let flags = s.flags.load(r);
                    WorkerState {
                        id: s.id.load(r) as u32,
                        fast_lane: s.lane.load(r) != 0,
                        in_flight: s.in_flight.load(r),
                        bulk_in_flight: s.bulk_in_flight.load(r),
                        oldest_ns: s.oldest_ns.load(r),
                        handed_total: s.handed_total.load(r),
                        leaving: flags & LEAVING != 0,
                        bulk_running: flags & BULK_RUNNING != 0,
                    }
                })
                .collect();
            // The fields' loads happen before the second load of `seq`.
            fence(Ordering::Acquire);
            if h.seq.load(r) == before {
                return (front, workers);
            }
        }
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are the mapping `new` made, unmapped only here; no reference
        // into it outlives `self` (they borrow it).
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(id: u32, in_flight: u64) -> WorkerState {
        WorkerState {
            id,
            in_flight,
            handed_total: in_flight * 10,
            ..WorkerState::default()
        }
    }

    #[test]
    fn a_snapshot_reads_what_was_published() {
        let board = Board::new(4).unwrap();
        assert_eq!(board.snapshot(), (FrontState::default(), Vec::new()));
        let front = FrontState {
            updated_ns: 5,
            accepted: 3,
            pending_bulk: 1,
            draining: true,
            ..FrontState::default()
        };
        let mut fast = worker(8, 2);
        fast.fast_lane = true;
        fast.bulk_running = true;
        fast.leaving = true;
        board.publish(5, &front, &[worker(7, 1), fast]);
        let (f, w) = board.snapshot();
        assert_eq!(f, front);
        assert_eq!(w, vec![worker(7, 1), fast]);
        // Fewer workers later: the stale slot is not read.
        board.publish(6, &front, &[worker(9, 0)]);
        assert_eq!(board.snapshot().1, vec![worker(9, 0)]);
    }

    #[test]
    fn a_seat_counts_its_worker_s_tasks_and_since_when_it_is_busy() {
        let board = Board::new(3).unwrap();
        assert!(board.seats().is_empty());
        board.seat_open(1, 42);
        board.seat_task(1, true, 100);
        board.seat_task(1, true, 200);
        let busy = SeatState {
            seat: 1,
            pid: 42,
            tasks_running: 2,
            busy_since_ns: 100,
            tasks_started: 2,
            requests: RequestTotals::default(),
        };
        assert_eq!(board.seats(), vec![busy]);
        board.seat_task(1, false, 300);
        board.seat_task(1, false, 400);
        let (running, since) = (
            board.seats()[0].tasks_running,
            board.seats()[0].busy_since_ns,
        );
        assert_eq!((running, since), (0, 0));
        board.seat_request(1, 0, 200, 5_000);
        assert_eq!(board.seats()[0].requests.count(0, 1), 1);
        // Retired: its requests stay in the totals; reopened for another worker: counts from
        // zero; 0 frees it.
        board.seat_retire(1);
        assert!(board.seats().is_empty());
        assert_eq!(board.request_totals().count(0, 1), 1);
        board.seat_open(1, 43);
        assert_eq!(board.seats()[0].tasks_started, 0);
        assert_eq!(board.seats()[0].requests, RequestTotals::default());
        board.seat_request(1, 0, 200, 5_000);
        assert_eq!(board.request_totals().count(0, 1), 2);
        board.seat_open(1, 0);
        assert!(board.seats().is_empty());
        // The front's part is untouched by the seats.
        assert_eq!(board.snapshot(), (FrontState::default(), Vec::new()));
    }

    #[test]
    fn loop_counters_are_summed_over_seats_and_kept_when_a_worker_retires() {
        let board = Board::new(2).unwrap();
        board.seat_open(0, 7);
        board.seat_open(1, 8);
        let mut stats = LoopStats::default();
        stats.enable();
        stats.iteration(1.0);
        stats.polled(1.0, 1.5);
        stats.work_starts(1.5);
        stats.timer_fired(1.5, 1.4);
        stats.iteration(1.6);
        board.seat_loop(0, &stats);
        board.seat_loop(1, &stats);
        let t = board.loop_totals();
        assert_eq!(
            (t.iterations, t.polls, t.poll_wait_ns),
            (4, 2, 1_000_000_000)
        );
        assert_eq!(
            (t.busy.iter().sum::<u64>(), t.lag.iter().sum::<u64>()),
            (2, 2)
        );
        board.seat_retire(0);
        assert_eq!(
            board.loop_totals().iterations,
            4,
            "a retired worker's count stays"
        );
        board.seat_open(0, 9);
        assert_eq!(
            board.loop_totals().iterations,
            4,
            "a new seat starts from zero"
        );
    }

    #[test]
    fn restarts_are_counted_by_reason_beside_the_requests() {
        let board = Board::new(2).unwrap();
        board.seat_open(0, 7);
        board.seat_request(0, 0, 200, 1_000);
        board.count_restart(1);
        board.count_restart(1);
        board.count_restart(3);
        assert_eq!(board.restarts(), [0, 2, 0, 1]);
        board.seat_retire(0);
        assert_eq!(
            board.request_totals().count(0, 1),
            1,
            "restarts do not touch requests"
        );
        assert_eq!(RESTART_REASONS[1], "max_requests");
    }

    #[test]
    fn workers_beyond_the_capacity_are_counted_not_listed() {
        let board = Board::new(1).unwrap();
        board.publish(
            1,
            &FrontState::default(),
            &[worker(1, 0), worker(2, 0), worker(3, 0)],
        );
        let (f, w) = board.snapshot();
        assert_eq!((f.unlisted, w.len()), (2, 1));
    }

    #[test]
    fn a_forked_process_reads_what_the_parent_publishes_after_the_fork() {
        let board = Board::new(2).unwrap();
        let mut fds = [0; 2];
        // SAFETY: a pipe into a local array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let [r, wr] = fds;
        // SAFETY: the child only reads the board, writes one byte and exits with `_exit`
        // (no allocation, no lock taken after the fork in a multi-threaded test process).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let mut byte = [0u8; 1];
            // SAFETY: reads into a local byte; `_exit` ends the child without unwinding.
            unsafe {
                libc::read(r, byte.as_mut_ptr().cast(), 1);
                let header = board.header();
                let ok = header.accepted.load(Ordering::Acquire) == 42
                    && board.slot(0).id.load(Ordering::Acquire) == 77;
                libc::_exit(i32::from(!ok));
            }
        }
        let front = FrontState {
            accepted: 42,
            ..FrontState::default()
        };
        board.publish(1, &front, &[worker(77, 1)]);
        // SAFETY: writes one byte from a local; then waits for the child.
        let status = unsafe {
            libc::write(wr, [1u8].as_ptr().cast(), 1);
            let mut status = 0;
            libc::waitpid(pid, &raw mut status, 0);
            libc::close(r);
            libc::close(wr);
            status
        };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
}
