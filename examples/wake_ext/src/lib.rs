//! `wake_ext`: an example PyO3 extension whose Rust worker threads complete the futures
//! Python coroutines await, written once for any asyncio loop with `ferroloop_embed::Remote`
//! (ferroloop's C API on a ferroloop loop, `call_soon_threadsafe` elsewhere).
//!
//! Invariants: every job closure handed to the remote holds a [`JobGuard`]; `live_jobs()` counts
//! the guards alive, so a test can tell that every job was run or dropped exactly once (none
//! leaked, none freed twice), whatever the loop did meanwhile.

use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use ferroloop_embed::{FutureToken, Remote};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

static LIVE_JOBS: AtomicIsize = AtomicIsize::new(0);

/// Counts one job closure alive (see the invariants).
struct JobGuard;

impl JobGuard {
    fn new() -> Self {
        LIVE_JOBS.fetch_add(1, Ordering::SeqCst);
        Self
    }
}

impl Drop for JobGuard {
    fn drop(&mut self) {
        LIVE_JOBS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Worker threads for one loop.
#[pyclass(frozen, module = "wake_ext")]
struct Waker {
    remote: Arc<Remote>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Completions the remote refused because the loop was closed.
    refused: Arc<AtomicUsize>,
}

#[pymethods]
impl Waker {
    /// `force_fallback`: use `call_soon_threadsafe` (with the GIL) even on ferroloop.
    #[new]
    #[pyo3(signature = (loop_, force_fallback=false))]
    fn new(loop_: &Bound<'_, PyAny>, force_fallback: bool) -> PyResult<Self> {
        let remote = if force_fallback {
            Remote::with_call_soon_threadsafe(loop_)?
        } else {
            Remote::for_loop(loop_)?
        };
        Ok(Self {
            remote: Arc::new(remote),
            threads: Mutex::new(Vec::new()),
            refused: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// Whether completions go through ferroloop's C API (no GIL per completion).
    #[getter]
    fn native(&self) -> bool {
        self.remote.is_native()
    }

    /// Completions refused so far because the loop was closed.
    #[getter]
    fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }

    /// Registers `futures`, then `threads` threads complete them without the GIL: future `i`
    /// gets `2 * i` (with `stamp`, the CLOCK_MONOTONIC nanoseconds when its thread sent it, as
    /// `time.monotonic_ns()` reads them), or `ValueError` when `fail_every` divides `i`. Each
    /// thread sleeps `delay_us` before each completion. Returns at once; `join()` waits.
    #[pyo3(signature = (futures, threads, fail_every=0, delay_us=0, stamp=false))]
    fn complete(
        &self,
        futures: Vec<Bound<'_, PyAny>>,
        threads: usize,
        fail_every: usize,
        delay_us: u64,
        stamp: bool,
    ) -> PyResult<()> {
        let threads = threads.max(1);
        let mut shares: Vec<Vec<(usize, FutureToken)>> = (0..threads).map(|_| Vec::new()).collect();
        for (i, f) in futures.iter().enumerate() {
            shares[i % threads].push((i, self.remote.register(f)?));
        }
        let mut handles = self
            .threads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for share in shares {
            let remote = Arc::clone(&self.remote);
            let refused = Arc::clone(&self.refused);
            handles.push(std::thread::spawn(move || {
                for (i, token) in share {
                    if delay_us > 0 {
                        std::thread::sleep(Duration::from_micros(delay_us));
                    }
                    let guard = JobGuard::new();
                    let fail = fail_every > 0 && i % fail_every == 0;
                    let value = if stamp { monotonic_ns() } else { 2 * i as u64 };
                    let sent = remote.resolve(token, move |py| {
                        let _guard = guard;
                        if fail {
                            return Err(PyValueError::new_err(format!("job {i} failed")));
                        }
                        Ok(value.into_pyobject(py)?.into_any().unbind())
                    });
                    if sent.is_err() {
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
        }
        Ok(())
    }

    /// A worker thread queues a callback that raises `RuntimeError(message)` on the loop
    /// thread (it goes to the loop's exception handler).
    fn raise_on_loop(&self, message: String) {
        let remote = Arc::clone(&self.remote);
        let refused = Arc::clone(&self.refused);
        let handle = std::thread::spawn(move || {
            let guard = JobGuard::new();
            let sent = remote.call(move |_py| {
                let _guard = guard;
                Err(PyRuntimeError::new_err(message))
            });
            if sent.is_err() {
                refused.fetch_add(1, Ordering::SeqCst);
            }
        });
        self.threads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(handle);
    }

    /// Waits, without the GIL, for every thread started so far.
    fn join(&self, py: Python<'_>) {
        join_all(py, &self.threads);
    }
}

/// The benchmark's other path (benchmarks/wake): threads queue `(index, sent_ns)` pairs and
/// write a byte to a pipe the loop watches with `add_reader` (only when the queue was empty, as
/// a careful extension would); the reader calls `drain()`.
#[pyclass(frozen, module = "wake_ext")]
struct PipeProducer {
    queue: Arc<Mutex<Vec<(usize, u64)>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

#[pymethods]
impl PipeProducer {
    #[new]
    fn new() -> Self {
        Self {
            queue: Arc::new(Mutex::new(Vec::new())),
            threads: Mutex::new(Vec::new()),
        }
    }

    /// `threads` threads send indexes `0..n` between them to `write_fd`, each sleeping
    /// `delay_us` before each. Returns at once.
    #[pyo3(signature = (n, threads, write_fd, delay_us=0))]
    fn start(&self, n: usize, threads: usize, write_fd: i32, delay_us: u64) {
        let threads = threads.max(1);
        let mut handles = self
            .threads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for t in 0..threads {
            let queue = Arc::clone(&self.queue);
            handles.push(std::thread::spawn(move || {
                for i in (t..n).step_by(threads) {
                    if delay_us > 0 {
                        std::thread::sleep(Duration::from_micros(delay_us));
                    }
                    let was_empty = {
                        let mut q = queue
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        q.push((i, monotonic_ns()));
                        q.len() == 1
                    };
                    if was_empty {
                        let byte = 1u8;
                        // SAFETY: one initialised byte that lives across the call; a full pipe
                        // (EAGAIN on a non-blocking fd) is fine: it is readable already.
                        let _ = unsafe { libc::write(write_fd, (&raw const byte).cast(), 1) };
                    }
                }
            }));
        }
    }

    /// Everything queued so far, in order (loop thread).
    fn drain(&self) -> Vec<(usize, u64)> {
        std::mem::take(
            &mut *self
                .queue
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Waits, without the GIL, for every thread started so far.
    fn join(&self, py: Python<'_>) {
        join_all(py, &self.threads);
    }
}

/// Waits, without the GIL, for the threads in `threads` (taken out of it).
fn join_all(py: Python<'_>, threads: &Mutex<Vec<JoinHandle<()>>>) {
    let handles = std::mem::take(
        &mut *threads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    py.detach(|| {
        for h in handles {
            let _ = h.join();
        }
    });
}

/// CLOCK_MONOTONIC in nanoseconds (what `time.monotonic_ns()` reads).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Job closures alive: queued or running, not yet dropped (0 once all are done).
#[pyfunction]
fn live_jobs() -> isize {
    LIVE_JOBS.load(Ordering::SeqCst)
}

#[pymodule]
fn wake_ext(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Waker>()?;
    m.add_class::<PipeProducer>()?;
    m.add_function(wrap_pyfunction!(live_jobs, m)?)?;
    Ok(())
}
