//! The ready queue: FIFO of callbacks due in this iteration, with asyncio's batch rule.
//!
//! asyncio runs exactly the callbacks that were ready when the run step began; callbacks they
//! schedule wait for the next iteration. `take_batch` implements that by swapping the whole
//! queue out (O(1), no per-item lock), and `restore_unrun` puts back what an interrupted batch
//! (KeyboardInterrupt) did not run, ahead of anything queued since, so no callback is lost or
//! reordered.
//!
//! Invariant: items leave only through `take_batch`/`drain`, in push order.

use std::collections::VecDeque;

#[derive(Debug)]
pub struct ReadyQueue<T> {
    queue: VecDeque<T>,
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
        std::mem::take(&mut self.queue)
    }

    /// Puts the unrun rest of a batch back in front of whatever was queued meanwhile.
    pub fn restore_unrun(&mut self, mut rest: VecDeque<T>) {
        rest.append(&mut self.queue);
        self.queue = rest;
    }

    /// Returns a fully run (empty) batch so its allocation serves the next iteration.
    pub fn recycle(&mut self, batch: VecDeque<T>) {
        debug_assert!(batch.is_empty(), "recycle takes a fully run batch");
        if self.queue.is_empty() && batch.capacity() > self.queue.capacity() {
            self.queue = batch;
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
        q.push(1);
        assert!(q.queue.capacity() >= cap);
    }

    #[test]
    fn recycle_never_drops_queued_items() {
        let mut q = ReadyQueue::new();
        q.push(1);
        q.recycle(VecDeque::with_capacity(64));
        assert_eq!(q.len(), 1);
    }
}
