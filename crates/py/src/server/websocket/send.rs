//! The app's side of a WebSocket's `send()`: the handshake's answer (`websocket.accept`,
//! `websocket.close`, `websocket.http.response.*`), messages and the close on an open socket,
//! and what the server sends on its own (the close when the app's task ends, at shutdown, and
//! the keepalive pings). The states and invariants are in `mod.rs`.

use ferroloop_core::clock;
use ferroloop_core::http::{encode_upgrade_head, error_response};
use ferroloop_core::ws::{Compressor, Decoder, Opcode, MAX_HEAD_LEN};
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use super::{
    finish, frame_head, logged_path, queue_close, queue_data_frame, queue_frame, tell_disconnect,
    ClientDisconnected, Deflate, WsSession, WsState, CLOSE_TIMEOUT,
};
use crate::server::conn::{Conn, ConnState, Phase, SMALL_BODY_COPY, WRITE_HIGH};
use crate::server::effects::Effects;
use crate::server::output::{flush_now, flush_or_cork};
use crate::server::respond::{flag, header_list, header_pairs, start_message, with_bytes, Body};
use crate::server::HttpServer;

impl Conn {
    /// `send(message)` of the WebSocket request `seq` (see `Conn::send`).
    pub(in crate::server) fn ws_send(
        slf: &Bound<'_, Self>,
        seq: u64,
        typ: &str,
        message: &Bound<'_, PyDict>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let server = this.server.bind(py).get();
        let fd = this.fd;
        let mut fx = Effects::default();
        let wait = {
            let mut st = this.state.borrow(py)?;
            if st.http.current(seq).is_none() || st.phase() == Phase::Closed {
                return Err(ClientDisconnected::new_err(
                    "the WebSocket connection is closed",
                ));
            }
            let ws = st.ws_mut().expect("a WebSocket request");
            match ws.state {
                WsState::Handshake => {
                    Self::ws_handshake_reply(py, server, &mut st, &mut fx, typ, message)?;
                    false
                }
                WsState::Denying => {
                    if typ != "websocket.http.response.body" {
                        return Err(PyRuntimeError::new_err(format!(
                            "Expected ASGI message 'websocket.http.response.body' but got '{typ}'."
                        )));
                    }
                    let more = flag(message, intern!(py, "more_body"))?;
                    let body = message
                        .get_item(intern!(py, "body"))?
                        .filter(|b| !b.is_none());
                    let mut send = |data: &[u8]| {
                        Self::send_body(py, fd, server, &mut st, &mut fx, Body::Bytes(data), more)
                    };
                    match body {
                        Some(b) => with_bytes(&b, "body", send)?,
                        None => send(b"")?,
                    }
                }
                WsState::Open => {
                    if ws.peer_gone {
                        return Err(ClientDisconnected::new_err(
                            "the WebSocket client has closed the connection",
                        ));
                    }
                    if ws.close_sent || st.phase() != Phase::Busy {
                        return Err(PyRuntimeError::new_err(format!(
                            "Unexpected ASGI message '{typ}', after sending 'websocket.close'."
                        )));
                    }
                    let batch = server.loop_core().get().batch_running(py);
                    let wait = Self::ws_send_open(py, &mut st, &mut fx, fd, typ, message, batch)?;
                    Self::ws_flow(server, &mut st, &mut fx);
                    wait
                }
            }
        };
        Self::send_done(slf, seq, wait, fx)
    }

    /// The app's answer to `websocket.connect`.
    fn ws_handshake_reply(
        py: Python<'_>,
        server: &HttpServer,
        st: &mut ConnState,
        fx: &mut Effects,
        typ: &str,
        message: &Bound<'_, PyDict>,
    ) -> PyResult<()> {
        match typ {
            "websocket.accept" => Self::ws_accept(py, server, st, fx, message),
            "websocket.close" => {
                // Refused before the handshake: 403, as uvicorn answers.
                fx.websocket_log = Some((logged_path(py, st), "403".to_owned()));
                let date = server.date(py);
                let fields = server.fields(date.as_ref().map(|d| &d[..]));
                let bytes = error_response(403, "", &fields, false);
                // The request (and its session) ends with this answer; later `receive()`s get
                // 1006 through `ws_seq`.
                st.out.push(&bytes);
                flush_now(st, fx);
                Self::complete(py, server, st, fx, 403, false);
                Ok(())
            }
            "websocket.http.response.start" => {
                let status: u16 = message
                    .get_item(intern!(py, "status"))?
                    .ok_or_else(|| {
                        PyTypeError::new_err("websocket.http.response.start needs 'status'")
                    })?
                    .extract()
                    .map_err(|_| PyTypeError::new_err("'status' must be an int in 100..=599"))?;
                if !(100..600).contains(&status) {
                    return Err(PyRuntimeError::new_err(format!(
                        "Invalid HTTP status code '{status}' in response."
                    )));
                }
                start_message(py, st, message)?;
                fx.websocket_log = Some((logged_path(py, st), status.to_string()));
                let ws = st.ws_mut().expect("a WebSocket");
                ws.state = WsState::Denying;
                Ok(())
            }
            other => Err(PyRuntimeError::new_err(format!(
                "Expected ASGI message 'websocket.accept', 'websocket.close' or \
                 'websocket.http.response.start' but got '{other}'."
            ))),
        }
    }

