//! The front over real sockets: a listener, a control socket and fake workers played by the
//! test thread with the channel codec.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::thread;
use std::time::{Duration, Instant};

use super::*;
use crate::handoff::{channel_pair, send_datagram};
use crate::http::H2_PREFACE;

fn config() -> Config {
    Config {
        limits: Limits {
            max_head_bytes: 65536,
            max_headers: 100,
            max_uri_bytes: 8192,
        },
        bulk_body: 1024,
        timeout_keep_alive: 5.0,
        timeout_header: 5.0,
        server_header: true,
        date_header: true,
        extra_headers: Vec::new(),
        place_at_accept: false,
    }
}

struct Running {
    addr: std::net::SocketAddr,
    control: OwnedFd,
    thread: thread::JoinHandle<Stats>,
}

fn start() -> Running {
    start_with(None)
}

fn start_with(board: Option<Arc<Board>>) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (control, theirs) = channel_pair().unwrap();
    let thread = thread::spawn(move || {
        let mut log = |m: &str| eprintln!("front: {m}");
        let mut front =
            Front::new(vec![OwnedFd::from(listener)], theirs, config(), &mut log).unwrap();
        if let Some(board) = board {
            front = front.with_board(board);
        }
        front.run().unwrap()
    });
    Running {
        addr,
        control,
        thread,
    }
}

fn send_control(control: &OwnedFd, text: &str, fd: Option<&OwnedFd>) {
    // As the supervisor writes them: text, and one fd for a new worker.
    send_datagram(
        control.as_raw_fd(),
        text.as_bytes(),
        fd.map(AsRawFd::as_raw_fd),
    )
    .unwrap();
}

/// A fake worker: its end of the channel.
struct FakeWorker {
    chan: OwnedFd,
    inp: ChannelIn,
    out: ChannelOut,
}

impl FakeWorker {
    fn add(control: &OwnedFd, id: u32, lane: &str) -> Self {
        let (front_end, worker_end) = channel_pair().unwrap();
        send_control(control, &format!("worker {id} {lane}"), Some(&front_end));
        Self {
            chan: worker_end,
            inp: ChannelIn::new(),
            out: ChannelOut::new(),
        }
    }

    fn next(&mut self) -> Message {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(m) = self.inp.recv(self.chan.as_raw_fd()).unwrap() {
                return m;
            }
            assert!(Instant::now() < until, "no message for the worker");
            thread::sleep(Duration::from_millis(1));
        }
    }

    fn nothing(&mut self) -> bool {
        thread::sleep(Duration::from_millis(50));
        self.inp.recv(self.chan.as_raw_fd()).unwrap().is_none()
    }

    /// Answers a handed request and gives the connection back.
    fn serve(&mut self, msg: Message, body: &str) {
        let fd = msg.fd.unwrap();
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        assert_eq!(
            net::send(fd.as_raw_fd(), response.as_bytes()).unwrap(),
            response.len()
        );
        self.out.push(Message::conn(
            Kind::Return,
            msg.token,
            msg.listener,
            msg.peer,
            fd,
            Vec::new(),
        ));
        assert!(self.out.flush(self.chan.as_raw_fd()).unwrap());
    }
}

