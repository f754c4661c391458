//! One WSGI request on a pool thread: `WsgiCall` is its `start_response` (and `write`), its
//! entry in the server's task table, and what hands its response to the loop thread.
//!
//! Ownership: the call's response state (`Head`) is used by the pool thread running it (with the
//! GIL); `Flow` is shared with the closures the loop thread runs; `cancelled` is set by the loop
//! thread (`abort`). See the module `wsgi` for the invariants.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use ferroloop_core::http::check_response;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use pyo3::PyTraverseError;

use super::WsgiFileWrapper;
use super::{PoolShared, WsgiInput, WsgiPool};
use crate::event_loop::LoopRemote;
use crate::server::conn::{Conn, WRITE_HIGH};
use crate::server::respond::{start_head, Body};
use crate::server::Ready;

/// The response head as `start_response` left it.
#[derive(Default)]
struct Head {
    status: Option<u16>,
    /// `[(bytes, bytes)]`, as `http.response.start` carries it.
    headers: Option<Py<PyList>>,
    /// The app declared a `Content-Length` or a `Transfer-Encoding`: the server adds neither.
    framed: bool,
    /// `http.response.start` has been handed to the loop thread.
    sent: bool,
}

/// Bytes handed to the loop thread and not yet written (or accepted under the connection's
/// high-water mark), and what the loop thread found out about the connection meanwhile.
#[derive(Default)]
struct FlowState {
    queued: usize,
    gone: bool,
    error: Option<PyErr>,
}

#[derive(Default)]
pub(crate) struct Flow {
    state: Mutex<FlowState>,
    cond: Condvar,
}

/// A piece of the response for the loop thread, sent through `Conn::send_http` (so with the
/// checks and framing of an ASGI app's messages, without building message dicts).
pub(super) enum Part {
    /// `http.response.start`: the status and the `[(bytes, bytes)]` headers.
    Start(u16, Py<PyList>),
    /// `http.response.body`: a block, and whether more follow.
    Body(Py<PyBytes>, bool),
    /// The rest of a `wsgi.file_wrapper` file: our fd, its offset and the byte count, sent
    /// with `sendfile` (the response's last part).
    File(OwnedFd, u64, u64),
}

impl Part {
    /// Loop thread: sends this part; returns what `send()` would (a ready awaitable, or a
    /// Future done when the write queue has drained).
    fn send(self, conn: &Bound<'_, Conn>, seq: u64) -> PyResult<Py<PyAny>> {
        match self {
            Self::Start(status, headers) => {
                Conn::send_http(conn, seq, "http.response.start", |py, _, _, st, _| {
                    start_head(st, status, Some(headers.bind(py).as_any()), false).map(|()| false)
                })
            }
            Self::Body(data, more) => {
                Conn::send_http(conn, seq, "http.response.body", |py, fd, server, st, fx| {
                    let body = Body::Bytes(data.as_bytes(py));
                    Conn::send_body(py, fd, server, st, fx, body, more)
                })
            }
            Self::File(file, offset, count) => Conn::send_http(
                conn,
                seq,
                "http.response.zerocopysend",
                |py, fd, server, st, fx| {
                    let body = Body::File(file, offset, count);
                    Conn::send_body(py, fd, server, st, fx, body, false)
                },
            ),
        }
    }
}

/// What handing over a block found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
enum Sent {
    Queued,
    /// The connection is closed: the app's further output has nowhere to go.
    Gone,
}

impl Flow {
    fn lock(&self) -> std::sync::MutexGuard<'_, FlowState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, f: impl FnOnce(&mut FlowState)) {
        f(&mut self.lock());
        self.cond.notify_all();
    }

    /// Books `bytes` against the credit if there is room; the connection's error or its end
    /// are answers too. `None`: wait for credit.
    fn try_acquire(st: &mut FlowState, bytes: usize) -> Option<PyResult<Sent>> {
        if let Some(e) = st.error.take() {
            return Some(Err(e));
        }
        if st.gone {
            return Some(Ok(Sent::Gone));
        }
        if st.queued > WRITE_HIGH {
            return None;
        }
        st.queued += bytes;
        Some(Ok(Sent::Queued))
    }

    fn release(&self, bytes: usize) {
        self.update(|st| st.queued = st.queued.saturating_sub(bytes));
    }
}

