//! `run_front(...)`: the dispatching front's process body (`ferroloop_core::front`), for the
//! supervisor to call in the process it forks for it. It runs with the GIL released and takes
//! it only to log. `FrontBoard`: the board the front publishes its workers' state on, made by
//! the supervisor before it forks the front, so the supervisor can read it.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use ferroloop_core::front::{exposition, Board, Config, Front, RESTART_REASONS};
use ferroloop_core::handoff::Peer;
use ferroloop_core::http::{valid_field, Limits};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::event_loop::LoopCore;

/// Shared memory where the front publishes each worker's state and its own counts
/// (`ferroloop_core::front::Board`); a process forked after it was made reads what the front
/// writes.
#[pyclass(module = "ferroloop._native", frozen)]
pub struct FrontBoard {
    board: Arc<Board>,
}

#[pymethods]
impl FrontBoard {
    #[new]
    fn new(capacity: usize) -> PyResult<Self> {
        if capacity == 0 || capacity > 4096 {
            return Err(PyValueError::new_err("capacity must be 1 to 4096 workers"));
        }
        let board = Board::new(capacity)
            .map_err(|e| PyOSError::new_err(format!("cannot map the front's board: {e}")))?;
        Ok(Self {
            board: Arc::new(board),
        })
    }

    /// Seat `seat` now belongs to worker `pid`, its counts from zero; `pid` 0 frees it. The
    /// supervisor gives each worker a seat; the worker's `HttpServer(board=, seat=)` counts
    /// its app tasks there.
    fn seat_open(&self, seat: usize, pid: u32) -> PyResult<()> {
        if seat >= self.board.capacity() {
            return Err(PyValueError::new_err("seat is beyond the board's capacity"));
        }
        self.board.seat_open(seat, pid);
        Ok(())
    }

