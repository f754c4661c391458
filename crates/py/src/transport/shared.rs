//! What the stream and datagram cores share: the state asyncio's `_SelectorTransport` keeps in
//! both (`_protocol`, `_conn_lost`, `_closing`) with the Python transport beside it, the one
//! definition of the Python-facing methods over it (`core_pymethods!`), and the cold calls back
//! into the transport (`Attached`).
//!
//! Shape: each core's state (`CoreState`, `DatagramState`) embeds one `SharedState` as its field
//! `shared`, inside the core's single `LoopCell`. `core_pymethods!` takes a core's own
//! `#[pymethods]` body and emits it in one `#[pymethods]` block together with the shared members:
//! the constructor that refuses Python callers, the `_protocol`/`_conn_lost`/`_closing`
//! properties, `__traverse__`/`__clear__` (the shared objects here, each state's own through
//! `OwnObjects`) and the `Attached` impl.
//!
//! Why a macro and not a native base class (`#[pyclass(subclass)]` with `extends`): PyO3 keeps a
//! base's fields and a subclass's in separate structs, so the state would be split over two
//! cells. The read and write paths decide on shared fields (`_conn_lost`, the protocol) and the
//! core's own (the queue) together, under one borrow; a base class would make that two borrows
//! and reach the base through `as_super()`, work the per-message path does not do today. Nor a
//! second `#[pymethods]` block per class: that needs PyO3's `multiple-pymethods` feature (the
//! `inventory` crate, registration at start-up). `#[pymethods]` cannot be generic over the class,
//! and it reads its block before macros inside it expand, so an accessor macro invoked there
//! would not be seen. So the macro wraps the whole block: the classes, their Python surface and
//! their hot paths (one borrow, the same fields) are what they were. The cost: rustfmt leaves
//! the inside of a brace-delimited macro call alone, so the two `core_pymethods!` bodies are
//! kept formatted by hand.
//!
//! Invariant: a core given to `core_pymethods!` has fields `loop_: Py<LoopCore>` and
//! `state: LoopCell<S>`, where `S` has the field `shared: SharedState` and implements
//! `OwnObjects` for the Python objects it holds besides those.

use pyo3::exceptions::{PyKeyboardInterrupt, PySystemExit};
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::PyTraverseError;

/// The state every core holds for its Python transport.
pub(crate) struct SharedState {
    pub(crate) protocol: Option<Py<PyAny>>,
    /// The Python transport, for the cold paths (EOF, errors, flow control, closing); `None`
    /// once the core is released.
    pub(crate) transport: Option<Py<PyAny>>,
    pub(crate) conn_lost: u64,
    pub(crate) closing: bool,
}

impl SharedState {
    pub(crate) fn new(transport: &Bound<'_, PyAny>) -> Self {
        Self {
            protocol: None,
            transport: Some(transport.clone().unbind()),
            conn_lost: 0,
            closing: false,
        }
    }

    pub(crate) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.protocol)?;
        visit.call(&self.transport)
    }

    /// Takes the Python objects out, for the caller to drop after the state borrow ends.
    pub(crate) fn take_objects(&mut self) -> [Option<Py<PyAny>>; 2] {
        [self.protocol.take(), self.transport.take()]
    }
}

/// The Python objects a core's state holds besides its `SharedState`, for the garbage collector.
pub(crate) trait OwnObjects {
    /// What `take_own` removes; dropped after the state borrow ends.
    type Taken;

    fn traverse_own(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError>;

    /// Removes the objects (and whatever counts them) for `__clear__`.
    fn take_own(&mut self) -> Self::Taken;
}

/// `KeyboardInterrupt` and `SystemExit` leave the callback; asyncio catches everything else.
pub(crate) fn is_exit(py: Python<'_>, err: &PyErr) -> bool {
    err.is_instance_of::<PyKeyboardInterrupt>(py) || err.is_instance_of::<PySystemExit>(py)
}

/// What both cores share: the Python transport, for the cold paths, until it is released.
pub(crate) trait Attached {
    /// The Python transport, or `None` once the core has let go of it.
    fn attached<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>>;

