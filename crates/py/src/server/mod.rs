//! The HTTP/1.1 server on the loop thread: `HttpServer` accepts, `Conn` reads, parses, frames
//! and writes, `Cycle` is one request's `receive`/`send` pair. The only Python on a request's
//! path is the app: the listener and every connection are registered in the loop's own fd
//! table with a native callback, so readiness goes poller → Rust without a Python frame.
//!
//! Layers (kept apart so a later front process can reuse them):
//! - `ferroloop_core::http`: the sans-IO codec and HTTP/1.1 connection (`http::conn`).
//! - `conn.rs` (+ `input.rs`, `output.rs`, `effects.rs`, `app.rs`): one connection's driver.
//! - `cycle.rs` + `scope.rs`: the ASGI side (scope, messages, the app task).
//!
//! Ownership and invariants:
//! - Everything here runs on the loop thread with the GIL; state lives in `LoopCell`s and no
//!   borrow is held across a call into Python code that could re-enter (the app, a Future's
//!   `set_result`, the loggers): connection methods collect `Effects` under the borrow and apply
//!   them after it ends.
//! - The server owns each accepted fd. A connection's fd leaves the poller before it is closed,
//!   and a closed connection never touches its (possibly reused) fd number again.
//! - `conns` holds exactly the open connections; `tasks` exactly the app tasks not yet done.

mod app;
mod conn;
mod cycle;
mod drain;
mod effects;
mod front;
mod handoff;
mod http2;
mod input;
mod output;
pub use front::{run_front, FrontBoard};
pub use http2::{H2Conn, H2Cycle};
mod receive;
mod respond;
mod scope;
mod tls;
pub use tls::check_tls;
mod websocket;
mod wsgi;

use std::io::{self, Write as _};
use std::os::fd::{IntoRawFd, RawFd};
use std::sync::Arc;

use ferroloop_core::handoff::Peer;
use ferroloop_core::http::{valid_field, DateCache, Limits, ServerFields};
use ferroloop_core::IntMap;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyString, PyTuple};
use pyo3::PyTraverseError;

pub use conn::Conn;
pub use cycle::{install_ready_am_send, Cycle, Ready};
pub use websocket::ClientDisconnected;
pub use wsgi::{WsgiCall, WsgiFileWrapper, WsgiInput, WsgiPool};

use crate::cell::LoopCell;
use crate::event_loop::LoopCore;
use scope::ScopeBase;
use websocket::WsOptions;

/// The server's fixed configuration.
#[allow(
    clippy::struct_excessive_bools,
    reason = "independent options, not a state"
)]
pub(crate) struct Options {
    pub limits: Limits,
    pub limit_concurrency: Option<usize>,
    pub limit_body: Option<u64>,
    pub timeout_keep_alive: f64,
    pub timeout_header: f64,
    pub server_header: bool,
    pub date_header: bool,
    /// `--header` fields sent with every response (`ServerFields::extra`), checked in `new`.
    pub extra_headers: Vec<(Vec<u8>, Vec<u8>)>,
    /// Each request's app runs in a new empty context rather than a copy of the server's
    /// (`--reset-contextvars`).
    pub reset_contextvars: bool,
    /// Run apps in `ferroloop.Task`s (`task.rs`) rather than asyncio's Task.
    pub native_tasks: bool,
    /// WebSocket upgrades are served (`--ws`, on by default); `None`: an upgrade request is an
    /// ordinary HTTP request (`--ws none`).
    pub ws: Option<WsOptions>,
    /// Behind the front (`handoff.rs`): a body larger than this (or chunked) is bulk work...
    pub bulk_body: u64,
    /// ... which this worker, a fast-lane one, gives back to the front.
    pub lane_fast: bool,
    /// The protocols served (`--http`): HTTP/1.1, HTTP/2 (`http2/`), or both.
    pub http: http2::HttpMode,
}

struct ServerState {
    /// Accepting: the listener is registered in the poller, except while `accept_retry` is set.
    listening: bool,
    /// While the process is out of fds or memory, the listener is out of the poller and this
    /// timer puts it back (level-triggered epoll would otherwise report it ready forever).
    accept_retry: Option<Py<PyAny>>,
    shutting_down: bool,
    conns: IntMap<RawFd, Py<Conn>>,
    /// The HTTP/2 connections (`http2/`), once HTTP/1.1 connections that became HTTP/2.
    h2_conns: IntMap<RawFd, Py<H2Conn>>,
    /// Running app tasks, by object address.
    tasks: IntMap<usize, Py<PyAny>>,
    /// Requests whose app start is queued (`Conn::start_pending`): counted with the tasks by
    /// `--limit-concurrency`, as each is about to be one.
    starts_queued: usize,
    requests: u64,
    /// App tasks started: the number in the next one's name (`task_name`).
    tasks_started: u64,
    sweep: Option<Py<PyAny>>,
    date: DateCache,
    /// `handoff=True`: the socket is this worker's channel to the dispatching front.
    channel: Option<handoff::Channel>,
}

