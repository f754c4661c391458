//! One HTTP/2 stream's ASGI side: the request body read from `h2`'s `RecvStream`, the response
//! written to its `SendStream`, and `H2Cycle`, the app's `receive`/`send` pair.
//!
//! Invariants:
//! - A `Stream` lives in its connection's `streams` map from the request's HEADERS until both
//!   the app's task is done and the response is over (`END_STREAM` handed to `h2`, or the
//!   stream reset); an `H2Cycle` whose stream is gone gets `http.disconnect` from `receive()`
//!   and a `RuntimeError` from `send()`, as on HTTP/1.1.
//! - Flow control is the backpressure: body bytes given to the app (and only those) are
//!   released to the peer's window; body parts the app sends wait in `pending` until `h2`
//!   grants send capacity, and `send()` waits while more than `WRITE_HIGH` bytes do.
//! - `gone` (the peer reset the stream, or the connection ended) is set once; after it,
//!   `receive()` says `http.disconnect` and body parts are dropped.

use std::collections::VecDeque;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};
use pyo3::PyTraverseError;

use super::H2Conn;
use crate::event_loop::LoopCore;
use crate::server::scope;

/// `send()` waits while more than this many body bytes wait for send capacity...
const WRITE_HIGH: usize = 64 * 1024;
/// ... until no more than this many do.
const WRITE_LOW: usize = 16 * 1024;
/// At most this many buffered body bytes go into one `http.request` message.
const RECEIVE_MAX: usize = 64 * 1024;
/// A request body the app left unread is read and dropped after the response, up to this many
/// bytes (so `h2` still checks it, a `content-length` that disagrees included); past it the
/// stream is reset with `NO_ERROR` (RFC 9113 §8.1: the client may stop sending).
const DISCARD_MAX: usize = 256 * 1024;

/// Header fields HTTP/2 forbids (RFC 9113 §8.2.2): dropped from an app's response.
const CONNECTION_SPECIFIC: &[&[u8]] = &[
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"transfer-encoding",
    b"upgrade",
];

#[allow(
    clippy::struct_excessive_bools,
    reason = "independent facts of one stream's two directions"
)]
pub(super) struct Stream {
    pub(super) waker: Waker,
    recv: RecvStream,
    respond: Option<SendResponse<Bytes>>,
    send: Option<SendStream<Bytes>>,
    pub(super) is_head: bool,
    /// The whole request body has been given to the app.
    body_done: bool,
    pub(super) gone: bool,
    pub(super) receive_waiter: Option<Py<PyAny>>,
    pub(super) drain_waiter: Option<Py<PyAny>>,
    /// `http.response.start`: status and fields, held until the first body part.
    pub(super) status: u16,
    headers: Option<http::HeaderMap>,
    pub(super) started: bool,
    /// The app sent its last body part.
    pub(super) finished: bool,
    /// `END_STREAM` is with `h2`.
    ended: bool,
    pending: VecDeque<Bytes>,
    pending_len: usize,
    /// Bytes of an unread request body dropped after the response (`discard_body`).
    discarded: usize,
    pub(super) task_done: bool,
    /// For the access log and the request counters.
    pub(super) method: Py<PyString>,
    pub(super) path: Py<PyString>,
    pub(super) method_index: u8,
    pub(super) started_at: f64,
}

/// What `send()` asks of the connection once its borrow ends.
#[must_use]
pub(super) enum Sent {
    /// Nothing to wait for.
    Done,
    /// Wait for this future (the queue is over `WRITE_HIGH`).
    Wait(Py<PyAny>),
}

impl Stream {
    pub(super) fn new(
        waker: Waker,
        recv: RecvStream,
        respond: SendResponse<Bytes>,
        is_head: bool,
        method: Py<PyString>,
        path: Py<PyString>,
    ) -> Self {
        Self {
            waker,
            recv,
            respond: Some(respond),
            send: None,
            is_head,
            body_done: false,
            gone: false,
            receive_waiter: None,
            drain_waiter: None,
            status: 0,
            headers: None,
            started: false,
            finished: false,
            ended: false,
            pending: VecDeque::new(),
            pending_len: 0,
            discarded: 0,
            task_done: false,
            method,
            path,
            method_index: 0,
            started_at: 0.0,
        }
    }

    /// A response sent without the app (a 503): nothing more is sent.
    pub(super) fn finish_unsent(&mut self) {
        self.finished = true;
    }

