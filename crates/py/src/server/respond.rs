//! A request's `send()`: response start, body parts (inside a ready batch, a small part is queued
//! and written when the batch ends; otherwise written from the app's buffer when the socket
//! takes it at once, queued if not), `pathsend`/`zerocopysend` through `sendfile`,
//! trailers, and the completion of the response (access log, keep-alive or close).

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use ferroloop_core::clock;
use ferroloop_core::http::conn::{ResponseError, Reuse};
use ferroloop_core::http::{
    check_response, encode_chunk, encode_head, encode_last_chunk, write_chunk_size, Framing,
    RequestInfo, Version,
};
use ferroloop_core::OutQueue;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyTypeError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use super::conn::{
    ready_none, Conn, ConnState, Phase, Req, COPY_MAX, CORK_MAX, SMALL_BODY_COPY, WRITE_HIGH,
};
use super::effects::Effects;
use super::handoff::Fate;
use super::output::{flush_now, hold_back, start_closing};
use super::scope;
use super::HttpServer;
use crate::event_loop::LoopCore;

/// An ASGI message's `type`, with the same errors for every protocol (HTTP/1.1, HTTP/2).
pub(super) fn message_type<'py>(message: &Bound<'py, PyDict>) -> PyResult<Bound<'py, PyString>> {
    let py = message.py();
    let typ = message
        .get_item(intern!(py, "type"))?
        .ok_or_else(|| PyTypeError::new_err("ASGI message without a 'type'"))?;
    typ.cast_into::<PyString>()
        .map_err(|_| PyTypeError::new_err("ASGI message 'type' must be a str"))
}

impl Conn {
    /// `send(message)` of request `seq`.
    pub(super) fn send(
        slf: &Bound<'_, Self>,
        seq: u64,
        message: &Bound<'_, PyDict>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let typ = message_type(message)?;
        let typ = typ.to_str()?;
        if this.state.borrow(py)?.ws_seq == seq {
            return Self::ws_send(slf, seq, typ, message);
        }
        Self::send_http(slf, seq, typ, |py, fd, server, st, fx| match typ {
            "http.response.start" => {
                start_message(py, st, message)?;
                Ok(false)
            }
            "http.response.body" => {
                let more = flag(message, intern!(py, "more_body"))?;
                with_body(message, |data| {
                    Self::send_body(py, fd, server, st, fx, Body::Bytes(data), more)
                })
            }
            "http.response.pathsend" => {
                let body = pathsend_body(message)?;
                Self::send_body(py, fd, server, st, fx, body, false)
            }
            "http.response.zerocopysend" => {
                let body = zerocopy_body(message)?;
                let more = flag(message, intern!(py, "more_body"))?;
                Self::send_body(py, fd, server, st, fx, body, more)
            }
            "http.response.trailers" => {
                let more = flag(message, intern!(py, "more_trailers"))?;
                let headers = message.get_item(intern!(py, "headers"))?;
                Self::send_trailers(py, server, st, fx, headers.as_ref(), more)?;
                Ok(false)
            }
            other => Err(PyRuntimeError::new_err(format!(
                "Unexpected ASGI message '{other}' sent for an http request."
            ))),
        })
    }

    /// One HTTP response message `typ` of request `seq`: `part` runs under the state's borrow
    /// once the request is known to be current and answering, and returns whether `send()`
    /// must wait for the queue to drain. A message for a closed connection, or for a request
    /// rejected mid-body, is dropped (as uvicorn does); one after the response is an error.
    pub(super) fn send_http(
        slf: &Bound<'_, Self>,
        seq: u64,
        typ: &str,
        part: impl FnOnce(
            Python<'_>,
            RawFd,
            &HttpServer,
            &mut ConnState,
            &mut Effects,
        ) -> PyResult<bool>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let server = this.server.bind(py).get();
        let mut fx = Effects::default();
        let wait = {
            let mut st = this.state.borrow(py)?;
            if st.phase() == Phase::Closed {
                // The client is gone: drop the message, as uvicorn does.
                return ready_none(py);
            }
            if st.http.current(seq).is_none() {
                return Err(PyRuntimeError::new_err(format!(
                    "Unexpected ASGI message '{typ}' sent, after response already completed."
                )));
            }
            if st.phase() != Phase::Busy {
                // The request was rejected mid-body (bad framing, body limit) and answered.
                return ready_none(py);
            }
            part(py, this.fd, server, &mut st, &mut fx)?
        };
        Self::send_done(slf, seq, wait, fx)
    }

