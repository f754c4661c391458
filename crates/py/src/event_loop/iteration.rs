//! One loop iteration (`run_once`), as asyncio's `_run_once`:
//! 1. read the clock once; with ready work (or Rust tasks taken in by a `call_soon`) skip the
//!    poll while the poll budget lasts (`ferroloop_core::poll_budget`: no system call until
//!    100 µs of ready work have run since the last poll), else timeout = 0; with a stop
//!    pending, timeout = 0; otherwise until the earliest timer (short of the kernel's timer
//!    slack when that is more than 50 ms out: `short_of_slack`), else forever;
//! 2. wait for I/O (GIL released only when the timeout is not zero), unless step 1 skipped it;
//! 3. queue the reader/writer handles of ready fds, then everything injected from other threads
//!    (injected Rust tasks run here, as a batch of their own: see step 6);
//! 4. move due timers (deadline < now + clock resolution) to the ready queue;
//! 5. run exactly the handles that were ready when step 5 began; later ones wait a turn, except
//!    native work queued for the batch's end (`push_call_at_batch_end`: the HTTP server's app
//!    starts), which runs once the batch's entries have run;
//! 6. write what the batch held back (`defer_flush`: the HTTP server's responses and small
//!    WebSocket frames leave together at the end of the batch, as uvloop writes streams in its
//!    check phase; asyncio transports still write at once).
//!
//! With `enable_metrics()`, the iteration also counts itself, its poll, its busy time and its
//! timers' lateness (`ferroloop_core::loop_stats`), from the clock reads above and no other.
//!
//! Invariants: no borrow of the loop state is held across the poll (GIL released) or across a
//! call into Python (a callback, a Rust task); nothing is held back (`deferred`) once
//! `run_ready` returns, so no write waits across a poll. A skipped poll skips only steps 2-3's
//! system call and the fd events: the injector's flag, signals and due timers are checked on
//! every iteration; the first iteration of a `run_forever` and the last (stop pending) always
//! poll, so I/O already ready is seen by a run of one iteration, as in asyncio.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use ferroloop_core::poller::short_of_slack;
use ferroloop_core::{clock, IntMap, Interest, PollDecision};
use pyo3::intern;
use pyo3::prelude::*;

use super::fds::FdEntry;
use super::{Injected, LoopCore, State, Taken, CLOCK_RESOLUTION, WAKER_TOKEN};
use crate::handle::{Handle, Ready};
use crate::sock_ops::os_error;

/// The largest injector buffer kept for reuse (entries): a burst beyond it gives its memory back.
const INJECTOR_SPARE_MAX: usize = 1 << 16;

/// What step 1 decided about I/O.
enum PollPlan {
    /// Ready work runs without a poll: the poll budget is not spent.
    Skip,
    /// Poll for I/O, waiting up to this long (`None`: until something happens).
    Wait(Option<Duration>),
}

impl LoopCore {
    /// One loop iteration; see the module docs. `may_skip_poll`: an iteration with ready work
    /// may skip the poll while the poll budget lasts (`_run_forever_native`; `_run_once` always
    /// polls).
    pub(super) fn run_once(slf: &Bound<'_, Self>, may_skip_poll: bool) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        // The iteration's one clock read while ready work is pending: for the budget, the poll
        // timeout and the due timers (a second one only after a poll that may have slept).
        let mut now = clock::monotonic();
        if this.flags.metrics() {
            this.state.borrow(py)?.stats.iteration(now);
        }
        let mut waker_fired = false;
        if let PollPlan::Wait(timeout) = this.poll_plan(py, now, may_skip_poll)? {
            let before = now;
            waker_fired = this.poll_and_queue(py, timeout)?;
            this.shared.injector.woke(waker_fired);
            if timeout != Some(Duration::ZERO) {
                now = clock::monotonic();
            }
            let mut st = this.state.borrow(py)?;
            st.poll_budget.polled(now);
            st.stats.polled(before, now);
        }
        // Rust tasks a `call_soon` took in (`drain_injector`) wait in `injected_tasks` with no
        // wake-up of their own: checked here too.
        if waker_fired || this.shared.injector.has_pending() || this.has_injected_tasks() {
            Self::take_injected(slf)?;
        }
        // A signal may have interrupted the wait: let Python run its handlers (KeyboardInterrupt
        // leaves run_forever here, as in asyncio).
        py.check_signals()?;
        this.queue_due_timers(py, now)?;
        Self::run_ready(slf)
    }

