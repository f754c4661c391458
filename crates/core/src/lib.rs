//! ferroloop's engine, without Python.
//!
//! Everything here is plain Rust that an event loop thread drives: the [`poller`] (epoll), the
//! [`waker`] (an eventfd), the [`inject`] queue through which other threads hand work to the loop
//! with a coalesced wake-up, the [`timers`] heap with O(log n) cancellation, the [`ready`] queue
//! with asyncio's batch rule, the [`poll_budget`] that bounds how long ready work runs between two
//! polls for I/O, and the [`outq`] write queue (vectored writes, sendfile). The Python extension (`crates/py`) owns one of each per loop and adds
//! the Python objects on top.
//!
//! The [`http`] module is the server's HTTP/1.1 codec, sans-IO (bytes in, parsed heads and body
//! runs out, response bytes to send) and the server connection over it (`http::conn`, a state
//! machine with a printable transition table): the native server drives them, and they can be
//! tested and fuzzed without sockets or Python. The [`ws`] module is the WebSocket (RFC 6455) codec for
//! the connections the server upgrades, sans-IO in the same way: client bytes in, messages and
//! control frames out, frame headers to send.
//!
//! Ownership rule for the whole crate: a `Poller` and a `Timers` are owned by exactly one loop
//! thread; only `Injector` (and the `Waker` inside it) is shared with other threads, and it is
//! `Sync` by construction (a mutex plus atomics).

pub mod clock;
pub mod front;
pub mod handoff;
pub mod http;
pub mod inject;
pub mod intmap;
pub mod loop_stats;
pub mod net;
pub mod outq;
pub mod poll_budget;
pub mod poller;
pub mod ready;
pub mod sys;
#[cfg(test)]
mod test_rng;
pub mod timers;
pub mod tls;
pub mod waker;
pub mod ws;

pub use inject::{Injector, PushOutcome, Sealed};
pub use intmap::IntMap;
pub use loop_stats::LoopStats;
pub use outq::{Flushed, OutQueue, WriteCall};
pub use poll_budget::{PollBudget, PollDecision};
pub use poller::{Events, Interest, Modified, Poller, Readiness};
pub use ready::ReadyQueue;
pub use timers::{TimerId, Timers};
pub use waker::Waker;
