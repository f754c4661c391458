//! [`Remote`]: one way for a PyO3 extension's threads to hand work to an asyncio loop.
//!
//! Invariants:
//! - `Native`: `api` is the static table of the ferroloop loaded in this process, checked at
//!   [`Remote::for_loop`] (version 1 or later, at least [`abi::SIZE_V1`] bytes); `handle` is ours
//!   until `Drop` frees it. The C API allows every call we make through it from any thread.
//! - A closure boxed for the C API (`arg`) belongs to the loop once `remote_call` or
//!   `remote_resolve` returned [`abi::OK`]: the loop calls our trampoline exactly once, which
//!   takes the box back. On any other return the box was not queued and we drop it here.
//! - `Fallback`: the closure travels inside a Python callable handed to `call_soon_threadsafe`
//!   (taking the GIL); it runs at most once. If that loop closes first, asyncio drops the
//!   callable with the loop's ready queue, and the closure with it, unrun.

use std::ffi::{c_int, c_void};
use std::panic::AssertUnwindSafe;
use std::ptr::NonNull;
use std::sync::Mutex;

use pyo3::exceptions::{PyImportError, PyRuntimeError};
use pyo3::intern;
use pyo3::panic::PanicException;
use pyo3::prelude::*;
use pyo3::types::{PyCFunction, PyCapsule, PyCapsuleMethods};

use crate::abi;

/// Hands closures and future completions from any thread to one asyncio loop.
pub struct Remote {
    inner: Inner,
}

enum Inner {
    Native {
        api: &'static abi::CApi,
        handle: NonNull<abi::Remote>,
    },
    Fallback {
        call_soon_threadsafe: Py<PyAny>,
    },
}

// SAFETY: the C API's handle may be used and freed from any thread (its thread rules, `abi`);
// the fallback holds only a `Py`, which is `Send + Sync`.
unsafe impl Send for Remote {}
// SAFETY: as above; no method takes `&mut self`, and the C API synchronises internally.
unsafe impl Sync for Remote {}

/// A future registered with [`Remote::register`], to be resolved once by [`Remote::resolve`].
pub struct FutureToken(TokenKind);

enum TokenKind {
    Native(u64),
    Fallback(Py<PyAny>),
}

/// The loop is closed: the work was not queued (and has been dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopClosed;

impl std::fmt::Display for LoopClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the event loop is closed")
    }
}

impl std::error::Error for LoopClosed {}

impl Remote {
    /// A remote for `loop_`: ferroloop's C API if `loop_` is a ferroloop loop, else the loop's
    /// `call_soon_threadsafe`. Fails if `loop_` is a closed ferroloop loop.
    pub fn for_loop(loop_: &Bound<'_, PyAny>) -> PyResult<Self> {
        let py = loop_.py();
        if let Some(api) = ferroloop_api_for(loop_)? {
            // SAFETY: the GIL is held and `loop_` is a live object, as remote_new requires.
            let handle = unsafe { (api.remote_new)(loop_.as_ptr().cast()) };
            let handle = NonNull::new(handle).ok_or_else(|| {
                PyErr::take(py).unwrap_or_else(|| {
                    PyRuntimeError::new_err("remote_new failed without an exception")
                })
            })?;
            return Ok(Self {
                inner: Inner::Native { api, handle },
            });
        }
        Self::with_call_soon_threadsafe(loop_)
    }