    /// `websocket.accept`: the `101`, then the socket is open.
    fn ws_accept(
        py: Python<'_>,
        server: &HttpServer,
        st: &mut ConnState,
        fx: &mut Effects,
        message: &Bound<'_, PyDict>,
    ) -> PyResult<()> {
        let subprotocol = message
            .get_item(intern!(py, "subprotocol"))?
            .filter(|s| !s.is_none());
        let subprotocol = match &subprotocol {
            Some(s) => Some(
                s.cast::<PyString>()
                    .map_err(|_| PyTypeError::new_err("'subprotocol' must be a str"))?
                    .to_str()?,
            ),
            None => None,
        };
        let held = match message.get_item(intern!(py, "headers"))? {
            Some(h) if !h.is_none() => header_list(&h)?,
            _ => Vec::new(),
        };
        let pairs = header_pairs(&held);
        let date = server.date(py);
        let fields = server.fields(date.as_ref().map(|d| &d[..]));
        let ws = st.ws().expect("a WebSocket");
        let accept = ws.accept;
        let extensions = match &ws.deflate {
            Deflate::Offered(params) => Some(params.response_value()),
            Deflate::Off | Deflate::On { .. } => None,
        };
        st.out
            .with_tail(|b| {
                encode_upgrade_head(
                    b,
                    &accept,
                    subprotocol.map(str::as_bytes),
                    extensions.as_deref().map(str::as_bytes),
                    &pairs,
                    &fields,
                )
            })
            .map_err(|e| PyRuntimeError::new_err(format!("invalid websocket.accept: {e}")))?;
        fx.websocket_log = Some((logged_path(py, st), "[accepted]".to_owned()));
        let ws_opts = server.opts().ws;
        let ping_interval = ws_opts.and_then(|o| o.ping_interval);
        let ws = st.ws_mut().expect("a WebSocket");
        ws.state = WsState::Open;
        if let (Deflate::Offered(params), Some(opts)) = (&ws.deflate, ws_opts) {
            // The 101 says permessage-deflate: from now on the client may compress, and we do.
            let params = *params;
            ws.decoder = Decoder::with_deflate(opts.max_size, &params);
            ws.deflate = Deflate::On {
                params,
                compressor: None,
            };
        }
        if let Some(interval) = ping_interval {
            ws.ping_due = clock::monotonic() + interval;
        }
        let deadline = ws.deadline();
        st.http.set_deadline(deadline);
        let (method, started) = st.req().map_or((0, 0.0), |r| (r.app.method, r.app.started));
        server.response_done(py, method, 101, started);
        flush_now(st, fx);
        // Frames the client sent right behind its request are decoded now.
        Self::ws_input(py, server, st, fx)
    }

    /// `websocket.send` / `websocket.close` on an open socket; returns whether `send()` waits
    /// for the write queue to drain.
    fn ws_send_open(
        py: Python<'_>,
        st: &mut ConnState,
        fx: &mut Effects,
        fd: std::os::fd::RawFd,
        typ: &str,
        message: &Bound<'_, PyDict>,
        batch: bool,
    ) -> PyResult<bool> {
        match typ {
            "websocket.send" => {
                let bytes = message
                    .get_item(intern!(py, "bytes"))?
                    .filter(|b| !b.is_none());
                let text = message
                    .get_item(intern!(py, "text"))?
                    .filter(|t| !t.is_none());
                match (bytes, text) {
                    (Some(b), _) => with_bytes(&b, "bytes", |data| {
                        Ok(Self::ws_write(st, fx, fd, Opcode::Binary, data, batch))
                    }),
                    (None, Some(t)) => {
                        let t = t
                            .cast::<PyString>()
                            .map_err(|_| PyTypeError::new_err("'text' must be a str"))?;
                        Ok(Self::ws_write(
                            st,
                            fx,
                            fd,
                            Opcode::Text,
                            t.to_str()?.as_bytes(),
                            batch,
                        ))
                    }
                    (None, None) => Err(PyTypeError::new_err(
                        "websocket.send needs 'bytes' or 'text'",
                    )),
                }
            }
            "websocket.close" => {
                let code: u16 = match message
                    .get_item(intern!(py, "code"))?
                    .filter(|c| !c.is_none())
                {
                    Some(c) => c
                        .extract()
                        .map_err(|_| PyTypeError::new_err("'code' must be an int"))?,
                    None => 1000,
                };
                let reason = match message
                    .get_item(intern!(py, "reason"))?
                    .filter(|r| !r.is_none())
                {
                    Some(r) => r
                        .cast::<PyString>()
                        .map_err(|_| PyTypeError::new_err("'reason' must be a str"))?
                        .to_str()?
                        .to_owned(),
                    None => String::new(),
                };
                queue_close(st, Some(code), reason.as_bytes());
                let ws = st.ws_mut().expect("a WebSocket");
                tell_disconnect(ws, code, &reason);
                ws.close_due = clock::monotonic() + CLOSE_TIMEOUT;
                let deadline = ws.deadline();
                st.http.set_deadline(deadline);
                flush_now(st, fx);
                Ok(false)
            }
            other => Err(PyRuntimeError::new_err(format!(
                "Expected ASGI message 'websocket.send' or 'websocket.close', but got '{other}'."
            ))),
        }
    }