#[pyclass(module = "ferroloop._native", name = "HttpServer", frozen)]
pub struct HttpServer {
    loop_: Py<LoopCore>,
    sock: Py<PyAny>,
    listen_fd: RawFd,
    app: Py<PyAny>,
    /// `app` is a WSGI app's pool (`wsgi/`): requests run there instead of in app tasks.
    wsgi: Option<Py<WsgiPool>>,
    /// `app` without its proxy-headers middleware, if it has one: see `app_for`.
    plain_app: Option<Py<PyAny>>,
    access_log: Option<Py<PyAny>>,
    log_error: Option<Py<PyAny>>,
    /// `--log-level trace`: called as `trace_connections(client, True)` when a connection is
    /// accepted and `(client, False)` when it closes (uvicorn's "HTTP connection made/lost").
    trace_connections: Option<Py<PyAny>>,
    /// The context the server was made in: every app task runs in a fresh copy of it, so a
    /// context variable set by one request is never seen by the next one on the connection
    /// (whose task may be started from inside the previous one's, as with pipelining).
    context: Py<PyAny>,
    base: ScopeBase,
    /// `--ssl-certfile`/`--ssl-keyfile`: every connection gets a TLS session (`tls.rs`).
    tls: Option<Arc<rustls::ServerConfig>>,
    /// Behind the front: this worker's seat on the front's board, where it counts its tasks.
    seat: Option<(Arc<ferroloop_core::front::Board>, usize)>,
    opts: Options,
    state: LoopCell<ServerState>,
}

/// `(host, port)` from a socket address object, `(path, None)` for a unix socket.
fn scope_address(py: Python<'_>, addr: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    if let Ok(t) = addr.cast::<PyTuple>() {
        if t.len() >= 2 {
            return Ok(PyTuple::new(py, [t.get_item(0)?, t.get_item(1)?])?
                .into_any()
                .unbind());
        }
    }
    if addr.is_instance_of::<PyString>() {
        return Ok(PyTuple::new(py, [addr.clone(), py.None().into_bound(py)])?
            .into_any()
            .unbind());
    }
    Ok(py.None())
}

