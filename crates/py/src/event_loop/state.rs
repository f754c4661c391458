//! `State`: what the loop thread owns behind the GIL (`LoopCell`): the ready queue, the timer
//! heap, the fd table, the poll budget and the batch bookkeeping.
//!
//! Invariants: touched only with the GIL held, on the loop thread or with the loop not running
//! (see `cell.rs`); no borrow of it is held across the poll or across a call into Python
//! (`iteration.rs`).

use std::os::fd::RawFd;

use ferroloop_core::{IntMap, LoopStats, PollBudget, ReadyQueue, Timers};
use pyo3::prelude::*;

use super::fds::FdEntry;
use super::Injected;
use crate::handle::{Ready, TimerHandle};

#[derive(Default)]
pub(super) struct State {
    pub(super) ready: ReadyQueue<Ready>,
    pub(super) timers: Timers<Py<TimerHandle>>,
    /// Looked up once per ready fd per iteration: an `IntMap` (SipHash cost about 100
    /// instructions per lookup; fd numbers come from the kernel, not from peers).
    pub(super) fds: IntMap<RawFd, FdEntry>,
    /// Fds whose entry a socket operation parked since the last poll (`fds.rs`); some may have
    /// been taken back or removed since. Emptied before every poll.
    pub(super) parked: Vec<RawFd>,
    /// The generation of the last epoll token handed out (`next_token`).
    pub(super) generation: u32,
    pub(super) thread_id: Option<u64>,
    /// A ready batch is running (`run_ready`): writes may be held back until it ends.
    pub(super) in_batch: bool,
    /// Writes held back (`defer_flush`), flushed in order when the batch ends.
    pub(super) deferred: Vec<(Py<PyAny>, DeferredFlush)>,
    /// Native work to run once the running batch's entries have run (`push_call_at_batch_end`).
    /// Empty outside a batch: `end_batch` queues what is left for the next one.
    pub(super) batch_end: Vec<Ready>,
    /// `batch_end` is running: work queued now waits for the next iteration.
    pub(super) in_batch_end: bool,
    /// When an iteration with ready work polls for I/O (`iteration.rs`).
    pub(super) poll_budget: PollBudget,
    /// Iterations, polls, busy time and timer lag, once `enable_metrics()` was called
    /// (`metrics.rs`).
    pub(super) stats: LoopStats,
    /// An empty buffer with room, handed to the injector at each drain (`drain_pending`) for
    /// the next batch of pushes: the two alternate, so a thread pushing thousands of
    /// `call_soon_threadsafe` calls per switch of the GIL does not regrow the injector's queue
    /// from empty every time (reallocations of hundreds of KiB, and their page faults).
    pub(super) injector_spare: Vec<Injected>,
}

impl State {
    /// A token for a new registration of `fd`: the fd in the low 32 bits, a new generation
    /// above. Never `WAKER_TOKEN` (an fd is never -1).
    pub(super) fn next_token(&mut self, fd: RawFd) -> u64 {
        self.generation = self.generation.wrapping_add(1);
        (u64::from(self.generation) << 32) | u64::from(fd as u32)
    }
}

/// Writes a target's held-back output (see `LoopCore::defer_flush`).
pub(crate) type DeferredFlush = fn(&Bound<'_, PyAny>) -> PyResult<()>;