    /// The last state the front published: a dict of its counts and `workers`, a list of one
    /// dict per worker (times are `time.monotonic()` seconds; `updated` is 0.0 before the
    /// front's first publish). A worker with a seat also says what it counted there:
    /// `tasks_running` (app tasks: a request's, or a WebSocket session's), `busy_since` (since
    /// when at least one has run, or `None`) and `tasks_started`.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (front, workers) = self.board.snapshot();
        let seats = self.board.seats();
        let out = PyDict::new(py);
        out.set_item("updated", front.updated_ns as f64 * 1e-9)?;
        out.set_item("accepted", front.accepted)?;
        out.set_item("dispatched", front.dispatched)?;
        out.set_item("returned", front.returned)?;
        out.set_item("lost_with_worker", front.lost_with_worker)?;
        out.set_item("held", front.held)?;
        out.set_item("pending_small", front.pending_small)?;
        out.set_item("pending_bulk", front.pending_bulk)?;
        out.set_item("draining", front.draining)?;
        out.set_item("unlisted", front.unlisted)?;
        let list = PyList::empty(py);
        for w in workers {
            let d = PyDict::new(py);
            d.set_item("pid", w.id)?;
            d.set_item("lane", if w.fast_lane { "fast" } else { "general" })?;
            d.set_item("in_flight", w.in_flight)?;
            d.set_item("bulk_in_flight", w.bulk_in_flight)?;
            let since = (w.oldest_ns > 0).then_some(w.oldest_ns as f64 * 1e-9);
            d.set_item("oldest_since", since)?;
            d.set_item("handed_total", w.handed_total)?;
            d.set_item("bulk_running", w.bulk_running)?;
            d.set_item("leaving", w.leaving)?;
            if let Some(s) = seats.iter().find(|s| s.pid == w.id) {
                d.set_item("tasks_running", s.tasks_running)?;
                let since = (s.busy_since_ns > 0).then_some(s.busy_since_ns as f64 * 1e-9);
                d.set_item("busy_since", since)?;
                d.set_item("tasks_started", s.tasks_started)?;
            }
            list.append(d)?;
        }
        out.set_item("workers", list)?;
        Ok(out)
    }

    /// Seat `seat`'s worker is gone: its request counts stay in the totals, and the seat is
    /// free (the supervisor, once the worker exited).
    fn seat_retire(&self, seat: usize) -> PyResult<()> {
        if seat >= self.board.capacity() {
            return Err(PyValueError::new_err("seat is beyond the board's capacity"));
        }
        self.board.seat_retire(seat);
        Ok(())
    }

    /// The seats in use: one dict per worker that has one (`seat`, `pid`, `tasks_running`,
    /// `busy_since`, `tasks_started`), as the workers wrote them.
    fn seats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for s in self.board.seats() {
            let d = PyDict::new(py);
            d.set_item("seat", s.seat)?;
            d.set_item("pid", s.pid)?;
            d.set_item("tasks_running", s.tasks_running)?;
            let since = (s.busy_since_ns > 0).then_some(s.busy_since_ns as f64 * 1e-9);
            d.set_item("busy_since", since)?;
            d.set_item("tasks_started", s.tasks_started)?;
            list.append(d)?;
        }
        Ok(list)
    }

    /// The board as Prometheus text (`--metrics`): the workers' seats, and the front's part
    /// once a front has published.
    fn exposition(&self) -> String {
        let total = self.board.request_totals();
        let seats = self.board.seats();
        let (front, workers) = self.board.snapshot();
        let now_ns = (ferroloop_core::clock::monotonic() * 1e9) as u64;
        let published = (front.updated_ns > 0).then_some((&front, workers.as_slice()));
        let resident: Vec<(u32, u64)> = seats
            .iter()
            .filter_map(|s| Some((s.pid, exposition::resident_bytes(s.pid)?)))
            .collect();
        let processes = exposition::Processes {
            restarts: self.board.restarts(),
            resident: &resident,
            loops: self.board.loop_totals(),
        };
        exposition::render(&total, &seats, &processes, published, now_ns)
    }

    /// Seat `seat`'s worker copies its loop's counters there (`loop.enable_metrics()` first):
    /// `ferroloop_loop_*` in the exposition.
    fn seat_loop(
        &self,
        py: Python<'_>,
        seat: usize,
        event_loop: PyRef<'_, LoopCore>,
    ) -> PyResult<()> {
        if seat >= self.board.capacity() {
            return Err(PyValueError::new_err("seat is beyond the board's capacity"));
        }
        self.board.seat_loop(seat, &event_loop.loop_stats(py)?);
        Ok(())
    }

    /// The supervisor replaced a worker, for `reason` (one of `crash`, `max_requests`,
    /// `healthcheck`, `signal`): counted in `ferroloop_worker_restarts_total`.
    fn count_restart(&self, reason: &str) -> PyResult<()> {
        let i = RESTART_REASONS
            .iter()
            .position(|r| *r == reason)
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "unknown restart reason {reason:?} (one of {RESTART_REASONS:?})"
                ))
            })?;
        self.board.count_restart(i);
        Ok(())
    }

    #[getter]
    fn capacity(&self) -> usize {
        self.board.capacity()
    }
}

impl FrontBoard {
    /// The board and `seat` on it, for a worker's `HttpServer(board=, seat=)`.
    pub(super) fn seat(&self, seat: usize) -> PyResult<(Arc<Board>, usize)> {
        if seat >= self.board.capacity() {
            return Err(PyValueError::new_err("seat is beyond the board's capacity"));
        }
        Ok((self.board.clone(), seat))
    }
}