    /// Step 1: skip the poll (ready work, budget left), or poll with a timeout: zero with work
    /// pending, else until the earliest timer, else forever (`None`).
    fn poll_plan(&self, py: Python<'_>, now: f64, may_skip_poll: bool) -> PyResult<PollPlan> {
        let st = self.state.borrow(py)?;
        if self.flags.stopping() {
            // The last iteration of a run polls, as asyncio's does.
            return Ok(PollPlan::Wait(Some(Duration::ZERO)));
        }
        if !st.ready.is_empty() || self.has_injected_tasks() {
            if may_skip_poll && st.poll_budget.decide(now) == PollDecision::Skip {
                return Ok(PollPlan::Skip);
            }
            return Ok(PollPlan::Wait(Some(Duration::ZERO)));
        }
        Ok(PollPlan::Wait(st.timers.peek_when().map(|when| {
            let dt = when - now;
            if dt > 0.0 {
                short_of_slack(Duration::from_secs_f64(dt.min(86400.0 * 365.0)))
            } else {
                Duration::ZERO
            }
        })))
    }

    /// Steps 2 and 3: waits for I/O (the GIL released unless the wait cannot block) and queues
    /// the handles of ready fds. Returns whether the injector's eventfd fired.
    fn poll_and_queue(&self, py: Python<'_>, timeout: Option<Duration>) -> PyResult<bool> {
        self.flush_parked(py)?;
        let mut events = self
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let shared = &*self.shared;
        let waited = if timeout == Some(Duration::ZERO) {
            shared.injector.settle()?;
            shared.poller.wait(&mut events, timeout)
        } else {
            let events_ref = &mut *events;
            let waited = crate::gil::detach_idle(py, || {
                shared.injector.settle()?;
                let t = if shared.injector.prepare_sleep() {
                    timeout
                } else {
                    Some(Duration::ZERO)
                };
                shared.poller.wait(events_ref, t)
            });
            crate::gil::park_if_exiting(py);
            waited
        };
        match waited {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(os_error(py, &e)),
        }
        let mut waker_fired = false;
        let mut stale = false;
        let mut st = self.state.borrow(py)?;
        let State { ready, fds, .. } = &mut *st;
        for (token, r) in events.iter() {
            if token == WAKER_TOKEN {
                waker_fired = true;
                continue;
            }
            // The low 32 bits are the fd (`State::next_token`).
            let entry = match fds.get(&(token as u32 as RawFd)) {
                Some(entry) if entry.token == token => entry,
                _ => {
                    // A registration the table no longer has: its fd was closed while
                    // registered and its file lives on elsewhere (see `Poller::reset`).
                    stale = true;
                    continue;
                }
            };
            let directions = [(r.readable, &entry.reader), (r.writable, &entry.writer)];
            for (is_ready, handle) in directions {
                if let (true, Some(h)) = (is_ready, handle) {
                    if !h.get().is_cancelled() {
                        ready.push(h.clone_ref(py).into());
                    }
                }
            }
        }
        if stale {
            self.reset_poller(fds).map_err(|e| os_error(py, &e))?;
        }
        Ok(waker_fired)
    }

    /// Starts epoll over with what the table watches, dropping registrations that outlived
    /// their fd (which would otherwise be reported, level-triggered, on every wait). An fd the
    /// kernel no longer takes (closed while registered) stays in the table as before: removing
    /// it later counts as done.
    fn reset_poller(&self, fds: &IntMap<RawFd, FdEntry>) -> io::Result<()> {
        let poller = &self.shared.poller;
        poller.reset()?;
        poller.add(
            self.shared.injector.as_raw_fd(),
            WAKER_TOKEN,
            Interest::READ,
        )?;
        for (&fd, entry) in fds {
            if !entry.registered.is_empty() {
                let _ = poller.add(fd, entry.token, entry.registered);
            }
        }
        Ok(())
    }

