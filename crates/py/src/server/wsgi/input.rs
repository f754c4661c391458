//! `wsgi.input`: the request body as a file, read on the app's pool thread.
//!
//! Ownership: `buf[pos..]` holds body bytes received and not yet read. Only the pool thread
//! running the call reads (PyO3's borrow flag refuses a second reader); new bytes come from the
//! loop thread as the answer to `Conn::receive` (`fetch`), one `http.request` message at a time,
//! so the connection's flow control applies: reading from the socket pauses while the app has
//! not read what came before.

use std::sync::Arc;

use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use pyo3::PyTraverseError;

use super::call::when_done;
use super::{Filler, PoolShared, Slot};
use crate::event_loop::LoopRemote;
use crate::server::conn::Conn;
use crate::server::ClientDisconnected;

#[pyclass(module = "ferroloop._native", name = "WsgiInput")]
pub struct WsgiInput {
    conn: Py<Conn>,
    seq: u64,
    remote: LoopRemote,
    pool: Arc<PoolShared>,
    buf: Vec<u8>,
    pos: usize,
    /// The last body part has been received.
    eof: bool,
    /// A `receive()` the loop thread started (`preread`) and has not answered yet.
    pending: Option<Arc<Slot>>,
}

impl WsgiInput {
    pub(super) fn new(conn: Py<Conn>, seq: u64, remote: LoopRemote, pool: Arc<PoolShared>) -> Self {
        Self {
            conn,
            seq,
            remote,
            pool,
            buf: Vec::new(),
            pos: 0,
            eof: false,
            pending: None,
        }
    }

    /// Loop thread, before the call is queued: takes the first body part if it is there; if
    /// not, the `receive()` stays pending and `fetch` waits for its answer.
    pub(super) fn preread(&mut self, py: Python<'_>) {
        let slot = Slot::new();
        let filler = Filler::new(&slot);
        when_done(py, Conn::receive(self.conn.bind(py), self.seq), move |r| {
            filler.fill(r);
        });
        let error = match slot.try_take() {
            Some(Ok(msg)) => match self.absorb(msg.bind(py)) {
                Ok(()) => return,
                Err(e) => Some(e),
            },
            Some(Err(e)) => Some(e),
            None => None,
        };
        if let Some(e) = error {
            // The client left (or the receive failed): the app is told when it reads.
            slot.fill(Err(e));
        }
        self.pending = Some(slot);
    }

    fn available(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Pool thread: waits for the next body part.
    fn fetch(&mut self, py: Python<'_>) -> PyResult<()> {
        let slot = if let Some(slot) = self.pending.take() {
            slot
        } else {
            let slot = Slot::new();
            let filler = Filler::new(&slot);
            let conn = self.conn.clone_ref(py);
            let seq = self.seq;
            self.remote
                .spawn(move |py| {
                    when_done(py, Conn::receive(conn.bind(py), seq), move |r| {
                        filler.fill(r);
                    });
                    Ok(())
                })
                .map(drop)
                .map_err(|e| {
                    PyRuntimeError::new_err(format!("could not wake the server's loop: {e}"))
                })?;
            slot
        };
        let pool = Arc::clone(&self.pool);
        let msg = py.detach(move || slot.wait(&pool))?;
        self.absorb(msg.bind(py))
    }

    /// Adds an `http.request` message's body; an `http.disconnect` is an error for the reader.
    fn absorb(&mut self, msg: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = msg.py();
        let msg = msg.cast::<PyDict>()?;
        let typ = msg.get_item(intern!(py, "type"))?;
        if typ.is_none_or(|t| !t.eq(intern!(py, "http.request")).unwrap_or(false)) {
            // Not the end of the body: every later read raises this again.
            return Err(ClientDisconnected::new_err(
                "the client closed the connection before sending the whole request body",
            ));
        }
        if let Some(body) = msg.get_item(intern!(py, "body"))? {
            let body = body.cast::<PyBytes>()?.as_bytes();
            if self.pos > 0 && self.pos == self.buf.len() {
                self.buf.clear();
                self.pos = 0;
            } else if self.pos > self.buf.len() / 2 {
                self.buf.drain(..self.pos);
                self.pos = 0;
            }
            self.buf.extend_from_slice(body);
        }
        let more = match msg.get_item(intern!(py, "more_body"))? {
            Some(m) => m.is_truthy()?,
            None => false,
        };
        if !more {
            self.eof = true;
        }
        Ok(())
    }

    /// Takes `n` buffered bytes.
    fn take<'py>(&mut self, py: Python<'py>, n: usize) -> Bound<'py, PyBytes> {
        let out = PyBytes::new(py, &self.buf[self.pos..self.pos + n]);
        self.pos += n;
        out
    }

    /// A line (up to and with `\n`), at most `limit` bytes.
    fn line<'py>(
        &mut self,
        py: Python<'py>,
        limit: Option<usize>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut scanned = 0;
        loop {
            let avail = &self.buf[self.pos..];
            if let Some(i) = avail[scanned..].iter().position(|&b| b == b'\n') {
                let n = scanned + i + 1;
                return Ok(self.take(py, limit.map_or(n, |l| n.min(l))));
            }
            if let Some(l) = limit.filter(|&l| avail.len() >= l) {
                return Ok(self.take(py, l));
            }
            if self.eof {
                let n = avail.len();
                return Ok(self.take(py, n));
            }
            scanned = avail.len();
            self.fetch(py)?;
        }
    }
}

/// `size` as file methods take it: negative or `None` means "all".
fn limit(size: Option<isize>) -> Option<usize> {
    size.and_then(|s| usize::try_from(s).ok())
}

#[pymethods]
impl WsgiInput {
    #[new]
    fn py_new() -> PyResult<Self> {
        Err(PyTypeError::new_err(
            "WsgiInput objects are created by the server",
        ))
    }

    /// Up to `size` bytes (all that is left if `size` is negative or omitted); `b""` at the end.
    #[pyo3(signature = (size=None))]
    fn read<'py>(&mut self, py: Python<'py>, size: Option<isize>) -> PyResult<Bound<'py, PyBytes>> {
        let want = limit(size);
        while !self.eof && want.is_none_or(|w| self.available() < w) {
            self.fetch(py)?;
        }
        let n = want.map_or(self.available(), |w| w.min(self.available()));
        Ok(self.take(py, n))
    }

    #[pyo3(signature = (size=None))]
    fn readline<'py>(
        &mut self,
        py: Python<'py>,
        size: Option<isize>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        self.line(py, limit(size))
    }

    /// The remaining lines; stops once about `hint` bytes were read, if `hint` is positive.
    #[pyo3(signature = (hint=None))]
    fn readlines<'py>(
        &mut self,
        py: Python<'py>,
        hint: Option<isize>,
    ) -> PyResult<Bound<'py, PyList>> {
        let hint = limit(hint).filter(|&h| h > 0);
        let lines = PyList::empty(py);
        let mut total = 0;
        loop {
            let line = self.line(py, None)?;
            let n = line.as_bytes().len();
            if n == 0 {
                return Ok(lines);
            }
            lines.append(line)?;
            total += n;
            if hint.is_some_and(|h| total >= h) {
                return Ok(lines);
            }
        }
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let line = self.line(py, None)?;
        Ok((!line.as_bytes().is_empty()).then_some(line))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.conn)
    }
}