#[pymethods]
impl HttpServer {
    #[new]
    #[pyo3(signature = (r#loop, sock, app, *, root_path="", state=None, scheme="http",
        limit_concurrency=None, timeout_keep_alive=5.0, timeout_header=10.0,
        limit_header_size=65536, limit_headers=100, limit_uri=8192, limit_body=None,
        server_header=true, date_header=true, headers=Vec::new(), reset_contextvars=false,
        access_log=None, log_error=None, plain_app=None, native_tasks=true,
        trace_connections=None, ws=true, ws_max_size=16_777_216, ws_max_queue=32,
        ws_ping_interval=Some(20.0), ws_ping_timeout=Some(20.0), ws_per_message_deflate=true, tls_cert=None, tls_key=None,
        tls_client_ca=None, tls_client_auth=0, tls_versions=None, handoff=false, server=None,
        lane="general", bulk_body=1_048_576, board=None, seat=0, http="auto"))]
    #[allow(clippy::too_many_arguments)]
    #[allow(
        clippy::fn_params_excessive_bools,
        reason = "Python keyword arguments, one per option"
    )]
    fn new(
        py: Python<'_>,
        r#loop: &Bound<'_, PyAny>,
        sock: &Bound<'_, PyAny>,
        app: Py<PyAny>,
        root_path: &str,
        state: Option<Bound<'_, PyDict>>,
        scheme: &str,
        limit_concurrency: Option<usize>,
        timeout_keep_alive: f64,
        timeout_header: f64,
        limit_header_size: usize,
        limit_headers: usize,
        limit_uri: usize,
        limit_body: Option<u64>,
        server_header: bool,
        date_header: bool,
        headers: Vec<(Vec<u8>, Vec<u8>)>,
        reset_contextvars: bool,
        access_log: Option<Py<PyAny>>,
        log_error: Option<Py<PyAny>>,
        plain_app: Option<Py<PyAny>>,
        native_tasks: bool,
        trace_connections: Option<Py<PyAny>>,
        ws: bool,
        ws_max_size: usize,
        ws_max_queue: usize,
        ws_ping_interval: Option<f64>,
        ws_ping_timeout: Option<f64>,
        ws_per_message_deflate: bool,
        tls_cert: Option<Vec<u8>>,
        tls_key: Option<Vec<u8>>,
        tls_client_ca: Option<Vec<u8>>,
        tls_client_auth: u8,
        tls_versions: Option<Vec<String>>,
        handoff: bool,
        server: Option<Bound<'_, PyAny>>,
        lane: &str,
        bulk_body: u64,
        board: Option<PyRef<'_, FrontBoard>>,
        seat: usize,
        http: &str,
    ) -> PyResult<Self> {
        let is_wsgi = app.bind(py).cast::<WsgiPool>().is_ok();
        let http = http2::HttpMode::parse(http, is_wsgi)?;
        let seat = board.map(|b| b.seat(seat)).transpose()?;
        let loop_ = r#loop.cast::<LoopCore>().map_err(|_| {
            PyTypeError::new_err("HttpServer needs a ferroloop loop (ferroloop.new_event_loop())")
        })?;
        check_numbers(
            [timeout_keep_alive, timeout_header],
            [limit_headers, limit_header_size, limit_uri],
            [ws_max_size, ws_max_queue],
            [ws_ping_interval, ws_ping_timeout],
        )?;
        if let Some((name, value)) = headers.iter().find(|(n, v)| !valid_field(n, v)) {
            return Err(PyValueError::new_err(format!(
                "invalid default header {:?}: {:?} (the name must be an RFC 9110 token, the \
                 value without CR, LF or NUL)",
                String::from_utf8_lossy(name),
                String::from_utf8_lossy(value),
            )));
        }
        let tls = tls::from_options(
            tls_cert,
            tls_key,
            tls_client_ca.as_deref(),
            tls_client_auth,
            tls_versions,
        )?
        .map(|config| {
            // ALPN: `h2` first when HTTP/2 is served, then `http/1.1`.
            let mut config = Arc::unwrap_or_clone(config);
            config.alpn_protocols = http.alpn();
            Arc::new(config)
        });
        let fd: RawFd = sock.call_method0(intern!(py, "fileno"))?.extract()?;
        if fd < 0 {
            return Err(PyValueError::new_err("the listening socket is closed"));
        }
        let server_addr = scope_server(py, sock, server)?;
        let base = ScopeBase::new(py, server_addr, scheme, root_path, state.map(Bound::unbind))?;
        // SAFETY: we hold the GIL; PyContext_CopyCurrent returns a new reference or NULL with
        // an exception set, which `from_owned_ptr_or_err` turns into `Err`.
        let context = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyContext_CopyCurrent()) }?;
        Ok(Self {
            context: context.unbind(),
            loop_: loop_.clone().unbind(),
            sock: sock.clone().unbind(),
            listen_fd: fd,
            wsgi: app
                .bind(py)
                .cast::<WsgiPool>()
                .ok()
                .map(|p| p.clone().unbind()),
            app,
            plain_app,
            access_log,
            log_error,
            trace_connections,
            base,
            tls,
            seat,
            opts: Options {
                limits: Limits {
                    max_head_bytes: limit_header_size,
                    max_headers: limit_headers,
                    max_uri_bytes: limit_uri,
                },
                limit_concurrency,
                limit_body,
                timeout_keep_alive,
                timeout_header,
                server_header,
                date_header,
                extra_headers: headers,
                reset_contextvars,
                native_tasks,
                ws: ws.then_some(WsOptions {
                    max_size: ws_max_size,
                    max_queue: ws_max_queue,
                    ping_interval: ws_ping_interval,
                    ping_timeout: ws_ping_timeout,
                    per_message_deflate: ws_per_message_deflate,
                }),
                bulk_body,
                lane_fast: lane == "fast",
                http,
            },
            state: LoopCell::new(ServerState {
                listening: false,
                accept_retry: None,
                shutting_down: false,
                conns: IntMap::default(),
                h2_conns: IntMap::default(),
                tasks: IntMap::default(),
                starts_queued: 0,
                requests: 0,
                tasks_started: 0,
                sweep: None,
                date: DateCache::new(),
                channel: handoff.then(handoff::Channel::new),
            }),
        })
    }

    /// Starts accepting (called once by the Python side after construction).
    fn start(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        {
            let mut st = this.state.borrow(py)?;
            if st.listening || st.shutting_down {
                return Ok(());
            }
            st.listening = true;
        }
        Self::watch_listener(slf)?;
        Self::schedule_sweep(slf)
    }

    /// Readable listener: accept every waiting connection. Behind the front: the channel is
    /// readable (or `writable`).
    #[pyo3(signature = (writable=false))]
    fn __call__(slf: &Bound<'_, Self>, writable: bool) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        if this.state.borrow(py)?.channel.is_some() {
            return Self::on_channel(slf, writable);
        }
        for _ in 0..256 {
            if !this.state.borrow(py)?.listening {
                return Ok(());
            }
            match ferroloop_core::net::accept(this.listen_fd) {
                Ok(Some((fd, peer))) => {
                    let client = peer_to_py(py, peer)?;
                    let fd = fd.into_raw_fd();
                    let conn = Conn::open(slf, fd, client, Vec::new(), None)?;
                    let client = this
                        .trace_connections
                        .as_ref()
                        .map(|_| conn.get().client.clone_ref(py));
                    this.state.borrow(py)?.conns.insert(fd, conn);
                    if let Some(client) = client {
                        this.trace_connection(py, client, true);
                    }
                }
                Ok(None) => return Ok(()),
                // Out of fds or memory: the waiting connection stays in the backlog and the
                // listener stays readable, so stop watching it and try again later, as
                // asyncio's accept loop does (its ACCEPT_RETRY_DELAY).
                Err(e) if is_resource_exhaustion(&e) => {
                    this.log(
                        py,
                        &format!(
                            "accept failed: {e}; not accepting for {ACCEPT_RETRY_DELAY} s \
                             (raise the open-files limit, ulimit -n)"
                        ),
                        None,
                    );
                    return Self::pause_accepting(slf);
                }
                // A connection reset before accept, or a signal: try the next readiness.
                Err(e) if is_transient_accept_error(&e) => return Ok(()),
                Err(e) => {
                    this.log(py, &format!("accept failed: {e}"), None);
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// The accept-retry timer fired: watch the listener again (if still accepting).
    fn _resume_accepting(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        {
            let mut st = this.state.borrow(py)?;
            st.accept_retry = None;
            if !st.listening || st.shutting_down {
                return Ok(());
            }
        }
        Self::watch_listener(slf)
    }

    /// Closes idle connections past their deadline (keep-alive, header read, lingering close).
    fn _sweep(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let now = ferroloop_core::clock::monotonic();
        let conns: Vec<Py<Conn>> = {
            let mut st = slf.get().state.borrow(py)?;
            st.sweep = None;
            st.conns.values().map(|c| c.clone_ref(py)).collect()
        };
        for conn in conns {
            Conn::check_deadline(conn.bind(py), now)?;
        }
        for conn in slf.get().h2_conns(py)? {
            H2Conn::check_idle(conn.bind(py), now)?;
        }
        Self::schedule_sweep(slf)
    }

    /// Stops accepting; existing connections go on. Connections the kernel has already
    /// completed are accepted first: once the caller closes the listening socket, the kernel
    /// would reset them, after their client saw the connection succeed. Behind the front the
    /// channel stays watched until the front closes it (it may still hand over requests it had
    /// read).
    fn close(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        if this.state.borrow(py)?.channel.is_some() {
            this.state.borrow(py)?.listening = false;
            return Ok(());
        }
        let accepting = {
            let st = this.state.borrow(py)?;
            st.listening && st.accept_retry.is_none()
        };
        if accepting {
            Self::__call__(slf, false)?;
        }
        let (was, retry) = {
            let mut st = this.state.borrow(py)?;
            (
                std::mem::replace(&mut st.listening, false),
                st.accept_retry.take(),
            )
        };
        if let Some(timer) = retry {
            timer.bind(py).call_method0(intern!(py, "cancel"))?;
        }
        if was {
            let fd = PyInt::new(py, this.listen_fd);
            LoopCore::remove_fd_handle(this.loop_.bind(py), fd.as_any(), false)?;
        }
        Ok(())
    }

    /// The graceful drain (`drain.rs`): every response from now on says `connection: close`
    /// and ends its connection; an idle connection is closed once it has been quiet for
    /// `DRAIN_QUIET` (a request that arrives first is served); a busy one after its response.
    fn shutdown(slf: &Bound<'_, Self>) -> PyResult<()> {
        Self::close(slf)?;
        if slf.get().channel_open(slf.py()) && !slf.get().shutting_down(slf.py()) {
            // Behind the front: nothing new for this worker; the front closes the channel
            // once what it handed here is back, and the idle connections go back now.
            Self::tell_front(slf, ferroloop_core::front::LEAVING, 0)?;
            slf.get().state.borrow(slf.py())?.shutting_down = true;
            Self::give_back_idle(slf)?;
        }
        slf.get().state.borrow(slf.py())?.shutting_down = true;
        Self::drain_connections(slf)
    }

    /// Closes every connection (and the channel to the front) now and cancels the running app
    /// tasks.
    fn abort(slf: &Bound<'_, Self>) -> PyResult<()> {
        Self::shutdown(slf)?;
        Self::close_channel(slf)?;
        let py = slf.py();
        let (conns, tasks): (Vec<Py<Conn>>, Vec<Py<PyAny>>) = {
            let st = slf.get().state.borrow(py)?;
            (
                st.conns.values().map(|c| c.clone_ref(py)).collect(),
                st.tasks.values().map(|t| t.clone_ref(py)).collect(),
            )
        };
        for conn in conns {
            Conn::close_now(conn.bind(py))?;
        }
        for conn in slf.get().h2_conns(py)? {
            H2Conn::close_now(conn.bind(py))?;
        }
        for task in tasks {
            task.bind(py).call_method0(intern!(py, "cancel"))?;
        }
        let sweep = slf.get().state.borrow(py)?.sweep.take();
        if let Some(t) = sweep {
            t.bind(py).call_method0(intern!(py, "cancel"))?;
        }
        Ok(())
    }

    /// Open connections (and the channel to the front while it is open).
    #[getter]
    fn connections(&self, py: Python<'_>) -> PyResult<usize> {
        let st = self.state.borrow(py)?;
        let conns = st.conns.len() + st.h2_conns.len();
        drop(st);
        Ok(conns + usize::from(self.channel_open(py)))
    }

    /// Responses completed so far.
    #[getter]
    fn requests(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.state.borrow(py)?.requests)
    }

    /// App tasks still running (a task may outlive its response, e.g. background work).
    #[getter]
    fn tasks(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.state.borrow(py)?.tasks.len())
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.loop_)?;
        visit.call(&self.sock)?;
        visit.call(&self.app)?;
        visit.call(&self.plain_app)?;
        visit.call(&self.wsgi)?;
        visit.call(&self.access_log)?;
        visit.call(&self.log_error)?;
        visit.call(&self.trace_connections)?;
        visit.call(&self.context)?;
        self.base.visit(&visit)?;
        if let Some(st) = self.state.try_borrow_for_gc() {
            for c in st.conns.values() {
                visit.call(c)?;
            }
            for t in st.tasks.values() {
                visit.call(t)?;
            }
            visit.call(&st.sweep)?;
            visit.call(&st.accept_retry)?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        let dropped = self.state.try_borrow_for_gc().map(|mut st| {
            (
                std::mem::take(&mut st.conns),
                std::mem::take(&mut st.tasks),
                st.sweep.take(),
                st.accept_retry.take(),
            )
        });
        drop(dropped);
    }
}

