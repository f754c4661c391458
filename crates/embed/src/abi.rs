//! The C ABI of ferroloop's remote handles, version [`VERSION`].
//!
//! Invariants (the compatibility contract):
//! - [`CApi`] starts with `version` and `size` and only ever grows at its end: a consumer built
//!   against version N reads a field of version M > N only after checking `size` (see
//!   [`CApi::has`]). A change that is not an append bumps nothing: it is a new capsule name.
//! - Every pointer to a Python object is a `PyObject*` (here `*mut c_void`, so this module needs
//!   no PyO3); who owns it is stated at each field.
//! - Thread rules: `remote_new` and `remote_register` need the GIL; `remote_call`,
//!   `remote_resolve` and `remote_free` are callable from any thread, with or without the GIL.

use std::ffi::{c_int, c_void, CStr};

/// The capsule's name, also its place: `ferroloop._native._C_API`.
pub const CAPSULE_NAME: &CStr = c"ferroloop._native._C_API";

/// The version this layout describes.
pub const VERSION: u32 = 1;

/// Queued: the loop will run the function exactly once.
pub const OK: c_int = 0;
/// The loop is closed (or closing): nothing was queued; the caller still owns `arg`.
pub const ERR_CLOSED: c_int = -1;
/// A NULL handle or function, or token 0: nothing was queued; the caller still owns `arg`.
pub const ERR_INVALID: c_int = -2;

/// An opaque remote handle: one loop, usable from any thread until `remote_free`.
#[repr(C)]
pub struct Remote {
    _private: [u8; 0],
}

/// Runs on the loop thread with the GIL held. Returns 0, or -1 with a Python exception set
/// (which goes to the loop's `call_exception_handler`). It owns `arg` from then on.
pub type CallFn = unsafe extern "C" fn(arg: *mut c_void) -> c_int;

/// Runs on the loop thread with the GIL held and returns a new reference to the future's
/// result, or NULL with a Python exception set, which becomes the future's exception. It owns
/// `arg` from then on; it runs even if the future was cancelled meanwhile (its value is then
/// dropped), so that it can always release `arg`.
pub type BuildFn = unsafe extern "C" fn(arg: *mut c_void) -> *mut c_void;

/// The function table the capsule points to (static, lives as long as the process).
#[repr(C)]
pub struct CApi {
    /// [`VERSION`] of the exporting ferroloop.
    pub version: u32,
    /// `size_of::<CApi>()` of the exporting ferroloop: fields past it do not exist.
    pub size: u32,
    /// GIL held. `loop` is borrowed. A new handle, or NULL with a Python exception set
    /// (`TypeError`: not a ferroloop loop; `RuntimeError`: the loop is closed).
    pub remote_new: unsafe extern "C" fn(loop_: *mut c_void) -> *mut Remote,
    /// Any thread. Releases the handle; it must not be used afterwards (not even by a call in
    /// progress on another thread). The loop itself is not affected.
    pub remote_free: unsafe extern "C" fn(remote: *mut Remote),
    /// Any thread, no GIL needed. Queues `func(arg)`; [`OK`], [`ERR_CLOSED`] or [`ERR_INVALID`].
    pub remote_call:
        unsafe extern "C" fn(remote: *mut Remote, func: Option<CallFn>, arg: *mut c_void) -> c_int,
    /// GIL held. `future` is borrowed (the loop keeps its own reference until the future is
    /// resolved or the loop closes). A token (never 0, never reused), or 0 with a Python
    /// exception set (`RuntimeError`: the loop is closed).
    pub remote_register: unsafe extern "C" fn(remote: *mut Remote, future: *mut c_void) -> u64,
    /// Any thread, no GIL needed. Queues: on the loop thread, `build(arg)` then the registered
    /// future's `set_result` (or `set_exception`, if `build` raised), unless it was cancelled.
    /// [`OK`], [`ERR_CLOSED`] or [`ERR_INVALID`]. A token may be resolved once.
    pub remote_resolve: unsafe extern "C" fn(
        remote: *mut Remote,
        token: u64,
        build: Option<BuildFn>,
        arg: *mut c_void,
    ) -> c_int,
}

impl CApi {
    /// Whether the table holds a field ending `end` bytes from its start (for fields appended
    /// by later versions).
    pub fn has(&self, end: usize) -> bool {
        self.size as usize >= end
    }
}

/// The size of version 1's table: what a consumer requires at least.
pub const SIZE_V1: usize = std::mem::offset_of!(CApi, remote_resolve) + size_of::<usize>();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_of_version_1_is_fixed() {
        // The header (ferroloop.h) declares the same: two uint32_t, then five pointers.
        assert_eq!(std::mem::offset_of!(CApi, version), 0);
        assert_eq!(std::mem::offset_of!(CApi, size), 4);
        assert_eq!(std::mem::offset_of!(CApi, remote_new), 8);
        assert_eq!(SIZE_V1, 8 + 5 * size_of::<usize>());
        assert_eq!(size_of::<CApi>(), SIZE_V1);
    }
}
