//! Socket addresses between the kernel's `sockaddr` and the Python forms `socket` uses.
//!
//! - [`SockAddr::to_python`] gives what `socket.recvfrom` returns: `(host, port)` for IPv4,
//!   `(host, port, flowinfo, scope_id)` for IPv6 (host from `getnameinfo(NI_NUMERICHOST)`, as
//!   CPython's `makeipaddr`, so a scoped address reads `fe80::1%lo`), a `str` path for a named
//!   Unix socket, `bytes` for an abstract one, `None` for an unnamed sender (the kernel reports
//!   no address), and `(family, sa_data)` for any other family.
//! - [`SockAddr::from_python`] parses only what needs no policy: an exact `tuple` of an exact
//!   `str` holding a numeric address and exact `int`s in range. Everything else (host names,
//!   `''`, `'<broadcast>'`, Unix paths, subclasses, out-of-range numbers) returns `None` and the
//!   caller lets the Python `socket` convert it, so its errors and name resolution are
//!   CPython's own.

use std::ffi::CStr;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyString, PyTuple};
use pyo3::IntoPyObjectExt;

/// A `sockaddr` as the kernel fills or reads it.
pub(super) struct SockAddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

/// `offsetof(struct sockaddr_un, sun_path)`.
const SUN_PATH_OFFSET: usize = std::mem::size_of::<libc::sa_family_t>();

impl SockAddr {
    /// An out-buffer for `recvfrom`: room for any family, length set to its size.
    pub(super) fn empty() -> Self {
        Self {
            // SAFETY: all-zero is a valid sockaddr_storage (plain integers).
            storage: unsafe { std::mem::zeroed() },
            len: std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t,
        }
    }

    pub(super) fn as_ptr(&self) -> *const libc::sockaddr {
        (&raw const self.storage).cast()
    }

    pub(super) fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        (&raw mut self.storage).cast()
    }

    pub(super) fn len(&self) -> libc::socklen_t {
        self.len
    }

    pub(super) fn len_mut(&mut self) -> &mut libc::socklen_t {
        &mut self.len
    }

    /// The address as `socket.recvfrom` gives it (see the module docs), the host `str` of an
    /// IPv4 sender taken from `cache` when it is the cached address (and cached otherwise).
    pub(super) fn to_python<'py>(
        &self,
        py: Python<'py>,
        cache: &mut HostCache,
    ) -> PyResult<Bound<'py, PyAny>> {
        let len = self.len as usize;
        if len == 0 {
            return Ok(py.None().into_bound(py));
        }
        match i32::from(self.storage.ss_family) {
            libc::AF_INET => {
                // SAFETY: the family says the storage holds a sockaddr_in.
                let a: &libc::sockaddr_in = unsafe { &*self.as_ptr().cast() };
                let ip = a.sin_addr.s_addr;
                let host = match &cache.v4 {
                    Some((cached, host)) if *cached == ip => host.bind(py).clone(),
                    _ => {
                        let host = ipv4_host(py, ip);
                        cache.v4 = Some((ip, host.clone().unbind()));
                        host
                    }
                };
                (host, u16::from_be(a.sin_port)).into_bound_py_any(py)
            }
            libc::AF_INET6 => {
                // SAFETY: the family says the storage holds a sockaddr_in6.
                let a: &libc::sockaddr_in6 = unsafe { &*self.as_ptr().cast() };
                (
                    self.numeric_host(py)?,
                    u16::from_be(a.sin6_port),
                    u32::from_be(a.sin6_flowinfo),
                    a.sin6_scope_id,
                )
                    .into_bound_py_any(py)
            }
            libc::AF_UNIX => {
                // SAFETY: the family says the storage holds a sockaddr_un, and `len` (at most
                // the storage's size) bounds what the kernel filled.
                let a: &libc::sockaddr_un = unsafe { &*self.as_ptr().cast() };
                let path_len = len.saturating_sub(SUN_PATH_OFFSET).min(a.sun_path.len());
                // SAFETY: `sun_path` has at least `path_len` initialised bytes (c_char is u8/i8).
                let path: &[u8] =
                    unsafe { std::slice::from_raw_parts(a.sun_path.as_ptr().cast(), path_len) };
                if path.first() == Some(&0) {
                    // Linux abstract namespace: the whole name, NULs included.
                    return Ok(PyBytes::new(py, path).into_any());
                }
                let end = path.iter().position(|&b| b == 0).unwrap_or(path.len());
                fs_decode(py, &path[..end])
            }
            family => {
                // SAFETY: every sockaddr starts with a family and 14 bytes of sa_data.
                let a: &libc::sockaddr = unsafe { &*self.as_ptr() };
                // SAFETY: sa_data is 14 initialised bytes.
                let data: &[u8] =
                    unsafe { std::slice::from_raw_parts(a.sa_data.as_ptr().cast(), 14) };
                (family, PyBytes::new(py, data)).into_bound_py_any(py)
            }
        }
    }

    /// `getnameinfo(NI_NUMERICHOST)`, as CPython's `makeipaddr`.
    fn numeric_host<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyString>> {
        let mut host = [0 as libc::c_char; libc::NI_MAXHOST as usize];
        // SAFETY: the address and host buffers are valid for the lengths passed; no service is
        // asked for.
        let r = unsafe {
            libc::getnameinfo(
                self.as_ptr(),
                self.len,
                host.as_mut_ptr(),
                host.len() as libc::socklen_t,
                std::ptr::null_mut(),
                0,
                libc::NI_NUMERICHOST,
            )
        };
        if r != 0 {
            return Err(std::io::Error::other("getnameinfo failed on a received address").into());
        }
        // SAFETY: getnameinfo succeeded, so `host` holds a NUL-terminated string.
        let host = unsafe { CStr::from_ptr(host.as_ptr()) };
        Ok(PyString::new(py, &host.to_string_lossy()))
    }

    /// A numeric IP address in the form `socket.sendto` takes for `family`, or `None` when the
    /// Python socket must convert it (see the module docs). An IPv4 host that is the very `str`
    /// object `cache` holds (the host of a datagram received from that peer, sent back to it) is
    /// not parsed again.
    pub(super) fn from_python(
        family: i32,
        addr: &Bound<'_, PyAny>,
        cache: &HostCache,
    ) -> Option<Self> {
        let tuple = addr.cast_exact::<PyTuple>().ok()?;
        let item = |i: usize| tuple.get_item(i).ok();
        let int = |i: usize, max: u64| -> Option<u64> {
            let v = item(i)?;
            let v = v.cast_exact::<PyInt>().ok()?.extract::<u64>().ok()?;
            (v <= max).then_some(v)
        };
        let host_obj = item(0)?;
        let host = host_obj.cast_exact::<PyString>().ok()?;
        let known_v4 = match &cache.v4 {
            Some((ip, cached)) if family == libc::AF_INET && host.is(cached) => Some(*ip),
            _ => None,
        };
        let host = host.to_str().ok()?;
        let mut out = Self::empty();
        match (family, tuple.len()) {
            (libc::AF_INET, 2) => {
                let port = int(1, 0xffff)? as u16;
                // SAFETY: the storage is large enough for any sockaddr.
                let a: &mut libc::sockaddr_in = unsafe { &mut *out.as_mut_ptr().cast() };
                a.sin_family = libc::AF_INET as libc::sa_family_t;
                a.sin_port = port.to_be();
                match known_v4 {
                    Some(ip) => a.sin_addr.s_addr = ip,
                    None => pton(libc::AF_INET, host, (&raw mut a.sin_addr).cast())?,
                }
                out.len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            }
            (libc::AF_INET6, 2..=4) => {
                if host.contains('%') {
                    return None; // a scope name: CPython resolves it with getaddrinfo
                }
                let port = int(1, 0xffff)? as u16;
                let flowinfo = if tuple.len() > 2 { int(2, 0xfffff)? } else { 0 };
                let scope_id = if tuple.len() > 3 {
                    int(3, u64::from(u32::MAX))?
                } else {
                    0
                };
                // SAFETY: the storage is large enough for any sockaddr.
                let a: &mut libc::sockaddr_in6 = unsafe { &mut *out.as_mut_ptr().cast() };
                a.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                a.sin6_port = port.to_be();
                a.sin6_flowinfo = (flowinfo as u32).to_be();
                a.sin6_scope_id = scope_id as u32;
                pton(libc::AF_INET6, host, (&raw mut a.sin6_addr).cast())?;
                out.len = std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            }
            _ => return None,
        }
        Some(out)
    }
}