    /// The stream can leave the connection's map: the app is done and so is the exchange
    /// (the response ended and the request too, or the stream is reset).
    pub(super) fn over(&self) -> bool {
        self.task_done && (self.gone || (self.ended && self.body_done))
    }

    /// After the response ended and the app's task is done: reads and drops the rest of an
    /// unread request body (`DISCARD_MAX` at most, then a reset).
    pub(super) fn discard_body(&mut self) {
        if !self.task_done || !self.ended || self.body_done || self.gone {
            return;
        }
        let waker = self.waker.clone();
        let mut cx = Context::from_waker(&waker);
        loop {
            match self.recv.poll_data(&mut cx) {
                Poll::Ready(Some(Ok(data))) => {
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    self.discarded += data.len();
                    if self.discarded > DISCARD_MAX {
                        if let Some(send) = self.send.as_mut() {
                            send.send_reset(h2::Reason::NO_ERROR);
                        }
                        self.gone = true;
                        return;
                    }
                }
                Poll::Ready(Some(Err(_))) => {
                    self.gone = true;
                    return;
                }
                Poll::Ready(None) => {
                    self.body_done = true;
                    return;
                }
                Poll::Pending => return,
            }
        }
    }

    /// The next `http.request` / `http.disconnect` message, or `None` if the app must wait.
    pub(super) fn next_message(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        if self.gone || self.ended {
            return Ok(Some(scope::disconnect_message(py)?.into_any().unbind()));
        }
        let waker = self.waker.clone();
        let mut cx = Context::from_waker(&waker);
        if self.body_done {
            // Nothing more to read: the next message is the disconnect, when it comes.
            if self.poll_reset(&mut cx) {
                return Ok(Some(scope::disconnect_message(py)?.into_any().unbind()));
            }
            return Ok(None);
        }
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut total = 0;
        loop {
            match self.recv.poll_data(&mut cx) {
                Poll::Ready(Some(Ok(data))) => {
                    // Given to the app: the peer may send as much again.
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    total += data.len();
                    chunks.push(data);
                    if total >= RECEIVE_MAX {
                        break;
                    }
                }
                Poll::Ready(Some(Err(_))) => {
                    if chunks.is_empty() {
                        self.gone = true;
                        return Ok(Some(scope::disconnect_message(py)?.into_any().unbind()));
                    }
                    break;
                }
                Poll::Ready(None) => {
                    self.body_done = true;
                    break;
                }
                Poll::Pending => break,
            }
        }
        if !self.body_done && self.recv.is_end_stream() {
            self.body_done = true;
        }
        if chunks.is_empty() && !self.body_done {
            return Ok(None);
        }
        let body = PyBytes::new_with(py, total, |buf| {
            let mut at = 0;
            for c in &chunks {
                buf[at..at + c.len()].copy_from_slice(c);
                at += c.len();
            }
            Ok(())
        })?;
        let msg = scope::request_message(py, body, !self.body_done)?;
        Ok(Some(msg.into_any().unbind()))
    }

    /// The peer reset the stream (polled only while the app waits for the disconnect).
    fn poll_reset(&mut self, cx: &mut Context<'_>) -> bool {
        let reset = match (&mut self.respond, &mut self.send) {
            (Some(r), _) => r.poll_reset(cx),
            (None, Some(s)) => s.poll_reset(cx),
            (None, None) => return false,
        };
        if reset.is_ready() {
            self.gone = true;
        }
        self.gone
    }

