//! How long ready work may run before the loop polls for I/O again.
//!
//! asyncio's `_run_once` selects with a zero timeout on every iteration while callbacks are
//! ready: one system call per iteration, which in a program that awaits one thing at a time
//! (two iterations per awaited future) costs more than the callbacks themselves. The loop
//! instead skips the poll of an iteration that has ready work, unless [`PollBudget::interval`]
//! has passed on the loop clock since the last poll. So, while callbacks keep the ready queue
//! busy, an fd that became ready waits at most the interval plus the one iteration that crosses
//! it (asyncio: one iteration); when the ready queue runs dry the loop polls (and may sleep) as
//! before.
//!
//! Only the poll is skipped. Everything else an iteration looks at needs no system call and is
//! still looked at every iteration: work other threads queued (the injector's `pending` flag),
//! due timers (one clock read, from the vDSO), signals (CPython's tripped flag).
//!
//! Invariants: owned by the loop thread. `polled` is told the clock after every poll, so
//! `decide` only ever measures time since a real poll; `force` makes the next decision a poll
//! whatever the clock says (a fresh `run_forever`, whose first iteration polls as asyncio's
//! does, so "run one iteration" idioms still see I/O that is already ready).

/// What an iteration with ready work does about I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum PollDecision {
    /// Poll with a zero timeout: the budget is spent (or a poll was forced).
    Poll,
    /// Run the ready work without polling.
    Skip,
}

/// The time budget of ready work between two polls.
#[derive(Debug, Clone)]
pub struct PollBudget {
    /// Loop clock (seconds) of the last poll; `-inf` when the next decision must poll.
    last_poll: f64,
    interval: f64,
}

impl Default for PollBudget {
    fn default() -> Self {
        Self::new(Self::DEFAULT_INTERVAL)
    }
}

impl PollBudget {
    /// 100 µs, chosen from a sweep of 0, 25, 100, 250 and 1,000 µs (`docs/measurements.md`,
    /// 2026-11-28 10:00-10:50): a zero-timeout `epoll_wait` cost about 0.2-0.3 µs there, two
    /// thirds of a one-callback iteration, so polling every 100 µs costs at most 0.3% of the
    /// loop's time; the storm's rate was at its plateau from 100 µs on, and the echo p50 under a
    /// storm stayed below asyncio's (which polls every iteration), while it grew with longer
    /// budgets. tokio's scheduler polls its driver every 61 tasks, which is of the same order.
    pub const DEFAULT_INTERVAL: f64 = 100e-6;

    /// A budget of `interval` seconds; the first decision polls.
    pub fn new(interval: f64) -> Self {
        Self {
            last_poll: f64::NEG_INFINITY,
            interval,
        }
    }

    pub fn interval(&self) -> f64 {
        self.interval
    }

    /// Sets the interval (a negative or NaN interval counts as zero: poll every iteration).
    pub fn set_interval(&mut self, interval: f64) {
        self.interval = if interval > 0.0 { interval } else { 0.0 };
    }

    /// Whether an iteration that has ready work at `now` polls for I/O.
    pub fn decide(&self, now: f64) -> PollDecision {
        if now - self.last_poll >= self.interval {
            PollDecision::Poll
        } else {
            PollDecision::Skip
        }
    }

    /// A poll ended at `now` (loop clock).
    pub fn polled(&mut self, now: f64) {
        self.last_poll = now;
    }

    /// The next decision polls, whatever the clock.
    pub fn force(&mut self) {
        self.last_poll = f64::NEG_INFINITY;
    }
}

#[cfg(test)]
mod tests {
    use super::{PollBudget, PollDecision};

    #[test]
    fn first_decision_polls() {
        assert_eq!(PollBudget::new(1.0).decide(0.0), PollDecision::Poll);
    }

    #[test]
    fn skips_until_the_interval_has_passed_since_the_last_poll() {
        let mut b = PollBudget::new(0.5);
        b.polled(10.0);
        assert_eq!(b.decide(10.0), PollDecision::Skip);
        assert_eq!(b.decide(10.49), PollDecision::Skip);
        assert_eq!(b.decide(10.5), PollDecision::Poll);
        b.polled(10.6);
        assert_eq!(b.decide(10.7), PollDecision::Skip);
    }

    #[test]
    fn force_polls_next_whatever_the_clock() {
        let mut b = PollBudget::new(0.5);
        b.polled(10.0);
        b.force();
        assert_eq!(b.decide(10.0), PollDecision::Poll);
    }

    #[test]
    fn zero_or_invalid_interval_polls_every_iteration() {
        let mut b = PollBudget::new(1.0);
        for bad in [0.0, -1.0, f64::NAN] {
            b.set_interval(bad);
            b.polled(5.0);
            assert_eq!(b.decide(5.0), PollDecision::Poll);
        }
    }
}
