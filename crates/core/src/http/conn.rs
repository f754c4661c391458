//! An HTTP/1.1 server connection as a sans-IO state machine, in the spirit of h11's
//! `Connection`: bytes, the client's end of input and deadlines go in; events come out (a request
//! head, body data, the end of the body, the client gone, an invalid request with its answer);
//! the response's progress goes in and decisions come out (keep the connection alive or close
//! it, when to shut the write side and linger). The driver (`crates/py/src/server/`) does the
//! I/O: it reads into [`Http1Conn::read_into`], writes what the connection and the app queue,
//! registers the socket with the loop and runs the app.
//!
//! Who owns what: the connection owns the read buffer (the bytes read and not yet consumed,
//! pipelined requests included), the current request head, the current [`Exchange`] (the body
//! decoder, `Expect: 100-continue`, the response's progress and the driver's per-request data
//! `T`), the request count and the deadlines. The driver owns the socket, the write queue and
//! the registrations.
//!
//! Invariants:
//! - The phase changes only through the table in `phase.rs` ([`TRANSITIONS`]); every change is
//!   one of its rows (a refused one is a bug: it panics in debug builds and leaves the phase as
//!   it was in release builds).
//! - One request at a time. A head stays in the read buffer from [`HeadEvent::Head`] until the
//!   driver has used it ([`Http1Conn::consume_head`]); nothing else consumes input meanwhile.
//!   Pipelined requests wait in the buffer, unparsed, until the current response is complete.
//! - Input is consumed only up to the end of what was decoded (the codec's invariant), so
//!   every answer is the same however the bytes were split into reads.
//! - Reading stops while [`READ_HIGH`] unconsumed bytes are buffered ([`Http1Conn::read_into`]
//!   refuses): the client is then held back by TCP flow control.
//! - After the client's end of input nothing more is read; requests already buffered are still
//!   answered, and the connection closes once none is left.

mod exchange;
mod phase;
#[cfg(test)]
mod random_tests;
pub mod replay;
#[cfg(test)]
mod tests;

use std::ops::Range;

pub use exchange::{Exchange, ResponseError, ResponseState};
pub use phase::{Phase, Transition, Transitions, Trigger, TRANSITIONS};

use super::{
    error_response, parse_head, BodyDecoder, BodyKind, Head, HttpError, Limits, RequestInfo,
    ServerFields,
};

/// Stop reading while this many received bytes wait for the app (a request body, pipelined
/// requests): the client is then held back by TCP flow control.
pub const READ_HIGH: usize = 256 * 1024;
/// Bytes read per readiness event (one `recv`). A connection streaming a large body gets this
/// much per loop iteration, so it sets how long a small request on another connection waits for
/// a turn: uvloop reads 256 KB per event, and uvicorn stops reading once 64 KiB of body wait
/// for the app.
pub const READ_CHUNK: usize = 64 * 1024;
/// How long a lingering close waits for the peer, in seconds.
pub const LINGER: f64 = 2.0;
/// The interim answer to `Expect: 100-continue` (RFC 9110 §10.1.1).
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

const BODY_TOO_LARGE: HttpError = HttpError::new(
    413,
    "request body larger than the limit; raise --limit-body",
);
const BODY_CUT_SHORT: HttpError = HttpError::new(
    400,
    "request body cut short: the client closed the connection before sending all of it",
);

/// What a connection is configured with.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Request head limits (also applied to a chunked body's trailers).
    pub limits: Limits,
    /// The largest request body accepted (`--limit-body`): 413 above it.
    pub limit_body: Option<u64>,
    /// Seconds for a request head to arrive once it has begun (`--timeout-header`).
    pub timeout_header: f64,
    /// Seconds an idle connection is kept between requests (`--timeout-keep-alive`).
    pub timeout_keep_alive: f64,
}

/// The server's defaults (`--timeout-header 10`, `--timeout-keep-alive 5`, no body limit).
impl Default for Settings {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            limit_body: None,
            timeout_header: 10.0,
            timeout_keep_alive: 5.0,
        }
    }
}