    /// Step 4: timers due before `now` + clock resolution join the ready queue, all in this one
    /// pass against one clock read.
    fn queue_due_timers(&self, py: Python<'_>, now: f64) -> PyResult<()> {
        let end = now + CLOCK_RESOLUTION;
        let mut st = self.state.borrow(py)?;
        let State {
            ready,
            timers,
            stats,
            ..
        } = &mut *st;
        stats.work_starts(now);
        let measured = stats.enabled();
        loop {
            // The deadline only for the metrics' timer lag (`loop_stats`).
            let when = if measured { timers.peek_when() } else { None };
            let Some(t) = timers.pop_before(end) else {
                break;
            };
            if let Some(when) = when {
                stats.timer_fired(now, when);
            }
            crate::handle::unscheduled(&t);
            ready.push(t.into_bound(py).into_super().unbind().into());
        }
        Ok(())
    }

    /// Step 5: takes the whole ready queue, so handles queued by these callbacks wait for the
    /// next iteration, without a lock per handle; then runs the work queued for the batch's end.
    fn run_ready(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let mut batch = {
            let mut st = this.state.borrow(py)?;
            st.in_batch = true;
            st.ready.take_batch()
        };
        let debug = this.flags.debug();
        while let Some(entry) = batch.pop_front() {
            let result = Self::run_entry(slf, entry, debug);
            if let Err(e) = result {
                // KeyboardInterrupt/SystemExit: the rest stays queued, in order, for the next run;
                // what the batch held back is written all the same.
                this.state.borrow(py)?.ready.restore_unrun(batch);
                Self::end_batch(slf)?;
                return Err(e);
            }
        }
        // Keep the larger allocation for the next iteration.
        this.state.borrow(py)?.ready.recycle(batch);
        let result = Self::run_batch_end(slf, debug);
        Self::end_batch(slf)?;
        result
    }

