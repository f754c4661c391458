//! The dispatching front (`--workers N`): one process with one thread and its own epoll that
//! owns the listening sockets and every idle connection, and hands each request, with its
//! connection, to a worker that is free ([`dispatch`]).
//!
//! A request's path: the front accepts, reads until the request head is whole, chooses a
//! worker by lane and load, and sends the connection with the bytes it read over the worker's
//! channel ([`crate::handoff`]). The worker serves it and keeps it for its next requests until
//! bulk work starts there (or it stops, or the front drains): then it sends its idle
//! connections back (`Return`, with any bytes of a next request already read), and each one
//! whose response completes meanwhile. It tells the front when it closed one or keeps one for
//! good (`Done`: an error, `Connection: close`, a WebSocket), and when bulk work starts and
//! ends there. So a worker busy with a large upload holds no idle connection and is handed no
//! small request while another worker is free.
//!
//! Who owns what:
//! - The front owns the listeners, the idle connections (`conns`) and the requests no worker
//!   may take yet (`pending`). A handed connection's fd is the worker's from the moment its
//!   `Conn` datagram is sent: the front keeps only its token, to count the worker's load.
//! - The supervisor owns the workers' processes. It gives the front each new worker's channel
//!   over the control socket (`worker ID LANE` with the fd) and says `drain SECONDS` at
//!   shutdown; the front never forks or signals.
//!
//! With TLS (`Config::place_at_accept`) the front cannot read a head: it hands each connection
//! on when it is accepted, to a worker without bulk work holding the fewest connections, and
//! that worker keeps it until it closes (a `Done`). An HTTP/2 connection with prior knowledge
//! (its first bytes are `http::H2_PREFACE`) is handed on at once, kept by its worker the same way.
//!
//! Invariants:
//! - Everything runs on one thread, the only one in its process; nothing blocks but
//!   `epoll_wait`.
//! - A connection is in exactly one place: `conns` (registered in the poller), `pending`
//!   (not registered), or handed to one worker (counted in its `handed`).
//! - A worker that goes away (its channel reads end of stream) takes the connections handed to
//!   it: the kernel closes them with the worker, and each client sees its connection close.
//! - Draining: the listeners close at once (new connections are refused by the kernel);
//!   heads already read or arriving are still dispatched, marked [`CLOSE_AFTER`]; an idle
//!   connection is closed, write side first, once it has been quiet for [`DRAIN_QUIET`]. The
//!   front returns when nothing is left or at the drain deadline, and its return closes the
//!   channels, which tells the workers.

mod board;
mod dispatch;
pub mod exposition;
pub mod loop_counts;
pub mod request_counts;

pub use board::{Board, FrontState, SeatState, WorkerState, RESTART_REASONS};
pub use dispatch::{choose, Lane, Load};

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use crate::clock;
use crate::handoff::{recv_datagram, ChannelIn, ChannelOut, Kind, Message, Peer};
use crate::http::date::DateCache;
use crate::http::{
    error_response, h2_preface, parse_head, BodyKind, Head, Limits, Preface, ServerFields,
    HEAD_TIMED_OUT,
};
use crate::net;
use crate::poller::{Events, Interest, Poller};

/// `detail` of a `Conn`: answer this request with `Connection: close` (the front is draining).
pub const CLOSE_AFTER: u8 = 1;
/// `detail` of a `Done`: the worker closed the connection.
pub const DONE_CLOSED: u8 = 0;
/// `detail` of a `Done`: the worker keeps the connection for good (a WebSocket).
pub const DONE_KEPT: u8 = 1;
/// The token of a `Done` that is a notice, not about a request. From a worker (`LEAVING`): it
/// is shutting down, gets nothing new, and the front closes its channel once every request
/// handed to it is back. From the front (`DRAINING`): it drains, so every response the worker
/// writes from now on says `Connection: close`.
pub const LEAVING: u64 = 0;
/// See [`LEAVING`].
pub const DRAINING: u64 = 0;
/// `detail` of a worker's [`LEAVING`]-token `Done`: bulk work started running there (it gets
/// no small request while another worker has none).
pub const BULK_STARTED: u8 = 1;
/// ... and the last of it ended.
pub const BULK_ENDED: u8 = 2;
/// `detail` of a `Return`: the connection's next request, unread in its data, is bulk work
/// that this (fast-lane) worker does not take.
pub const RETURN_BULK: u8 = 1;