    /// `http.response.start`: checked and held.
    pub(super) fn start(&mut self, py: Python<'_>, message: &Bound<'_, PyDict>) -> PyResult<()> {
        if self.started {
            return Err(PyRuntimeError::new_err(
                "Unexpected ASGI message 'http.response.start' sent, after response already \
                 started.",
            ));
        }
        let status: u16 = message
            .get_item(intern!(py, "status"))?
            .ok_or_else(|| PyTypeError::new_err("http.response.start needs a 'status'"))?
            .extract()?;
        if !(100..=999).contains(&status) {
            return Err(PyRuntimeError::new_err(format!(
                "invalid HTTP status {status}"
            )));
        }
        let mut map = http::HeaderMap::new();
        if let Some(headers) = message.get_item(intern!(py, "headers"))? {
            for pair in headers.try_iter()? {
                let (name, value): (Vec<u8>, Vec<u8>) = pair?.extract()?;
                let name = http::HeaderName::from_bytes(&name).map_err(|_| {
                    PyRuntimeError::new_err(format!(
                        "invalid response header name {:?}",
                        String::from_utf8_lossy(&name)
                    ))
                })?;
                if CONNECTION_SPECIFIC.contains(&name.as_str().as_bytes()) {
                    continue;
                }
                let value = http::HeaderValue::from_bytes(&value).map_err(|_| {
                    PyRuntimeError::new_err(format!(
                        "invalid value of response header {name}: {:?}",
                        String::from_utf8_lossy(&value)
                    ))
                })?;
                map.append(name, value);
            }
        }
        self.status = status;
        self.headers = Some(map);
        self.started = true;
        Ok(())
    }

    /// Sends the held response head; `end`: with `END_STREAM` (no body follows).
    /// `fields`: the server's own (`date`, `server`, `--header`), added unless the app set them.
    pub(super) fn send_head(&mut self, end: bool, fields: &[(&[u8], &[u8])]) {
        let Some(respond) = self.respond.as_mut() else {
            return;
        };
        let mut headers = self.headers.take().unwrap_or_default();
        for (name, value) in fields {
            if let (Ok(n), Ok(v)) = (
                http::HeaderName::from_bytes(name),
                http::HeaderValue::from_bytes(value),
            ) {
                if !headers.contains_key(&n) {
                    headers.append(n, v);
                }
            }
        }
        let mut response = http::Response::new(());
        *response.status_mut() =
            http::StatusCode::from_u16(self.status).unwrap_or(http::StatusCode::OK);
        *response.headers_mut() = headers;
        match respond.send_response(response, end) {
            Ok(send) => {
                self.send = Some(send);
                self.ended = end;
            }
            Err(_) => self.gone = true,
        }
        self.respond = None;
    }

    /// `http.response.body`: queues `body` and writes what flow control allows.
    pub(super) fn body(
        &mut self,
        loop_core: &Bound<'_, LoopCore>,
        body: Bytes,
        more: bool,
        fields: &[(&[u8], &[u8])],
    ) -> PyResult<Sent> {
        if !self.started {
            return Err(PyRuntimeError::new_err(
                "Expected ASGI message 'http.response.start', but got 'http.response.body'.",
            ));
        }
        if self.finished {
            return Err(PyRuntimeError::new_err(
                "Unexpected ASGI message 'http.response.body' sent, after response already \
                 completed.",
            ));
        }
        self.finished = !more;
        if self.gone {
            return Ok(Sent::Done);
        }
        let body = if self.is_head { Bytes::new() } else { body };
        if self.respond.is_some() {
            self.send_head(!more && body.is_empty(), fields);
        }
        if !body.is_empty() {
            self.pending_len += body.len();
            self.pending.push_back(body);
        }
        self.pump();
        if self.pending_len > WRITE_HIGH && !self.gone {
            let fut = LoopCore::create_future(loop_core)?;
            self.drain_waiter = Some(fut.clone_ref(loop_core.py()));
            return Ok(Sent::Wait(fut));
        }
        Ok(Sent::Done)
    }

    /// Hands queued body bytes to `h2` as far as its send capacity goes; the last with
    /// `END_STREAM` once the app finished.
    pub(super) fn pump(&mut self) {
        let waker = self.waker.clone();
        let mut cx = Context::from_waker(&waker);
        let Some(send) = self.send.as_mut() else {
            return;
        };
        while !self.ended && !self.gone {
            if self.pending_len == 0 {
                if self.finished {
                    if send.send_data(Bytes::new(), true).is_err() {
                        self.gone = true;
                    }
                    self.ended = true;
                }
                break;
            }
            send.reserve_capacity(self.pending_len);
            let mut cap = send.capacity();
            if cap == 0 {
                match send.poll_capacity(&mut cx) {
                    Poll::Ready(Some(Ok(n))) => cap = n,
                    Poll::Ready(Some(Err(_)) | None) => {
                        self.gone = true;
                        break;
                    }
                    Poll::Pending => break,
                }
                if cap == 0 {
                    continue;
                }
            }
            let front = self.pending.front_mut().expect("pending_len > 0");
            let chunk = if front.len() <= cap {
                self.pending.pop_front().expect("just seen")
            } else {
                front.split_to(cap)
            };
            self.pending_len -= chunk.len();
            let last = self.finished && self.pending_len == 0;
            if send.send_data(chunk, last).is_err() {
                self.gone = true;
                break;
            }
            self.ended = last;
        }
        if self.gone {
            self.pending.clear();
            self.pending_len = 0;
        }
    }

