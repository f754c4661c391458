//! WebSockets (RFC 6455) on the HTTP server: the upgrade, ASGI's `websocket` messages, and the
//! frames, decoded and encoded by the sans-IO codec `ferroloop_core::ws`.
//!
//! A WebSocket is its connection's last request: the upgrade request becomes the current
//! `Request` with `ws: Some(WsSession)`, the connection stays `Busy` while the socket is open,
//! nothing is pipelined behind it, and it never goes back to `Idle`.
//!
//! States (`WsState`), all changed on the loop thread:
//! - `Handshake`: the app has its scope; its first `receive()` gives `websocket.connect`. It
//!   answers with `websocket.accept` (the 101 is queued: `Open`), `websocket.close` (a 403, then
//!   the connection closes) or `websocket.http.response.start` (`Denying`: an HTTP response
//!   through the HTTP path, `Connection: close`).
//! - `Open`: frames are decoded as they arrive (`ws_input`, from the connection's read path):
//!   data messages wait in `inbox` for `receive()`, pings are answered at once, and reading
//!   pauses while `inbox` holds `ws_max_queue` messages or `READ_HIGH` bytes (flow control).
//!   `close_sent` is set once a close frame is queued (the app's `websocket.close`, the echo of
//!   the client's, a protocol error, a keepalive timeout or the server's shutdown); after it
//!   no data frame is sent and data frames that arrive are dropped.
//!
//! What the app is told: `receive()` returns the queued messages in order, then
//! `websocket.disconnect` with `disconnect`'s code: the client's close code (1005 if its close
//! frame had none), the app's own close code once it sent `websocket.close` (as uvicorn), the
//! codec's error code (1002, 1007, 1009), 1011 for a keepalive timeout, 1012 at shutdown, or
//! 1006 when the connection ended without a close frame. A `send()` after the client closed or
//! the connection ended raises `ClientDisconnected` (an `OSError`, which Starlette turns into
//! `WebSocketDisconnect`), as under uvicorn.
//!
//! Closing: when the client closes first, its close frame is echoed and the server closes TCP
//! (`start_closing`: write side shut after the queue, then a lingering read). When the app
//! closes first, reading goes on until the client's close frame answers (or `CLOSE_TIMEOUT`
//! passes), and then the same. When the app's task ends while the socket is open, a close
//! frame goes out: 1000 if it returned, 1011 if it raised.

mod send;

use std::collections::VecDeque;

use ferroloop_core::http::{error_response, Head, HttpError, Version};
use ferroloop_core::ws::{
    self, close_payload, encode_head, Compressor, Decoder, DeflateParams, Event, Opcode,
    MAX_HEAD_LEN, RSV1,
};
use ferroloop_core::OutQueue;
use pyo3::create_exception;
use pyo3::exceptions::{PyOSError, PyRuntimeError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};

use super::conn::{ready, Conn, ConnState, Phase, READ_HIGH};
use super::effects::Effects;
use super::output::{flush_now, start_closing};
use super::HttpServer;

create_exception!(
    ferroloop._native,
    ClientDisconnected,
    PyOSError,
    "The WebSocket client has gone: raised by `send()` after the client closed or the \
     connection ended (uvicorn's `ClientDisconnected`)."
);

/// How long the server waits for the client's answer to its close frame before closing TCP
/// (uvicorn's and the websockets library's default `close_timeout`).
const CLOSE_TIMEOUT: f64 = 10.0;

/// The server's WebSocket options (`--ws-*`), or none when `--ws none`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WsOptions {
    /// Largest message accepted, in bytes: 1009 above it (`--ws-max-size`, uvicorn's 16 MiB).
    pub max_size: usize,
    /// Messages received and not yet read by the app before reading pauses (`--ws-max-queue`).
    pub max_queue: usize,
    /// Seconds between keepalive pings (`--ws-ping-interval`); `None`: no pings.
    pub ping_interval: Option<f64>,
    /// Seconds a ping waits for its pong before the connection fails with 1011
    /// (`--ws-ping-timeout`); `None`: no limit.
    pub ping_timeout: Option<f64>,
    /// Negotiate permessage-deflate (RFC 7692) when the client offers it
    /// (`--ws-per-message-deflate`, on by default as in uvicorn).
    pub per_message_deflate: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WsState {
    Handshake,
    Denying,
    Open,
}