/// Seconds an idle connection is kept open in a graceful shutdown (the front's drain and each
/// worker's, `crates/py/src/server/drain.rs`), counted from when it became idle, for a request
/// its client may already be sending. Measured with the drain tests (50 clients in one process
/// on a busy 2-core machine): with 0 (idle connections closed at once, write side first) 1-5
/// requests were lost in about one run in five; with 0.5 s none in 32 runs.
pub const DRAIN_QUIET: f64 = 0.5;
/// How long a connection closed by a drain reads and discards before closing for good: long
/// enough for a request that crossed our FIN to be absorbed rather than answered by a reset,
/// short enough not to hold the process up for a client that never notices the FIN.
pub const DRAIN_LINGER: f64 = 0.5;
/// Bytes asked of each read of an idle connection.
const READ_CHUNK: usize = 64 * 1024;
/// Seconds the listeners rest after `accept` failed for want of fds or memory.
const ACCEPT_PAUSE: f64 = 1.0;
/// How often deadlines are checked (quiet connections found while draining).
const SWEEP: Duration = Duration::from_millis(50);

/// Poller tokens: the control socket, listeners, workers' channels and idle connections.
const CONTROL: u64 = 0;
const LISTENER: u64 = 1;
const WORKER: u64 = 1 << 40;
const CONN: u64 = 2 << 40;
const INDEX: u64 = (1 << 40) - 1;

/// Told of a connection accepted (`true`) or closed by the front (`false`).
pub type TraceFn<'a> = dyn FnMut(&Peer, bool) + 'a;

/// The front's fixed configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub limits: Limits,
    /// A request whose declared body is larger (or chunked) is bulk work.
    pub bulk_body: u64,
    pub timeout_keep_alive: f64,
    pub timeout_header: f64,
    /// What a response the front writes itself (a 408) carries, as the workers' responses do:
    /// `server: ferroloop`, `date`, and `--header` fields.
    pub server_header: bool,
    pub date_header: bool,
    pub extra_headers: Vec<(Vec<u8>, Vec<u8>)>,
    /// Hand each connection on as soon as it is accepted, to a worker that keeps it for good:
    /// the front cannot read its requests (TLS, which terminates in the workers).
    pub place_at_accept: bool,
}

struct Worker {
    id: u32,
    lane: Lane,
    chan: OwnedFd,
    out: ChannelOut,
    inp: ChannelIn,
    /// Tokens of the connections handed to it and not yet back: whether each is bulk, and when
    /// it was handed (monotonic nanoseconds). Ordered by token, which grows with time, so the
    /// first entry is the oldest.
    handed: BTreeMap<u64, (bool, u64)>,
    bulk: usize,
    /// Its channel is registered for writability (the out queue is not empty).
    waiting_to_write: bool,
    /// It said `LEAVING`.
    leaving: bool,
    /// Bulk work running there, as it told (`BULK_STARTED`, `BULK_ENDED`).
    bulk_running: bool,
    /// Connections handed to it in all.
    handed_total: u64,
}

impl Worker {
    fn load(&self) -> Load {
        Load {
            lane: self.lane,
            in_flight: self.handed.len(),
            bulk_in_flight: self.bulk + usize::from(self.bulk_running),
            leaving: self.leaving,
            oldest: self.handed.first_key_value().map_or(0, |(_, &(_, at))| at),
        }
    }

    fn state(&self) -> WorkerState {
        let load = self.load();
        WorkerState {
            id: self.id,
            fast_lane: self.lane == Lane::Fast,
            in_flight: load.in_flight as u64,
            bulk_in_flight: self.bulk as u64,
            oldest_ns: load.oldest,
            handed_total: self.handed_total,
            leaving: self.leaving,
            bulk_running: self.bulk_running,
        }
    }
}

/// A connection the front holds: no request of it is with a worker.
struct Held {
    fd: OwnedFd,
    listener: u8,
    peer: Peer,
    buf: Vec<u8>,
    eof: bool,
    deadline: f64,
    /// The deadline is the header timeout (part of a head has arrived).
    header_clock: bool,
    /// When it became idle (accepted, or given back after a response).
    idle_since: f64,
    /// Draining closed its write side: what arrives is read and dropped until the client
    /// closes or `deadline`.
    lingering: bool,
}