/// What [`Http1Conn::next_head`] found in the read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum HeadEvent {
    /// No complete head yet: read more.
    Wait,
    /// A complete head ([`Http1Conn::head`], its ranges into [`Http1Conn::input`]); the driver
    /// accepts it with [`Http1Conn::begin`] or refuses it ([`Http1Conn::reject`]).
    Head,
    /// The head is invalid: answer with [`Http1Conn::reject`] and close.
    Invalid(HttpError),
    /// The client ended its input with no whole request left: close once the output is written.
    InputEnded,
}

/// What [`Http1Conn::read_body`] found.
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub enum BodyEvent<R> {
    /// Body bytes (made by the caller's function from the decoded runs); `more`: the body goes
    /// on.
    Data { body: R, more: bool },
    /// Nothing new: wait for input (or, after the body, for the response to complete).
    Wait,
    /// The client is gone (or the request is no longer the current one): `http.disconnect`.
    Gone,
    /// The body's framing is invalid, it passed the limit, or the client ended it early: if
    /// the response has not started, answer with [`Http1Conn::reject`]; either way the
    /// connection closes, and the app is told the client is gone.
    Invalid(HttpError),
}

/// Whether a connection carries another request after a complete response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Reuse {
    /// Back to `Idle`; `pipelined`: a next request's bytes are already buffered.
    KeepAlive { pipelined: bool },
    /// `Closing`: shut the write side once the output is written.
    Close,
}

/// One HTTP/1.1 server connection's protocol state. See the module's invariants.
pub struct Http1Conn<T> {
    phase: Phase,
    rbuf: Vec<u8>,
    rpos: usize,
    head: Head,
    eof: bool,
    seq: u64,
    exchange: Option<Exchange<T>>,
    deadline: f64,
    /// The deadline is the header timeout (part of a head has arrived).
    header_clock: bool,
    idle_since: f64,
    settings: Settings,
}