    /// A remote that always takes the GIL and calls `loop_.call_soon_threadsafe`, even on a
    /// ferroloop loop (for comparisons, and to test an extension's fallback path).
    pub fn with_call_soon_threadsafe(loop_: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self {
            inner: Inner::Fallback {
                call_soon_threadsafe: loop_
                    .getattr(intern!(loop_.py(), "call_soon_threadsafe"))?
                    .unbind(),
            },
        })
    }

    /// Whether this remote uses ferroloop's C API (no GIL per completion).
    pub fn is_native(&self) -> bool {
        matches!(self.inner, Inner::Native { .. })
    }

    /// Runs `f` on the loop thread with the GIL. An `Err` it returns goes to the loop's
    /// exception handler. Callable from any thread; on ferroloop it takes no GIL.
    pub fn call<F>(&self, f: F) -> Result<(), LoopClosed>
    where
        F: FnOnce(Python<'_>) -> PyResult<()> + Send + 'static,
    {
        match &self.inner {
            Inner::Native { api, handle } => {
                let arg = Box::into_raw(Box::new(f)).cast::<c_void>();
                // SAFETY: `handle` is live (ours until Drop); `arg` is the box our trampoline
                // expects, and the C API allows this call from any thread.
                let rc = unsafe { (api.remote_call)(handle.as_ptr(), Some(run_call::<F>), arg) };
                if rc == abi::OK {
                    return Ok(());
                }
                // SAFETY: not queued: the box is still ours, made just above from a `F`.
                drop(unsafe { Box::from_raw(arg.cast::<F>()) });
                Err(LoopClosed)
            }
            Inner::Fallback {
                call_soon_threadsafe,
            } => Python::attach(|py| {
                let callback = once_callable(py, f).map_err(|_| LoopClosed)?;
                call_soon_threadsafe
                    .call1(py, (callback,))
                    .map(drop)
                    .map_err(|_| LoopClosed)
            }),
        }
    }

    /// Registers `future` (an asyncio future of this remote's loop) for [`Remote::resolve`].
    pub fn register(&self, future: &Bound<'_, PyAny>) -> PyResult<FutureToken> {
        match &self.inner {
            Inner::Native { api, handle } => {
                // SAFETY: the GIL is held (we have a `Bound`), the handle is live, `future`
                // is a live object the call only borrows.
                let token =
                    unsafe { (api.remote_register)(handle.as_ptr(), future.as_ptr().cast()) };
                if token == 0 {
                    return Err(PyErr::take(future.py()).unwrap_or_else(|| {
                        PyRuntimeError::new_err("remote_register failed without an exception")
                    }));
                }
                Ok(FutureToken(TokenKind::Native(token)))
            }
            Inner::Fallback { .. } => Ok(FutureToken(TokenKind::Fallback(future.clone().unbind()))),
        }
    }

    /// Resolves the future `token` stands for: `build` runs on the loop thread with the GIL,
    /// and its `Ok` becomes the future's result, its `Err` the future's exception (nothing, if
    /// the future was cancelled meanwhile). Callable from any thread; on ferroloop it takes no
    /// GIL.
    ///
    /// # Panics
    /// If `token` came from a `Remote` of the other kind (ferroloop's against a fallback).
    pub fn resolve<F>(&self, token: FutureToken, build: F) -> Result<(), LoopClosed>
    where
        F: FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send + 'static,
    {
        match (&self.inner, token.0) {
            (Inner::Native { api, handle }, TokenKind::Native(token)) => {
                let arg = Box::into_raw(Box::new(build)).cast::<c_void>();
                // SAFETY: as in `call`.
                let rc = unsafe {
                    (api.remote_resolve)(handle.as_ptr(), token, Some(run_build::<F>), arg)
                };
                if rc == abi::OK {
                    return Ok(());
                }
                // SAFETY: not queued: the box is still ours, made just above from a `F`.
                drop(unsafe { Box::from_raw(arg.cast::<F>()) });
                Err(LoopClosed)
            }
            (Inner::Fallback { .. }, TokenKind::Fallback(future)) => {
                self.call(move |py| settle(future.bind(py), build(py)))
            }
            _ => panic!("a FutureToken resolved through a Remote of another loop kind"),
        }
    }
}

/// Sets `future`'s result or exception from `value`, unless it was cancelled (asyncio's
/// `_set_result_unless_cancelled`).
fn settle(future: &Bound<'_, PyAny>, value: PyResult<Py<PyAny>>) -> PyResult<()> {
    let py = future.py();
    if future.call_method0(intern!(py, "cancelled"))?.is_truthy()? {
        return Ok(());
    }
    match value {
        Ok(v) => future.call_method1(intern!(py, "set_result"), (v,))?,
        Err(e) => future.call_method1(intern!(py, "set_exception"), (e.into_value(py),))?,
    };
    Ok(())
}

