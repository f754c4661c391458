//! `loop.enable_metrics()` and `loop.metrics()`: the loop's own counters
//! (`ferroloop_core::loop_stats`) for programs that use only the loop, and for the server's
//! `--metrics`. Counting starts with `enable_metrics()`; the iteration (`iteration.rs`)
//! records, this module only switches it on and copies a snapshot out.

use std::sync::atomic::Ordering;

use ferroloop_core::loop_stats::{Histogram, BUCKETS};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::LoopCore;

pub(super) fn enable(core: &LoopCore, py: Python<'_>) -> PyResult<()> {
    core.state.borrow(py)?.stats.enable();
    core.flags.metrics.store(true, Ordering::Relaxed);
    Ok(())
}

/// `{"enabled", "iterations", "polls", "poll_wait_seconds", "busy_seconds",
/// "timer_lag_seconds"}`, the two histograms as `{"buckets": [(upper bound, cumulative
/// count), ..., (inf, count)], "sum", "count"}` (Prometheus's shape).
pub(super) fn snapshot<'py>(core: &LoopCore, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
    let stats = core.state.borrow(py)?.stats;
    let out = PyDict::new(py);
    out.set_item("enabled", stats.enabled())?;
    out.set_item("iterations", stats.iterations)?;
    out.set_item("polls", stats.polls)?;
    out.set_item("poll_wait_seconds", stats.poll_wait)?;
    out.set_item("busy_seconds", histogram(py, &stats.busy)?)?;
    out.set_item("timer_lag_seconds", histogram(py, &stats.timer_lag)?)?;
    Ok(out)
}

fn histogram<'py>(py: Python<'py>, h: &Histogram) -> PyResult<Bound<'py, PyDict>> {
    let buckets = PyList::empty(py);
    let mut cumulative = 0;
    for (i, count) in h.counts.iter().enumerate() {
        cumulative += count;
        let bound = BUCKETS.get(i).copied().unwrap_or(f64::INFINITY);
        buckets.append((bound, cumulative))?;
    }
    let out = PyDict::new(py);
    out.set_item("buckets", buckets)?;
    out.set_item("sum", h.sum)?;
    out.set_item("count", cumulative)?;
    Ok(out)
}