/// Counts for the log line at the end and for tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub accepted: u64,
    pub dispatched: u64,
    pub returned: u64,
    /// Connections a worker took with it when it went away.
    pub lost_with_worker: u64,
}

pub struct Front<'a> {
    poller: Poller,
    config: Config,
    control: Option<OwnedFd>,
    listeners: Vec<Option<OwnedFd>>,
    workers: Vec<Worker>,
    conns: Vec<Option<Held>>,
    free: Vec<usize>,
    pending: VecDeque<(Held, bool)>,
    next_token: u64,
    cursor: usize,
    head: Head,
    date: DateCache,
    draining: Option<f64>,
    /// Reused by every read of a held connection and every choice of a worker.
    read_buf: Vec<u8>,
    loads: Vec<Load>,
    /// The listeners are out of the poller until then (`accept` failed).
    accept_paused: Option<f64>,
    stats: Stats,
    /// Where the workers' state is published for other processes, if anywhere.
    board: Option<Arc<Board>>,
    board_workers: Vec<WorkerState>,
    log: &'a mut dyn FnMut(&str),
    /// `--log-level trace`: told of each connection accepted (`true`) and of each the front
    /// closes (a worker reports those it closes itself).
    trace: Option<&'a mut TraceFn<'a>>,
}

impl<'a> Front<'a> {
    pub fn new(
        listeners: Vec<OwnedFd>,
        control: OwnedFd,
        config: Config,
        log: &'a mut dyn FnMut(&str),
    ) -> io::Result<Self> {
        let poller = Poller::new()?;
        poller.add(control.as_raw_fd(), CONTROL, Interest::READ)?;
        for (i, l) in listeners.iter().enumerate() {
            // Its accept loop must end with `WouldBlock`, not wait in the kernel.
            net::set_nonblocking(l.as_raw_fd())?;
            poller.add(l.as_raw_fd(), LISTENER + i as u64, Interest::READ)?;
        }
        Ok(Self {
            poller,
            config,
            control: Some(control),
            listeners: listeners.into_iter().map(Some).collect(),
            workers: Vec::new(),
            conns: Vec::new(),
            free: Vec::new(),
            pending: VecDeque::new(),
            next_token: 1,
            cursor: 0,
            head: Head::default(),
            date: DateCache::new(),
            draining: None,
            read_buf: vec![0; READ_CHUNK],
            loads: Vec::new(),
            accept_paused: None,
            stats: Stats::default(),
            board: None,
            board_workers: Vec::new(),
            log,
            trace: None,
        })
    }

    /// Reports connections accepted and closed here to `trace` (uvicorn's trace lines).
    #[must_use]
    pub fn with_trace(mut self, trace: &'a mut TraceFn<'a>) -> Self {
        self.trace = Some(trace);
        self
    }

    /// Publishes the workers' state and the front's counts on `board` after every batch of
    /// events (and at least every [`SWEEP`]).
    #[must_use]
    pub fn with_board(mut self, board: Arc<Board>) -> Self {
        self.board = Some(board);
        self
    }

    fn publish(&mut self, now: f64) {
        let Some(board) = &self.board else {
            return;
        };
        self.board_workers.clear();
        self.board_workers
            .extend(self.workers.iter().map(Worker::state));
        let pending_bulk = self.pending.iter().filter(|(_, bulk)| *bulk).count() as u64;
        let front = FrontState {
            updated_ns: (now * 1e9) as u64,
            accepted: self.stats.accepted,
            dispatched: self.stats.dispatched,
            returned: self.stats.returned,
            lost_with_worker: self.stats.lost_with_worker,
            held: (self.conns.len() - self.free.len()) as u64,
            pending_small: self.pending.len() as u64 - pending_bulk,
            pending_bulk,
            draining: self.draining.is_some(),
            unlisted: 0,
        };
        board.publish(front.updated_ns, &front, &self.board_workers);
    }

