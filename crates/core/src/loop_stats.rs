//! Counters of one loop's iterations, for `loop.metrics()` and the server's `--metrics`: how
//! many iterations and polls, how long the loop waited for I/O, how long each iteration ran
//! ready work (the callbacks, the timers due, the loop's own bookkeeping), and how late timers
//! were dispatched against their deadline.
//!
//! Invariants:
//! - Owned by the loop's thread, like the rest of its state: plain fields, no atomics.
//! - Off until [`LoopStats::enable`]: every recording method then returns after one branch, so
//!   a loop nobody measures pays nothing else. On, they use only the clock reads the iteration
//!   makes anyway (no extra system call or clock read).
//! - The histograms' bounds are fixed ([`BUCKETS`]), so a snapshot is a fixed-size copy.

/// Upper bounds (seconds) of the histograms' buckets; one more bucket counts the rest.
pub const BUCKETS: [f64; 8] = [1e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 0.1, 1.0];

/// Observations by bucket (not cumulative; the last is above every bound) and their sum.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Histogram {
    pub counts: [u64; BUCKETS.len() + 1],
    pub sum: f64,
}

impl Histogram {
    pub fn observe(&mut self, seconds: f64) {
        let i = BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(BUCKETS.len());
        self.counts[i] += 1;
        self.sum += seconds;
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// One loop's counters (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LoopStats {
    enabled: bool,
    /// When the running iteration began its ready work (0: none yet).
    work_started: f64,
    pub iterations: u64,
    /// Polls for I/O (`epoll_wait` calls; an iteration with ready work may skip its poll).
    pub polls: u64,
    /// Seconds spent in polls that could block.
    pub poll_wait: f64,
    /// Per iteration: from the start of its ready work to the start of the next iteration.
    pub busy: Histogram,
    /// Per timer dispatched: how long after its deadline the iteration that ran it began.
    pub timer_lag: Histogram,
}

impl LoopStats {
    /// Starts counting (idempotent); the counts start from zero the first time.
    pub fn enable(&mut self) {
        if !self.enabled {
            *self = Self {
                enabled: true,
                ..Self::default()
            };
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// An iteration starts at `now`: the previous one's ready work ended.
    #[inline]
    pub fn iteration(&mut self, now: f64) {
        if !self.enabled {
            return;
        }
        self.iterations += 1;
        if self.work_started > 0.0 {
            self.busy.observe((now - self.work_started).max(0.0));
            self.work_started = 0.0;
        }
    }

    /// A poll from `before` to `after` (equal when it could not block).
    #[inline]
    pub fn polled(&mut self, before: f64, after: f64) {
        if !self.enabled {
            return;
        }
        self.polls += 1;
        self.poll_wait += (after - before).max(0.0);
    }

    /// The iteration's ready work starts at `now` (after its poll, if any).
    #[inline]
    pub fn work_starts(&mut self, now: f64) {
        if self.enabled {
            self.work_started = now.max(f64::MIN_POSITIVE);
        }
    }

    /// A timer due at `when` is dispatched by the iteration whose clock read `now`.
    #[inline]
    pub fn timer_fired(&mut self, now: f64, when: f64) {
        if self.enabled {
            self.timer_lag.observe((now - when).max(0.0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_counted_until_enabled() {
        let mut s = LoopStats::default();
        s.iteration(1.0);
        s.polled(1.0, 2.0);
        s.work_starts(2.0);
        s.timer_fired(2.0, 1.0);
        s.iteration(3.0);
        assert_eq!(s, LoopStats::default());
    }

    #[test]
    fn iterations_polls_busy_time_and_timer_lag_are_counted() {
        let mut s = LoopStats::default();
        s.enable();
        s.iteration(10.0);
        s.polled(10.0, 10.5);
        s.work_starts(10.5);
        s.timer_fired(10.5, 10.499_995); // 5 µs late
        s.timer_fired(10.5, 10.6); // early (within the clock's resolution): 0
        s.iteration(10.502); // 2 ms of work
        s.polled(10.502, 10.502);
        s.work_starts(10.502);
        s.iteration(12.502); // 2 s of work: above every bound
        assert_eq!((s.iterations, s.polls), (3, 2));
        assert!((s.poll_wait - 0.5).abs() < 1e-9);
        assert_eq!(s.busy.count(), 2);
        assert_eq!(s.busy.counts[4], 1, "2 ms is in the 5 ms bucket");
        assert_eq!(s.busy.counts[BUCKETS.len()], 1);
        assert_eq!(s.timer_lag.counts[0], 2, "5 µs and 0 are under 10 µs");
        assert!((s.busy.sum - 2.002).abs() < 1e-9);
        s.enable();
        assert_eq!(s.iterations, 3, "enabling again keeps the counts");
    }
}
