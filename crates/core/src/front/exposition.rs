//! The board as Prometheus text (exposition format 0.0.4), for `--metrics`: the workers'
//! request counters summed, their app tasks, and, behind the front, each worker's load and the
//! front's counts.
//!
//! Label values come only from fixed tables (`request_counts`), lanes and process ids, so
//! nothing a client sends reaches the text.

use std::fmt::Write;

use super::board::{FrontState, SeatState, WorkerState, RESTART_REASONS};
use super::loop_counts::LoopTotals;
use super::request_counts::{RequestTotals, BUCKETS, METHODS, STATUS_CLASSES};
use crate::loop_stats::BUCKETS as LOOP_BUCKETS;

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// What is known of the worker processes beside their seats' counters.
#[derive(Debug, Default)]
pub struct Processes<'a> {
    /// Workers replaced so far, by `board::RESTART_REASONS` (`Board::restarts`).
    pub restarts: [u64; RESTART_REASONS.len()],
    /// Resident memory of each worker, `(pid, bytes)`, as [`resident_bytes`] read it.
    pub resident: &'a [(u32, u64)],
    /// The workers' loops, summed, gone ones included (`Board::loop_totals`).
    pub loops: LoopTotals,
}

/// Process `pid`'s resident set in bytes, from `/proc/PID/statm` (`None` if it is gone or
/// the file cannot be read).
pub fn resident_bytes(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf reads a constant of the system; no memory of ours is involved.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

/// The text for `seats` and, when a front publishes on the board, `front`. `now_ns` is the
/// monotonic clock of the scrape (for how long workers have been busy).
/// `total`: the requests of every worker so far, gone ones included (`Board::request_totals`).
pub fn render(
    total: &RequestTotals,
    seats: &[SeatState],
    processes: &Processes<'_>,
    front: Option<(&FrontState, &[WorkerState])>,
    now_ns: u64,
) -> String {
    let mut out = String::with_capacity(4096);
    family(
        &mut out,
        "ferroloop_requests_total",
        "counter",
        "HTTP requests answered by the app (WebSocket upgrades accepted count as 1xx), by \
         method and status class, over every worker since the server started.",
    );
    for (m, method) in METHODS.iter().enumerate() {
        for (c, class) in STATUS_CLASSES.iter().enumerate() {
            let n = total.count(m, c);
            if n > 0 {
                let _ = writeln!(
                    out,
                    "ferroloop_requests_total{{method=\"{method}\",status=\"{class}\"}} {n}"
                );
            }
        }
    }
    family(
        &mut out,
        "ferroloop_request_duration_seconds",
        "histogram",
        "From a request's head read to its response's last byte handed to the socket.",
    );
    let mut cumulative = 0;
    for (i, bound) in BUCKETS.iter().enumerate() {
        cumulative += total.buckets[i];
        let _ = writeln!(
            out,
            "ferroloop_request_duration_seconds_bucket{{le=\"{bound}\"}} {cumulative}"
        );
    }
    cumulative += total.buckets[BUCKETS.len()];
    let _ = writeln!(
        out,
        "ferroloop_request_duration_seconds_bucket{{le=\"+Inf\"}} {cumulative}\n\
         ferroloop_request_duration_seconds_sum {}\n\
         ferroloop_request_duration_seconds_count {cumulative}",
        total.duration_sum_ns as f64 * 1e-9
    );
    family(
        &mut out,
        "ferroloop_requests_in_flight",
        "gauge",
        "App tasks running: requests being answered and open WebSocket sessions.",
    );
    let running: u64 = seats.iter().map(|s| s.tasks_running).sum();
    let _ = writeln!(out, "ferroloop_requests_in_flight {running}");
    family(
        &mut out,
        "ferroloop_worker_busy_seconds",
        "gauge",
        "Per worker: for how long it has had at least one app task running (0: free).",
    );
    for s in seats {
        let busy = if s.busy_since_ns > 0 {
            now_ns.saturating_sub(s.busy_since_ns) as f64 * 1e-9
        } else {
            0.0
        };
        let _ = writeln!(
            out,
            "ferroloop_worker_busy_seconds{{pid=\"{}\"}} {busy}",
            s.pid
        );
    }
    family(
        &mut out,
        "ferroloop_worker_tasks_started_total",
        "counter",
        "Per worker: app tasks started since it started.",
    );
    for s in seats {
        let _ = writeln!(
            out,
            "ferroloop_worker_tasks_started_total{{pid=\"{}\"}} {}",
            s.pid, s.tasks_started
        );
    }
    render_processes(&mut out, processes);
    if let Some((front, workers)) = front {
        render_front(&mut out, front, workers);
    }
    out
}

/// One counter without labels.
fn counter(out: &mut String, name: &str, help: &str, value: impl std::fmt::Display) {
    family(out, name, "counter", help);
    let _ = writeln!(out, "{name} {value}");
}

fn histogram(out: &mut String, name: &str, counts: &[u64], sum_ns: u64) {
    let mut cumulative = 0;
    for (i, bound) in LOOP_BUCKETS.iter().enumerate() {
        cumulative += counts[i];
        let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
    }
    cumulative += counts[LOOP_BUCKETS.len()];
    let _ = writeln!(
        out,
        "{name}_bucket{{le=\"+Inf\"}} {cumulative}\n{name}_sum {}\n{name}_count {cumulative}",
        sum_ns as f64 * 1e-9
    );
}

fn render_loops(out: &mut String, loops: &LoopTotals) {
    for (name, help, value) in [
        (
            "ferroloop_loop_iterations_total",
            "Loop iterations, over every worker's loop.",
            loops.iterations as f64,
        ),
        (
            "ferroloop_loop_polls_total",
            "Polls for I/O (an iteration with ready work may skip its poll).",
            loops.polls as f64,
        ),
        (
            "ferroloop_loop_poll_wait_seconds_total",
            "Time the loops waited for I/O, timers or wake-ups (idle).",
            loops.poll_wait_ns as f64 * 1e-9,
        ),
    ] {
        counter(out, name, help, value);
    }
    family(
        out,
        "ferroloop_loop_iteration_seconds",
        "histogram",
        "Per loop iteration: time running ready work (callbacks, due timers, the loop's own \
         work), from the end of its poll to the start of the next iteration.",
    );
    histogram(
        out,
        "ferroloop_loop_iteration_seconds",
        &loops.busy,
        loops.busy_sum_ns,
    );
    family(
        out,
        "ferroloop_loop_lag_seconds",
        "histogram",
        "Per timer: how long after its deadline the iteration that dispatched it began (a loop \
         held by a long callback shows here).",
    );
    histogram(
        out,
        "ferroloop_loop_lag_seconds",
        &loops.lag,
        loops.lag_sum_ns,
    );
}

fn render_processes(out: &mut String, processes: &Processes<'_>) {
    render_loops(out, &processes.loops);
    family(
        out,
        "ferroloop_worker_restarts_total",
        "counter",
        "Workers replaced by the supervisor, by reason: crash (it exited unasked: a signal, a \
         failure exit or an exit of its own), max_requests (--limit-max-requests), healthcheck (killed after an unanswered \
         check), signal (SIGHUP).",
    );
    for (reason, n) in RESTART_REASONS.iter().zip(processes.restarts) {
        let _ = writeln!(
            out,
            "ferroloop_worker_restarts_total{{reason=\"{reason}\"}} {n}"
        );
    }
    family(
        out,
        "ferroloop_worker_resident_memory_bytes",
        "gauge",
        "Per worker: resident memory (RSS), from /proc/PID/statm.",
    );
    for (pid, bytes) in processes.resident {
        let _ = writeln!(
            out,
            "ferroloop_worker_resident_memory_bytes{{pid=\"{pid}\"}} {bytes}"
        );
    }
}

fn render_front(out: &mut String, front: &FrontState, workers: &[WorkerState]) {
    for (name, help, value) in [
        (
            "ferroloop_front_connections_accepted_total",
            "Connections the front accepted.",
            front.accepted,
        ),
        (
            "ferroloop_front_dispatched_total",
            "Connections the front handed to a worker, with a request.",
            front.dispatched,
        ),
        (
            "ferroloop_front_returned_total",
            "Connections workers gave back to the front.",
            front.returned,
        ),
        (
            "ferroloop_front_lost_with_worker_total",
            "Connections a worker took with it when it went away.",
            front.lost_with_worker,
        ),
    ] {
        counter(out, name, help, value);
    }
    family(
        out,
        "ferroloop_front_connections_held",
        "gauge",
        "Idle connections the front holds.",
    );
    let _ = writeln!(out, "ferroloop_front_connections_held {}", front.held);
    family(
        out,
        "ferroloop_front_pending",
        "gauge",
        "Requests waiting in the front for a worker that may take them, by kind.",
    );
    let _ = writeln!(
        out,
        "ferroloop_front_pending{{kind=\"small\"}} {}\nferroloop_front_pending{{kind=\"bulk\"}} {}",
        front.pending_small, front.pending_bulk
    );
    family(
        out,
        "ferroloop_worker_handed",
        "gauge",
        "Per worker: connections handed to it and not back (a request being served, or a \
         keep-alive connection it keeps), by lane.",
    );
    for w in workers {
        let lane = if w.fast_lane { "fast" } else { "general" };
        let _ = writeln!(
            out,
            "ferroloop_worker_handed{{pid=\"{}\",lane=\"{lane}\"}} {}",
            w.id, w.in_flight
        );
    }
    family(
        out,
        "ferroloop_worker_bulk_running",
        "gauge",
        "Per worker: 1 while bulk work (a large or chunked upload) runs there.",
    );
    for w in workers {
        let _ = writeln!(
            out,
            "ferroloop_worker_bulk_running{{pid=\"{}\"}} {}",
            w.id,
            u8::from(w.bulk_running)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_s_resident_memory_is_read() {
        let rss = resident_bytes(std::process::id()).unwrap();
        assert!(rss > 0 && rss % 4096 == 0, "{rss}");
        assert_eq!(resident_bytes(u32::MAX), None);
    }

    #[test]
    fn counters_are_summed_over_seats_and_buckets_are_cumulative() {
        let mut a = SeatState {
            pid: 7,
            tasks_running: 1,
            busy_since_ns: 1_000_000_000,
            tasks_started: 3,
            ..SeatState::default()
        };
        a.requests.by_method_status[1] = 2; // GET 2xx
        a.requests.buckets[0] = 2;
        a.requests.duration_sum_ns = 1_500_000;
        let mut b = SeatState {
            pid: 8,
            ..SeatState::default()
        };
        b.requests.by_method_status[2 * 5 + 4] = 1; // POST 5xx
        b.requests.buckets[BUCKETS.len()] = 1;
        b.requests.duration_sum_ns = 11_000_000_000;
        let mut total = RequestTotals::default();
        total.add(&a.requests);
        total.add(&b.requests);
        let mut loops = LoopTotals {
            iterations: 10,
            busy_sum_ns: 3_000_000,
            ..LoopTotals::default()
        };
        loops.busy[2] = 4; // up to 500 µs
        loops.busy[8] = 1; // above 1 s
        let processes = Processes {
            restarts: [1, 0, 0, 2],
            resident: &[(7, 4096)],
            loops,
        };
        let text = render(&total, &[a, b], &processes, None, 3_000_000_000);
        for line in [
            "ferroloop_requests_total{method=\"GET\",status=\"2xx\"} 2",
            "ferroloop_requests_total{method=\"POST\",status=\"5xx\"} 1",
            "ferroloop_request_duration_seconds_bucket{le=\"0.001\"} 2",
            "ferroloop_request_duration_seconds_bucket{le=\"10\"} 2",
            "ferroloop_request_duration_seconds_bucket{le=\"+Inf\"} 3",
            "ferroloop_request_duration_seconds_count 3",
            "ferroloop_request_duration_seconds_sum 11.0015",
            "ferroloop_requests_in_flight 1",
            "ferroloop_worker_busy_seconds{pid=\"7\"} 2",
            "ferroloop_worker_busy_seconds{pid=\"8\"} 0",
            "ferroloop_worker_tasks_started_total{pid=\"7\"} 3",
            "ferroloop_worker_restarts_total{reason=\"crash\"} 1",
            "ferroloop_worker_restarts_total{reason=\"max_requests\"} 0",
            "ferroloop_worker_restarts_total{reason=\"signal\"} 2",
            "ferroloop_worker_resident_memory_bytes{pid=\"7\"} 4096",
            "ferroloop_loop_iterations_total 10",
            "ferroloop_loop_iteration_seconds_bucket{le=\"0.0001\"} 0",
            "ferroloop_loop_iteration_seconds_bucket{le=\"0.0005\"} 4",
            "ferroloop_loop_iteration_seconds_bucket{le=\"1\"} 4",
            "ferroloop_loop_iteration_seconds_bucket{le=\"+Inf\"} 5",
            "ferroloop_loop_iteration_seconds_sum 0.003",
            "ferroloop_loop_lag_seconds_count 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        assert!(!text.contains("ferroloop_front_"));
        assert!(!text.contains("method=\"PUT\""), "zero cells are left out");
    }

    #[test]
    fn behind_the_front_each_worker_s_load_is_there() {
        let front = FrontState {
            accepted: 5,
            pending_bulk: 2,
            ..FrontState::default()
        };
        let w = WorkerState {
            id: 9,
            fast_lane: true,
            in_flight: 4,
            bulk_running: true,
            ..WorkerState::default()
        };
        let text = render(
            &RequestTotals::default(),
            &[],
            &Processes::default(),
            Some((&front, &[w])),
            0,
        );
        for line in [
            "ferroloop_front_connections_accepted_total 5",
            "ferroloop_front_pending{kind=\"bulk\"} 2",
            "ferroloop_worker_handed{pid=\"9\",lane=\"fast\"} 4",
            "ferroloop_worker_bulk_running{pid=\"9\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }
}
