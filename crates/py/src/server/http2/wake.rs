//! The wakers the connection gives `h2`: they only record what woke (the connection, or a
//! stream by id), for the next round of the drive (`H2Conn::drive`) to look at. Every wake-up
//! comes from the loop thread itself (`h2` has no thread), so a flag and a short list suffice.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Wake;

/// What woke since the last look: the connection, and which streams.
#[derive(Default)]
pub(super) struct Woken {
    pub(super) conn: AtomicBool,
    streams: Mutex<Vec<u32>>,
}

impl Woken {
    pub(super) fn take_streams(&self) -> Vec<u32> {
        let mut ids = std::mem::take(
            &mut *self
                .streams
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    pub(super) fn any(&self) -> bool {
        self.conn.load(Ordering::Relaxed)
            || !self
                .streams
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .is_empty()
    }
}

pub(super) struct ConnWake(pub(super) Arc<Woken>);

impl Wake for ConnWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.conn.store(true, Ordering::Relaxed);
    }
}

pub(super) struct StreamWake {
    pub(super) woken: Arc<Woken>,
    pub(super) id: u32,
}

impl Wake for StreamWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut ids = self
            .woken
            .streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        ids.push(self.id);
    }
}