    /// Serves until drained (or the control socket closes); returns the counts.
    pub fn run(mut self) -> io::Result<Stats> {
        let mut events = Events::with_capacity(256);
        let mut ready: Vec<(u64, bool, bool)> = Vec::with_capacity(256);
        let mut next_sweep = clock::monotonic();
        loop {
            match self.poller.wait(&mut events, Some(SWEEP)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            ready.clear();
            ready.extend(events.iter().map(|(t, r)| (t, r.readable, r.writable)));
            for &(token, readable, writable) in &ready {
                match token & !INDEX {
                    0 if token == CONTROL && !self.on_control()? => return Ok(self.stats),
                    0 if token == CONTROL => {}
                    0 => self.on_listener((token - LISTENER) as usize),
                    WORKER => self.on_worker((token & INDEX) as u32, readable, writable),
                    CONN => self.on_conn((token & INDEX) as usize),
                    _ => {}
                }
            }
            let now = clock::monotonic();
            if now >= next_sweep {
                next_sweep = now + SWEEP.as_secs_f64();
                self.sweep(now);
            }
            self.publish(now);
            if self.finished(now) {
                let stats = self.stats;
                let lost: usize = self.workers.iter().map(|w| w.handed.len()).sum();
                if lost > 0 {
                    (self.log)(&format!(
                        "graceful shutdown timed out with {lost} request(s) still with workers"
                    ));
                }
                return Ok(stats);
            }
        }
    }

    /// Reads the control socket; `false` when the supervisor is gone.
    fn on_control(&mut self) -> io::Result<bool> {
        let Some(control) = self.control.as_ref().map(AsRawFd::as_raw_fd) else {
            return Ok(true);
        };
        let mut buf = [0u8; 256];
        loop {
            match recv_datagram(control, &mut buf) {
                Ok(None) => return Ok(true),
                Ok(Some((n, fd))) => self.control_message(&buf[..n], fd),
                Err(_) => {
                    // The supervisor is gone: nobody will replace workers or say drain.
                    self.control = None;
                    return Ok(false);
                }
            }
        }
    }

    fn control_message(&mut self, text: &[u8], fd: Option<OwnedFd>) {
        let text = String::from_utf8_lossy(text);
        let mut words = text.split_whitespace();
        match (words.next(), words.next(), words.next(), fd) {
            (Some("worker"), Some(id), Some(lane), Some(chan)) => {
                let (Ok(id), lane) = (id.parse::<u32>(), lane) else {
                    return;
                };
                let lane = if lane == "fast" {
                    Lane::Fast
                } else {
                    Lane::General
                };
                self.add_worker(id, lane, chan);
            }
            (Some("drain"), Some(seconds), _, _) => {
                let seconds = seconds.parse::<f64>().unwrap_or(f64::INFINITY);
                self.drain(clock::monotonic() + seconds);
            }
            _ => (self.log)(&format!("front: unknown control message {text:?}")),
        }
    }

    fn add_worker(&mut self, id: u32, lane: Lane, chan: OwnedFd) {
        if let Err(e) = self
            .poller
            .add(chan.as_raw_fd(), WORKER | u64::from(id), Interest::READ)
        {
            (self.log)(&format!("front: cannot watch worker {id}'s channel: {e}"));
            return;
        }
        self.workers.push(Worker {
            id,
            lane,
            chan,
            out: ChannelOut::new(),
            inp: ChannelIn::new(),
            handed: BTreeMap::new(),
            bulk: 0,
            waiting_to_write: false,
            leaving: false,
            bulk_running: false,
            handed_total: 0,
        });
        // Requests that waited for a worker go now, in arrival order.
        let waiting: Vec<(Held, bool)> = self.pending.drain(..).collect();
        for (conn, bulk) in waiting {
            self.hand(conn, bulk);
        }
    }

    /// Stops accepting; what was read is still served; returns by `deadline` at the latest.
    /// An idle connection stays open until it has been quiet for [`DRAIN_QUIET`] (a request
    /// its client sends meanwhile is served, with `Connection: close`), then its write side
    /// is shut and it lingers up to [`DRAIN_LINGER`]: a request that crosses our FIN is never
    /// started, so its client may safely send it again elsewhere.
    pub fn drain(&mut self, deadline: f64) {
        self.draining = Some(deadline);
        for l in self.listeners.iter_mut().filter_map(Option::take) {
            let _ = self.poller.delete(l.as_raw_fd());
        }
        // Responses to requests already with workers say `Connection: close` too.
        let mut ids = Vec::with_capacity(self.workers.len());
        for worker in &mut self.workers {
            worker.out.push(Message::done(DRAINING, 0));
            ids.push(worker.id);
        }
        for id in ids {
            self.flush_worker(id);
        }
        for slot in 0..self.conns.len() {
            if self.conns[slot].is_some() {
                self.on_conn(slot);
            }
        }
    }

    fn finished(&self, now: f64) -> bool {
        let Some(deadline) = self.draining else {
            return false;
        };
        // With no worker left, what waits can never be served (the supervisor starts none
        // while it stops): returning closes it.
        now >= deadline
            || self.workers.is_empty()
            || (self.conns.iter().all(Option::is_none)
                && self.pending.is_empty()
                && self
                    .workers
                    .iter()
                    .all(|w| w.handed.is_empty() && w.out.is_empty()))
    }

    fn on_listener(&mut self, index: usize) {
        let Some(fd) = self
            .listeners
            .get(index)
            .and_then(|l| l.as_ref().map(AsRawFd::as_raw_fd))
        else {
            return;
        };
        for _ in 0..64 {
            match net::accept(fd) {
                Ok(Some((conn, peer))) => {
                    self.stats.accepted += 1;
                    if let Some(trace) = self.trace.as_mut() {
                        trace(&peer, true);
                    }
                    let idle = Held {
                        fd: conn,
                        listener: index as u8,
                        peer,
                        buf: Vec::new(),
                        eof: false,
                        deadline: clock::monotonic() + self.config.timeout_header,
                        header_clock: true,
                        idle_since: clock::monotonic(),
                        lingering: false,
                    };
                    if self.config.place_at_accept {
                        // Placed like a small request: on a worker without bulk work, the
                        // one holding the fewest connections.
                        self.hand(idle, false);
                    } else {
                        self.watch(idle);
                    }
                }
                Ok(None) => return,
                Err(e) if is_transient(&e) => return,
                Err(e) => {
                    // Out of fds or memory (or worse): the connection stays in the backlog and
                    // the listener readable, so stop watching it for a while.
                    (self.log)(&format!(
                        "front: accept failed: {e}; not accepting for {ACCEPT_PAUSE} s (raise \
                         the open-files limit, ulimit -n, if it says too many open files)"
                    ));
                    let _ = self.poller.delete(fd);
                    self.accept_paused = Some(clock::monotonic() + ACCEPT_PAUSE);
                    return;
                }
            }
        }
    }

    /// Registers an idle connection; returns its slot.
    fn watch(&mut self, idle: Held) -> Option<usize> {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        if let Err(e) = self
            .poller
            .add(idle.fd.as_raw_fd(), CONN | slot as u64, Interest::READ)
        {
            (self.log)(&format!("front: cannot watch a connection: {e}"));
            self.free.push(slot);
            return None;
        }
        self.conns[slot] = Some(idle);
        Some(slot)
    }

    fn close(&mut self, slot: usize) {
        if let Some(conn) = self.conns[slot].take() {
            let _ = self.poller.delete(conn.fd.as_raw_fd());
            self.free.push(slot);
            if let Some(trace) = self.trace.as_mut() {
                trace(&conn.peer, false);
            }
        }
    }

    /// An idle connection is readable (or was just given bytes): read, and hand a whole head on.
    fn on_conn(&mut self, slot: usize) {
        let Some(conn) = self.conns[slot].as_mut() else {
            return;
        };
        if conn.lingering {
            let mut sink = [0u8; 4096];
            loop {
                match net::recv(conn.fd.as_raw_fd(), &mut sink) {
                    Ok(None) => return,
                    Ok(Some(n)) if n > 0 => {}
                    _ => break,
                }
            }
            self.close(slot);
            return;
        }
        if !conn.eof {
            match net::recv(conn.fd.as_raw_fd(), &mut self.read_buf) {
                Ok(Some(0)) => conn.eof = true,
                Ok(Some(n)) => conn.buf.extend_from_slice(&self.read_buf[..n]),
                Ok(None) => {}
                Err(_) => {
                    self.close(slot);
                    return;
                }
            }
        }
        if conn.buf.is_empty() {
            if conn.eof {
                self.close(slot);
            }
            return;
        }
        // HTTP/2 with prior knowledge (its preface, whole or begun): no HTTP/1.1 head to read;
        // the worker keeps the connection for its life, as a TLS one (`place_at_accept`).
        let h2 = h2_preface(&conn.buf);
        if h2 != Preface::No {
            if h2 == Preface::Partial && !conn.eof {
                return;
            }
            let conn = self.conns[slot].take().expect("checked above");
            let _ = self.poller.delete(conn.fd.as_raw_fd());
            self.free.push(slot);
            self.hand(conn, false);
            return;
        }
        let bulk = match parse_head(&mut conn.buf, &self.config.limits, &mut self.head) {
            Ok(true) => match self.head.body {
                BodyKind::Chunked => true,
                BodyKind::Length(n) => n > self.config.bulk_body,
                BodyKind::Empty => false,
            },
            // Half a head: wait for the rest, under the header timeout.
            Ok(false) if !conn.eof => {
                if !conn.header_clock {
                    conn.header_clock = true;
                    conn.deadline = clock::monotonic() + self.config.timeout_header;
                }
                return;
            }
            Ok(false) => {
                self.close(slot);
                return;
            }
            // A malformed head: the worker answers it (400, 414, 431...) as it would its own.
            Err(_) => false,
        };
        let conn = self.conns[slot].take().expect("checked above");
        let _ = self.poller.delete(conn.fd.as_raw_fd());
        self.free.push(slot);
        self.hand(conn, bulk);
    }

    /// Sends a connection whose head is whole to the worker the policy picks, or queues it.
    fn hand(&mut self, conn: Held, bulk: bool) {
        self.loads.clear();
        self.loads.extend(self.workers.iter().map(Worker::load));
        // With no general worker at all, bulk work goes wherever it can.
        let no_general = !self.loads.iter().any(|l| l.lane == Lane::General);
        let Some(i) = choose(&self.loads, bulk && !no_general, self.cursor) else {
            self.pending.push_back((conn, bulk));
            return;
        };
        self.cursor = i;
        let token = self.next_token;
        self.next_token += 1;
        let detail = if self.draining.is_some() {
            CLOSE_AFTER
        } else {
            0
        };
        let worker = &mut self.workers[i];
        worker
            .handed
            .insert(token, (bulk, (clock::monotonic() * 1e9) as u64));
        worker.bulk += usize::from(bulk);
        worker.handed_total += 1;
        let mut msg = Message::conn(
            Kind::Conn,
            token,
            conn.listener,
            conn.peer,
            conn.fd,
            conn.buf,
        );
        msg.detail = detail;
        worker.out.push(msg);
        self.stats.dispatched += 1;
        let id = worker.id;
        self.flush_worker(id);
    }

    fn worker_index(&self, id: u32) -> Option<usize> {
        self.workers.iter().position(|w| w.id == id)
    }

    fn flush_worker(&mut self, id: u32) {
        let Some(i) = self.worker_index(id) else {
            return;
        };
        let worker = &mut self.workers[i];
        match worker.out.flush(worker.chan.as_raw_fd()) {
            Ok(empty) => {
                if empty == worker.waiting_to_write {
                    let interest = if empty {
                        Interest::READ
                    } else {
                        Interest {
                            readable: true,
                            writable: true,
                        }
                    };
                    let _ = self.poller.modify(
                        worker.chan.as_raw_fd(),
                        WORKER | u64::from(id),
                        interest,
                    );
                    worker.waiting_to_write = !empty;
                }
            }
            Err(_) => self.worker_gone(i),
        }
    }

    fn on_worker(&mut self, id: u32, readable: bool, writable: bool) {
        if writable {
            self.flush_worker(id);
        }
        if !readable {
            return;
        }
        loop {
            let Some(i) = self.worker_index(id) else {
                return;
            };
            let worker = &mut self.workers[i];
            match worker.inp.recv(worker.chan.as_raw_fd()) {
                Ok(None) => {
                    if worker.leaving && worker.handed.is_empty() && worker.out.is_empty() {
                        // Its last request is back: closing the channel lets it exit.
                        let gone = self.workers.remove(i);
                        let _ = self.poller.delete(gone.chan.as_raw_fd());
                    }
                    return;
                }
                Ok(Some(msg)) => self.worker_message(i, msg),
                Err(_) => {
                    self.worker_gone(i);
                    return;
                }
            }
        }
    }

    fn worker_message(&mut self, i: usize, msg: Message) {
        let worker = &mut self.workers[i];
        if msg.kind == Kind::Done && msg.token == LEAVING {
            match msg.detail {
                BULK_STARTED => worker.bulk_running = true,
                BULK_ENDED => worker.bulk_running = false,
                _ => worker.leaving = true,
            }
            return;
        }
        if let Some((bulk, _)) = worker.handed.remove(&msg.token) {
            worker.bulk -= usize::from(bulk);
        }
        let Message {
            kind,
            listener,
            peer,
            fd,
            data,
            detail,
            ..
        } = msg;
        if kind != Kind::Return {
            return;
        }
        let Some(fd) = fd else {
            return;
        };
        self.stats.returned += 1;
        let idle = Held {
            fd,
            listener,
            peer,
            buf: data,
            eof: false,
            deadline: clock::monotonic() + self.config.timeout_keep_alive,
            header_clock: false,
            idle_since: clock::monotonic(),
            lingering: false,
        };
        if detail & RETURN_BULK != 0 {
            // Its next request, whole in `data`, goes to a general worker.
            self.hand(idle, true);
            return;
        }
        let has_data = !idle.buf.is_empty();
        if let Some(slot) = self.watch(idle) {
            // Bytes of the next request may have come back with it; those still in the socket
            // make it readable (no read here just to find it empty, the usual case).
            if has_data {
                self.on_conn(slot);
            }
        }
    }

    fn worker_gone(&mut self, i: usize) {
        let mut worker = self.workers.remove(i);
        let _ = self.poller.delete(worker.chan.as_raw_fd());
        // Connections it never received go to another worker, in order.
        for msg in worker.out.take_unsent() {
            let Some(fd) = msg.fd else {
                continue;
            };
            let bulk = worker
                .handed
                .remove(&msg.token)
                .is_some_and(|(bulk, _)| bulk);
            self.stats.dispatched -= 1;
            let idle = Held {
                fd,
                listener: msg.listener,
                peer: msg.peer,
                buf: msg.data,
                eof: false,
                deadline: clock::monotonic() + self.config.timeout_header,
                header_clock: true,
                idle_since: clock::monotonic(),
                lingering: false,
            };
            self.hand(idle, bulk);
        }
        let lost = worker.handed.len();
        self.stats.lost_with_worker += lost as u64;
        if lost > 0 {
            (self.log)(&format!(
                "worker {} went away with {lost} request(s) in flight; their connections are closed",
                worker.id
            ));
        }
    }

    /// Closes idle connections past their deadline: quietly after the keep-alive timeout, with
    /// a 408 after the header timeout.
    fn sweep(&mut self, now: f64) {
        if self.accept_paused.is_some_and(|until| now >= until) {
            self.accept_paused = None;
            for (i, l) in self.listeners.iter().enumerate() {
                if let Some(l) = l {
                    let _ = self
                        .poller
                        .add(l.as_raw_fd(), LISTENER + i as u64, Interest::READ);
                }
            }
        }
        for slot in 0..self.conns.len() {
            let Some(conn) = self.conns[slot].as_mut() else {
                continue;
            };
            let quiet = self.draining.is_some()
                && !conn.lingering
                && conn.buf.is_empty()
                && now >= conn.idle_since + DRAIN_QUIET;
            if quiet && net::shutdown_write(conn.fd.as_raw_fd()).is_ok() {
                conn.lingering = true;
                conn.deadline = conn.deadline.min(now + DRAIN_LINGER);
                continue;
            }
            if now < conn.deadline && !quiet {
                continue;
            }
            if conn.header_clock && !conn.buf.is_empty() {
                // The workers' own 408 (`Conn::on_timer`), fields and all.
                let date = self.config.date_header.then(|| *self.date.get());
                let fields = ServerFields {
                    date: date.as_ref().map(|d| &d[..]),
                    server: self.config.server_header.then_some(b"ferroloop"),
                    extra: &self.config.extra_headers,
                };
                let e = HEAD_TIMED_OUT;
                let response = error_response(e.status, e.reason, &fields, false);
                let _ = net::send(conn.fd.as_raw_fd(), &response);
            }
            self.close(slot);
        }
    }
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNABORTED | libc::EPROTO | libc::EINTR)
    )
}

#[cfg(test)]
mod tests;