    /// Step 5b: the work queued for the end of the batch (`push_call_at_batch_end`), in order.
    /// On KeyboardInterrupt/SystemExit the rest is left for `end_batch` to queue.
    fn run_batch_end(slf: &Bound<'_, Self>, debug: bool) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let mut entries = {
            let mut st = this.state.borrow(py)?;
            if st.batch_end.is_empty() {
                return Ok(());
            }
            st.in_batch_end = true;
            std::mem::take(&mut st.batch_end)
        };
        let mut result = Ok(());
        let mut rest = entries.drain(..);
        for entry in rest.by_ref() {
            if let Err(e) = Self::run_entry(slf, entry, debug) {
                result = Err(e);
                break;
            }
        }
        let unrun: Vec<Ready> = rest.collect();
        let mut st = this.state.borrow(py)?;
        // Nothing can have joined `batch_end` while it ran (`in_batch_end`): the unrun rest
        // goes back, and the emptied vector's allocation is kept otherwise.
        if unrun.is_empty() {
            st.batch_end = entries;
        } else {
            st.batch_end = unrun;
        }
        result
    }

    /// Ends the batch: work still waiting for its end (after KeyboardInterrupt, or queued by the
    /// injected Rust tasks' batch) joins the ready queue, and writes held back during it go out
    /// (`defer_flush`), in the order they were deferred. A failing flush is reported as a
    /// failing callback is.
    fn end_batch(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let deferred = {
            let mut st = slf.get().state.borrow(py)?;
            st.in_batch = false;
            st.in_batch_end = false;
            if !st.batch_end.is_empty() {
                let State {
                    ready, batch_end, ..
                } = &mut *st;
                for entry in batch_end.drain(..) {
                    ready.push(entry);
                }
            }
            if st.deferred.is_empty() {
                return Ok(());
            }
            std::mem::take(&mut st.deferred)
        };
        // Every target is flushed even if one raises KeyboardInterrupt: the first such error
        // is returned after the rest.
        let mut fatal = None;
        for (target, flush) in deferred {
            let target = target.into_bound(py);
            if let Err(e) = flush(&target) {
                let loop_ = slf.clone().into_any().unbind();
                if let Err(e) = crate::handle::report_failure(&target, &loop_, e) {
                    fatal.get_or_insert(e);
                }
            }
        }
        fatal.map_or(Ok(()), Err)
    }

    /// Runs one ready-queue entry (a cancelled handle is skipped). `Err` only for
    /// KeyboardInterrupt/SystemExit or a failing exception handler, as `Handle::run`.
    pub(crate) fn run_entry(slf: &Bound<'_, Self>, entry: Ready, debug: bool) -> PyResult<()> {
        let py = slf.py();
        match entry {
            Ready::Handle(queued) => {
                let handle = queued.bind(py);
                if handle.get().is_cancelled() {
                    Ok(())
                } else if debug {
                    slf.call_method1(intern!(py, "_run_handle_debug"), (handle,))
                        .map(drop)
                } else {
                    Handle::run(handle)
                }
            }
            // Queued before debug mode was switched on, if at all: run as they are. Taken as
            // `Bound`s, so that releasing them is a plain decref (a `Py` drop first reads a
            // thread-local GIL counter).
            Ready::Step { step, arg, context } => Ready::run_step(
                slf.as_any(),
                &step.into_bound(py),
                arg.map(|a| a.into_bound(py)).as_ref(),
                &context.into_bound(py),
            ),
            Ready::Task { task, throw } => {
                Ready::run_task(slf.as_any(), &task.into_bound(py), throw)
            }
            Ready::Call { target, run } => {
                let target = target.into_bound(py);
                match run(&target) {
                    Ok(()) => Ok(()),
                    Err(e) => {
                        crate::handle::report_failure(&target, &slf.clone().into_any().unbind(), e)
                    }
                }
            }
        }
    }

    /// Moves everything injected so far into the loop: handles join the ready queue in push
    /// order, Rust tasks wait in `injected_tasks` for `take_injected`. Inlined check: every
    /// `call_soon` asks, and usually nothing is pending.
    #[inline]
    pub(super) fn drain_injector(&self, py: Python<'_>) -> PyResult<()> {
        if !self.shared.injector.has_pending() {
            return Ok(());
        }
        self.drain_pending(py)
    }

    #[inline(never)]
    fn drain_pending(&self, py: Python<'_>) -> PyResult<()> {
        let mut tasks = self
            .injected_tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut st = self.state.borrow(py)?;
        // The spare (empty, with room) becomes the injector's queue; the queued items come out
        // in the queue's own buffer, which is the spare once emptied (`State::injector_spare`).
        let mut batch = std::mem::take(&mut st.injector_spare);
        self.shared.injector.drain_into(&mut batch);
        for item in batch.drain(..) {
            match item {
                // Untracked it stays: the ready queue's traversal visits it in place, and its
                // entry's drop tracks it again if anything else still holds it (handle.rs).
                Injected::Handle(h) => st.ready.push(h.into()),
                Injected::Task(t) => tasks.push(Taken::Rust(t)),
                Injected::Native(w) => tasks.push(Taken::Native(w)),
            }
        }
        if batch.capacity() <= INJECTOR_SPARE_MAX {
            st.injector_spare = batch;
        }
        Ok(())
    }

    /// Rust tasks wait in `injected_tasks` (taken in from the injector, not yet run).
    fn has_injected_tasks(&self) -> bool {
        !self
            .injected_tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_empty()
    }

    /// Step 3b: drains the injector and runs the Rust tasks handed over by other threads.
    fn take_injected(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        this.drain_injector(py)?;
        let mut tasks = std::mem::take(
            &mut *this
                .injected_tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        if tasks.is_empty() {
            return Ok(());
        }
        // The Rust tasks are a batch of their own: responses they send (a WSGI app's, handed
        // over from its pool thread) are written together when they are all done.
        this.state.borrow(py)?.in_batch = true;
        let mut result = Ok(());
        for task in tasks.drain(..) {
            let failed = match task {
                Taken::Rust(t) => t(py).err().map(|e| (e, false)),
                Taken::Native(w) => w
                    .run(py, Some(&this.shared.futures))
                    .err()
                    .map(|e| (e, true)),
            };
            if let Some((e, native)) = failed {
                if let Err(e) = Self::report_injected_failure(slf, e, native) {
                    result = Err(e);
                    break;
                }
            }
        }
        // The emptied buffer serves the next batch, as the injector's spare does.
        if tasks.capacity() <= INJECTOR_SPARE_MAX {
            let mut slot = this
                .injected_tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if slot.is_empty() && slot.capacity() < tasks.capacity() {
                *slot = tasks;
            }
        }
        Self::end_batch(slf)?;
        result
    }
}