    /// After a wake-up: more send capacity, body data, or a reset. Returns the futures to
    /// resolve and their values.
    pub(super) fn service(
        &mut self,
        py: Python<'_>,
        resolve: &mut Vec<(Py<PyAny>, Py<PyAny>)>,
    ) -> PyResult<()> {
        self.pump();
        if self.pending_len <= WRITE_LOW || self.gone {
            if let Some(f) = self.drain_waiter.take() {
                resolve.push((f, py.None()));
            }
        }
        if self.receive_waiter.is_some() {
            if let Some(msg) = self.next_message(py)? {
                let f = self.receive_waiter.take().expect("checked above");
                resolve.push((f, msg));
            }
        }
        self.discard_body();
        Ok(())
    }

    /// The connection ended: every waiter is told.
    pub(super) fn connection_gone(
        &mut self,
        py: Python<'_>,
        resolve: &mut Vec<(Py<PyAny>, Py<PyAny>)>,
    ) -> PyResult<()> {
        self.gone = true;
        self.pending.clear();
        self.pending_len = 0;
        if let Some(f) = self.drain_waiter.take() {
            resolve.push((f, py.None()));
        }
        if let Some(f) = self.receive_waiter.take() {
            resolve.push((f, scope::disconnect_message(py)?.into_any().unbind()));
        }
        Ok(())
    }

    /// The app's task ended without finishing its response: a 500 if nothing was sent, else
    /// the stream is reset.
    pub(super) fn abandon(&mut self, fields: &[(&[u8], &[u8])]) {
        if self.gone || self.ended {
            return;
        }
        if self.respond.is_some() {
            self.status = 500;
            let mut headers = http::HeaderMap::new();
            headers.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            self.headers = Some(headers);
            self.started = true;
            self.finished = true;
            self.send_head(self.is_head, fields);
            if !self.ended {
                self.pending
                    .push_back(Bytes::from_static(b"Internal Server Error"));
                self.pending_len = self.pending.back().map_or(0, Bytes::len);
                self.pump();
            }
            return;
        }
        if let Some(send) = self.send.as_mut() {
            send.send_reset(h2::Reason::INTERNAL_ERROR);
        }
        self.gone = true;
    }

    pub(super) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.receive_waiter)?;
        visit.call(&self.drain_waiter)?;
        visit.call(&self.method)?;
        visit.call(&self.path)
    }
}

/// One stream's `receive`/`send` pair and its task's done callback.
#[pyclass(module = "ferroloop._native", name = "Http2Cycle", frozen)]
pub struct H2Cycle {
    pub(super) conn: Py<H2Conn>,
    pub(super) id: u32,
}

#[pymethods]
impl H2Cycle {
    #[new]
    fn py_new() -> PyResult<Self> {
        Err(PyTypeError::new_err(
            "Http2Cycle objects are created by the server",
        ))
    }

    /// ASGI `receive()`.
    fn receive(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        H2Conn::receive(self.conn.bind(py), self.id)
    }

    /// ASGI `send(message)`.
    fn send(&self, py: Python<'_>, message: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let message = message
            .cast::<PyDict>()
            .map_err(|_| PyTypeError::new_err("ASGI send() takes a message dict"))?;
        H2Conn::send(self.conn.bind(py), self.id, message)
    }

    /// The app task's done callback.
    fn __call__(&self, py: Python<'_>, task: &Bound<'_, PyAny>) -> PyResult<()> {
        let conn = self.conn.bind(py);
        drop(conn.get().server.bind(py).get().task_done(py, task));
        let (exc, cancelled) = match task.call_method0(intern!(py, "exception")) {
            Ok(e) => ((!e.is_none()).then_some(e), false),
            Err(err) if err.is_instance_of::<pyo3::exceptions::asyncio::CancelledError>(py) => {
                (None, true)
            }
            Err(err) => return Err(err),
        };
        H2Conn::app_finished(conn, self.id, exc.as_ref(), cancelled)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.conn)
    }
}