// `HttpServer.__call__()` (the listener is readable), called directly by the loop
// (`native_call.rs`).
crate::native_call::native_call!(HttpServer, |slf, arg| match arg {
    None => Some(Self::__call__(slf, false)),
    Some(a) => a
        .cast::<pyo3::types::PyBool>()
        .ok()
        .map(|w| Self::__call__(slf, w.is_true())),
});

impl HttpServer {
    /// Each connection here starts its drain (`Conn::shutdown`), and the sweep that closes
    /// the quiet ones runs from now on every `DRAIN_SWEEP` seconds.
    pub(super) fn drain_connections(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let (conns, sweep) = {
            let mut st = slf.get().state.borrow(py)?;
            (
                st.conns
                    .values()
                    .map(|c| c.clone_ref(py))
                    .collect::<Vec<_>>(),
                st.sweep.take(),
            )
        };
        for conn in conns {
            Conn::shutdown(conn.bind(py))?;
        }
        for conn in slf.get().h2_conns(py)? {
            H2Conn::shutdown(conn.bind(py))?;
        }
        if let Some(timer) = sweep {
            timer.bind(py).call_method0(intern!(py, "cancel"))?;
        }
        Self::schedule_sweep(slf)
    }

    pub(crate) fn loop_core(&self) -> &Py<LoopCore> {
        &self.loop_
    }