#[pyclass(module = "ferroloop._native", name = "WsgiCall", frozen)]
pub struct WsgiCall {
    conn: Py<Conn>,
    seq: u64,
    remote: LoopRemote,
    pool: Arc<PoolShared>,
    scope: Py<PyDict>,
    forwarded: bool,
    input: Py<WsgiInput>,
    cancelled: AtomicBool,
    head: Mutex<Head>,
    flow: Arc<Flow>,
}

impl WsgiCall {
    pub(super) fn new(
        conn: Py<Conn>,
        seq: u64,
        remote: LoopRemote,
        pool: Arc<PoolShared>,
        scope: Py<PyDict>,
        forwarded: bool,
        input: Py<WsgiInput>,
    ) -> Self {
        Self {
            conn,
            seq,
            remote,
            pool,
            scope,
            forwarded,
            input,
            cancelled: AtomicBool::new(false),
            head: Mutex::new(Head::default()),
            flow: Arc::default(),
        }
    }

    fn head(&self) -> std::sync::MutexGuard<'_, Head> {
        self.head.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The head as a part, if it has not been handed over yet; `length` is the whole body's,
    /// when known, for a `Content-Length` the app did not set.
    fn take_start(&self, py: Python<'_>, length: Option<usize>) -> PyResult<Option<Part>> {
        let mut head = self.head();
        if head.sent {
            return Ok(None);
        }
        let (Some(status), Some(headers)) = (head.status, head.headers.as_ref()) else {
            return Err(PyRuntimeError::new_err(
                "the WSGI app did not call start_response() before its first body block \
                 (or before returning)",
            ));
        };
        let headers = headers.clone_ref(py);
        let bodiless = status < 200 || status == 204 || status == 304;
        if let (Some(n), false, false) = (length, head.framed, bodiless) {
            let value = PyBytes::new(py, n.to_string().as_bytes());
            headers
                .bind(py)
                .append((PyBytes::new(py, b"content-length"), value))?;
        }
        head.sent = true;
        Ok(Some(Part::Start(status, headers)))
    }

    /// Hands `data` (non-empty, `more_body`) to the loop thread, after the head if it is not
    /// out yet; waits first while too many bytes are in flight.
    fn send_block(&self, py: Python<'_>, data: &Bound<'_, PyBytes>) -> PyResult<Sent> {
        let mut parts = Vec::with_capacity(2);
        if let Some(start) = self.take_start(py, None)? {
            parts.push(start);
        }
        parts.push(Part::Body(data.clone().unbind(), true));
        let bytes = data.as_bytes().len();
        // The GIL is let go only when there is no credit to take at once.
        let ready = Flow::try_acquire(&mut self.flow.lock(), bytes);
        let sent = ready.unwrap_or_else(|| {
            let (flow, pool) = (Arc::clone(&self.flow), Arc::clone(&self.pool));
            py.detach(move || {
                pool.wait_for(&flow.state, &flow.cond, |st| Flow::try_acquire(st, bytes))
                    // A closed pool: the server is gone, and so is the client.
                    .unwrap_or(Ok(Sent::Gone))
            })
        });
        if sent? == Sent::Gone {
            return Ok(Sent::Gone);
        }
        let flow = Arc::clone(&self.flow);
        let conn = self.conn.clone_ref(py);
        let seq = self.seq;
        self.hand_over(move |py| {
            deliver(py, conn.bind(py), seq, parts, bytes, &flow);
            Ok(())
        })?;
        Ok(Sent::Queued)
    }

