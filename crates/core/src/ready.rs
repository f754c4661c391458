//! The ready queue: FIFO of callbacks due in this iteration, with asyncio's batch rule.
//!
//! asyncio runs exactly the callbacks that were ready when the run step began; callbacks they
//! schedule wait for the next iteration. `take_batch` implements that by swapping the whole
//! queue out (O(1), no per-item lock), and `restore_unrun` puts back what an interrupted batch
//! (KeyboardInterrupt) did not run, ahead of anything queued since, so no callback is lost or
//! reordered.
//!
//! The callbacks of a batch usually queue about as many for the next one (every chain of
//! `call_soon`s, every task step), so the queue they fill would grow from empty, reallocating
//! and copying about log2(N) times per iteration. Instead a run batch's buffer comes back
//! (`recycle`) as the `spare` that the next `take_batch` leaves in the queue's place: in the
//! steady state two buffers take turns and nothing is reallocated.
//!
//! Invariants: items leave only through `take_batch`/`drain`, in push order. `spare` is always
//! empty (only its allocation is kept).

use std::collections::VecDeque;

#[derive(Debug)]
pub struct ReadyQueue<T> {
    queue: VecDeque<T>,
    /// The allocation of the last batch that ran in full, for the next batch's successors.
    spare: VecDeque<T>,
}

impl<T> Default for ReadyQueue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> ReadyQueue<T> {
    pub fn new() -> Self {
        Self {
            queue: VecDeque::new(),
            spare: VecDeque::new(),
        }
    }

    pub fn push(&mut self, item: T) {
        self.queue.push_back(item);
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.queue.iter()
    }

    /// Everything queued now, in order; the queue starts empty for the next batch.
    pub fn take_batch(&mut self) -> VecDeque<T> {
        let next = std::mem::take(&mut self.spare);
        std::mem::replace(&mut self.queue, next)
    }

    /// Puts the unrun rest of a batch back in front of whatever was queued meanwhile.
    pub fn restore_unrun(&mut self, mut rest: VecDeque<T>) {
        rest.append(&mut self.queue);
        self.queue = rest;
    }

    /// Returns a fully run (empty) batch so its allocation serves the next iteration's
    /// successors (the larger of it and the current spare is kept).
    pub fn recycle(&mut self, batch: VecDeque<T>) {
        debug_assert!(batch.is_empty(), "recycle takes a fully run batch");
        if batch.is_empty() && batch.capacity() > self.spare.capacity() {
            self.spare = batch;
        }
    }

    /// Removes everything (loop close); the caller drops the items where that is safe.
    pub fn drain(&mut self) -> VecDeque<T> {
        std::mem::take(&mut self.queue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_holds_only_what_was_ready_when_it_was_taken() {
        let mut q = ReadyQueue::new();
        q.push(1);
        q.push(2);
        let mut batch = q.take_batch();
        // A callback of this batch schedules another: it waits for the next batch.
        q.push(3);
        assert_eq!(batch.pop_front(), Some(1));
        assert_eq!(batch.pop_front(), Some(2));
        assert_eq!(batch.pop_front(), None);
        assert_eq!(q.take_batch().into_iter().collect::<Vec<_>>(), vec![3]);
    }

    #[test]
    fn interrupted_batch_goes_back_in_front_in_order() {
        let mut q = ReadyQueue::new();
        for i in 0..5 {
            q.push(i);
        }
        let mut batch = q.take_batch();
        assert_eq!(batch.pop_front(), Some(0)); // ran, then raised KeyboardInterrupt
        q.push(10); // scheduled by the interrupted callback before it raised
        q.restore_unrun(batch);
        assert_eq!(
            q.drain().into_iter().collect::<Vec<_>>(),
            vec![1, 2, 3, 4, 10]
        );
    }

    #[test]
    fn recycle_keeps_the_larger_allocation() {
        let mut q = ReadyQueue::new();
        for i in 0..1000 {
            q.push(i);
        }
        let mut batch = q.take_batch();
        batch.clear();
        let cap = batch.capacity();
        q.recycle(batch);
        assert!(q.is_empty());
        q.recycle(VecDeque::with_capacity(4));
        drop(q.take_batch());
        q.push(1);
        assert!(q.queue.capacity() >= cap);
    }

    #[test]
    fn steady_batches_take_turns_with_two_allocations() {
        let mut q = ReadyQueue::new();
        for i in 0..1000 {
            q.push(i);
        }
        // Each run item queues one successor, as a chain of call_soon does.
        for round in 0..3 {
            let mut batch = q.take_batch();
            let cap_before = q.queue.capacity();
            while let Some(i) = batch.pop_front() {
                q.push(i + 1);
            }
            if round > 0 {
                assert_eq!(
                    q.queue.capacity(),
                    cap_before,
                    "no reallocation in round {round}"
                );
            }
            q.recycle(batch);
        }
        assert_eq!(q.len(), 1000);
    }

    #[test]
    fn recycle_never_drops_queued_items() {
        let mut q = ReadyQueue::new();
        q.push(1);
        q.recycle(VecDeque::with_capacity(64));
        assert_eq!(q.len(), 1);
    }
}
