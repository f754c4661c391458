//! Whole conversations, table-driven: each is played whole, byte by byte, in pieces of 7 bytes,
//! and (when it leaves the connection open) with a pipelined request behind; the transcripts
//! must agree with the expected one.
#![allow(
    clippy::float_cmp,
    reason = "the deadlines compared are sums of small whole numbers, exact in f64"
)]

use super::replay::{replay, Play, Transcript};
use super::*;

/// A pipelined request behind a conversation.
const NEXT: &[u8] = b"GET /next HTTP/1.1\r\nHost: b\r\n\r\n";
const NEXT_EVENTS: [&str; 2] = ["head GET /next Empty", "got 0 bytes, keep-alive"];

struct Case {
    name: &'static str,
    input: &'static [u8],
    half_close: bool,
    settings: Settings,
    events: &'static [&'static str],
    phase: Phase,
}

const SMALL: Settings = Settings {
    limits: Limits {
        max_head_bytes: 64,
        max_headers: 4,
        max_uri_bytes: 16,
    },
    limit_body: Some(8),
    timeout_header: 5.0,
    timeout_keep_alive: 5.0,
};

const fn case(
    name: &'static str,
    input: &'static [u8],
    events: &'static [&'static str],
    phase: Phase,
) -> Case {
    Case {
        name,
        input,
        half_close: false,
        settings: Settings {
            limits: Limits {
                max_head_bytes: 65536,
                max_headers: 100,
                max_uri_bytes: 8192,
            },
            limit_body: None,
            timeout_header: 5.0,
            timeout_keep_alive: 5.0,
        },
        events,
        phase,
    }
}

const fn half_closed(mut c: Case) -> Case {
    c.half_close = true;
    c
}

const fn small(mut c: Case) -> Case {
    c.settings = SMALL;
    c
}

const CASES: &[Case] = &[
    case(
        "get",
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
        &["head GET / Empty", "got 0 bytes, keep-alive"],
        Phase::Idle,
    ),
    case(
        "post with a length",
        b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
        &["head POST /p Length(5)", "got 5 bytes, keep-alive"],
        Phase::Idle,
    ),
    case(
        "chunked with trailers",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nT: 1\r\n\r\n",
        &["head POST / Chunked", "got 5 bytes, keep-alive"],
        Phase::Idle,
    ),
    case(
        "expect 100-continue",
        b"PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
        &["head PUT / Length(3)", "100 continue", "got 3 bytes, keep-alive"],
        Phase::Idle,
    ),
    case(
        "expect 100-continue in HTTP/1.0 is ignored",
        b"PUT / HTTP/1.0\r\nConnection: keep-alive\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\na",
        &["head PUT / Length(1)", "got 1 bytes, keep-alive"],
        Phase::Idle,
    ),
    case(
        "http/1.0 closes",
        b"GET / HTTP/1.0\r\n\r\n",
        &["head GET / Empty", "got 0 bytes, close"],
        Phase::Lingering,
    ),
    case(
        "connection close; what follows is never read",
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n",
        &["head GET / Empty", "got 0 bytes, close"],
        Phase::Lingering,
    ),
    case(
        "pipelined",
        b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nPOST /2 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhiGET /3 HTTP/1.1\r\nHost: a\r\n\r\n",
        &[
            "head GET /1 Empty",
            "got 0 bytes, keep-alive",
            "head POST /2 Length(2)",
            "got 2 bytes, keep-alive",
            "head GET /3 Empty",
            "got 0 bytes, keep-alive",
        ],
        Phase::Idle,
    ),
    case(
        "empty lines before a request",
        b"\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
        &["head GET / Empty", "got 0 bytes, keep-alive"],
        Phase::Idle,
    ),
    case(
        "head request",
        b"HEAD / HTTP/1.1\r\nHost: a\r\n\r\n",
        &["head HEAD / Empty", "got 0 bytes, keep-alive"],
        Phase::Idle,
    ),
    case(
        "invalid head",
        b"GET / HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n",
        &["invalid 400"],
        Phase::Lingering,
    ),
    case(
        "invalid head after a good request",
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\nNOT HTTP\r\n\r\n",
        &["head GET / Empty", "got 0 bytes, keep-alive", "invalid 400"],
        Phase::Lingering,
    ),
    case(
        "a lone CR before HEAD is judged where the parser refuses it",
        b"\rHEAD / HTTP/1.1\r\nHost: a\r\n\r\n",
        &["invalid 400"],
        Phase::Lingering,
    ),
    case(
        "invalid chunk size",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        &["head POST / Chunked", "invalid body 400"],
        Phase::Lingering,
    ),
    case(
        "unsupported version",
        b"GET / HTTP/2.0\r\n\r\n",
        &["invalid 505"],
        Phase::Lingering,
    ),
    case(
        "upgrade is the last request",
        b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
        &["head GET /ws Empty upgrade", "got 0 bytes, close"],
        Phase::Lingering,
    ),
    half_closed(case(
        "half-close after a request",
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
        &["head GET / Empty", "got 0 bytes, keep-alive", "input ended"],
        Phase::Lingering,
    )),
    half_closed(case(
        "half-close after two pipelined requests",
        b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n",
        &[
            "head GET /1 Empty",
            "got 0 bytes, keep-alive",
            "head GET /2 Empty",
            "got 0 bytes, keep-alive",
            "input ended",
        ],
        Phase::Lingering,
    )),
    half_closed(case(
        "half-close mid-head",
        b"GET / HTTP/1.1\r\nHost:",
        &["input ended"],
        Phase::Lingering,
    )),
    half_closed(case(
        "half-close mid-body",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc",
        &["head POST / Length(10)", "invalid body 400"],
        Phase::Lingering,
    )),
    half_closed(case(
        "half-close with nothing sent",
        b"",
        &["input ended"],
        Phase::Lingering,
    )),
    small(case(
        "declared body over the limit",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9\r\n\r\n123456789",
        &["invalid 413"],
        Phase::Lingering,
    )),
    small(case(
        "chunked body over the limit",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n123456789\r\n0\r\n\r\n",
        &["head POST / Chunked", "invalid body 413"],
        Phase::Lingering,
    )),
    small(case(
        "body at the limit",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 8\r\n\r\n12345678",
        &["head POST / Length(8)", "got 8 bytes, keep-alive"],
        Phase::Idle,
    )),
    small(case(
        "head over the limit",
        b"GET / HTTP/1.1\r\nHost: a\r\nA: 1234567890123456789012345678901234567890\r\n\r\n",
        &["invalid 431"],
        Phase::Lingering,
    )),
    small(case(
        "target over the limit",
        b"GET /12345678901234567 HTTP/1.1\r\nHost: a\r\n\r\n",
        &["invalid 414"],
        Phase::Lingering,
    )),
];