    fn hand_over(
        &self,
        task: impl FnOnce(Python<'_>) -> PyResult<()> + Send + 'static,
    ) -> PyResult<()> {
        self.remote
            .spawn(task)
            .map(drop)
            .map_err(|e| PyRuntimeError::new_err(format!("could not wake the server's loop: {e}")))
    }

    /// The request's end: `pending` messages are sent unless the app failed, then the task
    /// table entry goes and `Conn::app_finished` answers 500 or closes as for an ASGI app.
    fn finish(
        slf: &Bound<'_, Self>,
        pending: Vec<Part>,
        exc: Option<PyErr>,
        cancelled: bool,
    ) -> PyResult<()> {
        let call = slf.clone().unbind();
        slf.get().hand_over(move |py| {
            let call = call.bind(py);
            let this = call.get();
            let conn = this.conn.bind(py);
            // A block the connection refused (one past the declared Content-Length, say) ends
            // the request with that error, even if the app yielded nothing after it: the
            // closures run in order, so every block's outcome is known here.
            let refused = this.flow.lock().error.take();
            let mut exc = exc.or(refused).map(|e| e.into_value(py).into_any());
            if exc.is_none() {
                for part in pending {
                    if let Err(e) = part.send(conn, this.seq) {
                        exc = Some(e.into_value(py).into_any());
                        break;
                    }
                }
            }
            let server = conn.get().server().bind(py).get();
            drop(server.task_done(py, call.as_any()));
            Conn::app_finished(conn, this.seq, exc.as_ref().map(|e| e.bind(py)), cancelled)
        })
    }
}

/// Loop thread: sends a pool thread's parts, then gives the credit back now, or when the
/// connection's write queue drains if `send()` asked to wait.
fn deliver(
    py: Python<'_>,
    conn: &Bound<'_, Conn>,
    seq: u64,
    parts: Vec<Part>,
    bytes: usize,
    flow: &Arc<Flow>,
) {
    // The last part's awaitable tells whether the queue is over its high-water mark.
    let mut last = None;
    for part in parts {
        match part.send(conn, seq) {
            Ok(aw) => last = Some(aw),
            Err(e) => {
                flow.update(|st| st.error = Some(e));
                return;
            }
        }
    }
    if Conn::is_closed(conn) {
        flow.update(|st| st.gone = true);
    }
    let flow = Arc::clone(flow);
    match last {
        Some(aw) => when_done(py, Ok(aw), move |_| flow.release(bytes)),
        None => flow.release(bytes),
    }
}

type DoneFn = Box<dyn FnOnce(PyResult<Py<PyAny>>) + Send>;

/// A Future's done callback that runs its function once with the Future's result, or with an
/// error when it is dropped uncalled (the Future was collected unresolved), so what a pool
/// thread waits for (an answer, write credit) always comes.
#[pyclass(module = "ferroloop._native", name = "WsgiDoneCallback", frozen)]
struct OnDone {
    f: Mutex<Option<DoneFn>>,
}

impl OnDone {
    fn run(&self, result: PyResult<Py<PyAny>>) {
        let f = self.f.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(f) = f {
            f(result);
        }
    }
}

impl Drop for OnDone {
    fn drop(&mut self) {
        self.run(Err(PyRuntimeError::new_err(
            "the server dropped a pending receive() or send() of a WSGI request",
        )));
    }
}

#[pymethods]
impl OnDone {
    fn __call__(&self, fut: &Bound<'_, PyAny>) {
        self.run(
            fut.call_method0(intern!(fut.py(), "result"))
                .map(Bound::unbind),
        );
    }
}

/// Loop thread: `f` with what `Conn::receive`/`Conn::send` gave: the value of a ready
/// awaitable at once, a Future's result when it is done.
pub(crate) fn when_done(
    py: Python<'_>,
    awaited: PyResult<Py<PyAny>>,
    f: impl FnOnce(PyResult<Py<PyAny>>) + Send + 'static,
) {
    let aw = match awaited {
        Ok(aw) => aw,
        Err(e) => return f(Err(e)),
    };
    if let Ok(ready) = aw.bind(py).cast::<Ready>() {
        return f(Ok(ready.get().value(py)));
    }
    let callback = OnDone {
        f: Mutex::new(Some(Box::new(f))),
    };
    // On failure the callback is dropped, which runs `f` with an error.
    if let Ok(cb) = Bound::new(py, callback) {
        let _ = aw
            .bind(py)
            .call_method1(intern!(py, "add_done_callback"), (cb,));
    }
}

#[pymethods]
impl WsgiCall {
    #[new]
    fn py_new() -> PyResult<Self> {
        Err(PyTypeError::new_err(
            "WsgiCall objects are created by the server",
        ))
    }

    /// PEP 3333 `start_response(status, response_headers, exc_info=None)`; returns `write`.
    #[pyo3(signature = (status, headers, exc_info=None))]
    fn __call__<'py>(
        slf: &Bound<'py, Self>,
        status: &Bound<'py, PyAny>,
        headers: &Bound<'py, PyAny>,
        exc_info: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let exc_info = exc_info.filter(|e| !e.is_none());
        {
            let head = this.head();
            if head.sent {
                if let Some(info) = exc_info {
                    // PEP 3333: too late to change the head; re-raise the app's error.
                    let exc = info.get_item(1)?;
                    return Err(PyErr::from_value(exc));
                }
            }
            if head.status.is_some() && exc_info.is_none() {
                return Err(PyRuntimeError::new_err(
                    "start_response() called a second time without exc_info",
                ));
            }
        }
        let code = parse_status(status)?;
        let (list, framed) = encode_headers(py, code, headers)?;
        let mut head = this.head();
        head.status = Some(code);
        head.headers = Some(list.unbind());
        head.framed = framed;
        drop(head);
        slf.getattr(intern!(py, "write"))
    }

