//! A worker's loop counters on its seat of the board ([`super::Board`]), for `--metrics`:
//! the last snapshot of its loop's [`LoopStats`] (iterations, polls, time waiting for I/O, the
//! busy-time and timer-lag histograms), which the worker copies there about once a second.
//!
//! Invariants:
//! - One writer per seat (its worker), who stores a whole snapshot field by field with relaxed
//!   stores; a reader in another process loads each field whole and may see a snapshot half
//!   stored, never a counter going back (each field only grows until the seat is reopened).
//! - The retired workers' part is written only by the process that gives seats, under the
//!   board's retired `seq`.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::loop_stats::{LoopStats, BUCKETS};

const CELLS: usize = BUCKETS.len() + 1;

/// The counters in shared memory (whole nanoseconds for the sums).
#[repr(C)]
pub(super) struct LoopCounts {
    iterations: AtomicU64,
    polls: AtomicU64,
    poll_wait_ns: AtomicU64,
    busy: [AtomicU64; CELLS],
    busy_sum_ns: AtomicU64,
    lag: [AtomicU64; CELLS],
    lag_sum_ns: AtomicU64,
}

/// A copy of one or more seats' loop counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoopTotals {
    pub iterations: u64,
    pub polls: u64,
    pub poll_wait_ns: u64,
    /// Iterations per busy-time bucket (not cumulative; the last is above every bound).
    pub busy: [u64; CELLS],
    pub busy_sum_ns: u64,
    /// Timers per lag bucket (not cumulative).
    pub lag: [u64; CELLS],
    pub lag_sum_ns: u64,
}

fn ns(seconds: f64) -> u64 {
    (seconds * 1e9) as u64
}

impl LoopTotals {
    pub fn add(&mut self, other: &Self) {
        self.iterations += other.iterations;
        self.polls += other.polls;
        self.poll_wait_ns += other.poll_wait_ns;
        for i in 0..CELLS {
            self.busy[i] += other.busy[i];
            self.lag[i] += other.lag[i];
        }
        self.busy_sum_ns += other.busy_sum_ns;
        self.lag_sum_ns += other.lag_sum_ns;
    }
}

impl From<&LoopStats> for LoopTotals {
    fn from(s: &LoopStats) -> Self {
        Self {
            iterations: s.iterations,
            polls: s.polls,
            poll_wait_ns: ns(s.poll_wait),
            busy: s.busy.counts,
            busy_sum_ns: ns(s.busy.sum),
            lag: s.timer_lag.counts,
            lag_sum_ns: ns(s.timer_lag.sum),
        }
    }
}

impl LoopCounts {
    /// Replaces the counters with `t` (the seat's one writer, or the retired part's).
    pub(super) fn store(&self, t: &LoopTotals) {
        let r = Ordering::Relaxed;
        self.iterations.store(t.iterations, r);
        self.polls.store(t.polls, r);
        self.poll_wait_ns.store(t.poll_wait_ns, r);
        for i in 0..CELLS {
            self.busy[i].store(t.busy[i], r);
            self.lag[i].store(t.lag[i], r);
        }
        self.busy_sum_ns.store(t.busy_sum_ns, r);
        self.lag_sum_ns.store(t.lag_sum_ns, r);
    }

    pub(super) fn read(&self) -> LoopTotals {
        let r = Ordering::Relaxed;
        LoopTotals {
            iterations: self.iterations.load(r),
            polls: self.polls.load(r),
            poll_wait_ns: self.poll_wait_ns.load(r),
            busy: std::array::from_fn(|i| self.busy[i].load(r)),
            busy_sum_ns: self.busy_sum_ns.load(r),
            lag: std::array::from_fn(|i| self.lag[i].load(r)),
            lag_sum_ns: self.lag_sum_ns.load(r),
        }
    }

    /// Adds `t` (the retired part, when a worker's seat is given up).
    pub(super) fn add(&self, t: &LoopTotals) {
        let mut sum = self.read();
        sum.add(t);
        self.store(&sum);
    }
}