/// The last IPv4 peer a datagram transport received from, with its host as the `str` handed to
/// the protocol: a peer that keeps talking costs neither a formatting per datagram received nor,
/// when the protocol answers with the address it was given, an `inet_pton` per datagram sent.
/// The `str` is immutable, so handing the same object out again is invisible to Python.
#[derive(Default)]
pub(super) struct HostCache {
    /// The address (network byte order) and its dotted-quad text.
    v4: Option<(u32, Py<PyString>)>,
}

/// The dotted-quad text of an IPv4 address in network byte order, as `inet_ntoa` writes it (what
/// `socket.recvfrom` returns), formatted without `core::fmt` (about 1,300 instructions there).
fn ipv4_host(py: Python<'_>, be_addr: u32) -> Bound<'_, PyString> {
    let mut buf = [0u8; 15];
    let mut len = 0;
    for (i, octet) in be_addr.to_ne_bytes().into_iter().enumerate() {
        if i > 0 {
            buf[len] = b'.';
            len += 1;
        }
        if octet >= 100 {
            buf[len] = b'0' + octet / 100;
            len += 1;
        }
        if octet >= 10 {
            buf[len] = b'0' + octet / 10 % 10;
            len += 1;
        }
        buf[len] = b'0' + octet % 10;
        len += 1;
    }
    // Only ASCII digits and dots were written.
    PyString::new(py, std::str::from_utf8(&buf[..len]).unwrap_or_default())
}

unsafe extern "C" {
    /// POSIX `inet_pton` (the `libc` crate does not declare it).
    fn inet_pton(af: libc::c_int, src: *const libc::c_char, dst: *mut libc::c_void) -> libc::c_int;
}

/// `inet_pton(family, host, dst)`; `None` unless `host` is a numeric address of that family.
fn pton(family: i32, host: &str, dst: *mut libc::c_void) -> Option<()> {
    let mut buf = [0u8; 64];
    if host.len() >= buf.len() || host.as_bytes().contains(&0) {
        return None;
    }
    buf[..host.len()].copy_from_slice(host.as_bytes());
    // SAFETY: `buf` is NUL-terminated; `dst` points at an in_addr/in6_addr of `family`.
    let r = unsafe { inet_pton(family, buf.as_ptr().cast(), dst) };
    (r == 1).then_some(())
}

/// `PyUnicode_DecodeFSDefaultAndSize`: a path as `socket` decodes it (surrogateescape).
fn fs_decode<'py>(py: Python<'py>, path: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: we hold the GIL; `path` is valid for its length. The result is a new reference
    // or NULL with an exception set.
    unsafe {
        let obj = pyo3::ffi::PyUnicode_DecodeFSDefaultAndSize(
            path.as_ptr().cast(),
            path.len() as pyo3::ffi::Py_ssize_t,
        );
        Bound::from_owned_ptr_or_err(py, obj)
    }
}
