//! The C API: remote handles for native extensions, exported as the capsule
//! `ferroloop._native._C_API` (layout: `ferroloop_embed::abi`; contract for C:
//! `python/ferroloop/include/ferroloop.h`).
//!
//! Invariants:
//! - The table is one `static`: the capsule points to it and it never changes, so a consumer
//!   may keep the pointer for the life of the process.
//! - A handle is a `Box<LoopRemote>` (an `Arc` of the loop's `Shared`: the injector and the
//!   future table, never the loop object itself), so it may outlive the loop, be used from any
//!   thread without the GIL, and be freed from any thread. Once the loop is closed or freed the
//!   injector is sealed and every request on the handle returns `ERR_CLOSED`.
//! - What a request does and when it runs is `event_loop::native_work`'s business; here the
//!   arguments are checked and the ownership of `arg` is decided: queued (the loop's), or not
//!   (the caller's, the work is disarmed).

use std::ffi::{c_int, c_void};

use ferroloop_embed::abi::{self, BuildFn, CApi, CallFn, Remote};
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::event_loop::native_work::NativeWork;
use crate::event_loop::{LoopCore, LoopRemote};

static C_API: CApi = CApi {
    version: abi::VERSION,
    size: size_of::<CApi>() as u32,
    remote_new,
    remote_free,
    remote_call,
    remote_register,
    remote_resolve,
};

/// Adds the capsule to the module.
pub fn install(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let ptr = std::ptr::NonNull::from(&C_API).cast::<c_void>();
    // SAFETY: the pointer is to a `static` that lives as long as the process and is never
    // written, so no destructor is needed.
    let capsule = unsafe {
        PyCapsule::new_with_pointer_and_destructor(m.py(), ptr, abi::CAPSULE_NAME, None)
    }?;
    m.add("_C_API", capsule)
}

/// The handle's remote. The caller guarantees `remote` came from `remote_new` and was not freed.
unsafe fn remote_ref<'a>(remote: *mut Remote) -> Option<&'a LoopRemote> {
    // SAFETY: per the caller, a non-null `remote` is a live `Box<LoopRemote>`.
    unsafe { remote.cast::<LoopRemote>().as_ref() }
}

unsafe extern "C" fn remote_new(loop_: *mut c_void) -> *mut Remote {
    // SAFETY: the contract of remote_new: the GIL is held.
    let py = unsafe { Python::assume_attached() };
    if loop_.is_null() {
        PyTypeError::new_err("remote_new: loop is NULL").restore(py);
        return std::ptr::null_mut();
    }
    // SAFETY: a non-null `loop_` is a live object the caller lends us (the contract).
    let obj = unsafe { Bound::from_borrowed_ptr(py, loop_.cast()) };
    let Ok(core) = obj.cast::<LoopCore>() else {
        let ty = obj
            .get_type()
            .name()
            .map_or_else(|_| "?".to_owned(), |n| n.to_string());
        PyTypeError::new_err(format!(
            "remote_new: a {ty} is not a ferroloop loop; use loop.call_soon_threadsafe (ferroloop-embed's Remote falls back to it)"
        ))
        .restore(py);
        return std::ptr::null_mut();
    };
    if core.get().is_closed_flag() {
        PyRuntimeError::new_err("Event loop is closed").restore(py);
        return std::ptr::null_mut();
    }
    Box::into_raw(Box::new(core.get().remote())).cast()
}

unsafe extern "C" fn remote_free(remote: *mut Remote) {
    if !remote.is_null() {
        // SAFETY: `remote` came from remote_new's `Box<LoopRemote>` and is freed once (the
        // contract); dropping it touches no Python object.
        drop(unsafe { Box::from_raw(remote.cast::<LoopRemote>()) });
    }
}

unsafe extern "C" fn remote_call(
    remote: *mut Remote,
    func: Option<CallFn>,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: the contract: `remote` is NULL or a live handle.
    let (Some(remote), Some(func)) = (unsafe { remote_ref(remote) }, func) else {
        return abi::ERR_INVALID;
    };
    match remote.try_native(NativeWork::call(func, arg)) {
        Ok(()) => abi::OK,
        Err(work) => {
            work.disarm();
            abi::ERR_CLOSED
        }
    }
}

unsafe extern "C" fn remote_register(remote: *mut Remote, future: *mut c_void) -> u64 {
    // SAFETY: the contract of remote_register: the GIL is held.
    let py = unsafe { Python::assume_attached() };
    // SAFETY: the contract: `remote` is NULL or a live handle.
    let Some(remote) = (unsafe { remote_ref(remote) }) else {
        PyTypeError::new_err("remote_register: remote is NULL").restore(py);
        return 0;
    };
    if future.is_null() {
        PyTypeError::new_err("remote_register: future is NULL").restore(py);
        return 0;
    }
    // SAFETY: a non-null `future` is a live object the caller lends us; we take our own
    // reference.
    let future = unsafe { Bound::from_borrowed_ptr(py, future.cast()) }.unbind();
    match remote.register_future(py, future) {
        Ok(token) => token,
        Err(e) => {
            e.restore(py);
            0
        }
    }
}

unsafe extern "C" fn remote_resolve(
    remote: *mut Remote,
    token: u64,
    build: Option<BuildFn>,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: the contract: `remote` is NULL or a live handle.
    let (Some(remote), Some(build)) = (unsafe { remote_ref(remote) }, build) else {
        return abi::ERR_INVALID;
    };
    if token == 0 {
        return abi::ERR_INVALID;
    }
    match remote.try_native(NativeWork::resolve(token, build, arg)) {
        Ok(()) => abi::OK,
        Err(work) => {
            work.disarm();
            abi::ERR_CLOSED
        }
    }
}