fn read_response(client: &mut TcpStream) -> String {
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("\r\n\r\n") || got.ends_with(b"\r\n\r\n") {
        let n = client.read(&mut buf).unwrap();
        assert!(n > 0, "connection closed");
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(got).unwrap()
}

#[test]
fn each_request_of_a_keep_alive_connection_is_handed_on_whole() {
    let front = start();
    let mut worker = FakeWorker::add(&front.control, 1, "general");
    let mut client = TcpStream::connect(front.addr).unwrap();
    // Half a head first: nothing is handed on until the head is whole.
    client.write_all(b"GET /a HTTP/1.1\r\nHost: x").unwrap();
    assert!(worker.nothing());
    client.write_all(b"\r\n\r\n").unwrap();
    let msg = worker.next();
    assert_eq!(msg.kind, Kind::Conn);
    assert_eq!(msg.data, b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n");
    let local = client.local_addr().unwrap();
    assert_eq!(msg.peer, Peer::Inet(local.ip(), local.port()));
    worker.serve(msg, "a");
    assert!(read_response(&mut client).ends_with("\r\n\r\na"));
    // The returned connection's next request comes again, to the same (only) worker.
    client
        .write_all(b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let msg = worker.next();
    assert!(msg.data.starts_with(b"GET /b"));
    worker.serve(msg, "b");
    assert!(read_response(&mut client).ends_with('b'));
    send_control(&front.control, "drain 5", None);
    let stats = front.thread.join().unwrap();
    assert_eq!(
        (stats.accepted, stats.dispatched, stats.returned),
        (1, 2, 2)
    );
}

#[test]
fn bulk_goes_to_the_general_worker_and_small_to_the_free_one() {
    let front = start();
    let mut general = FakeWorker::add(&front.control, 1, "general");
    let mut fast = FakeWorker::add(&front.control, 2, "fast");
    let mut uploader = TcpStream::connect(front.addr).unwrap();
    uploader
        .write_all(b"POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nxx")
        .unwrap();
    let upload = general.next();
    assert!(upload.data.starts_with(b"POST /up"));
    assert!(
        upload.data.ends_with(b"xx"),
        "body bytes read with the head go along"
    );
    // While the upload is with the general worker, small requests go to the fast one.
    for _ in 0..3 {
        let mut small = TcpStream::connect(front.addr).unwrap();
        small
            .write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let msg = fast.next();
        fast.serve(msg, "pong");
        assert!(read_response(&mut small).ends_with("pong"));
    }
    assert!(general.nothing());
    // A chunked upload is bulk too, and a fast worker never takes it.
    let mut chunked = TcpStream::connect(front.addr).unwrap();
    chunked
        .write_all(b"POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        .unwrap();
    let msg = general.next();
    assert!(msg.data.starts_with(b"POST /up"));
    assert!(fast.nothing());
    drop((upload, msg));
    send_control(&front.control, "drain 0.2", None);
    front.thread.join().unwrap();
}

#[test]
fn requests_wait_for_a_worker_and_a_gone_worker_costs_its_requests_only() {
    let front = start();
    let mut client = TcpStream::connect(front.addr).unwrap();
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    thread::sleep(Duration::from_millis(50));
    // The request waited in the front until a worker came.
    let mut first = FakeWorker::add(&front.control, 1, "general");
    let msg = first.next();
    // This worker dies holding it: its client sees the connection close.
    drop((msg, first));
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(client.read(&mut buf).unwrap_or(0), 0);
    // A new worker serves new connections.
    let mut second = FakeWorker::add(&front.control, 2, "general");
    let mut client = TcpStream::connect(front.addr).unwrap();
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let msg = second.next();
    second.serve(msg, "ok");
    assert!(read_response(&mut client).ends_with("ok"));
    send_control(&front.control, "drain 5", None);
    let stats = front.thread.join().unwrap();
    assert_eq!(stats.lost_with_worker, 1);
}

#[test]
fn draining_refuses_new_connections_and_serves_what_was_sent() {
    let front = start();
    let mut worker = FakeWorker::add(&front.control, 1, "general");
    let mut idle = TcpStream::connect(front.addr).unwrap();
    let mut half = TcpStream::connect(front.addr).unwrap();
    half.write_all(b"GET /late HTTP/1.1\r\n").unwrap();
    thread::sleep(Duration::from_millis(50));
    send_control(&front.control, "drain 5", None);
    thread::sleep(Duration::from_millis(50));
    // The listener is closed: the kernel refuses new connections.
    assert!(TcpStream::connect(front.addr).is_err());
    // An idle connection with nothing sent is closed.
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(idle.read(&mut buf).unwrap_or(0), 0);
    // The worker was told: its responses now say `Connection: close`.
    let notice = worker.next();
    assert_eq!((notice.kind, notice.token), (Kind::Done, DRAINING));
    // Half a head is waited for, then handed on marked "close after".
    half.write_all(b"Host: x\r\n\r\n").unwrap();
    let msg = worker.next();
    assert_eq!(msg.detail, CLOSE_AFTER);
    worker.out.push(Message::done(msg.token, DONE_CLOSED));
    assert!(worker.out.flush(worker.chan.as_raw_fd()).unwrap());
    drop(msg);
    // Nothing is left: the front returns well before the deadline.
    let t = Instant::now();
    front.thread.join().unwrap();
    assert!(t.elapsed() < Duration::from_secs(4));
}

#[test]
fn a_head_that_times_out_gets_a_408() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let (control, theirs) = channel_pair().unwrap();
    let thread = thread::spawn(move || {
        let mut log = |_: &str| {};
        let mut cfg = config();
        cfg.timeout_header = 0.2;
        Front::new(vec![OwnedFd::from(listener)], theirs, cfg, &mut log)
            .unwrap()
            .run()
            .unwrap()
    });
    let mut client = TcpStream::connect(addr).unwrap();
    client.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut got = String::new();
    let _ = client.read_to_string(&mut got);
    assert!(got.starts_with("HTTP/1.1 408"), "{got:?}");
    drop(control);
    thread.join().unwrap();
}

#[test]
fn a_leaving_worker_gets_nothing_new_and_its_channel_closes_when_it_is_done() {
    let front = start();
    let mut old = FakeWorker::add(&front.control, 1, "general");
    let mut client = TcpStream::connect(front.addr).unwrap();
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let msg = old.next();
    // It says it is leaving while the request is with it.
    old.out.push(Message::done(LEAVING, 0));
    assert!(old.out.flush(old.chan.as_raw_fd()).unwrap());
    thread::sleep(Duration::from_millis(50));
    // A new request waits for another worker.
    let mut other = TcpStream::connect(front.addr).unwrap();
    other
        .write_all(b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert!(old.nothing());
    let mut new = FakeWorker::add(&front.control, 2, "general");
    let got = new.next();
    assert!(got.data.starts_with(b"GET /other"));
    new.serve(got, "new");
    assert!(read_response(&mut other).ends_with("new"));
    // The old worker's request comes back; then its channel closes (end of stream).
    old.serve(msg, "old");
    assert!(read_response(&mut client).ends_with("old"));
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match old.inp.recv(old.chan.as_raw_fd()) {
            Err(e) => {
                assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
                break;
            }
            Ok(_) => assert!(Instant::now() < until, "the channel stayed open"),
        }
        thread::sleep(Duration::from_millis(5));
    }
    // The kept-alive client's next request goes to the new worker.
    client
        .write_all(b"GET /again HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let again = new.next();
    assert!(again.data.starts_with(b"GET /again"));
    drop(again);
    send_control(&front.control, "drain 0.2", None);
    front.thread.join().unwrap();
}

/// Polls `board` until `done` holds of a snapshot (the front publishes after each batch).
fn board_until(board: &Board, done: impl Fn(&FrontState, &[WorkerState]) -> bool) {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let (front, workers) = board.snapshot();
        if done(&front, &workers) {
            return;
        }
        assert!(
            Instant::now() < until,
            "board never got there: {front:?} {workers:?}"
        );
        thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn the_board_shows_each_worker_s_lane_load_and_bulk_work() {
    let board = Arc::new(Board::new(4).unwrap());
    let front = start_with(Some(board.clone()));
    let mut general = FakeWorker::add(&front.control, 11, "general");
    let _fast = FakeWorker::add(&front.control, 12, "fast");
    board_until(&board, |_, w| w.len() == 2);
    let mut client = TcpStream::connect(front.addr).unwrap();
    client
        .write_all(b"POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n")
        .unwrap();
    let msg = general.next();
    board_until(&board, |f, w| {
        f.accepted == 1 && f.dispatched == 1 && w[0].in_flight == 1 && w[0].bulk_in_flight == 1
    });
    let (_, workers) = board.snapshot();
    let (g, fast) = (workers[0], workers[1]);
    assert_eq!((g.id, g.fast_lane, g.handed_total), (11, false, 1));
    assert!(g.oldest_ns > 0 && !g.bulk_running && !g.leaving);
    assert_eq!(
        (fast.id, fast.fast_lane, fast.in_flight, fast.oldest_ns),
        (12, true, 0, 0)
    );
    // The worker says bulk work runs there, then answers and gives the connection back.
    general.out.push(Message::done(LEAVING, BULK_STARTED));
    assert!(general.out.flush(general.chan.as_raw_fd()).unwrap());
    board_until(&board, |_, w| w[0].bulk_running);
    general.serve(msg, "ok");
    board_until(&board, |f, w| {
        w[0].in_flight == 0 && w[0].oldest_ns == 0 && f.returned == 1 && f.held == 1
    });
    send_control(&front.control, "drain 5", None);
    board_until(&board, |f, _| f.draining);
    front.thread.join().unwrap();
}

#[test]
fn connections_accepted_and_closed_by_the_front_are_traced() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (control, theirs) = channel_pair().unwrap();
    let traced = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = traced.clone();
    let thread = thread::spawn(move || {
        let mut log = |m: &str| eprintln!("front: {m}");
        let mut trace = |peer: &Peer, made: bool| seen.lock().unwrap().push((*peer, made));
        let front = Front::new(vec![OwnedFd::from(listener)], theirs, config(), &mut log)
            .unwrap()
            .with_trace(&mut trace);
        front.run().unwrap()
    });
    let client = TcpStream::connect(addr).unwrap();
    let local = client.local_addr().unwrap();
    let peer = Peer::Inet(local.ip(), local.port());
    let until = Instant::now() + Duration::from_secs(5);
    while traced.lock().unwrap().is_empty() {
        assert!(Instant::now() < until, "the accept was not traced");
        thread::sleep(Duration::from_millis(2));
    }
    // The client leaves while the front holds the connection idle: the front closes it.
    drop(client);
    while traced.lock().unwrap().len() < 2 {
        assert!(Instant::now() < until, "the close was not traced");
        thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(*traced.lock().unwrap(), vec![(peer, true), (peer, false)]);
    send_control(&control, "drain 1", None);
    thread.join().unwrap();
}

#[test]
fn with_place_at_accept_a_connection_is_handed_on_before_any_byte_to_a_worker_without_bulk() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (control, theirs) = channel_pair().unwrap();
    let thread = thread::spawn(move || {
        let mut log = |m: &str| eprintln!("front: {m}");
        let config = Config {
            place_at_accept: true,
            ..config()
        };
        Front::new(vec![OwnedFd::from(listener)], theirs, config, &mut log)
            .unwrap()
            .run()
            .unwrap()
    });
    let mut busy = FakeWorker::add(&control, 1, "general");
    let mut free = FakeWorker::add(&control, 2, "general");
    // Worker 1 runs bulk work: new connections go to worker 2, with no byte read.
    busy.out.push(Message::done(LEAVING, BULK_STARTED));
    assert!(busy.out.flush(busy.chan.as_raw_fd()).unwrap());
    thread::sleep(Duration::from_millis(50));
    let clients: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
    for _ in &clients {
        let msg = free.next();
        assert_eq!((msg.kind, msg.data.len()), (Kind::Conn, 0));
    }
    assert!(busy.nothing());
    send_control(&control, "drain 0", None);
    thread.join().unwrap();
}

#[test]
fn an_h2c_preface_is_handed_on_whole_without_waiting_for_a_head() {
    let front = start();
    let mut worker = FakeWorker::add(&front.control, 1, "general");
    let mut client = TcpStream::connect(front.addr).unwrap();
    // The preface up to its blank line reads as a whole (bad) HTTP/1.1 head, which would go
    // on at once to be refused: a begun preface waits for the rest instead.
    client.write_all(&H2_PREFACE[..18]).unwrap();
    assert!(worker.nothing());
    // Whole, it goes on at once (no HTTP/1.1 head follows), with what came after it.
    let mut rest = H2_PREFACE[18..].to_vec();
    rest.extend_from_slice(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00");
    client.write_all(&rest).unwrap();
    let msg = worker.next();
    assert_eq!(msg.kind, Kind::Conn);
    assert!(msg.data.starts_with(H2_PREFACE));
    // The worker keeps it (HTTP/2): it says `Done` when it closes it.
    worker.out.push(Message::done(msg.token, DONE_CLOSED));
    assert!(worker.out.flush(worker.chan.as_raw_fd()).unwrap());
    drop(msg);
    send_control(&front.control, "drain 5", None);
    let stats = front.thread.join().unwrap();
    assert_eq!((stats.accepted, stats.dispatched), (1, 1));
}