    /// The WSGI app's pool, if the app is a WSGI app.
    pub(crate) fn wsgi(&self) -> Option<&Py<WsgiPool>> {
        self.wsgi.as_ref()
    }

    pub(crate) fn tls_config(&self) -> Option<&Arc<rustls::ServerConfig>> {
        self.tls.as_ref()
    }

    pub(crate) fn opts(&self) -> &Options {
        &self.opts
    }

    pub(crate) fn base(&self) -> &ScopeBase {
        &self.base
    }

    /// The app to call for a request: `plain_app` when the request has no `X-Forwarded-*`
    /// header, since the proxy-headers middleware would leave its scope as it is (whoever the
    /// peer is); that saves a Python call per request. Otherwise `app`.
    pub(crate) fn app_for(&self, forwarded: bool) -> &Py<PyAny> {
        match &self.plain_app {
            Some(plain) if !forwarded => plain,
            _ => &self.app,
        }
    }

    /// Request apps run in `ferroloop.Task`s: asked for (`native_tasks`), the type exists
    /// (`task_base::native_tasks`) and no task factory on the loop (a factory is honoured:
    /// the app then runs in what it makes).
    pub(crate) fn native_tasks(&self, core: &Bound<'_, LoopCore>) -> PyResult<bool> {
        Ok(self.opts().native_tasks
            && crate::task_base::native_tasks()
            && !LoopCore::has_task_factory(core)?)
    }