impl Drop for Remote {
    fn drop(&mut self) {
        if let Inner::Native { api, handle } = &self.inner {
            // SAFETY: the handle is ours and nobody uses it after this (we are being dropped);
            // remote_free may run on any thread.
            unsafe { (api.remote_free)(handle.as_ptr()) };
        }
    }
}

/// ferroloop's C API, if `loop_` is a ferroloop loop (then `ferroloop._native` is loaded
/// already: nothing is imported for another loop).
fn ferroloop_api_for(loop_: &Bound<'_, PyAny>) -> PyResult<Option<&'static abi::CApi>> {
    let py = loop_.py();
    let modules = py
        .import(intern!(py, "sys"))?
        .getattr(intern!(py, "modules"))?;
    let Ok(native) = modules.get_item(intern!(py, "ferroloop._native")) else {
        return Ok(None);
    };
    if !loop_.is_instance(&native.getattr(intern!(py, "LoopCore"))?)? {
        return Ok(None);
    }
    let capsule = native
        .getattr(intern!(py, "_C_API"))?
        .cast_into::<PyCapsule>()?;
    let ptr = capsule.pointer_checked(Some(abi::CAPSULE_NAME))?;
    // SAFETY: a capsule of this name points to ferroloop's static `CApi` (it lives as long as
    // the process and nobody writes it); alignment holds for a Rust static.
    let api: &'static abi::CApi = unsafe { ptr.cast::<abi::CApi>().as_ref() };
    if api.version < 1 || !api.has(abi::SIZE_V1) {
        return Err(PyImportError::new_err(format!(
            "ferroloop's C API is version {} ({} bytes); this extension needs version {} ({} bytes): upgrade ferroloop",
            api.version,
            api.size,
            abi::VERSION,
            abi::SIZE_V1
        )));
    }
    Ok(Some(api))
}

/// A Python callable that runs `f` once (for `call_soon_threadsafe`).
fn once_callable<F>(py: Python<'_>, f: F) -> PyResult<Bound<'_, PyCFunction>>
where
    F: FnOnce(Python<'_>) -> PyResult<()> + Send + 'static,
{
    let cell = Mutex::new(Some(f));
    PyCFunction::new_closure(py, Some(c"ferroloop_embed_call"), None, move |args, _| {
        let f = cell
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("a ferroloop-embed callback ran twice"))?;
        f(args.py())
    })
}

/// The error a panic in a callback becomes.
fn panic_error(payload: &(dyn std::any::Any + Send)) -> PyErr {
    let msg = payload
        .downcast_ref::<&str>()
        .map(ToString::to_string)
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a callback handed to the loop panicked".into());
    PanicException::new_err(msg)
}

/// `remote_call`'s function: runs the boxed closure.
unsafe extern "C" fn run_call<F>(arg: *mut c_void) -> c_int
where
    F: FnOnce(Python<'_>) -> PyResult<()> + Send + 'static,
{
    // SAFETY: the loop calls this once, with the GIL held, with the box `call` queued.
    let (f, py) = unsafe { (Box::from_raw(arg.cast::<F>()), Python::assume_attached()) };
    let err = match std::panic::catch_unwind(AssertUnwindSafe(|| f(py))) {
        Ok(Ok(())) => return 0,
        Ok(Err(e)) => e,
        Err(payload) => panic_error(&*payload),
    };
    err.restore(py);
    -1
}

/// `remote_resolve`'s function: runs the boxed builder.
unsafe extern "C" fn run_build<F>(arg: *mut c_void) -> *mut c_void
where
    F: FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send + 'static,
{
    // SAFETY: the loop calls this once, with the GIL held, with the box `resolve` queued.
    let (f, py) = unsafe { (Box::from_raw(arg.cast::<F>()), Python::assume_attached()) };
    let err = match std::panic::catch_unwind(AssertUnwindSafe(|| f(py))) {
        Ok(Ok(value)) => return value.into_ptr().cast(),
        Ok(Err(e)) => e,
        Err(payload) => panic_error(&*payload),
    };
    err.restore(py);
    std::ptr::null_mut()
}
