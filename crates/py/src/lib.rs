//! `ferroloop._native`: the extension module. Its whole surface is the export list below,
//! mirrored by `python/ferroloop/_native.pyi` (checked by `mypy.stubtest`).

mod cached_method;
mod capi;
mod cell;
mod context_pool;
mod cpython_loans;
pub mod event_loop;
mod fastcall;
mod gc_head;
mod gil;
mod handle;
mod handle_alloc;
mod handle_threadsafe;
mod hooks;
mod native_call;
mod private_fn;
mod server;
mod sock_ops;
mod task;
mod task_base;
mod task_registry;
mod transport;

use pyo3::prelude::*;

// `gil_used = true`: the loop's state is serialized by the GIL (`cell.rs`) and the pools and
// caches assume it, so a free-threaded CPython (3.14t) turns its GIL back on when this module
// is imported (with a `RuntimeWarning` of its own). Declaring otherwise needs every path other
// threads take to be correct without it first (issue 28).
#[pymodule(gil_used = true)]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The CPython loans (`cpython_loans.rs`) are decided first, each once.
    private_fn::install(m.py());
    cached_method::install(m.py());
    m.add_class::<event_loop::LoopCore>()?;
    m.add_class::<handle::Handle>()?;
    m.add_class::<handle::TimerHandle>()?;
    handle_alloc::install(m.py());
    handle::install_traverse(m.py());
    context_pool::install(m.py());
    gc_head::install(m.py());
    m.add_class::<sock_ops::SocketOperation>()?;
    m.add_class::<server::HttpServer>()?;
    m.add_function(wrap_pyfunction!(server::check_tls, m)?)?;
    m.add_function(wrap_pyfunction!(server::run_front, m)?)?;
    m.add_class::<server::FrontBoard>()?;
    m.add_class::<server::Conn>()?;
    m.add_class::<server::Cycle>()?;
    m.add_class::<server::H2Conn>()?;
    m.add_class::<server::H2Cycle>()?;
    m.add_class::<server::Ready>()?;
    m.add_class::<server::WsgiPool>()?;
    m.add_class::<server::WsgiCall>()?;
    m.add_class::<server::WsgiInput>()?;
    m.add_class::<server::WsgiFileWrapper>()?;
    m.add(
        "ClientDisconnected",
        m.py().get_type::<server::ClientDisconnected>(),
    )?;
    m.add_class::<transport::StreamCore>()?;
    m.add_class::<transport::DatagramCore>()?;
    m.add_class::<transport::TlsRecords>()?;
    server::install_ready_am_send(m.py());
    sock_ops::install_op_am_send(m.py());
    native_call::init(m.py());
    m.add_class::<task_registry::TaskRegistry>()?;
    task_base::take_current_tasks(m.py());
    if task_base::take_layout(m.py()) {
        m.add_class::<task::Task>()?;
        task::install_task_slots(m.py())?;
    } else {
        // The `task_layout` fallback: `ferroloop.Task` is asyncio's own.
        m.add("Task", hooks::task_type(m.py())?)?;
    }
    m.add_class::<task::TaskAwait>()?;
    m.add_function(wrap_pyfunction!(fastcall::_install_fast_methods, m)?)?;
    m.add_function(wrap_pyfunction!(gil::_prepare_exit, m)?)?;
    m.add_function(wrap_pyfunction!(gil::_after_fork_in_child, m)?)?;
    m.add_function(wrap_pyfunction!(task_registry::_install_task_registry, m)?)?;
    m.add_function(wrap_pyfunction!(transport::_install_transport_methods, m)?)?;
    capi::install(m)?;
    m.add("DEBUG_BUILD", cfg!(debug_assertions))?;
    m.add("HANDLE_POOL", handle_alloc::installed(m.py()))?;
    m.add("CONTEXT_POOL", context_pool::installed())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("CPYTHON_LOANS", cpython_loans::as_dict(m.py())?)?;
    cpython_loans::warn_failed(m.py());
    Ok(())
}