    /// The end of a `send()` (HTTP or WebSocket): a Future resolved when the write queue has
    /// drained if `wait` and it is still over `WRITE_HIGH`, else the shared ready awaitable;
    /// the effects run first, and an error they carry is raised after them.
    pub(super) fn send_done(
        slf: &Bound<'_, Self>,
        seq: u64,
        wait: bool,
        mut fx: Effects,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let fut = if wait {
            let server = this.server.bind(py).get();
            let fut = LoopCore::create_future(server.loop_core().bind(py))?;
            let mut st = this.state.borrow(py)?;
            let over = st.out_pending() > WRITE_HIGH;
            match st.http.current_mut(seq) {
                // A send made while another still waits (two tasks of an ASGI app, or a WSGI
                // app's blocks in flight) waits for the same drain: replacing the Future would
                // leave the first waiter unresolved for good.
                Some(req) if over => {
                    if let Some(pending) = &req.app.drain_waiter {
                        Some(pending.clone_ref(py))
                    } else {
                        req.app.drain_waiter = Some(fut.clone_ref(py));
                        Some(fut)
                    }
                }
                _ => None,
            }
        } else {
            None
        };
        let error = fx.error.take();
        Self::apply(slf, fx)?;
        if let Some(e) = error {
            return Err(e);
        }
        match fut {
            Some(f) => Ok(f),
            None => ready_none(py),
        }
    }

    /// Writes the head if it is not out yet, then body bytes; returns whether `send()` must
    /// wait for the queue to drain.
    pub(super) fn send_body(
        py: Python<'_>,
        fd: RawFd,
        server: &HttpServer,
        st: &mut ConnState,
        fx: &mut Effects,
        body: Body<'_>,
        more: bool,
    ) -> PyResult<bool> {
        let body_len = match &body {
            Body::Bytes(b) => b.len() as u64,
            Body::File(_, _, n) => *n,
        };
        let (framing, trailers, status) = Self::begin_body_part(py, server, st, body_len, more)?;
        let file = matches!(body, Body::File(..));
        let mut extra: &[u8] = b"";
        let mut after: &[u8] = b"";
        if framing.send_body && body_len > 0 {
            match body {
                Body::Bytes(data) => {
                    if framing.chunked && data.len() <= COPY_MAX {
                        st.out.with_tail(|b| encode_chunk(b, data));
                    } else if framing.chunked {
                        st.out.with_tail(|b| write_chunk_size(b, data.len()));
                        extra = data;
                        after = b"\r\n";
                    } else if data.len() <= SMALL_BODY_COPY && !st.out.is_empty() {
                        // Behind the head (or other queued bytes): one buffer, one `send`.
                        st.out.with_tail(|b| b.extend_from_slice(data));
                    } else {
                        extra = data;
                    }
                }
                Body::File(file, offset, len) => {
                    if framing.chunked {
                        st.out.with_tail(|b| write_chunk_size(b, len as usize));
                        st.out.push_file(file, offset, len);
                        st.out.push(b"\r\n");
                    } else {
                        st.out.push_file(file, offset, len);
                    }
                }
            }
        }
        let last = !more;
        if last {
            let req = st.req_mut().expect("current");
            req.resp.body_done = true;
        }
        if last && !trailers && framing.chunked {
            // Written after `extra`, so queued behind it below.
            after = if after.is_empty() {
                b"0\r\n\r\n"
            } else {
                b"\r\n0\r\n\r\n"
            };
        }
        // Inside a ready batch a small part is held back until the batch ends (`CORK_MAX`):
        // the batch's responses leave together, one `send` each.
        let cork = !file
            && extra.len() + st.out_pending() <= CORK_MAX
            && (st.corked || server.loop_core().get().batch_running(py));
        if cork {
            st.out.push(extra);
            st.out.push(after);
            hold_back(st, fx);
        } else {
            // Try the socket now: the head, queued bytes and `extra` in one vectored write.
            if extra.is_empty() {
                st.out.push(after);
                after = b"";
            }
            let Ok(n) = st.write_out_with(fd, extra) else {
                st.clear_out();
                fx.close = true;
                return Ok(false);
            };
            st.out.push(&extra[n..]);
            if !after.is_empty() {
                st.out.push(after);
                if n == extra.len() {
                    flush_now(st, fx);
                }
            }
            if !st.out_empty() {
                st.set_writing(fx, true);
            }
        }
        if last {
            // What was sent goes out, but a short response is never complete: the app's error
            // ends its task, the connection is closed, and the client sees the truncation.
            fx.error = st
                .req()
                .expect("current")
                .resp
                .short_of_declared(framing)
                .map(app_error);
            if fx.error.is_some() {
                return Ok(false);
            }
        }
        if last && !trailers {
            Self::complete(py, server, st, fx, status, framing.keep_alive);
            return Ok(false);
        }
        Ok(st.out_pending() > WRITE_HIGH)
    }