/// One WebSocket's state, inside its connection's current `Request`.
pub(super) struct WsSession {
    state: WsState,
    accept: [u8; 28],
    connect_told: bool,
    decoder: Decoder,
    inbox: VecDeque<Event>,
    inbox_bytes: usize,
    close_sent: bool,
    /// The client sent a close frame, or the connection ended: `send()` raises
    /// `ClientDisconnected`.
    peer_gone: bool,
    /// The `websocket.disconnect` the app gets once `inbox` is empty.
    disconnect: Option<(u16, String)>,
    ping_due: f64,
    pong_due: f64,
    close_due: f64,
    /// Keepalive pings sent; the last one's payload is this count, big-endian.
    pings: u32,
    deflate: Deflate,
}

/// permessage-deflate on one WebSocket.
enum Deflate {
    /// Not offered (or not acceptable, or `--ws-per-message-deflate false`).
    Off,
    /// Offered and acceptable: answered in the 101 if the app accepts.
    Offered(DeflateParams),
    /// In force since the 101 went out. The compressor is made by the first data frame sent:
    /// about 400 KiB of zlib state (a 15-bit window) that a connection which never sends does
    /// not pay for.
    On {
        params: DeflateParams,
        compressor: Option<Compressor>,
    },
}

impl WsSession {
    fn new(accept: [u8; 28], deflate: Option<DeflateParams>, opts: &WsOptions) -> Self {
        Self {
            state: WsState::Handshake,
            accept,
            connect_told: false,
            decoder: Decoder::new(opts.max_size),
            inbox: VecDeque::new(),
            inbox_bytes: 0,
            close_sent: false,
            peer_gone: false,
            disconnect: None,
            ping_due: f64::INFINITY,
            pong_due: f64::INFINITY,
            close_due: f64::INFINITY,
            pings: 0,
            deflate: deflate.map_or(Deflate::Off, Deflate::Offered),
        }
    }

    fn deadline(&self) -> f64 {
        self.ping_due.min(self.pong_due).min(self.close_due)
    }

    /// The connection ended: the disconnect the app is told (1006 unless a close was
    /// exchanged or the app closed).
    pub(super) fn gone_code(&mut self) -> (u16, String) {
        self.peer_gone = true;
        self.disconnect.get_or_insert((1006, String::new())).clone()
    }

    /// Whether the 101 went out: the app's task ending then closes with a close frame.
    pub(super) fn is_open(&self) -> bool {
        self.state == WsState::Open
    }
}

/// What `websocket_request` decides about a parsed head.
pub(super) enum Upgrade {
    /// Not a WebSocket upgrade: an ordinary HTTP request.
    No,
    /// A valid upgrade: the session to put in the request.
    Yes(Box<WsSession>),
    /// A WebSocket upgrade the server refuses (400, or 426 for an unsupported version).
    Refused(HttpError),
}

/// Whether the request in `buf` (parsed into `head`) asks for a WebSocket: `GET`, HTTP/1.1,
/// `Upgrade: websocket` and `Connection: upgrade` (RFC 6455 §4.2.1), without a body.
fn websocket_request(buf: &[u8], head: &Head, opts: &WsOptions) -> Upgrade {
    if !head.upgrade || head.version != Version::Http11 || &buf[head.method.clone()] != b"GET" {
        return Upgrade::No;
    }
    let (mut upgrade, mut connection, mut version, mut key) = (false, false, None, None);
    let mut extensions = Vec::new();
    for (name, value) in head.header_fields(buf) {
        match name {
            b"upgrade" => upgrade |= ws::has_token(value, b"websocket"),
            b"connection" => connection |= ws::has_token(value, b"upgrade"),
            b"sec-websocket-version" => version = version.or(Some(value)),
            b"sec-websocket-key" => key = key.or(Some(value)),
            b"sec-websocket-extensions" => extensions.push(value),
            _ => {}
        }
    }
    if !(upgrade && connection) {
        return Upgrade::No;
    }
    if let Err(e) = ws::check_version(version) {
        return Upgrade::Refused(HttpError {
            status: e.status,
            reason: e.reason,
        });
    }
    let Some(key) = key else {
        return Upgrade::Refused(HttpError {
            status: 400,
            reason: "WebSocket upgrade without Sec-WebSocket-Key",
        });
    };
    if let Err(e) = ws::check_key(key) {
        return Upgrade::Refused(HttpError {
            status: e.status,
            reason: e.reason,
        });
    }
    if head.body != ferroloop_core::http::BodyKind::Empty {
        return Upgrade::Refused(HttpError {
            status: 400,
            reason: "WebSocket upgrade request with a body",
        });
    }
    let deflate = if opts.per_message_deflate {
        DeflateParams::negotiate(extensions)
    } else {
        None
    };
    Upgrade::Yes(Box::new(WsSession::new(ws::accept_key(key), deflate, opts)))
}