    pub(crate) fn access_log(&self) -> Option<&Py<PyAny>> {
        self.access_log.as_ref()
    }

    pub(crate) fn shutting_down(&self, py: Python<'_>) -> bool {
        self.state.borrow(py).is_ok_and(|st| st.shutting_down)
    }

    /// Whether a new request may start (`--limit-concurrency`, counted as uvicorn does).
    pub(crate) fn over_capacity(&self, py: Python<'_>) -> bool {
        let Some(limit) = self.opts.limit_concurrency else {
            return false;
        };
        self.state
            .borrow(py)
            .is_ok_and(|st| st.conns.len() > limit || st.tasks.len() + st.starts_queued >= limit)
    }

    /// The current `Date` header value, when enabled (a copy: no allocation per response).
    pub(crate) fn date(&self, py: Python<'_>) -> Option<[u8; 29]> {
        if !self.opts.date_header {
            return None;
        }
        self.state.borrow(py).ok().map(|mut st| *st.date.get())
    }

    /// The fields the server adds to a response head, with `date` (from [`Self::date`]).
    pub(crate) fn fields<'a>(&'a self, date: Option<&'a [u8]>) -> ServerFields<'a> {
        ServerFields {
            date,
            server: self.opts.server_header.then_some(b"ferroloop"),
            extra: &self.opts.extra_headers,
        }
    }

    /// Graceful shutdown (GOAWAY) of every HTTP/2 connection: kept here for good behind the
    /// front, they drain here when the front does.
    pub(super) fn shutdown_h2(slf: &Bound<'_, Self>) -> PyResult<()> {
        for conn in slf.get().h2_conns(slf.py())? {
            H2Conn::shutdown(conn.bind(slf.py()))?;
        }
        Ok(())
    }

    /// The HTTP/2 connections now open.
    fn h2_conns(&self, py: Python<'_>) -> PyResult<Vec<Py<H2Conn>>> {
        let st = self.state.borrow(py)?;
        Ok(st.h2_conns.values().map(|c| c.clone_ref(py)).collect())
    }

    /// An HTTP/1.1 connection became the HTTP/2 connection `conn` (`http2::H2Conn::adopt`).
    pub(crate) fn h2_opened(&self, py: Python<'_>, fd: RawFd, conn: Py<H2Conn>) -> PyResult<()> {
        self.state.borrow(py)?.h2_conns.insert(fd, conn);
        Ok(())
    }

    pub(crate) fn h2_closed(&self, py: Python<'_>, fd: RawFd) -> Option<Py<H2Conn>> {
        self.state.borrow(py).ok()?.h2_conns.remove(&fd)
    }

    pub(crate) fn conn_closed(&self, py: Python<'_>, fd: RawFd) -> Option<Py<Conn>> {
        self.state.borrow(py).ok()?.conns.remove(&fd)
    }

    /// A request's app start was queued (`true`) or is being taken off the queue (`false`).
    pub(crate) fn start_queued(&self, py: Python<'_>, queued: bool) -> PyResult<()> {
        let mut st = self.state.borrow(py)?;
        if queued {
            st.starts_queued += 1;
        } else {
            st.starts_queued = st.starts_queued.saturating_sub(1);
        }
        Ok(())
    }

    pub(crate) fn task_started(&self, py: Python<'_>, task: &Bound<'_, PyAny>) -> PyResult<()> {
        self.state
            .borrow(py)?
            .tasks
            .insert(task.as_ptr() as usize, task.clone().unbind());
        self.count_task(true);
        Ok(())
    }

    pub(crate) fn task_done(&self, py: Python<'_>, task: &Bound<'_, PyAny>) -> Option<Py<PyAny>> {
        let done = self
            .state
            .borrow(py)
            .ok()?
            .tasks
            .remove(&(task.as_ptr() as usize));
        if done.is_some() {
            self.count_task(false);
        }
        done
    }

    /// Behind the front: the seat says how many app tasks run here, and since when.
    fn count_task(&self, started: bool) {
        if let Some((board, seat)) = &self.seat {
            // Only a start is timed (`busy_since`): an end reads no clock.
            let now_ns = if started {
                (ferroloop_core::clock::monotonic() * 1e9) as u64
            } else {
                0
            };
            board.seat_task(*seat, started, now_ns);
        }
    }