    /// Checks that a body part may be sent now, writes the head before the first one, and
    /// counts the part against a declared length. Returns the framing, whether trailers follow,
    /// and the status.
    fn begin_body_part(
        py: Python<'_>,
        server: &HttpServer,
        st: &mut ConnState,
        body_len: u64,
        more: bool,
    ) -> PyResult<(Framing, bool, u16)> {
        let ConnState { http, out, .. } = st;
        let req = http.exchange_mut().expect("current");
        req.resp.check_body_part().map_err(app_error)?;
        if req.resp.framing.is_none() {
            let known = (!more && !req.resp.trailers).then_some(body_len);
            let framing = write_head(py, server, out, req, known)?;
            req.resp.framing = Some(framing);
        }
        let framing = req.resp.framing.expect("set above");
        req.resp.count_body(framing, body_len).map_err(app_error)?;
        Ok((framing, req.resp.trailers, req.resp.status))
    }

    pub(super) fn send_trailers(
        py: Python<'_>,
        server: &HttpServer,
        st: &mut ConnState,
        fx: &mut Effects,
        headers: Option<&Bound<'_, PyAny>>,
        more: bool,
    ) -> PyResult<()> {
        let ConnState { http, out, .. } = st;
        let req = http.exchange_mut().expect("current");
        let framing = req.resp.check_trailers().map_err(app_error)?;
        let status = req.resp.status;
        // Trailers may come in several messages: they are kept, checked and written together
        // after the last chunk when the final one arrives.
        if let Some(h) = headers.filter(|h| !h.is_none()) {
            for (n, v) in header_list(h)? {
                req.resp
                    .pending_trailers
                    .push((n.as_bytes().to_vec(), v.as_bytes().to_vec()));
            }
        }
        if more {
            return Ok(());
        }
        if framing.chunked && framing.send_body {
            let pairs: Vec<(&[u8], &[u8])> = req
                .resp
                .pending_trailers
                .iter()
                .map(|(n, v)| (n.as_slice(), v.as_slice()))
                .collect();
            out.with_tail(|buf| encode_last_chunk(buf, &pairs))
                .map_err(|e| PyRuntimeError::new_err(format!("invalid trailers: {e}")))?;
        }
        flush_now(st, fx);
        Self::complete(py, server, st, fx, status, framing.keep_alive);
        Ok(())
    }