fn play(c: &Case, input: &[u8], piece: usize) -> Transcript {
    replay(
        input,
        Play {
            piece,
            half_close: c.half_close,
            settings: c.settings,
        },
    )
}

fn events(t: &Transcript) -> Vec<&str> {
    t.events.iter().map(String::as_str).collect()
}

#[test]
fn conversations_whole_byte_by_byte_and_in_pieces() {
    for c in CASES {
        let whole = play(c, c.input, c.input.len());
        assert_eq!(events(&whole), c.events, "{}", c.name);
        assert_eq!(whole.phase, Some(c.phase), "{}", c.name);
        for piece in [1, 7] {
            let split = play(c, c.input, piece);
            assert_eq!(events(&split), c.events, "{} in pieces of {piece}", c.name);
            assert_eq!(
                split.output, whole.output,
                "{} in pieces of {piece}",
                c.name
            );
            assert_eq!(split.phase, whole.phase, "{} in pieces of {piece}", c.name);
        }
    }
}

#[test]
fn conversations_with_a_pipelined_request_behind() {
    for c in CASES.iter().filter(|c| !c.half_close) {
        let input = [c.input, NEXT].concat();
        let mut expected = c.events.to_vec();
        if c.phase == Phase::Idle {
            expected.extend(NEXT_EVENTS);
        }
        for piece in [1, 7, input.len()] {
            let t = play(c, &input, piece);
            assert_eq!(events(&t), expected, "{} + next, pieces of {piece}", c.name);
            assert_eq!(t.phase, Some(c.phase), "{} + next", c.name);
        }
    }
}

#[test]
fn responses_are_framed_for_the_request() {
    let c = &CASES[0];
    let t = play(
        c,
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\nHEAD / HTTP/1.0\r\n\r\n",
        1,
    );
    let text = String::from_utf8(t.output).unwrap();
    assert_eq!(
        text,
        "HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\ngot 0 bytes\
         HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n"
    );
}

#[test]
fn an_invalid_head_request_is_answered_without_a_body_however_it_arrives() {
    let c = &CASES[0];
    for piece in [1, 3, 64] {
        let t = play(
            c,
            b"HEAD / HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n",
            piece,
        );
        let text = String::from_utf8(t.output).unwrap();
        assert!(text.ends_with("connection: close\r\n\r\n"), "{text}");
        let t = play(c, b"\rHEAD / HTTP/1.1\r\n\r\n", piece);
        let text = String::from_utf8(t.output).unwrap();
        assert!(
            text.ends_with("head"),
            "a body for a request that is not HEAD: {text}"
        );
    }
}

#[test]
fn continue_is_not_sent_once_the_response_started() {
    let mut conn: Http1Conn<()> = Http1Conn::new(Settings::default(), Vec::new(), 0.0);
    let head = b"PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n";
    let _ = conn.read_into(|b| b.extend_from_slice(head));
    assert_eq!(conn.next_head(|| 0.0), HeadEvent::Head);
    let seq = conn.begin(false, false, ());
    conn.consume_head();
    assert_eq!(seq, 1);
    conn.exchange_mut().unwrap().resp.start(417, false).unwrap();
    assert!(!conn.take_continue());
}