    /// Writes a data frame: small ones copied behind what is queued (and, inside a ready
    /// `batch`, written when it ends, with the batch's other output: `flush_or_cork`), large
    /// payloads straight from the app's buffer when the socket takes them (only the rest is
    /// copied).
    fn ws_write(
        st: &mut ConnState,
        fx: &mut Effects,
        fd: std::os::fd::RawFd,
        op: Opcode,
        data: &[u8],
        batch: bool,
    ) -> bool {
        // With permessage-deflate in force every data message is compressed, as the websockets
        // library under uvicorn does.
        let compressed = match st.ws_mut().map(|ws| &mut ws.deflate) {
            Some(Deflate::On { params, compressor }) => {
                let c = compressor.get_or_insert_with(|| Compressor::new(params));
                let mut out = Vec::with_capacity(data.len() / 2 + 16);
                c.compress(data, &mut out);
                Some(out)
            }
            _ => None,
        };
        let (data, rsv1) = match &compressed {
            Some(c) => (&c[..], true),
            None => (data, false),
        };
        if data.len() <= SMALL_BODY_COPY {
            queue_data_frame(&mut st.out, op, rsv1, data);
            flush_or_cork(st, fx, batch);
        } else {
            let mut head = [0u8; MAX_HEAD_LEN];
            let n = frame_head(op, rsv1, data.len(), &mut head);
            st.out.push(&head[..n]);
            let Ok(written) = st.write_out_with(fd, data) else {
                st.clear_out();
                fx.close = true;
                return false;
            };
            st.out.push(&data[written..]);
            if !st.out_empty() {
                st.set_writing(fx, true);
            }
        }
        st.out_pending() > WRITE_HIGH
    }

    /// The app's task ended after the 101: close with 1000 (it returned) or 1011 (it raised or
    /// was cancelled), unless a close frame already went out.
    pub(in crate::server) fn ws_app_finished(st: &mut ConnState, fx: &mut Effects, failed: bool) {
        let Some(ws) = st.ws_mut() else {
            return;
        };
        if ws.close_sent {
            if ws.peer_gone {
                finish(st, fx);
            }
            return;
        }
        let (code, reason) = if failed {
            (1011, "Internal Server Error")
        } else {
            (1000, "")
        };
        tell_disconnect(ws, code, reason);
        queue_close(st, Some(code), reason.as_bytes());
        finish(st, fx);
    }

    /// Server shutdown: an open WebSocket is closed with 1012 (service restart), as uvicorn does.
    pub(in crate::server) fn ws_shutdown(
        py: Python<'_>,
        st: &mut ConnState,
        fx: &mut Effects,
    ) -> PyResult<()> {
        let open = |ws: &&mut WsSession| ws.state == WsState::Open && !ws.close_sent;
        let Some(ws) = st.ws_mut().filter(open) else {
            return Ok(());
        };
        tell_disconnect(ws, 1012, "");
        queue_close(st, Some(1012), b"");
        finish(st, fx);
        Self::ws_wake_receiver(py, st, fx)
    }

    /// The sweep found the WebSocket's deadline passed: send a keepalive ping, fail on a missing
    /// pong (1011), or give up waiting for the client's close frame.
    pub(in crate::server) fn ws_deadline(
        server: &HttpServer,
        st: &mut ConnState,
        fx: &mut Effects,
        now: f64,
    ) {
        let opts = server
            .opts()
            .ws
            .expect("a WebSocket exists only with --ws on");
        let Some(ws) = st.ws_mut() else {
            return;
        };
        if ws.close_due <= now {
            fx.close = true;
            return;
        }
        if ws.pong_due <= now {
            tell_disconnect(ws, 1011, "keepalive ping timeout");
            ws.peer_gone = true;
            queue_close(st, Some(1011), b"keepalive ping timeout");
            finish(st, fx);
            return;
        }
        if ws.ping_due <= now && !ws.close_sent {
            ws.pings = ws.pings.wrapping_add(1);
            let payload = ws.pings.to_be_bytes();
            match opts.ping_timeout {
                Some(t) => {
                    ws.pong_due = now + t;
                    ws.ping_due = opts.ping_interval.map_or(f64::INFINITY, |i| now + i.max(t));
                }
                None => ws.ping_due = opts.ping_interval.map_or(f64::INFINITY, |i| now + i),
            }
            let deadline = ws.deadline();
            st.http.set_deadline(deadline);
            queue_frame(&mut st.out, Opcode::Ping, &payload);
            flush_now(st, fx);
            return;
        }
        let deadline = ws.deadline();
        st.http.set_deadline(deadline);
    }
}
