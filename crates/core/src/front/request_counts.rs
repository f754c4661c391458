//! A worker's request counters on its seat of the board ([`super::Board`]): requests answered
//! by method and status class, and a histogram of their durations, for `--metrics`.
//!
//! Invariants:
//! - One writer per seat (its worker's loop thread): each update is a relaxed load and store,
//!   no read-modify-write instruction. Readers in other processes load each counter whole; a
//!   scrape may see a request counted in `by_method_status` and not yet in the histogram, and
//!   never a counter going back (counters only grow until the seat is reopened).
//! - Fixed sizes ([`METHODS`], [`STATUS_CLASSES`], [`BUCKETS`]): the layout lives in shared
//!   memory, so it cannot grow with what clients send.

use std::sync::atomic::{AtomicU64, Ordering};

/// The methods counted by name; every other method counts as `other`.
pub const METHODS: [&str; 8] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "other",
];
/// Status classes, `1xx` to `5xx`.
pub const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
/// Upper bounds (seconds) of the duration histogram's buckets; one more bucket counts the rest.
pub const BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

const CELLS: usize = METHODS.len() * STATUS_CLASSES.len();

/// The index in [`METHODS`] of a request method.
pub fn method_index(method: &[u8]) -> usize {
    METHODS[..METHODS.len() - 1]
        .iter()
        .position(|m| m.as_bytes() == method)
        .unwrap_or(METHODS.len() - 1)
}

/// The index in [`STATUS_CLASSES`] of a status code (codes outside 100-599 count as `5xx`).
pub fn status_index(status: u16) -> usize {
    match status {
        100..=599 => usize::from(status / 100 - 1),
        _ => STATUS_CLASSES.len() - 1,
    }
}

/// The counters in shared memory.
#[repr(C)]
pub(super) struct RequestCounts {
    by_method_status: [AtomicU64; CELLS],
    buckets: [AtomicU64; BUCKETS.len() + 1],
    duration_sum_ns: AtomicU64,
}

/// A copy of one seat's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTotals {
    /// Indexed `method * STATUS_CLASSES.len() + status class`.
    pub by_method_status: [u64; CELLS],
    /// Requests per bucket (not cumulative); the last is above every bound.
    pub buckets: [u64; BUCKETS.len() + 1],
    pub duration_sum_ns: u64,
}

impl Default for RequestTotals {
    fn default() -> Self {
        Self {
            by_method_status: [0; CELLS],
            buckets: [0; BUCKETS.len() + 1],
            duration_sum_ns: 0,
        }
    }
}

impl RequestTotals {
    /// Requests answered with `method` (index) and status class (index).
    pub fn count(&self, method: usize, class: usize) -> u64 {
        self.by_method_status[method * STATUS_CLASSES.len() + class]
    }

    pub fn add(&mut self, other: &Self) {
        for (a, b) in self.by_method_status.iter_mut().zip(other.by_method_status) {
            *a += b;
        }
        for (a, b) in self.buckets.iter_mut().zip(other.buckets) {
            *a += b;
        }
        self.duration_sum_ns += other.duration_sum_ns;
    }
}

fn bump(counter: &AtomicU64, by: u64) {
    // One writer: no other store can come between this load and store.
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

impl RequestCounts {
    pub(super) fn reset(&self) {
        let all = self.by_method_status.iter().chain(&self.buckets);
        for counter in all.chain([&self.duration_sum_ns]) {
            counter.store(0, Ordering::Relaxed);
        }
    }

    /// One request answered (the seat's worker only).
    pub(super) fn record(&self, method: usize, status: u16, duration_ns: u64) {
        let cell = method.min(METHODS.len() - 1) * STATUS_CLASSES.len() + status_index(status);
        bump(&self.by_method_status[cell], 1);
        let seconds = duration_ns as f64 * 1e-9;
        let bucket = BUCKETS
            .iter()
            .position(|&bound| seconds <= bound)
            .unwrap_or(BUCKETS.len());
        bump(&self.buckets[bucket], 1);
        bump(&self.duration_sum_ns, duration_ns);
    }

    /// Adds `t` (the process that retires seats only: one writer).
    pub(super) fn add(&self, t: &RequestTotals) {
        for (c, v) in self.by_method_status.iter().zip(t.by_method_status) {
            bump(c, v);
        }
        for (c, v) in self.buckets.iter().zip(t.buckets) {
            bump(c, v);
        }
        bump(&self.duration_sum_ns, t.duration_sum_ns);
    }

    pub(super) fn read(&self) -> RequestTotals {
        let mut t = RequestTotals::default();
        for (out, c) in t.by_method_status.iter_mut().zip(&self.by_method_status) {
            *out = c.load(Ordering::Relaxed);
        }
        for (out, c) in t.buckets.iter_mut().zip(&self.buckets) {
            *out = c.load(Ordering::Relaxed);
        }
        t.duration_sum_ns = self.duration_sum_ns.load(Ordering::Relaxed);
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_and_statuses_fall_in_their_cells() {
        assert_eq!(method_index(b"GET"), 0);
        assert_eq!(method_index(b"OPTIONS"), 6);
        assert_eq!(method_index(b"get"), 7);
        assert_eq!(method_index(b"PROPFIND"), 7);
        assert_eq!(
            [100, 204, 308, 404, 503, 999, 42].map(status_index),
            [0, 1, 2, 3, 4, 4, 4]
        );
    }

    #[test]
    fn a_request_counts_once_in_its_cell_and_its_bucket() {
        // Built on the stack here; on a board it lives in shared memory.
        let counts: RequestCounts = RequestCounts {
            by_method_status: std::array::from_fn(|_| AtomicU64::new(0)),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            duration_sum_ns: AtomicU64::new(0),
        };
        counts.record(method_index(b"POST"), 201, 3_000_000);
        counts.record(method_index(b"POST"), 500, 20_000_000_000);
        counts.record(method_index(b"GET"), 200, 1_000_000);
        let t = counts.read();
        assert_eq!((t.count(2, 1), t.count(2, 4), t.count(0, 1)), (1, 1, 1));
        assert_eq!(t.by_method_status.iter().sum::<u64>(), 3);
        // 1 ms is in the first bucket (bounds are inclusive), 3 ms in the 5 ms one, 20 s above all.
        assert_eq!(
            (t.buckets[0], t.buckets[2], t.buckets[BUCKETS.len()]),
            (1, 1, 1)
        );
        assert_eq!(t.duration_sum_ns, 20_004_000_000);
        let mut sum = RequestTotals::default();
        sum.add(&t);
        sum.add(&t);
        assert_eq!(sum.count(2, 1), 2);
        counts.reset();
        assert_eq!(counts.read(), RequestTotals::default());
    }
}
