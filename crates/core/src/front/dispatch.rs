//! Which worker gets a request: the front's policy, without I/O.
//!
//! Rules (the lanes of `--lane-bulk-body` and `--lane-fast-workers`):
//! - A bulk request (its declared body is over the threshold, or chunked) goes only to a
//!   general worker: fast-lane workers never take bulk work.
//! - A small request avoids workers with bulk work in flight while any other worker is alive,
//!   then takes the worker with the fewest requests in flight, and among those the one whose
//!   oldest request is youngest: a worker stuck on one long request is the last choice.
//! - A worker that is leaving (shutting down) takes nothing.
//! - Ties go round-robin from the last choice, so equal workers share the load.

/// A worker's lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Takes any request.
    General,
    /// Takes small requests only.
    Fast,
}

/// What the policy needs to know of one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    pub lane: Lane,
    /// Requests handed to the worker and not yet given back or finished.
    pub in_flight: usize,
    /// Of those, bulk ones.
    pub bulk_in_flight: usize,
    /// The worker is shutting down: it takes nothing new.
    pub leaving: bool,
    /// When its oldest request in flight was handed to it (any clock; `0` with none).
    pub oldest: u64,
}

/// Chooses among `workers` for a request (`bulk` or small); `None` if no worker may take it.
/// `cursor` is where the last choice was: ties are broken by distance from it.
pub fn choose(workers: &[Load], bulk: bool, cursor: usize) -> Option<usize> {
    let n = workers.len();
    (0..n)
        .map(|k| (cursor + 1 + k) % n)
        .filter(|&i| !workers[i].leaving && (!bulk || workers[i].lane == Lane::General))
        .min_by_key(|&i| {
            let w = &workers[i];
            (
                w.bulk_in_flight > 0,
                w.in_flight,
                std::cmp::Reverse(w.oldest),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(lane: Lane, in_flight: usize, bulk_in_flight: usize) -> Load {
        Load {
            lane,
            in_flight,
            bulk_in_flight,
            leaving: false,
            oldest: 0,
        }
    }

    #[test]
    fn bulk_goes_to_general_workers_only() {
        let ws = [w(Lane::Fast, 0, 0), w(Lane::General, 3, 1)];
        assert_eq!(choose(&ws, true, 0), Some(1));
        assert_eq!(choose(&[w(Lane::Fast, 0, 0)], true, 0), None);
    }

    #[test]
    fn small_avoids_workers_with_bulk_in_flight() {
        let ws = [w(Lane::General, 1, 1), w(Lane::Fast, 5, 0)];
        assert_eq!(choose(&ws, false, 0), Some(1));
        // ... unless every worker has some.
        let ws = [w(Lane::General, 2, 1), w(Lane::General, 1, 1)];
        assert_eq!(choose(&ws, false, 0), Some(1));
    }

    #[test]
    fn small_takes_the_least_busy_and_ties_rotate() {
        let ws = [
            w(Lane::General, 2, 0),
            w(Lane::General, 0, 0),
            w(Lane::Fast, 1, 0),
        ];
        assert_eq!(choose(&ws, false, 0), Some(1));
        let idle = [w(Lane::General, 0, 0); 3];
        assert_eq!(choose(&idle, false, 0), Some(1));
        assert_eq!(choose(&idle, false, 1), Some(2));
        assert_eq!(choose(&idle, false, 2), Some(0));
    }

    #[test]
    fn of_equally_loaded_workers_the_one_stuck_longest_is_last() {
        let mut stuck = w(Lane::General, 1, 0);
        stuck.oldest = 100;
        let mut fresh = w(Lane::General, 1, 0);
        fresh.oldest = 900;
        assert_eq!(choose(&[stuck, fresh], false, 1), Some(1));
        assert_eq!(choose(&[fresh, stuck], false, 0), Some(0));
    }

    #[test]
    fn no_workers_no_choice() {
        assert_eq!(choose(&[], false, 0), None);
        let mut leaving = w(Lane::General, 0, 0);
        leaving.leaving = true;
        assert_eq!(
            choose(&[leaving, w(Lane::General, 9, 0)], false, 0),
            Some(1)
        );
        assert_eq!(choose(&[leaving], false, 0), None);
    }
}