/// `idle_step`'s question about a parsed head: an ordinary request, a WebSocket (its session),
/// or an upgrade refused, whose answer is then queued and the connection closing.
pub(super) fn upgrade_step(
    py: Python<'_>,
    server: &HttpServer,
    st: &mut ConnState,
    fx: &mut Effects,
) -> Upgrade {
    let Some(opts) = server.opts().ws else {
        return Upgrade::No;
    };
    match websocket_request(st.http.input(), st.http.head(), &opts) {
        Upgrade::Refused(e) if e.status == 426 => {
            let date = server.date(py);
            let bytes = version_refusal(server, date.as_ref().map(|d| &d[..]), &e);
            let warning = format!("invalid WebSocket request: {}", e.reason);
            Conn::refuse(st, fx, &bytes, Some(warning));
            Upgrade::Refused(e)
        }
        Upgrade::Refused(e) => {
            Conn::reject(py, server, st, fx, &e);
            Upgrade::Refused(e)
        }
        other => other,
    }
}

/// The 426 answer to an upgrade in a version other than 13, which must name the version served
/// (RFC 6455 §4.4).
fn version_refusal(server: &HttpServer, date: Option<&[u8]>, e: &HttpError) -> Vec<u8> {
    let mut extra = server.opts().extra_headers.clone();
    extra.push((b"sec-websocket-version".to_vec(), b"13".to_vec()));
    let fields = ferroloop_core::http::ServerFields {
        extra: &extra,
        ..server.fields(date)
    };
    error_response(e.status, e.reason, &fields, false)
}

/// `{"type": "websocket.disconnect", "code": code, "reason": reason}`.
pub(super) fn disconnect_message(py: Python<'_>, code: u16, reason: &str) -> PyResult<Py<PyAny>> {
    let msg = PyDict::new(py);
    msg.set_item(intern!(py, "type"), intern!(py, "websocket.disconnect"))?;
    msg.set_item(intern!(py, "code"), code)?;
    msg.set_item(intern!(py, "reason"), reason)?;
    Ok(msg.into_any().unbind())
}

/// Queues one whole frame (header and payload copied into the queue).
fn queue_frame(out: &mut OutQueue, op: Opcode, payload: &[u8]) {
    queue_data_frame(out, op, false, payload);
}

/// Queues one whole frame, with RSV1 set if `compressed` (a permessage-deflate message).
fn queue_data_frame(out: &mut OutQueue, op: Opcode, compressed: bool, payload: &[u8]) {
    let mut head = [0u8; MAX_HEAD_LEN];
    let n = frame_head(op, compressed, payload.len(), &mut head);
    out.with_tail(|b| {
        b.extend_from_slice(&head[..n]);
        b.extend_from_slice(payload);
    });
}

/// A single-frame message's header; RSV1 marks a compressed payload (RFC 7692 §6).
fn frame_head(op: Opcode, compressed: bool, len: usize, head: &mut [u8; MAX_HEAD_LEN]) -> usize {
    let n = encode_head(op, true, len, head);
    if compressed {
        head[0] |= RSV1;
    }
    n
}

/// Queues a close frame with `code` and `reason`, and notes it was sent.
fn queue_close(st: &mut ConnState, code: Option<u16>, reason: &[u8]) {
    let payload = code.map_or_else(Vec::new, |c| close_payload(c, reason));
    queue_frame(&mut st.out, Opcode::Close, &payload);
    if let Some(ws) = st.ws_mut() {
        ws.close_sent = true;
        ws.ping_due = f64::INFINITY;
        ws.pong_due = f64::INFINITY;
    }
}

/// What one decoding step leaves to do once the session is no longer borrowed.
enum Decoded {
    More,
    /// A protocol error: (close code, reason, whether a close frame was sent already).
    Failed(u16, &'static str, bool),
    /// The client's close frame with its code; `echo`: answer it (no close frame of ours went
    /// out yet).
    Closed {
        echo: bool,
        code: Option<u16>,
    },
}

/// The request's path and query as uvicorn logs a WebSocket (`/chat?room=1`).
fn logged_path(py: Python<'_>, st: &ConnState) -> String {
    let Some(facts) = st.req().and_then(|r| r.app.facts.as_ref()) else {
        return String::new();
    };
    let path = facts.path.bind(py).to_str().unwrap_or("");
    let query = facts.query.bind(py).as_bytes();
    if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", String::from_utf8_lossy(query))
    }
}