    /// The response of the current request is fully queued: log it, and either go back to
    /// `Idle` (keep-alive) or start closing.
    pub(super) fn complete(
        py: Python<'_>,
        server: &HttpServer,
        st: &mut ConnState,
        fx: &mut Effects,
        status: u16,
        keep_alive: bool,
    ) {
        // `keep_alive` is what the head told the client: in a graceful shutdown, a head written
        // before it still said keep-alive, and the connection waits for a request the client
        // may already be sending (`drain.rs`). An unread rest of the body is skipped if
        // buffered, else the connection is not reused (`Http1Conn::complete`).
        let now = clock::monotonic();
        let Some((mut req, reuse)) = st.http.complete(keep_alive, now) else {
            return;
        };
        if st
            .handoff
            .as_mut()
            .is_some_and(|h| std::mem::take(&mut h.bulk))
        {
            fx.bulk = Some(false);
        }
        server.response_done(py, req.app.method, status, req.app.started);
        if server.access_log().is_some() {
            fx.access = access_record(py, &req, status);
        }
        // Wake a receive() waiting for the end of the response, and any drain waiter.
        if let Some(f) = req.app.receive_waiter.take() {
            if let Ok(m) = scope::disconnect_message(py) {
                fx.resolve.push((f, m.into_any().unbind()));
            }
        }
        if let Some(f) = req.app.drain_waiter.take() {
            fx.resolve.push((f, py.None()));
        }
        match reuse {
            Reuse::KeepAlive { .. }
                if st.handoff.as_ref().is_some_and(|h| !h.pinned())
                    && !server.keeps_connections(py) =>
            {
                // Back to the front once the response is written, with what was read of the
                // next request (`Conn::hand_back`).
                if let Some(h) = st.handoff.as_mut() {
                    h.fate = Fate::GoesBack;
                }
                fx.hand_back = true;
            }
            Reuse::KeepAlive { pipelined } => {
                if !st.http.eof() {
                    st.set_reading(fx, true);
                }
                fx.advance = pipelined;
            }
            Reuse::Close => start_closing(st, fx),
        }
    }
}

/// The access log's line for a complete request, if its app started.
fn access_record(py: Python<'_>, req: &Req, status: u16) -> Option<super::effects::AccessRecord> {
    let facts = req.app.facts.as_ref()?;
    let query = facts.query.bind(py).as_bytes();
    let path = if query.is_empty() {
        facts.path.clone_ref(py)
    } else {
        let text = format!(
            "{}?{}",
            facts.path.bind(py).to_str().unwrap_or(""),
            String::from_utf8_lossy(query)
        );
        PyString::new(py, &text).unbind()
    };
    // `scope.get("client")`, as uvicorn reads it: `None` (an empty address in the log) if the
    // app deleted the key.
    let client = facts.scope.as_ref().map(|s| {
        s.bind(py)
            .get_item(intern!(py, "client"))
            .ok()
            .flatten()
            .map_or_else(|| py.None(), Bound::unbind)
    });
    Some((
        client,
        facts.method.clone_ref(py),
        path,
        version_str(req.info.version),
        status,
    ))
}

/// The app's mistake in a response, raised from its `send()`.
fn app_error(e: ResponseError) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

/// Calls `f` with the message's `body`: a `bytes` object (what apps send) read in place, another
/// bytes-like object through the buffer protocol, an absent or `None` body as empty.
fn with_body<R>(message: &Bound<'_, PyDict>, f: impl FnOnce(&[u8]) -> PyResult<R>) -> PyResult<R> {
    match message
        .get_item(intern!(message.py(), "body"))?
        .filter(|b| !b.is_none())
    {
        Some(body) => with_bytes(&body, "body", f),
        None => f(b""),
    }
}

/// Calls `f` with the bytes of `value` (the message field `key`): a `bytes` object read in place,
/// another bytes-like object through the buffer protocol.
pub(super) fn with_bytes<R>(
    value: &Bound<'_, PyAny>,
    key: &str,
    f: impl FnOnce(&[u8]) -> PyResult<R>,
) -> PyResult<R> {
    if let Ok(bytes) = value.cast::<PyBytes>() {
        return f(bytes.as_bytes());
    }
    let buf = pyo3::buffer::PyBuffer::<u8>::get(value)
        .map_err(|_| PyTypeError::new_err(format!("'{key}' must be bytes-like")))?;
    if !buf.is_c_contiguous() {
        return Err(PyTypeError::new_err(format!("'{key}' must be contiguous")));
    }
    // SAFETY: a contiguous u8 buffer of `len_bytes()` bytes, kept alive by `buf` until `f`
    // returns; `f` writes it to the socket or copies it and runs no Python code that could
    // resize it.
    let data = unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const u8, buf.len_bytes()) };
    f(data)
}