    /// Calls a method of the Python transport (a cold path), if it is still attached.
    fn call_transport<'py>(
        &self,
        py: Python<'py>,
        name: &Bound<'py, pyo3::types::PyString>,
        args: impl pyo3::call::PyCallArgs<'py>,
    ) -> PyResult<()> {
        match self.attached(py)? {
            Some(t) => t.call_method1(name, args).map(drop),
            None => Ok(()),
        }
    }

    /// asyncio's `except BaseException as exc: self._fatal_error(exc, message)`.
    fn fatal(&self, py: Python<'_>, err: PyErr, message: &str) -> PyResult<()> {
        if is_exit(py, &err) {
            return Err(err);
        }
        self.call_transport(
            py,
            intern!(py, "_fatal_error"),
            (err.into_value(py), message),
        )
    }
}

/// An optional object attribute as Python reads it (`None` when absent).
pub(super) fn get_object(py: Python<'_>, slot: Option<&Py<PyAny>>) -> Option<Py<PyAny>> {
    slot.map(|o| o.clone_ref(py))
}

/// Stores an object attribute set from Python (`None` as absent). Returns the old value, for
/// the caller to drop after the state borrow ends (dropping it can run Python code).
pub(super) fn put_object(
    py: Python<'_>,
    slot: &mut Option<Py<PyAny>>,
    value: Option<Py<PyAny>>,
) -> Option<Py<PyAny>> {
    std::mem::replace(slot, value.filter(|v| !v.is_none(py)))
}

/// `#[pymethods] impl $core { <the core's own methods> <the shared members> }`, plus
/// `impl Attached for $core` (see the module header).
macro_rules! core_pymethods {
    (impl $core:ident { $($own:tt)* }) => {
        #[pymethods]
        impl $core {
            $($own)*

            #[new]
            fn py_new() -> PyResult<Self> {
                Err(pyo3::exceptions::PyTypeError::new_err(concat!(
                    stringify!($core),
                    " objects are created by the transport (",
                    stringify!($core),
                    "._attach)"
                )))
            }

            #[getter(_protocol)]
            fn protocol(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
                let st = self.state.borrow(py)?;
                Ok($crate::transport::shared::get_object(py, st.shared.protocol.as_ref()))
            }

            #[setter(_protocol)]
            fn set_protocol_attr(&self, py: Python<'_>, value: Option<Py<PyAny>>) -> PyResult<()> {
                let old = $crate::transport::shared::put_object(
                    py,
                    &mut self.state.borrow(py)?.shared.protocol,
                    value,
                );
                drop(old);
                Ok(())
            }

            #[getter(_conn_lost)]
            fn conn_lost(&self, py: Python<'_>) -> PyResult<u64> {
                Ok(self.state.borrow(py)?.shared.conn_lost)
            }

            #[setter(_conn_lost)]
            fn set_conn_lost(&self, py: Python<'_>, value: u64) -> PyResult<()> {
                self.state.borrow(py)?.shared.conn_lost = value;
                Ok(())
            }

            #[getter(_closing)]
            fn closing(&self, py: Python<'_>) -> PyResult<bool> {
                Ok(self.state.borrow(py)?.shared.closing)
            }

            #[setter(_closing)]
            fn set_closing(&self, py: Python<'_>, value: bool) -> PyResult<()> {
                self.state.borrow(py)?.shared.closing = value;
                Ok(())
            }

            fn __traverse__(
                &self,
                visit: pyo3::gc::PyVisit<'_>,
            ) -> Result<(), pyo3::PyTraverseError> {
                use $crate::transport::shared::OwnObjects as _;
                visit.call(&self.loop_)?;
                if let Some(st) = self.state.try_borrow_for_gc() {
                    st.shared.traverse(&visit)?;
                    st.traverse_own(&visit)?;
                }
                Ok(())
            }

            fn __clear__(&self) {
                use $crate::transport::shared::OwnObjects as _;
                let dropped = self
                    .state
                    .try_borrow_for_gc()
                    .map(|mut st| (st.shared.take_objects(), st.take_own()));
                drop(dropped);
            }
        }

        impl $crate::transport::shared::Attached for $core {
            fn attached<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
                let st = self.state.borrow(py)?;
                Ok(st.shared.transport.as_ref().map(|t| t.bind(py).clone()))
            }
        }
    };
}