    /// A fresh copy of the server's context, for one app task.
    /// The next app task's name, `"ferroloop-request-N"` (N counts from 1 per server), formatted
    /// here: the C `Task` formats its default `"Task-N"` with `PyUnicode_FromFormat`, about
    /// 1,450 instructions, against a few hundred for this.
    pub(crate) fn task_name<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyString>> {
        let mut st = self.state.borrow(py)?;
        st.tasks_started += 1;
        // Formatted on the stack: the prefix and at most 20 digits fit in 40 bytes.
        let mut buf = [0u8; 40];
        let mut rest = &mut buf[..];
        let _ = write!(rest, "ferroloop-request-{}", st.tasks_started);
        let len = 40 - rest.len();
        Ok(PyString::new(
            py,
            std::str::from_utf8(&buf[..len]).unwrap_or("ferroloop-request"),
        ))
    }

    /// The context a request's app runs in: a copy of the server's, or with
    /// `--reset-contextvars` a new empty one.
    pub(crate) fn task_context<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if self.opts.reset_contextvars {
            // SAFETY: we hold the GIL; PyContext_New returns a new reference or NULL with an
            // exception set.
            return unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyContext_New()) };
        }
        // SAFETY: we hold the GIL and `self.context` is a live `contextvars.Context` (made by
        // PyContext_CopyCurrent); PyContext_Copy returns a new reference or NULL with an
        // exception set.
        unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyContext_Copy(self.context.as_ptr())) }
    }

    /// A response completed: counted, and on the seat (when this worker has one) by method
    /// and status, with its duration from `started` (when its head was read).
    pub(crate) fn response_done(&self, py: Python<'_>, method: u8, status: u16, started: f64) {
        if let Ok(mut st) = self.state.borrow(py) {
            st.requests += 1;
        }
        if let Some((board, seat)) = &self.seat {
            let took = (ferroloop_core::clock::monotonic() - started).max(0.0);
            board.seat_request(*seat, usize::from(method), status, (took * 1e9) as u64);
        }
    }

    /// What `response_done` needs of a request whose head was just read, when this worker
    /// counts requests on a seat (`--metrics`, or behind the front): its method's index in
    /// `request_counts::METHODS` and the time; zeros otherwise.
    pub(crate) fn request_started(&self, method: &[u8]) -> (u8, f64) {
        if self.seat.is_none() {
            return (0, 0.0);
        }
        let index = ferroloop_core::front::request_counts::method_index(method);
        (index as u8, ferroloop_core::clock::monotonic())
    }

    /// Reports a connection accepted (`made`) or closed to `trace_connections`, if set; what
    /// it raises is reported as unraisable, never to the connection.
    pub(crate) fn trace_connection(&self, py: Python<'_>, client: Py<PyAny>, made: bool) {
        if let Some(f) = &self.trace_connections {
            if let Err(e) = f.bind(py).call1((client, made)) {
                e.write_unraisable(py, Some(f.bind(py)));
            }
        }
    }

    /// Logs through the Python side's `log_error(message, exc)`, or to `ferroloop.error`
    /// without one.
    pub(crate) fn log(&self, py: Python<'_>, message: &str, exc: Option<&Bound<'_, PyAny>>) {
        let exc_obj = exc.map_or_else(|| py.None().into_bound(py), Clone::clone);
        let result = match &self.log_error {
            Some(f) => f.bind(py).call1((message, exc_obj)).map(drop),
            None => crate::hooks::call(py, "log_server_error", (message, exc_obj)).map(drop),
        };
        if let Err(e) = result {
            e.write_unraisable(py, None);
        }
    }

    /// Logs a client's fault at WARNING through `log_error.warning(message)` (a `log_error`
    /// without that method gets the message as an error), or to `ferroloop.error` without one.
    pub(crate) fn warn(&self, py: Python<'_>, message: &str) {
        let result = match &self.log_error {
            Some(f) => match f.bind(py).getattr(intern!(py, "warning")) {
                Ok(warning) => warning.call1((message,)).map(drop),
                Err(_) => f.bind(py).call1((message, py.None())).map(drop),
            },
            None => crate::hooks::call(py, "log_server_warning", (message,)).map(drop),
        };
        if let Err(e) = result {
            e.write_unraisable(py, None);
        }
    }

    /// Logs a WebSocket handshake's outcome through `log_error.websocket(client, path,
    /// outcome)` (uvicorn's `127.0.0.1:5000 - "WebSocket /ws" [accepted]` at INFO); nothing
    /// without a `log_error` that has the method.
    pub(crate) fn log_websocket(
        &self,
        py: Python<'_>,
        client: &Bound<'_, PyAny>,
        path: &str,
        outcome: &str,
    ) {
        let Some(f) = &self.log_error else {
            return;
        };
        let result = f
            .bind(py)
            .getattr(intern!(py, "websocket"))
            .and_then(|m| m.call1((client, path, outcome)));
        if let Err(e) = result {
            e.write_unraisable(py, None);
        }
    }

    /// Takes the listener out of the poller for `ACCEPT_RETRY_DELAY` seconds.
    fn pause_accepting(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let fd = PyInt::new(py, this.listen_fd);
        LoopCore::remove_fd_handle(this.loop_.bind(py), fd.as_any(), false)?;
        let timer = Self::call_later(slf, ACCEPT_RETRY_DELAY, intern!(py, "_resume_accepting"))?;
        this.state.borrow(py)?.accept_retry = Some(timer);
        Ok(())
    }

    /// Registers this server as the listener's reader.
    fn watch_listener(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let fd = PyInt::new(py, this.listen_fd);
        LoopCore::set_fd_handle(
            this.loop_.bind(py),
            fd.as_any(),
            slf.as_any(),
            PyTuple::empty(py),
            false,
        )
        .map(drop)
    }

    /// `loop.call_later(delay, self.<method>)`; returns the timer handle.
    fn call_later(
        slf: &Bound<'_, Self>,
        delay: f64,
        method: &Bound<'_, PyString>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let method = slf.getattr(method)?;
        let delay = delay.into_pyobject(py)?;
        let timer = LoopCore::call_later_impl(
            slf.get().loop_.bind(py),
            delay.as_any(),
            &method,
            crate::handle::CallArgs::Empty,
            None,
        )?;
        Ok(timer.into_any())
    }

    fn schedule_sweep(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        {
            let st = this.state.borrow(py)?;
            if st.sweep.is_some()
                || (st.shutting_down && st.conns.is_empty() && st.h2_conns.is_empty())
            {
                return Ok(());
            }
        }
        let shortest = this.opts.timeout_keep_alive.min(this.opts.timeout_header);
        let interval = if this.draining_own(py) {
            drain::DRAIN_SWEEP
        } else {
            (shortest / 4.0).clamp(0.05, 1.0)
        };
        let timer = Self::call_later(slf, interval, intern!(py, "_sweep"))?;
        this.state.borrow(py)?.sweep = Some(timer);
        Ok(())
    }
}

