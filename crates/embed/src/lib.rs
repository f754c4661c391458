//! Wake an asyncio loop from native threads without taking the GIL per completion.
//!
//! - [`abi`]: the layout of ferroloop's C API (the capsule `ferroloop._native._C_API`), the same
//!   contract as `python/ferroloop/include/ferroloop.h`. No PyO3 here: ferroloop's own
//!   extension fills this struct.
//! - [`Remote`] (feature `pyo3`, on by default): a safe wrapper for PyO3 extensions. On a
//!   ferroloop loop it uses the C API (no GIL on the producer's side, one coalesced wake-up);
//!   on any other loop it takes the GIL and calls `loop.call_soon_threadsafe`, so an extension
//!   is written once.

pub mod abi;

#[cfg(feature = "pyo3")]
mod remote;

#[cfg(feature = "pyo3")]
pub use remote::{FutureToken, LoopClosed, Remote};
