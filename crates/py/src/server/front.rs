//! `run_front(...)`: the dispatching front's process body (`ferroloop_core::front`), for the
//! supervisor to call in the process it forks for it. It runs with the GIL released and takes
//! it only to log.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use ferroloop_core::front::{Config, Front};
use ferroloop_core::http::{valid_field, Limits};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

/// Serves `listeners` (fds, taken over: they close when the front returns) until the
/// supervisor says `drain` on `control` (an fd, taken over too) and the draining is done, or
/// closes `control`. `log(message)` is called for what an operator should see. `server_header`,
/// `date_header` and `headers` are `HttpServer`'s, for the one response the front writes
/// itself (408 to a head not whole in time). Returns the counts `(accepted, dispatched,
/// returned, lost_with_worker)`.
#[pyfunction]
#[pyo3(signature = (listeners, control, *, log, bulk_body=1_048_576, timeout_keep_alive=5.0,
    timeout_header=10.0, limit_header_size=65536, limit_headers=100, limit_uri=8192,
    server_header=true, date_header=true, headers=Vec::new()))]
#[allow(clippy::too_many_arguments)]
pub fn run_front(
    py: Python<'_>,
    listeners: Vec<RawFd>,
    control: RawFd,
    log: Py<PyAny>,
    bulk_body: u64,
    timeout_keep_alive: f64,
    timeout_header: f64,
    limit_header_size: usize,
    limit_headers: usize,
    limit_uri: usize,
    server_header: bool,
    date_header: bool,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
) -> PyResult<(u64, u64, u64, u64)> {
    if !(timeout_keep_alive > 0.0 && timeout_header > 0.0) {
        return Err(PyValueError::new_err("timeouts must be positive"));
    }
    if let Some((name, value)) = headers.iter().find(|(n, v)| !valid_field(n, v)) {
        return Err(PyValueError::new_err(format!(
            "invalid default header {:?}: {:?} (the name must be an RFC 9110 token, the value \
             without CR, LF or NUL)",
            String::from_utf8_lossy(name),
            String::from_utf8_lossy(value),
        )));
    }
    if listeners.iter().chain([&control]).any(|&fd| fd < 0) || listeners.len() > 255 {
        return Err(PyValueError::new_err(
            "run_front needs open fds, and at most 255 listeners",
        ));
    }
    let config = Config {
        limits: Limits {
            max_head_bytes: limit_header_size,
            max_headers: limit_headers,
            max_uri_bytes: limit_uri,
        },
        bulk_body,
        timeout_keep_alive,
        timeout_header,
        server_header,
        date_header,
        extra_headers: headers,
    };
    // SAFETY: the caller hands these fds over (documented above): each is open and owned by
    // nothing else in this process from now on.
    let listeners: Vec<OwnedFd> = listeners
        .into_iter()
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect();
    // SAFETY: as above.
    let control = unsafe { OwnedFd::from_raw_fd(control) };
    let stats = py
        .detach(move || {
            let mut write_log = |message: &str| {
                Python::attach(|py| {
                    if let Err(e) = log.bind(py).call1((message,)) {
                        e.write_unraisable(py, None);
                    }
                });
            };
            Front::new(listeners, control, config, &mut write_log)?.run()
        })
        .map_err(|e| PyOSError::new_err(format!("the front failed: {e}")))?;
    Ok((
        stats.accepted,
        stats.dispatched,
        stats.returned,
        stats.lost_with_worker,
    ))
}
