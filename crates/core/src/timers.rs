//! The timer heap: a 4-ary min-heap on `(when, seq)` with an index from each timer to its heap
//! slot, so cancelling a timer removes it in O(log n) without scanning and without leaving a
//! tombstone for the loop to skip later.
//!
//! The heap array holds each timer's sort key itself (its deadline as order-preserving bits,
//! and its sequence number), not an index to look the key up through: a comparison reads two
//! neighbouring entries instead of two random slots, and with four children per node a pop
//! walks half as many levels as a binary heap's. Entries move into a hole instead of being
//! swapped, so each level costs one write plus the moved timer's `pos`. Measured on 20k timers
//! due in one 10 ms window (`benchmarks/loop/shapes.py dense_timers`, callgrind), see
//! `docs/measurements.md` 2026-11-28.
//!
//! Invariants:
//! - `heap[i].slot` is a slot index; `slots[heap[i].slot].pos == i` for every live slot, and
//!   `heap[i]` is not less than `heap[(i - 1) / ARITY]`.
//! - A live slot has `value: Some(_)`; a free slot is on `free` and has `value: None`.
//! - `TimerId` carries the slot's generation, so an id kept after its timer fired or was removed
//!   can never remove a newer timer that reused the slot.
//! - Equal deadlines fire in insertion order (`seq`), which asyncio's heapq does not promise but
//!   every user expects.

/// Children per heap node.
const ARITY: usize = 4;

/// A handle on one scheduled timer, valid until it fires or is removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerId {
    slot: u32,
    generation: u32,
}

impl TimerId {
    /// Packs the id into a `u64` that is never `u64::MAX`, so a caller can keep it in an atomic
    /// with `u64::MAX` as "not scheduled".
    pub fn to_bits(self) -> u64 {
        (u64::from(self.generation & 0x7fff_ffff) << 32) | u64::from(self.slot)
    }

    pub fn from_bits(bits: u64) -> Self {
        Self {
            slot: bits as u32,
            generation: (bits >> 32) as u32,
        }
    }
}

/// `when` as bits whose unsigned order is `f64::total_cmp`'s order, and back.
fn order_bits(when: f64) -> u64 {
    let bits = when.to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | (1 << 63)
    }
}

fn from_order_bits(key: u64) -> f64 {
    f64::from_bits(if key >> 63 == 1 {
        key & !(1 << 63)
    } else {
        !key
    })
}

/// One heap entry: the sort key, and the slot of the timer it belongs to.
#[derive(Clone, Copy, Debug)]
struct Entry {
    key: u64,
    seq: u64,
    slot: u32,
}

impl Entry {
    #[inline]
    fn less(&self, other: &Self) -> bool {
        (self.key, self.seq) < (other.key, other.seq)
    }
}

#[derive(Debug)]
struct Slot<T> {
    pos: usize,
    generation: u32,
    value: Option<T>,
}

#[derive(Debug)]
pub struct Timers<T> {
    heap: Vec<Entry>,
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    next_seq: u64,
}

