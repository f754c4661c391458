//! A reference driver for [`Http1Conn`]: plays a client's bytes into a connection in pieces of a
//! given size and answers every request as a small app would (the whole body read, then `200`
//! with a body naming what was read). It writes a transcript of everything the connection said
//! and decided. The connection's tests and its fuzz target (`fuzz/fuzz_targets/conversation.rs`)
//! check that a transcript does not depend on how the bytes were split.
//!
//! Invariant it checks as it goes: a connection never asks for more input while it can still
//! make progress with what it has, and never stalls a read (flow control pauses only while the
//! app has input to take).

use std::fmt::Write as _;

use super::{BodyEvent, HeadEvent, Http1Conn, Phase, Reuse, Settings, CONTINUE, READ_CHUNK};
use crate::http::{encode_head, HttpError, ServerFields};

/// How one conversation is played.
#[derive(Debug, Clone, Copy)]
pub struct Play {
    /// Bytes handed to the connection per read (at least 1).
    pub piece: usize,
    /// The client ends its input (half-close) after its last byte.
    pub half_close: bool,
    pub settings: Settings,
}

/// What the connection said and decided, in order, and what it wrote.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Transcript {
    /// One line per event or decision.
    pub events: Vec<String>,
    /// Everything written to the client.
    pub output: Vec<u8>,
    /// The phase at the end.
    pub phase: Option<Phase>,
    /// Bytes of the input the connection never read (it closed first).
    pub unread: usize,
}

/// Plays `input` into a fresh connection as `play` says.
pub fn replay(input: &[u8], play: Play) -> Transcript {
    let mut conn: Http1Conn<Vec<u8>> = Http1Conn::new(play.settings, Vec::new(), 0.0);
    let mut t = Transcript::default();
    let mut fed = 0;
    let piece = play.piece.max(1);
    let mut ended = false;
    loop {
        step(&mut conn, &mut t);
        if matches!(conn.phase(), Phase::Lingering | Phase::Closed) {
            break;
        }
        if fed < input.len() {
            let end = (fed + piece.min(READ_CHUNK)).min(input.len());
            let read = conn.read_into(|buf| buf.extend_from_slice(&input[fed..end]));
            assert!(
                read.is_some(),
                "reading paused while nothing can drain the buffer"
            );
            fed = end;
        } else if play.half_close && !ended {
            ended = true;
            conn.receive_eof();
        } else {
            break;
        }
    }
    t.phase = Some(conn.phase());
    t.unread = input.len() - fed;
    t
}

const FIELDS: ServerFields<'static> = ServerFields {
    date: None,
    server: None,
    extra: &[],
};

/// Runs the connection until it waits for input or closes.
fn step(conn: &mut Http1Conn<Vec<u8>>, t: &mut Transcript) {
    loop {
        match conn.phase() {
            Phase::Idle => match conn.next_head(|| 0.0) {
                HeadEvent::Wait => return,
                HeadEvent::InputEnded => {
                    t.events.push("input ended".into());
                    let _closing = conn.close();
                    conn.shut(0.0);
                    return;
                }
                HeadEvent::Invalid(e) => return reject(conn, t, "invalid", &e),
                HeadEvent::Head => {
                    let head = conn.head();
                    let target = String::from_utf8_lossy(&conn.input()[head.target.clone()]);
                    let line = format!(
                        "head {} {target} {:?}{}",
                        String::from_utf8_lossy(conn.method()),
                        head.body,
                        if head.upgrade { " upgrade" } else { "" }
                    );
                    let upgrade = head.upgrade;
                    t.events.push(line);
                    let seq = conn.begin(upgrade, false, Vec::new());
                    assert_eq!(conn.current(seq).map(|e| e.seq), Some(seq));
                    conn.consume_head();
                }
            },
            Phase::Busy => {
                if conn.take_continue() {
                    t.events.push("100 continue".into());
                    t.output.extend_from_slice(CONTINUE);
                }
                let event = conn.read_body(|buf, runs, total| {
                    let mut body = Vec::with_capacity(total);
                    for r in runs {
                        body.extend_from_slice(&buf[r.clone()]);
                    }
                    body
                });
                match event {
                    BodyEvent::Wait => return,
                    BodyEvent::Gone => {
                        t.events.push("client gone".into());
                        conn.abort();
                        return;
                    }
                    BodyEvent::Invalid(e) => return reject(conn, t, "invalid body", &e),
                    BodyEvent::Data { body, more } => {
                        let app = &mut conn.exchange_mut().expect("busy").app;
                        app.extend_from_slice(&body);
                        if !more {
                            respond(conn, t);
                        }
                    }
                }
            }
            Phase::Closing | Phase::Lingering | Phase::Closed => return,
        }
    }
}

/// The answer to an invalid request, written before the connection closes.
fn reject(conn: &mut Http1Conn<Vec<u8>>, t: &mut Transcript, what: &str, e: &HttpError) {
    t.events.push(format!("{what} {}", e.status));
    let answer = conn.reject(e, &FIELDS);
    t.output.extend_from_slice(&answer);
    conn.shut(0.0);
}

/// The app's answer once the whole body is read: `200`, `got N bytes`.
fn respond(conn: &mut Http1Conn<Vec<u8>>, t: &mut Transcript) {
    let e = conn.exchange_mut().expect("busy");
    let mut text = String::new();
    let _ = write!(text, "got {} bytes", e.app.len());
    e.resp.start(200, false).expect("first start");
    e.resp.check_body_part().expect("started");
    let framing = encode_head(
        &mut t.output,
        e.info,
        200,
        &[],
        Some(text.len() as u64),
        &FIELDS,
    )
    .expect("a valid head");
    e.resp.framing = Some(framing);
    e.resp
        .count_body(framing, text.len() as u64)
        .expect("as declared");
    if framing.send_body {
        t.output.extend_from_slice(text.as_bytes());
    }
    e.resp.body_done = true;
    assert_eq!(e.resp.short_of_declared(framing), None);
    let (done, reuse) = conn.complete(framing.keep_alive, 0.0).expect("busy");
    let next = match reuse {
        Reuse::KeepAlive { .. } => "keep-alive",
        Reuse::Close => "close",
    };
    t.events.push(format!("{text}, {next}"));
    assert_eq!(done.body_bytes(), done.app.len() as u64);
    if reuse == Reuse::Close {
        conn.shut(0.0);
    }
}