/// Serves `listeners` (fds, taken over: they close when the front returns) until the
/// supervisor says `drain` on `control` (an fd, taken over too) and the draining is done, or
/// closes `control`. `log(message)` is called for what an operator should see. `server_header`,
/// `date_header` and `headers` are `HttpServer`'s, for the one response the front writes
/// itself (408 to a head not whole in time). `board`: where to publish the workers' state.
/// `place_at_accept`: hand each connection on when accepted, to be kept by its worker (TLS,
/// which the workers terminate). `trace_connections(client, made)`: as `HttpServer`'s, for the connections the front accepts
/// and those it closes itself (`--log-level trace`).
/// Returns the counts `(accepted, dispatched, returned, lost_with_worker)`.
#[pyfunction]
#[pyo3(signature = (listeners, control, *, log, board=None, trace_connections=None, bulk_body=1_048_576, timeout_keep_alive=5.0,
    timeout_header=10.0, limit_header_size=65536, limit_headers=100, limit_uri=8192,
    server_header=true, date_header=true, headers=Vec::new(), place_at_accept=false))]
#[allow(clippy::too_many_arguments)]
pub fn run_front(
    py: Python<'_>,
    listeners: Vec<RawFd>,
    control: RawFd,
    log: Py<PyAny>,
    board: Option<PyRef<'_, FrontBoard>>,
    trace_connections: Option<Py<PyAny>>,
    bulk_body: u64,
    timeout_keep_alive: f64,
    timeout_header: f64,
    limit_header_size: usize,
    limit_headers: usize,
    limit_uri: usize,
    server_header: bool,
    date_header: bool,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    place_at_accept: bool,
) -> PyResult<(u64, u64, u64, u64)> {
    if !(timeout_keep_alive > 0.0 && timeout_header > 0.0) {
        return Err(PyValueError::new_err("timeouts must be positive"));
    }
    if let Some((name, value)) = headers.iter().find(|(n, v)| !valid_field(n, v)) {
        return Err(PyValueError::new_err(format!(
            "invalid default header {:?}: {:?} (the name must be an RFC 9110 token, the value \
             without CR, LF or NUL)",
            String::from_utf8_lossy(name),
            String::from_utf8_lossy(value),
        )));
    }
    if listeners.iter().chain([&control]).any(|&fd| fd < 0) || listeners.len() > 255 {
        return Err(PyValueError::new_err(
            "run_front needs open fds, and at most 255 listeners",
        ));
    }
    let config = Config {
        limits: Limits {
            max_head_bytes: limit_header_size,
            max_headers: limit_headers,
            max_uri_bytes: limit_uri,
        },
        bulk_body,
        timeout_keep_alive,
        timeout_header,
        server_header,
        date_header,
        extra_headers: headers,
        place_at_accept,
    };
    // SAFETY: the caller hands these fds over (documented above): each is open and owned by
    // nothing else in this process from now on.
    let listeners: Vec<OwnedFd> = listeners
        .into_iter()
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect();
    // SAFETY: as above.
    let control = unsafe { OwnedFd::from_raw_fd(control) };
    let board = board.map(|b| b.board.clone());
    let stats = py
        .detach(move || {
            let mut write_log = |message: &str| {
                Python::attach(|py| {
                    if let Err(e) = log.bind(py).call1((message,)) {
                        e.write_unraisable(py, None);
                    }
                });
            };
            let mut write_trace = |peer: &Peer, made: bool| {
                let Some(trace) = &trace_connections else {
                    return;
                };
                Python::attach(|py| {
                    let called = super::peer_to_py(py, *peer)
                        .and_then(|client| trace.bind(py).call1((client, made)));
                    if let Err(e) = called {
                        e.write_unraisable(py, None);
                    }
                });
            };
            let mut front = Front::new(listeners, control, config, &mut write_log)?;
            if let Some(board) = board {
                front = front.with_board(board);
            }
            if trace_connections.is_some() {
                front = front.with_trace(&mut write_trace);
            }
            front.run()
        })
        .map_err(|e| PyOSError::new_err(format!("the front failed: {e}")))?;
    Ok((
        stats.accepted,
        stats.dispatched,
        stats.returned,
        stats.lost_with_worker,
    ))
}