impl<T> Default for Timers<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Timers<T> {
    pub fn new() -> Self {
        Self {
            heap: Vec::new(),
            slots: Vec::new(),
            free: Vec::new(),
            next_seq: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Schedules `value` at `when` (seconds on the loop clock).
    pub fn insert(&mut self, when: f64, value: T) -> TimerId {
        let seq = self.next_seq;
        self.next_seq += 1;
        let pos = self.heap.len();
        let slot = if let Some(slot) = self.free.pop() {
            let s = &mut self.slots[slot as usize];
            s.pos = pos;
            s.value = Some(value);
            slot
        } else {
            let slot = u32::try_from(self.slots.len()).expect("more than 4 billion timers");
            self.slots.push(Slot {
                pos,
                generation: 0,
                value: Some(value),
            });
            slot
        };
        self.heap.push(Entry {
            key: order_bits(when),
            seq,
            slot,
        });
        self.sift_up(pos);
        TimerId {
            slot,
            generation: self.slots[slot as usize].generation,
        }
    }

    /// The earliest deadline, if any.
    pub fn peek_when(&self) -> Option<f64> {
        self.heap.first().map(|e| from_order_bits(e.key))
    }

    /// Removes and returns the earliest timer if its deadline is before `deadline`.
    pub fn pop_before(&mut self, deadline: f64) -> Option<T> {
        let top = self.heap.first()?;
        if top.key < order_bits(deadline) {
            Some(self.remove_at(0))
        } else {
            None
        }
    }

    /// Removes a scheduled timer. `None` if it already fired or was removed.
    pub fn remove(&mut self, id: TimerId) -> Option<T> {
        let s = self.slots.get(id.slot as usize)?;
        if s.generation != id.generation || s.value.is_none() {
            return None;
        }
        let pos = s.pos;
        Some(self.remove_at(pos))
    }

    /// Every scheduled value, in no particular order (for the garbage collector's traversal).
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.heap
            .iter()
            .filter_map(|e| self.slots[e.slot as usize].value.as_ref())
    }

    /// Removes every timer, returning their values (so the caller can drop them where it is
    /// safe to run destructors).
    pub fn drain(&mut self) -> Vec<T> {
        let mut out = Vec::with_capacity(self.heap.len());
        for s in &mut self.slots {
            if let Some(v) = s.value.take() {
                out.push(v);
            }
        }
        self.heap.clear();
        self.slots.clear();
        self.free.clear();
        out
    }

    fn remove_at(&mut self, pos: usize) -> T {
        let removed = self.heap.swap_remove(pos);
        if pos < self.heap.len() {
            // The moved entry may belong above or below its new place.
            if pos > 0 && self.heap[pos].less(&self.heap[(pos - 1) / ARITY]) {
                self.sift_up(pos);
            } else {
                self.sift_down(pos);
            }
        }
        let s = &mut self.slots[removed.slot as usize];
        s.generation = s.generation.wrapping_add(1) & 0x7fff_ffff;
        let v = s.value.take().expect("heap holds only live slots");
        self.free.push(removed.slot);
        v
    }

    /// Puts `entry` at heap position `pos` and records it in its slot.
    #[inline]
    fn place(&mut self, pos: usize, entry: Entry) {
        self.heap[pos] = entry;
        self.slots[entry.slot as usize].pos = pos;
    }

    fn sift_up(&mut self, mut pos: usize) {
        let entry = self.heap[pos];
        while pos > 0 {
            let parent = (pos - 1) / ARITY;
            let above = self.heap[parent];
            if !entry.less(&above) {
                break;
            }
            self.place(pos, above);
            pos = parent;
        }
        self.place(pos, entry);
    }

    fn sift_down(&mut self, mut pos: usize) {
        let n = self.heap.len();
        let entry = self.heap[pos];
        loop {
            let first = ARITY * pos + 1;
            if first >= n {
                break;
            }
            let mut child = first;
            for c in first + 1..(first + ARITY).min(n) {
                if self.heap[c].less(&self.heap[child]) {
                    child = c;
                }
            }
            let below = self.heap[child];
            if !below.less(&entry) {
                break;
            }
            self.place(pos, below);
            pos = child;
        }
        self.place(pos, entry);
    }

    #[cfg(test)]
    fn check_invariants(&self) {
        for (i, e) in self.heap.iter().enumerate() {
            assert_eq!(self.slots[e.slot as usize].pos, i);
            assert!(self.slots[e.slot as usize].value.is_some());
            if i > 0 {
                assert!(
                    !e.less(&self.heap[(i - 1) / ARITY]),
                    "heap order broken at {i}"
                );
            }
        }
        let live = self.slots.iter().filter(|s| s.value.is_some()).count();
        assert_eq!(live, self.heap.len());
        assert_eq!(live + self.free.len(), self.slots.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator so the tests need no crates.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            self.0 >> 33
        }
    }

    #[test]
    fn pops_in_deadline_order_then_fifo() {
        let mut t = Timers::new();
        t.insert(3.0, "c");
        t.insert(1.0, "a1");
        t.insert(2.0, "b");
        t.insert(1.0, "a2");
        let mut out = Vec::new();
        while let Some(v) = t.pop_before(f64::INFINITY) {
            out.push(v);
        }
        assert_eq!(out, ["a1", "a2", "b", "c"]);
    }

    #[test]
    fn pop_before_respects_deadline() {
        let mut t = Timers::new();
        t.insert(5.0, 5);
        assert_eq!(t.pop_before(5.0), None);
        assert_eq!(t.peek_when(), Some(5.0));
        assert_eq!(t.pop_before(5.000_001), Some(5));
        assert!(t.is_empty());
    }

    #[test]
    fn remove_is_exact_and_ids_do_not_outlive_their_timer() {
        let mut t = Timers::new();
        let a = t.insert(1.0, 'a');
        let b = t.insert(2.0, 'b');
        assert_eq!(t.remove(a), Some('a'));
        assert_eq!(t.remove(a), None);
        // The freed slot is reused; the stale id must not reach the new timer.
        let c = t.insert(0.5, 'c');
        assert_eq!(t.remove(a), None);
        assert_eq!(t.len(), 2);
        assert_eq!(t.remove(b), Some('b'));
        assert_eq!(t.pop_before(10.0), Some('c'));
        assert_eq!(t.remove(c), None);
    }

    #[test]
    fn random_inserts_and_removes_keep_the_heap_valid() {
        let mut rng = Lcg(42);
        let mut t = Timers::new();
        let mut live: Vec<(TimerId, u64)> = Vec::new();
        for step in 0..20_000_u64 {
            match rng.next() % 3 {
                0 | 1 => {
                    let when = (rng.next() % 1000) as f64;
                    live.push((t.insert(when, step), step));
                }
                _ if !live.is_empty() => {
                    let i = (rng.next() as usize) % live.len();
                    let (id, v) = live.swap_remove(i);
                    assert_eq!(t.remove(id), Some(v));
                }
                _ => {}
            }
            if step % 1000 == 0 {
                t.check_invariants();
            }
        }
        t.check_invariants();
        let mut last = f64::NEG_INFINITY;
        let mut n = 0;
        while let Some(when) = t.peek_when() {
            assert!(when >= last);
            last = when;
            t.pop_before(f64::INFINITY).unwrap();
            n += 1;
        }
        assert_eq!(n, live.len());
    }

    #[test]
    fn deadlines_keep_total_order_and_round_trip_through_order_bits() {
        let values = [
            f64::NEG_INFINITY,
            -1e300,
            -1.0,
            -0.0,
            0.0,
            1e-300,
            1.0,
            1e300,
            f64::INFINITY,
        ];
        for pair in values.windows(2) {
            assert!(order_bits(pair[0]) < order_bits(pair[1]), "{pair:?}");
        }
        for v in values {
            assert_eq!(from_order_bits(order_bits(v)).to_bits(), v.to_bits());
        }
    }

    #[test]
    fn ids_round_trip_through_bits() {
        let mut t = Timers::new();
        let id = t.insert(1.0, ());
        let bits = id.to_bits();
        assert_ne!(bits, u64::MAX);
        assert_eq!(t.remove(TimerId::from_bits(bits)), Some(()));
    }

    #[test]
    fn drain_returns_everything() {
        let mut t = Timers::new();
        for i in 0..10 {
            t.insert(f64::from(i), i);
        }
        assert_eq!(t.iter().count(), 10);
        let mut v = t.drain();
        v.sort_unstable();
        assert_eq!(v, (0..10).collect::<Vec<_>>());
        assert!(t.is_empty());
        t.insert(1.0, 1);
        assert_eq!(t.len(), 1);
    }
}