/// The payload size of a queued data message (counted against `READ_HIGH`).
fn message_len(event: &Event) -> usize {
    match event {
        Event::Text(d) | Event::Binary(d) => d.len(),
        _ => 0,
    }
}

/// Sets the disconnect the app will be told, unless one is set already.
fn tell_disconnect(ws: &mut WsSession, code: u16, reason: &str) {
    if ws.disconnect.is_none() {
        ws.disconnect = Some((code, reason.to_owned()));
    }
}

/// The socket is done with (a close exchanged, a protocol error, a timeout): write what is
/// queued, then shut and linger.
fn finish(st: &mut ConnState, fx: &mut Effects) {
    if st.phase() == Phase::Busy && st.http.close() {
        start_closing(st, fx);
    }
}

impl Conn {
    /// The next message for the app's `receive()`, if there is one now.
    fn ws_next_message(
        py: Python<'_>,
        st: &mut ConnState,
        closed: bool,
    ) -> PyResult<Option<Py<PyAny>>> {
        let Some(ws) = st.ws_mut() else {
            return disconnect_message(py, 1006, "").map(Some);
        };
        if !ws.connect_told {
            ws.connect_told = true;
            let msg = PyDict::new(py);
            msg.set_item(intern!(py, "type"), intern!(py, "websocket.connect"))?;
            return Ok(Some(msg.into_any().unbind()));
        }
        if let Some(event) = ws.inbox.pop_front() {
            let msg = PyDict::new(py);
            msg.set_item(intern!(py, "type"), intern!(py, "websocket.receive"))?;
            ws.inbox_bytes -= message_len(&event);
            match event {
                Event::Text(data) => {
                    // SAFETY: the codec checked the whole message as UTF-8 before it made the
                    // event (`Event::Text`'s contract), so the bytes are a valid `str`.
                    let text = unsafe { std::str::from_utf8_unchecked(&data) };
                    msg.set_item(intern!(py, "text"), PyString::new(py, text))?;
                }
                Event::Binary(data) => {
                    msg.set_item(intern!(py, "bytes"), PyBytes::new(py, &data))?;
                }
                _ => unreachable!("only data messages are queued"),
            }
            return Ok(Some(msg.into_any().unbind()));
        }
        if let Some((code, reason)) = &ws.disconnect {
            return disconnect_message(py, *code, reason).map(Some);
        }
        if closed {
            ws.peer_gone = true;
            tell_disconnect(ws, 1006, "");
            return disconnect_message(py, 1006, "").map(Some);
        }
        Ok(None)
    }

    /// `receive()` of the WebSocket request `seq` (see `Conn::receive`).
    pub(super) fn ws_receive(slf: &Bound<'_, Self>, seq: u64) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let server = this.server.bind(py).get();
        let mut fx = Effects::default();
        let result = {
            let mut st = this.state.borrow(py)?;
            let Some(req) = st.http.current(seq) else {
                // The handshake was answered with an HTTP response: the socket is done.
                drop(st);
                return ready(py, disconnect_message(py, 1006, "")?);
            };
            if req.app.receive_waiter.is_some() {
                return Err(PyRuntimeError::new_err(
                    "receive() called while another receive() of the same WebSocket is waiting",
                ));
            }
            let closed = st.phase() == Phase::Closed;
            let msg = Self::ws_next_message(py, &mut st, closed)?;
            Self::ws_flow(server, &mut st, &mut fx);
            Self::message_or_waiter(py, server, &mut st, msg)?
        };
        Self::receive_done(slf, fx, result)
    }

    /// Flow control: reading pauses while the inbox is full (`ws_max_queue` messages or
    /// `READ_HIGH` bytes) or `READ_HIGH` undecoded bytes wait (before the handshake's answer),
    /// and goes on otherwise. Once a close frame is sent, reading goes on regardless: data is
    /// dropped from then on, and the client's close frame must be read. Only while `Busy`: a
    /// closing connection's reads belong to the lingering close.
    fn ws_flow(server: &HttpServer, st: &mut ConnState, fx: &mut Effects) {
        if st.phase() != Phase::Busy {
            return;
        }
        let max_queue = server.opts().ws.map_or(1, |o| o.max_queue);
        let undecoded = st.http.input().len();
        let Some(ws) = st.ws() else {
            return;
        };
        let want = ws.close_sent
            || (ws.inbox.len() < max_queue && ws.inbox_bytes < READ_HIGH && undecoded < READ_HIGH);
        let want = want && !st.http.eof();
        st.set_reading(fx, want);
    }