#[test]
fn an_unread_body_is_skipped_if_buffered_else_the_connection_closes() {
    let head = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\n";
    for (body, reuse) in [
        (&b"abcd"[..], Reuse::KeepAlive { pipelined: false }),
        (&b"abcdGET"[..], Reuse::KeepAlive { pipelined: true }),
        (&b"ab"[..], Reuse::Close),
    ] {
        let mut conn: Http1Conn<()> = Http1Conn::new(Settings::default(), head.to_vec(), 0.0);
        let _ = conn.read_into(|b| b.extend_from_slice(body));
        assert_eq!(conn.next_head(|| 0.0), HeadEvent::Head);
        let _ = conn.begin(false, false, ());
        conn.consume_head();
        let (_, got) = conn.complete(true, 1.0).unwrap();
        assert_eq!(got, reuse);
        if let Reuse::KeepAlive { .. } = got {
            assert_eq!(conn.phase(), Phase::Idle);
            assert_eq!(
                conn.deadline(),
                1.0 + Settings::default().timeout_keep_alive
            );
            assert_eq!(conn.input(), &body[4..]);
        } else {
            assert_eq!(conn.phase(), Phase::Closing);
        }
    }
}

#[test]
fn close_after_and_upgrade_turn_keep_alive_off() {
    for (upgrade, close_after) in [(true, false), (false, true)] {
        let mut conn: Http1Conn<()> = Http1Conn::new(Settings::default(), Vec::new(), 0.0);
        let _ = conn.read_into(|b| b.extend_from_slice(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"));
        assert_eq!(conn.next_head(|| 0.0), HeadEvent::Head);
        let _ = conn.begin(upgrade, close_after, ());
        assert!(!conn.exchange().unwrap().info.keep_alive);
    }
}

#[test]
fn the_header_clock_starts_with_the_first_bytes_of_a_head() {
    let mut conn: Http1Conn<()> = Http1Conn::new(Settings::default(), Vec::new(), 0.0);
    let _ = conn.read_into(|b| b.extend_from_slice(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"));
    assert_eq!(conn.next_head(|| 0.0), HeadEvent::Head);
    let _ = conn.begin(false, false, ());
    conn.consume_head();
    assert_eq!(conn.deadline(), f64::INFINITY);
    let _ = conn.complete(true, 10.0).unwrap();
    assert_eq!(conn.deadline(), 15.0);
    let _ = conn.read_into(|b| b.extend_from_slice(b"GET"));
    assert_eq!(conn.next_head(|| 12.0), HeadEvent::Wait);
    assert_eq!(conn.deadline(), 22.0);
    // Only the first bytes start it.
    let _ = conn.read_into(|b| b.extend_from_slice(b" /"));
    assert_eq!(conn.next_head(|| 13.0), HeadEvent::Wait);
    assert_eq!(conn.deadline(), 22.0);
}

#[test]
fn reading_pauses_while_the_buffer_is_full() {
    let mut conn: Http1Conn<()> = Http1Conn::new(Settings::default(), Vec::new(), 0.0);
    let chunk = vec![b'x'; READ_CHUNK];
    let mut reads = 0;
    while conn.read_into(|b| b.extend_from_slice(&chunk)).is_some() {
        reads += 1;
        assert!(reads < 100, "never paused");
    }
    assert_eq!(reads, (READ_HIGH + READ_CHUNK) / READ_CHUNK);
    assert!(conn.input_full());
}

#[test]
fn hand_back_returns_the_unread_bytes_and_closes() {
    let mut conn: Http1Conn<()> = Http1Conn::new(Settings::default(), b"GET /".to_vec(), 0.0);
    assert_eq!(conn.hand_back(), Some(b"GET /".to_vec()));
    assert_eq!(conn.phase(), Phase::Closed);
    assert!(!conn.abort());
}

#[test]
fn the_lingering_deadline_starts_when_the_write_side_is_shut() {
    let mut conn: Http1Conn<()> = Http1Conn::new(Settings::default(), Vec::new(), 0.0);
    assert!(conn.close());
    assert!(!conn.close());
    conn.shut(3.0);
    assert_eq!(conn.phase(), Phase::Lingering);
    assert_eq!(conn.deadline(), 3.0 + LINGER);
    assert!(conn.abort());
    assert_eq!(conn.phase(), Phase::Closed);
}

#[test]
fn after_the_clients_end_only_buffered_requests_keep_the_connection() {
    for (input, reuse) in [
        (&b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"[..], Reuse::Close),
        (
            &b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n"[..],
            Reuse::KeepAlive { pipelined: true },
        ),
    ] {
        let mut conn: Http1Conn<()> = Http1Conn::new(Settings::default(), input.to_vec(), 0.0);
        assert_eq!(conn.next_head(|| 0.0), HeadEvent::Head);
        let _ = conn.begin(false, false, ());
        conn.consume_head();
        // The client half-closes while the app is still answering.
        conn.receive_eof();
        let (_, got) = conn.complete(true, 1.0).unwrap();
        assert_eq!(got, reuse);
    }
}