impl<T> Http1Conn<T> {
    /// A connection accepted at `now`; `data`: bytes already read from it (by the front that
    /// handed it over). Its first head must arrive within the header timeout.
    pub fn new(settings: Settings, data: Vec<u8>, now: f64) -> Self {
        Self {
            phase: Phase::Idle,
            rbuf: data,
            rpos: 0,
            head: Head::default(),
            eof: false,
            seq: 0,
            exchange: None,
            deadline: now + settings.timeout_header,
            header_clock: true,
            idle_since: now,
            settings,
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Makes the change `trigger`, if the table has it from the current phase.
    fn go(&mut self, trigger: Trigger) -> bool {
        let next = self.phase.after(trigger);
        debug_assert!(
            next.is_some(),
            "no transition {} --{trigger}-->",
            self.phase
        );
        match next {
            Some(next) => {
                self.phase = next;
                true
            }
            None => false,
        }
    }

    /// Requests begun so far: the current (or last) request's `seq`.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The current request, if one is in flight.
    pub fn exchange(&self) -> Option<&Exchange<T>> {
        self.exchange.as_ref()
    }

    pub fn exchange_mut(&mut self) -> Option<&mut Exchange<T>> {
        self.exchange.as_mut()
    }

    /// The current request if it is request `seq`.
    pub fn current(&self, seq: u64) -> Option<&Exchange<T>> {
        self.exchange.as_ref().filter(|e| e.seq == seq)
    }

    pub fn current_mut(&mut self, seq: u64) -> Option<&mut Exchange<T>> {
        self.exchange.as_mut().filter(|e| e.seq == seq)
    }

    /// Takes the current request out (the driver forgets it: `__clear__`).
    pub fn take_exchange(&mut self) -> Option<Exchange<T>> {
        self.exchange.take()
    }

    // ---- time ----

    /// When the connection's current wait ends (keep-alive, header, linger): the driver's sweep
    /// calls its timeout handling once the clock passes it.
    pub fn deadline(&self) -> f64 {
        self.deadline
    }

    /// The driver's own deadline for a busy connection (a WebSocket's pings and close).
    pub fn set_deadline(&mut self, deadline: f64) {
        self.deadline = deadline;
    }

    /// When the connection last became idle (accepted, or its last response complete).
    pub fn idle_since(&self) -> f64 {
        self.idle_since
    }

    // ---- input ----

    /// The client ended its input (or the read failed): nothing more will arrive.
    pub fn eof(&self) -> bool {
        self.eof
    }

    pub fn receive_eof(&mut self) {
        self.eof = true;
    }

    /// The unconsumed input: a head (ranges of [`Http1Conn::head`] index this), a body, or
    /// pipelined requests.
    pub fn input(&self) -> &[u8] {
        &self.rbuf[self.rpos..]
    }

    /// Unconsumed input is buffered.
    pub fn has_input(&self) -> bool {
        self.rpos < self.rbuf.len()
    }

    /// At least [`READ_HIGH`] unconsumed bytes wait: stop reading until the app takes some.
    pub fn input_full(&self) -> bool {
        self.rbuf.len() - self.rpos >= READ_HIGH
    }

    /// Lets `read` append at most [`READ_CHUNK`] bytes to the buffer (it has that much spare
    /// capacity); `None`, without calling it, while `READ_HIGH + READ_CHUNK` bytes wait
    /// already (flow control).
    pub fn read_into<R>(&mut self, read: impl FnOnce(&mut Vec<u8>) -> R) -> Option<R> {
        if self.rpos > 0 && self.rpos == self.rbuf.len() {
            self.rbuf.clear();
            self.rpos = 0;
        }
        if self.rbuf.len() - self.rpos >= READ_HIGH + READ_CHUNK {
            return None;
        }
        if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK {
            if self.rpos > 0 {
                self.rbuf.drain(..self.rpos);
                self.rpos = 0;
            }
            self.rbuf.reserve(READ_CHUNK);
        }
        Some(read(&mut self.rbuf))
    }

    /// Drops everything read (a lingering close discards input).
    pub fn discard_input(&mut self) {
        self.rbuf.clear();
        self.rpos = 0;
    }

    /// Lets `f` decode the unconsumed input (a WebSocket's frames) with the current request;
    /// `f` returns how many bytes it consumed.
    pub fn with_input<R>(
        &mut self,
        f: impl FnOnce(&[u8], Option<&mut Exchange<T>>) -> (usize, R),
    ) -> R {
        let (consumed, r) = f(&self.rbuf[self.rpos..], self.exchange.as_mut());
        self.rpos += consumed;
        self.forget_consumed();
        r
    }

    fn forget_consumed(&mut self) {
        if self.rpos == self.rbuf.len() {
            self.rbuf.clear();
            self.rpos = 0;
        }
    }

    // ---- a request's head ----

    /// `Idle`: looks for the next request head. `now` is read only to start the header timeout
    /// when part of a head has arrived.
    pub fn next_head(&mut self, now: impl FnOnce() -> f64) -> HeadEvent {
        if self.phase != Phase::Idle {
            return HeadEvent::Wait;
        }
        if !self.has_input() {
            return if self.eof {
                HeadEvent::InputEnded
            } else {
                HeadEvent::Wait
            };
        }
        let parsed = parse_head(
            &mut self.rbuf[self.rpos..],
            &self.settings.limits,
            &mut self.head,
        );
        match parsed {
            Ok(false) if self.eof => HeadEvent::InputEnded,
            Ok(false) => {
                if !self.header_clock {
                    self.header_clock = true;
                    self.deadline = now() + self.settings.timeout_header;
                }
                HeadEvent::Wait
            }
            Err(e) => HeadEvent::Invalid(e),
            Ok(true) => match (self.settings.limit_body, self.head.body) {
                (Some(limit), BodyKind::Length(n)) if n > limit => {
                    HeadEvent::Invalid(BODY_TOO_LARGE)
                }
                _ => HeadEvent::Head,
            },
        }
    }

    /// The head [`HeadEvent::Head`] announced, its ranges into [`Http1Conn::input`].
    pub fn head(&self) -> &Head {
        &self.head
    }

    /// The head's method.
    pub fn method(&self) -> &[u8] {
        &self.input()[self.head.method.clone()]
    }

    /// Accepts the announced head: request `seq` begins (returned), `Idle` → `Busy`. `upgrade`:
    /// it becomes a WebSocket, its connection's last request; `close_after`: the driver wants
    /// the connection closed after it (the dispatching front drains).
    pub fn begin(&mut self, upgrade: bool, close_after: bool, app: T) -> u64 {
        let info = RequestInfo {
            version: self.head.version,
            is_head: self.method() == b"HEAD",
            keep_alive: self.head.keep_alive && !upgrade && !close_after,
        };
        if !self.go(Trigger::Head) {
            return self.seq;
        }
        self.seq += 1;
        self.exchange = Some(Exchange {
            seq: self.seq,
            info,
            upgrade,
            expect_continue: self.head.expect_continue,
            decoder: BodyDecoder::new(self.head.body, &self.settings.limits),
            body_bytes: 0,
            body_delivered: false,
            disconnect_told: false,
            resp: ResponseState::default(),
            app,
        });
        self.deadline = f64::INFINITY;
        self.header_clock = false;
        self.seq
    }

    /// The driver is done with the current head (its scope is built): the body follows it.
    pub fn consume_head(&mut self) {
        self.rpos += self.head.head_len;
    }

    /// Whether an answer to the unstarted request must go without a body: the current request
    /// is a `HEAD`, or the unparsed head's first token is `HEAD` (after the empty lines RFC
    /// 9112 §2.2 lets a client send).
    fn answers_head(&self) -> bool {
        if let Some(e) = &self.exchange {
            return e.info.is_head;
        }
        let input = self.judged_input();
        let start = input.iter().position(|&b| b != b'\r' && b != b'\n');
        start.is_some_and(|at| input[at..].starts_with(b"HEAD "))
    }

    /// The input an unstarted request is judged by: if the head parser refuses it, only up to
    /// the earliest prefix it refuses (so the answer does not depend on how many bytes behind
    /// that point had arrived); else all of it. Runs only on the way to an error answer.
    fn judged_input(&self) -> &[u8] {
        let input = self.input();
        let parser_refuses = |len: usize| {
            let mut scratch = input[..len].to_vec();
            parse_head(&mut scratch, &self.settings.limits, &mut Head::default()).is_err()
        };
        if !parser_refuses(input.len()) {
            return input;
        }
        // The parser refuses every prefix from the earliest it refuses on (its invariant), and
        // not the empty one: a binary search finds the earliest.
        let (mut good, mut bad) = (0, input.len());
        while bad - good > 1 {
            let mid = good + (bad - good) / 2;
            if parser_refuses(mid) {
                bad = mid;
            } else {
                good = mid;
            }
        }
        &input[..bad]
    }

    /// Refuses the request with `e`: returns the answer to write, drops the input, and closes
    /// once it is written (`Closing`).
    #[must_use]
    pub fn reject(&mut self, e: &HttpError, fields: &ServerFields<'_>) -> Vec<u8> {
        let answer = error_response(e.status, e.reason, fields, self.answers_head());
        self.refuse();
        answer
    }

    /// Refuses the request with an answer the driver made: drops the input; `Closing`.
    pub fn refuse(&mut self) {
        self.discard_input();
        let _closing = self.go(Trigger::Close);
    }

    // ---- a request's body ----

    /// `Expect: 100-continue` is to be answered now (the app asks for the body, and nothing of
    /// the response or the body went out): the driver writes [`CONTINUE`]. Once.
    pub fn take_continue(&mut self) -> bool {
        match self.exchange.as_mut() {
            Some(e) if e.expect_continue && !e.resp.started && !e.body_delivered => {
                e.expect_continue = false;
                true
            }
            _ => false,
        }
    }

    /// The body bytes available now, decoded: `make` builds one value from the buffer and the
    /// runs of body bytes in it (their total length given).
    pub fn read_body<R>(
        &mut self,
        make: impl FnOnce(&[u8], &[Range<usize>], usize) -> R,
    ) -> BodyEvent<R> {
        if self.phase != Phase::Busy {
            return BodyEvent::Gone;
        }
        let limit = self.settings.limit_body;
        let eof = self.eof;
        let Some(e) = self.exchange.as_mut() else {
            return BodyEvent::Gone;
        };
        if e.body_delivered {
            // After the body: wait for the response to complete or the client to leave.
            e.disconnect_told = eof;
            return if eof {
                BodyEvent::Gone
            } else {
                BodyEvent::Wait
            };
        }
        let mut runs: Vec<Range<usize>> = Vec::new();
        let mut total = 0;
        let mut failure = None;
        loop {
            match e.decoder.decode(&self.rbuf[self.rpos..]) {
                Ok(d) => {
                    if !d.data.is_empty() {
                        runs.push(self.rpos + d.data.start..self.rpos + d.data.end);
                        total += d.data.len();
                    }
                    self.rpos += d.consumed;
                    // Checked run by run, so the answer does not depend on how the body was
                    // split into reads: a framing error behind the byte that passed the limit
                    // is never reached.
                    if limit.is_some_and(|limit| e.body_bytes + total as u64 > limit) {
                        failure = Some(BODY_TOO_LARGE);
                        break;
                    }
                    if d.done || d.consumed == 0 {
                        break;
                    }
                }
                Err(err) => {
                    failure = Some(err);
                    break;
                }
            }
        }
        e.body_bytes += total as u64;
        let done = e.decoder.is_done();
        if failure.is_none() && total == 0 && !done && eof && !e.resp.started {
            // The client closed its side (or reset) before the declared body was complete: a
            // malformed request, answered (a half-closed client still reads) like a framing
            // error, not blamed on the app that then returns without a response.
            failure = Some(BODY_CUT_SHORT);
        }
        if let Some(err) = failure {
            return BodyEvent::Invalid(err);
        }
        if total == 0 && !done {
            e.disconnect_told = eof;
            return if eof {
                BodyEvent::Gone
            } else {
                BodyEvent::Wait
            };
        }
        e.body_delivered = done;
        let body = make(&self.rbuf, &runs, total);
        self.forget_consumed();
        BodyEvent::Data { body, more: !done }
    }

    // ---- the response ----

    /// The current response is complete (its last byte queued); `keep_alive`: what its head
    /// told the client. An unread rest of the body is skipped if it is buffered, else the
    /// connection cannot be reused; after the client's end of input it is reused only for
    /// requests already buffered. Returns the finished exchange and the decision.
    pub fn complete(&mut self, keep_alive: bool, now: f64) -> Option<(Exchange<T>, Reuse)> {
        let mut e = self.exchange.take()?;
        let mut reusable = keep_alive;
        if reusable && !e.body_delivered {
            while let Ok(d) = e.decoder.decode(&self.rbuf[self.rpos..]) {
                self.rpos += d.consumed;
                if d.done || d.consumed == 0 {
                    break;
                }
            }
            reusable = e.decoder.is_done();
        }
        self.forget_consumed();
        if self.eof && !self.has_input() {
            reusable = false;
        }
        if reusable && self.go(Trigger::KeepAlive) {
            self.idle_since = now;
            self.deadline = now + self.settings.timeout_keep_alive;
            self.header_clock = false;
            let pipelined = self.has_input();
            return Some((e, Reuse::KeepAlive { pipelined }));
        }
        let _closing = self.go(Trigger::Close);
        Some((e, Reuse::Close))
    }

    // ---- the end ----

    /// The last output is queued (a WebSocket's end, an idle connection closed by a drain or a
    /// timeout): `Closing`, to shut the write side once it is written. `false` if the
    /// connection is closing already.
    pub fn close(&mut self) -> bool {
        matches!(self.phase, Phase::Idle | Phase::Busy) && self.go(Trigger::Close)
    }

    /// `Closing`, the output written and the write side shut at `now`: `Lingering` until the
    /// peer closes or [`LINGER`] passes.
    pub fn shut(&mut self, now: f64) {
        if self.go(Trigger::Shut) {
            self.deadline = now + LINGER;
        }
    }

    /// Closed now; the input is dropped. `false` if it was closed already.
    pub fn abort(&mut self) -> bool {
        if self.phase == Phase::Closed {
            return false;
        }
        self.rbuf = Vec::new();
        self.rpos = 0;
        self.go(Trigger::Abort)
    }

    /// An idle connection leaves (to the front): returns what was read of its next request.
    pub fn hand_back(&mut self) -> Option<Vec<u8>> {
        if !self.go(Trigger::HandBack) {
            return None;
        }
        let data = self.rbuf.split_off(self.rpos);
        self.rbuf = Vec::new();
        self.rpos = 0;
        Some(data)
    }
}