    /// The legacy `write(data)` callable `start_response` returns: sends `data` at once.
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let data = data.cast::<PyBytes>().map_err(|_| {
            PyTypeError::new_err(format!(
                "write() takes bytes, not {}",
                data.get_type()
                    .name()
                    .map_or_else(|_| "?".into(), |n| n.to_string())
            ))
        })?;
        if data.as_bytes().is_empty() {
            return Ok(());
        }
        match self.send_block(py, data)? {
            Sent::Queued => Ok(()),
            Sent::Gone => Err(crate::server::ClientDisconnected::new_err(
                "the client closed the connection",
            )),
        }
    }

    /// Called by `HttpServer.abort` as on an app task: the call stops at its next block.
    fn cancel(&self) -> bool {
        !self.cancelled.swap(true, Ordering::SeqCst)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.conn)?;
        visit.call(&self.scope)?;
        visit.call(&self.input)?;
        if let Ok(head) = self.head.try_lock() {
            if let Some(h) = &head.headers {
                visit.call(h)?;
            }
        }
        Ok(())
    }
}

/// `"200 OK"` → 200. PEP 3333: a str, three digits, a space and a reason phrase (the phrase
/// itself is not sent: the server writes the standard one, as uvicorn does).
fn parse_status(status: &Bound<'_, PyAny>) -> PyResult<u16> {
    let text = status.cast::<PyString>().map_err(|_| {
        PyTypeError::new_err("start_response() status must be a str such as '200 OK'")
    })?;
    let text = text.to_str()?;
    let b = text.as_bytes();
    let digits = b.len() >= 3 && b[..3].iter().all(u8::is_ascii_digit);
    if !digits || (b.len() > 3 && b[3] != b' ') || b[0] == b'0' {
        return Err(PyValueError::new_err(format!(
            "start_response() status {text:?} is not a 3-digit code and a reason, such as '200 OK'"
        )));
    }
    Ok(u16::from(b[0] - b'0') * 100 + u16::from(b[1] - b'0') * 10 + u16::from(b[2] - b'0'))
}

/// The app's `[(str, str)]` headers as `[(bytes, bytes)]` (latin-1, PEP 3333), and whether
/// they frame the body themselves (`Content-Length` or `Transfer-Encoding`). A head the server
/// could not write (a name that is not a token, a value with CR, LF or NUL, a bad
/// `Content-Length`) is refused here, in the app's call, as `http.response.start` refuses it.
fn encode_headers<'py>(
    py: Python<'py>,
    status: u16,
    headers: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyList>, bool)> {
    let list = headers.cast::<PyList>().map_err(|_| {
        PyTypeError::new_err("start_response() headers must be a list of (name, value) tuples")
    })?;
    let out = PyList::empty(py);
    let mut held = Vec::with_capacity(list.len());
    let mut framed = false;
    for item in list.iter() {
        let pair = item.cast::<PyTuple>().map_err(|_| {
            PyTypeError::new_err("each response header must be a (name, value) tuple of str")
        })?;
        if pair.len() != 2 {
            return Err(PyTypeError::new_err(
                "each response header must be a (name, value) tuple of str",
            ));
        }
        let name = latin1_bytes(py, &pair.get_item(0)?, "header name")?;
        let value = latin1_bytes(py, &pair.get_item(1)?, "header value")?;
        let n = name.as_bytes();
        framed |= n.eq_ignore_ascii_case(b"content-length")
            || n.eq_ignore_ascii_case(b"transfer-encoding");
        held.push((name, value));
    }
    check_response(
        status,
        held.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())),
    )
    .map_err(|e| PyValueError::new_err(format!("start_response(): invalid response: {e}")))?;
    for pair in held {
        out.append(pair)?;
    }
    Ok((out, framed))
}

fn latin1_bytes<'py>(
    py: Python<'py>,
    s: &Bound<'py, PyAny>,
    what: &str,
) -> PyResult<Bound<'py, PyBytes>> {
    let s = s
        .cast::<PyString>()
        .map_err(|_| PyTypeError::new_err(format!("response {what} must be a str")))?;
    let text = s.to_str()?;
    if text.is_ascii() {
        return Ok(PyBytes::new(py, text.as_bytes()));
    }
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        let b = u8::try_from(u32::from(c)).map_err(|_| {
            PyValueError::new_err(format!("response {what} {text:?} is not latin-1"))
        })?;
        out.push(b);
    }
    Ok(PyBytes::new(py, &out))
}