fn version_str(v: Version) -> &'static str {
    match v {
        Version::Http10 => "1.0",
        Version::Http11 => "1.1",
    }
}

/// `message[key]` as a bool (absent: false).
pub(super) fn flag(message: &Bound<'_, PyDict>, key: &Bound<'_, PyString>) -> PyResult<bool> {
    match message.get_item(key)? {
        Some(v) => v.is_truthy(),
        None => Ok(false),
    }
}

/// `http.response.start`: remembered until the first body part, so both go out in one write.
pub(super) fn start_message(
    py: Python<'_>,
    st: &mut ConnState,
    message: &Bound<'_, PyDict>,
) -> PyResult<()> {
    let status: u16 = message
        .get_item(intern!(py, "status"))?
        .ok_or_else(|| PyTypeError::new_err("http.response.start needs 'status'"))?
        .extract()
        .map_err(|_| PyTypeError::new_err("'status' must be an int in 100..=999"))?;
    let headers = message.get_item(intern!(py, "headers"))?;
    let trailers = flag(message, intern!(py, "trailers"))?;
    start_head(st, status, headers.as_ref(), trailers)
}

/// The response head of the current request (`http.response.start`'s fields). The status and
/// the header fields are checked here, as the head will be written with the first body part:
/// a head that could never be written is the app's error now, while the response has not
/// started and the server can still answer `500`, not later when it can only close.
pub(super) fn start_head(
    st: &mut ConnState,
    status: u16,
    headers: Option<&Bound<'_, PyAny>>,
    trailers: bool,
) -> PyResult<()> {
    let req = st.req_mut().expect("current");
    if req.resp.started {
        return Err(app_error(ResponseError::StartedTwice));
    }
    let held = match headers.filter(|h| !h.is_none()) {
        Some(h) => header_list(h)?,
        None => Vec::new(),
    };
    check_response(
        status,
        held.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())),
    )
    .map_err(|e| PyRuntimeError::new_err(format!("invalid response: {e}")))?;
    req.resp.start(status, trailers).map_err(app_error)?;
    req.app.headers = held
        .into_iter()
        .map(|(n, v)| (n.unbind(), v.unbind()))
        .collect();
    Ok(())
}