/// The scope's `server`: `server` if given (behind the front, `sock` is the channel and the
/// listener's address comes as `server`), else `sock`'s own address.
fn scope_server(
    py: Python<'_>,
    sock: &Bound<'_, PyAny>,
    server: Option<Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    match server {
        Some(addr) => scope_address(py, &addr),
        None => scope_address(py, &sock.call_method0(intern!(py, "getsockname"))?),
    }
}

/// `HttpServer`'s numeric options: `[timeout_keep_alive, timeout_header]` positive,
/// `[limit_headers, limit_header_size, limit_uri]` positive (the head size at least 64),
/// `[ws_max_size, ws_max_queue]` positive, `[ws_ping_interval, ws_ping_timeout]` positive or
/// `None`.
fn check_numbers(
    timeouts: [f64; 2],
    [limit_headers, limit_header_size, limit_uri]: [usize; 3],
    ws_sizes: [usize; 2],
    ws_pings: [Option<f64>; 2],
) -> PyResult<()> {
    if !timeouts.iter().all(|&t| t > 0.0) {
        return Err(PyValueError::new_err("timeouts must be positive"));
    }
    if limit_headers == 0 || limit_header_size < 64 || limit_uri == 0 {
        return Err(PyValueError::new_err(
            "limit_headers, limit_uri must be positive and limit_header_size at least 64",
        ));
    }
    if ws_sizes.contains(&0) {
        return Err(PyValueError::new_err(
            "ws_max_size and ws_max_queue must be positive",
        ));
    }
    if !ws_pings.iter().all(|t| t.is_none_or(|t| t > 0.0)) {
        return Err(PyValueError::new_err(
            "ws_ping_interval and ws_ping_timeout must be positive or None",
        ));
    }
    Ok(())
}

/// A peer address as the scope's `client`: `(host, port)`, or `None` (unix sockets).
pub(super) fn peer_to_py(py: Python<'_>, peer: Peer) -> PyResult<Py<PyAny>> {
    Ok(match peer {
        Peer::Inet(ip, port) => (ip.to_string(), port)
            .into_pyobject(py)?
            .into_any()
            .unbind(),
        Peer::None => py.None(),
    })
}

/// Seconds the listener rests after running out of fds or memory (asyncio's
/// `constants.ACCEPT_RETRY_DELAY`).
const ACCEPT_RETRY_DELAY: f64 = 1.0;

fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

fn is_transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNABORTED | libc::EPROTO | libc::EINTR)
    )
}