/// A pool thread runs one call: the app in a fresh copy of the server's context, then the
/// request's end handed to the loop thread. Never raises: the app's errors end its request.
pub(super) fn run(py: Python<'_>, pool: &WsgiPool, call: &Bound<'_, WsgiCall>) {
    let this = call.get();
    let server = this.conn.bind(py).get().server().bind(py).get();
    let mut pending = Vec::new();
    let outcome = server.task_context(py).and_then(|ctx| {
        crate::handle::run_in_context(&ctx, || drive(py, pool, call, &mut pending))
    });
    let cancelled = this.cancelled.load(Ordering::SeqCst);
    if let Err(e) = WsgiCall::finish(call, pending, outcome.err(), cancelled) {
        // The loop is gone: nothing can answer this request any more.
        e.write_unraisable(py, Some(call.as_any()));
    }
}

/// Builds the environ, calls the app, sends its blocks and closes its result; the last
/// messages (the body's end) are left in `pending` for `finish`.
fn drive(
    py: Python<'_>,
    pool: &WsgiPool,
    call: &Bound<'_, WsgiCall>,
    pending: &mut Vec<Part>,
) -> PyResult<()> {
    let this = call.get();
    let scope = this.scope.bind(py);
    if this.forwarded {
        if let Some(proxy) = &pool.proxy {
            proxy.bind(py).call1((scope,))?;
        }
    }
    let environ = pool.environ.build(py, scope, this.input.bind(py))?;
    let result = pool.app.bind(py).call1((environ, call))?;
    let sent = send_result(py, call, &result, pending);
    // PEP 3333: `close()` is called however the iteration ended.
    let closed =
        if result.is_exact_instance_of::<PyList>() || result.is_exact_instance_of::<PyTuple>() {
            Ok(())
        } else {
            match result.getattr_opt(intern!(py, "close"))? {
                Some(close) => close.call0().map(drop),
                None => Ok(()),
            }
        };
    sent.and(closed)
}

/// Iterates the app's result. A list or tuple is sent whole at the end (with a
/// `Content-Length` if the app set none); an iterator block by block as it yields.
fn send_result(
    py: Python<'_>,
    call: &Bound<'_, WsgiCall>,
    result: &Bound<'_, PyAny>,
    pending: &mut Vec<Part>,
) -> PyResult<()> {
    let this = call.get();
    if let Ok(wrapper) = result.cast_exact::<WsgiFileWrapper>() {
        if let Some((file, offset, count)) = wrapper.get().file_body(py) {
            let length = usize::try_from(count).ok();
            if let Some(start) = this.take_start(py, length)? {
                pending.push(start);
            }
            pending.push(Part::File(file, offset, count));
            return Ok(());
        }
    }
    let items: Option<Vec<Bound<'_, PyAny>>> = if let Ok(list) = result.cast_exact::<PyList>() {
        Some(list.iter().collect())
    } else if let Ok(tuple) = result.cast_exact::<PyTuple>() {
        Some(tuple.iter().collect())
    } else {
        None
    };
    if let Some(items) = items {
        let blocks = items.iter().map(as_block).collect::<PyResult<Vec<_>>>()?;
        let total = blocks.iter().map(|b| b.as_bytes().len()).sum();
        if let Some(start) = this.take_start(py, Some(total))? {
            pending.push(start);
        }
        let last = blocks.len().saturating_sub(1);
        for (i, block) in blocks.iter().enumerate() {
            if i == last || !block.as_bytes().is_empty() {
                pending.push(Part::Body(block.clone().unbind(), i != last));
            }
        }
        if blocks.is_empty() {
            pending.push(Part::Body(PyBytes::new(py, b"").unbind(), false));
        }
        return Ok(());
    }
    for item in result.try_iter()? {
        let block = as_block(&item?)?;
        if this.cancelled.load(Ordering::SeqCst) {
            return Ok(());
        }
        if block.as_bytes().is_empty() {
            continue;
        }
        if this.send_block(py, &block)? == Sent::Gone {
            return Ok(());
        }
    }
    if let Some(start) = this.take_start(py, None)? {
        pending.push(start);
    }
    pending.push(Part::Body(PyBytes::new(py, b"").unbind(), false));
    Ok(())
}

fn as_block<'py>(item: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    item.cast::<PyBytes>().cloned().map_err(|_| {
        PyTypeError::new_err(format!(
            "a WSGI app's iterable must yield bytes, not {}",
            item.get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    })
}