/// `http.response.pathsend`: the whole file, sent with `sendfile`.
fn pathsend_body(message: &Bound<'_, PyDict>) -> PyResult<Body<'static>> {
    let py = message.py();
    let path: std::path::PathBuf = message
        .get_item(intern!(py, "path"))?
        .ok_or_else(|| PyTypeError::new_err("http.response.pathsend needs 'path'"))?
        .extract()?;
    let file = std::fs::File::open(&path)
        .map_err(|e| PyOSError::new_err(format!("cannot open {}: {e}", path.display())))?;
    let len = file
        .metadata()
        .map_err(|e| PyOSError::new_err(e.to_string()))?
        .len();
    Ok(Body::File(OwnedFd::from(file), 0, len))
}

/// `http.response.zerocopysend`: a range of the app's open file, through our own dup of its fd
/// (the app may close its file once `send()` returns).
fn zerocopy_body(message: &Bound<'_, PyDict>) -> PyResult<Body<'static>> {
    let py = message.py();
    let file = message
        .get_item(intern!(py, "file"))?
        .ok_or_else(|| PyTypeError::new_err("http.response.zerocopysend needs 'file'"))?;
    let raw: RawFd = file.call_method0(intern!(py, "fileno"))?.extract()?;
    let (owned, stat) = own_copy(raw).map_err(|e| PyOSError::new_err(e.to_string()))?;
    let size = stat.st_size as u64;
    let offset: u64 = match message.get_item(intern!(py, "offset"))? {
        Some(o) if !o.is_none() => o.extract()?,
        // SAFETY: lseek with SEEK_CUR and offset 0 only reads the app's file position.
        _ => unsafe { libc::lseek(raw, 0, libc::SEEK_CUR) }.max(0) as u64,
    };
    let count: u64 = match message.get_item(intern!(py, "count"))? {
        Some(c) if !c.is_none() => c.extract()?,
        _ => size.saturating_sub(offset),
    };
    Ok(Body::File(owned, offset, count))
}

/// Our own descriptor for the app's open file `raw` (so the app may close its file before
/// the loop sends ours), and its `fstat`.
pub(super) fn own_copy(raw: RawFd) -> std::io::Result<(OwnedFd, libc::stat)> {
    // SAFETY: fcntl with F_DUPFD_CLOEXEC only reads `raw`; a bad fd is an error, not UB.
    let dup = unsafe { libc::fcntl(raw, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `dup` is a fresh fd that nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(dup) };
    // SAFETY: an all-zero stat is a valid out-buffer.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on an fd we own into a stat buffer that outlives the call.
    if unsafe { libc::fstat(dup, &raw mut stat) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((owned, stat))
}

pub(super) enum Body<'a> {
    Bytes(&'a [u8]),
    File(OwnedFd, u64, u64),
}

/// The app's headers as owned `bytes` pairs. A list or tuple of 2-tuples (what apps send) is read
/// by index, without a Python iterator per level; anything else (subclasses too) goes through the
/// iterator protocol.
pub(super) fn header_list<'py>(
    headers: &Bound<'py, PyAny>,
) -> PyResult<Vec<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)>> {
    if let Ok(list) = headers.cast_exact::<PyList>() {
        let mut out = Vec::with_capacity(list.len());
        for item in list {
            out.push(header_pair(item)?);
        }
        return Ok(out);
    }
    if let Ok(tuple) = headers.cast_exact::<PyTuple>() {
        let mut out = Vec::with_capacity(tuple.len());
        for item in tuple {
            out.push(header_pair(item)?);
        }
        return Ok(out);
    }
    let mut out = Vec::new();
    for item in headers.try_iter()? {
        out.push(header_pair(item?)?);
    }
    Ok(out)
}

/// `header_list`'s pairs as the byte slices the codec's encoders take.
pub(super) fn header_pairs<'a>(
    held: &'a [(Bound<'_, PyBytes>, Bound<'_, PyBytes>)],
) -> Vec<(&'a [u8], &'a [u8])> {
    held.iter()
        .map(|(n, v)| (n.as_bytes(), v.as_bytes()))
        .collect()
}

/// One `(name, value)` header of `bytes`.
fn header_pair(item: Bound<'_, PyAny>) -> PyResult<(Bound<'_, PyBytes>, Bound<'_, PyBytes>)> {
    let not_pair = || PyTypeError::new_err("each header must be a (name, value) pair");
    let (name, value) = if let Ok(pair) = item.cast_exact::<PyTuple>() {
        if pair.len() != 2 {
            return Err(not_pair());
        }
        (pair.get_item(0)?, pair.get_item(1)?)
    } else {
        let mut it = item.try_iter()?;
        let (Some(name), Some(value), None) = (it.next(), it.next(), it.next()) else {
            return Err(not_pair());
        };
        (name?, value?)
    };
    let (Ok(n), Ok(v)) = (name.cast_into::<PyBytes>(), value.cast_into::<PyBytes>()) else {
        return Err(PyTypeError::new_err(
            "header names and values must be bytes",
        ));
    };
    Ok((n, v))
}

/// Encodes the response head into the queue.
fn write_head(
    py: Python<'_>,
    server: &HttpServer,
    out: &mut OutQueue,
    req: &Req,
    known_length: Option<u64>,
) -> PyResult<Framing> {
    let pairs: Vec<(&[u8], &[u8])> = req
        .app
        .headers
        .iter()
        .map(|(n, v)| (n.as_bytes(py), v.as_bytes(py)))
        .collect();
    let date = server.date(py);
    let fields = server.fields(date.as_ref().map(|d| &d[..]));
    // In a graceful shutdown every response says `connection: close` (`drain.rs`), and so
    // does every response of a worker whose front drains (`handoff.rs`).
    let info = RequestInfo {
        keep_alive: req.info.keep_alive && !server.closing_connections(py),
        ..req.info
    };
    out.with_tail(|buf| encode_head(buf, info, req.resp.status, &pairs, known_length, &fields))
        .map_err(|e| PyRuntimeError::new_err(format!("invalid response: {e}")))
}