    /// New input on an open WebSocket (or an ended read): decode frames, answer pings and
    /// closes, queue messages, and hand the next one to a waiting `receive()`.
    pub(super) fn ws_input(
        py: Python<'_>,
        server: &HttpServer,
        st: &mut ConnState,
        fx: &mut Effects,
    ) -> PyResult<()> {
        let open = st.ws().is_some_and(|w| w.state == WsState::Open);
        if open {
            Self::ws_decode(st, fx);
        }
        flush_now(st, fx);
        let eof = st.http.eof();
        let phase = st.phase();
        if let Some(ws) = st.ws_mut() {
            if eof && phase == Phase::Busy {
                // The client is gone without (answering) a close frame.
                ws.peer_gone = true;
                tell_disconnect(ws, 1006, "");
                fx.close = true;
            }
        }
        Self::ws_wake_receiver(py, st, fx)?;
        Self::ws_flow(server, st, fx);
        Ok(())
    }

    /// Hands a waiting `receive()` its next message, if there is one now.
    fn ws_wake_receiver(py: Python<'_>, st: &mut ConnState, fx: &mut Effects) -> PyResult<()> {
        if st.req().is_some_and(|r| r.app.receive_waiter.is_some()) {
            if let Some(msg) = Self::ws_next_message(py, st, false)? {
                let req = st.req_mut().expect("checked above");
                let fut = req.app.receive_waiter.take().expect("checked above");
                fx.resolve.push((fut, msg));
            }
        }
        Ok(())
    }

    /// Decodes every complete frame in the read buffer.
    fn ws_decode(st: &mut ConnState, fx: &mut Effects) {
        loop {
            let ConnState { http, out, .. } = &mut *st;
            let after = http.with_input(|input, req| {
                let Some(ws) = req.and_then(|r| r.app.ws.as_deref_mut()) else {
                    return (0, None);
                };
                match ws.decoder.decode(input) {
                    Err(e) => {
                        // Fail the connection (RFC 6455 §7.1.7) with the codec's close code.
                        tell_disconnect(ws, e.code, e.reason);
                        ws.peer_gone = true;
                        (0, Some(Decoded::Failed(e.code, e.reason, ws.close_sent)))
                    }
                    Ok((n, event)) => (n, decoded(ws, out, n, event)),
                }
            });
            match after {
                None => return,
                Some(Decoded::More) => {}
                Some(Decoded::Failed(code, reason, close_sent)) => {
                    st.http.discard_input();
                    if !close_sent {
                        queue_close(st, Some(code), reason.as_bytes());
                    }
                    finish(st, fx);
                    return;
                }
                Some(Decoded::Closed { echo, code }) => {
                    st.http.discard_input();
                    // Echo the client's code (RFC 6455 §5.5.1); then the server closes TCP first.
                    if echo {
                        queue_close(st, code, b"");
                    }
                    finish(st, fx);
                    return;
                }
            }
        }
    }
}

/// What one decoded frame (`n` bytes, `event`) does to the session: a data message queued, a
/// ping answered, a pong noted, the client's close. `None`: nothing more to decode.
fn decoded(
    ws: &mut WsSession,
    out: &mut OutQueue,
    n: usize,
    event: Option<Event>,
) -> Option<Decoded> {
    Some(match event {
        None if n == 0 => return None,
        None => Decoded::More,
        Some(event @ (Event::Text(_) | Event::Binary(_))) => {
            if !ws.close_sent {
                ws.inbox_bytes += message_len(&event);
                ws.inbox.push_back(event);
            }
            Decoded::More
        }
        Some(Event::Ping(payload)) => {
            if !ws.close_sent {
                queue_frame(out, Opcode::Pong, &payload);
            }
            Decoded::More
        }
        Some(Event::Pong(payload)) => {
            if ws.pong_due.is_finite() && payload == ws.pings.to_be_bytes() {
                ws.pong_due = f64::INFINITY;
            }
            Decoded::More
        }
        Some(Event::Close { code, reason }) => {
            ws.peer_gone = true;
            let echo = !ws.close_sent;
            if echo {
                tell_disconnect(ws, code.unwrap_or(1005), &reason);
            }
            Decoded::Closed { echo, code }
        }
    })
}
