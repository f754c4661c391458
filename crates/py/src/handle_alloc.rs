//! `Handle` and `TimerHandle` objects made and freed without PyO3's generic path, their memory
//! reused.
//!
//! Every `call_soon` of a callback makes a `Handle` (`call_soon_impl`, `call_soon_threadsafe`),
//! and running it usually frees it. Through PyO3 that costs,
//! under callgrind, about 270 instructions to make one (`create_class_object`, the base type's
//! `tp_new` with its argument checks, `PyType_GenericAlloc`'s allocation, zeroing and GC
//! linking) and about 260 to free one (PyO3's trampoline, the type lookup, `PyObject_GC_Del`).
//! Here a freed handle's memory goes to a small pool, and the next handle is built in it: only
//! what a live handle needs is written (the header by `PyObject_Init`, the `Handle` value, the
//! weak reference list), and the handle is tracked by the garbage collector again (unless the
//! caller keeps it where the loop visits it in place: handle.rs). A handle that ran from the
//! ready queue with nothing else referencing it is not even freed: it is kept whole, alive, for
//! the next one (`LIVE`, `release_sole`).
//!
//! `TimerHandle`s (`call_later`, `call_at`, every `asyncio.sleep` with a delay and every timeout)
//! get the same in a pool of their own. With a pool empty, a new handle of either type is
//! allocated by the type's `tp_alloc` directly (`obtain`), where PyO3's initialiser goes through
//! the base type's `tp_new` (and for a `TimerHandle` two levels: about 750 instructions).
//!
//! PyO3's own `#[pyclass(freelist = N)]` is not used: it takes a mutex on every allocation and
//! free, and an object it hands out again is never re-tracked by the collector (its `tp_dealloc`
//! untracked it), so reference cycles through such a handle would never be collected.
//!
//! Invariants:
//! - `LAYOUT` is set once, at module initialisation (`install`), and only if the `Handle` type's
//!   instances are laid out as this module writes them: the object header, the `Handle` value
//!   at `value`, the weak reference list at `weaklist`, nothing else (checked against
//!   `tp_basicsize`, `tp_weaklistoffset` and a live instance), on a version the `handle_reuse`
//!   loan lists (`cpython_loans.rs`: reusing a dead GC object's memory and skipping a live
//!   one's `tp_dealloc` are interpreter behaviours the C API does not promise), unless
//!   `FERROLOOP_PORTABLE=1`. Otherwise nothing is pooled and every handle goes through PyO3.
//! - `handle_dealloc` is the `Handle` type's `tp_dealloc` once `LAYOUT` is set. It pools only
//!   instances whose type is exactly `Handle`; others reach it only through a Python subclass's
//!   `subtype_dealloc` (`TimerHandle` has its own, `timer_dealloc`) and go to PyO3's, kept in
//!   `LAYOUT`.
//! - A block in `POOL` is the memory of a dead exact `Handle`: allocated for the `Handle` type
//!   by `PyType_GenericAlloc` (a GC header, then `tp_basicsize` bytes), untracked by the
//!   collector, its weak references cleared, its value dropped and its reference to the type
//!   released. Nothing else points to it. The pool holds at most `POOL_CAPACITY` blocks; beyond
//!   that a block goes to the type's `tp_free`.
//! - A block leaves the pool only in `new_handle`, which makes it a live handle before anything
//!   else runs: `PyObject_Init` (reference count 1, a reference to the type), the value and a
//!   NULL weak reference list written, and `PyObject_GC_Track` when the caller asks: a reused
//!   handle is tracked by the collector exactly as a new one is
//!   (`tests/loop/test_handle_objects.py` checks that, that a cycle through one is collected,
//!   and that it starts without weak references).
//! - `TIMER_LAYOUT` is set only after `LAYOUT`, and only if a `TimerHandle` instance is a
//!   `Handle` instance as `LAYOUT` describes it (the same value and weak reference list offsets,
//!   no dict), followed by the `TimerHandle` value and nothing else. `timer_dealloc` is then the
//!   type's `tp_dealloc` (`TimerHandle` cannot be subclassed); `TIMER_POOL` holds dead
//!   `TimerHandle`s under the same rules as `POOL`, and a block leaves it only in
//!   `new_timer_handle`, which initialises it (and tracks it when asked) as `new_handle` does.
//! - A handle made with its pool empty comes from `PyType_GenericAlloc`, already tracked and
//!   zeroed; its fields are written before any Python code can run, so the collector never sees
//!   them zeroed.
//! - A block in `LIVE` is a live exact `Handle` that ran and that only the pool references
//!   (reference count 1, its reference to the type held), untracked by the collector, without
//!   weak references, its value dropped. It gets there only from `release_sole`, which checks
//!   each of those on the handle its ready-queue entry held alone (nothing else can reach such
//!   an object: not the collector, which does not track it, nor a weak reference), and leaves
//!   only in `new_handle`, which writes the value (and tracks it if asked) before anything else
//!   runs. CPython never sees such a handle die, so it skips `tp_dealloc`, `PyObject_Init` and
//!   the type's reference count; a block that `release_sole` cannot pool (the pool filled while
//!   the value was dropped) gets an inert value and goes through `tp_dealloc` as usual.
//! - `POOL`, `LIVE` and `TIMER_POOL` are touched only with the GIL held (they are `LoopCell`s), in
//!   sections that run no Python code. Pooled blocks are never returned to the allocator: at
//!   most 256 handles' worth of each pool (about 30 KiB) per process, and PyO3 modules are
//!   initialised once per process.

use std::ptr::{self, NonNull};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::cell::LoopCell;
use crate::cpython_loans::{self, Loan};
use crate::handle::{Handle, TimerHandle};

/// Blocks kept for reuse: a loop that runs N callbacks per iteration frees and makes about N
/// handles in turn, so a few are enough for the steady state; the bound keeps a burst (a million
/// cancelled handles freed at once) from pinning memory.
const POOL_CAPACITY: usize = 256;

/// Where a `Handle` instance keeps what `new_handle` writes.
struct Layout {
    /// The `Handle` type (its instances hold a reference to it, as for any heap type).
    tp: Py<PyType>,
    /// Byte offset of the `Handle` value in the object.
    value: usize,
    /// Byte offset of the weak reference list (`tp_weaklistoffset`).
    weaklist: usize,
    /// PyO3's `tp_dealloc` for `Handle`, for instances of Python subclasses.
    pyo3_dealloc: unsafe extern "C" fn(*mut ffi::PyObject),
}

static LAYOUT: PyOnceLock<Layout> = PyOnceLock::new();

/// The memory of a dead `Handle` (see the module invariants).
struct Block(NonNull<ffi::PyObject>);

// SAFETY: a block is memory no object owns; it is reached only through `POOL`, with the GIL held.
unsafe impl Send for Block {}

struct Pool {
    len: usize,
    blocks: [Option<Block>; POOL_CAPACITY],
}

static POOL: LoopCell<Pool> = LoopCell::new(Pool {
    len: 0,
    blocks: [const { None }; POOL_CAPACITY],
});

/// Where a `TimerHandle` instance keeps what `new_timer_handle` writes: its `Handle` part where a
/// `Handle` keeps it (the same offsets), then the `TimerHandle` value.
struct TimerLayout {
    /// The `TimerHandle` type.
    tp: Py<PyType>,
    /// Byte offset of the `TimerHandle` value in the object.
    value: usize,
}

static TIMER_LAYOUT: PyOnceLock<TimerLayout> = PyOnceLock::new();

/// The memory of dead `TimerHandle`s, as `POOL` is for `Handle`s.
static TIMER_POOL: LoopCell<Pool> = LoopCell::new(Pool {
    len: 0,
    blocks: [const { None }; POOL_CAPACITY],
});

/// A type's instance size fields.
struct Sizes {
    basicsize: usize,
    itemsize: isize,
    weaklist: usize,
    dictoffset: isize,
}

/// The instance size fields of `tp`, if its sizes and weak reference offset are not negative.
fn sizes(tp: *mut ffi::PyTypeObject) -> Option<Sizes> {
    // SAFETY: callers pass a live type object (with the GIL held); its fields are only read.
    let (basicsize, itemsize, weaklist, dictoffset) = unsafe {
        (
            (*tp).tp_basicsize,
            (*tp).tp_itemsize,
            (*tp).tp_weaklistoffset,
            (*tp).tp_dictoffset,
        )
    };
    Some(Sizes {
        basicsize: usize::try_from(basicsize).ok()?,
        itemsize,
        weaklist: usize::try_from(weaklist).ok()?,
        dictoffset,
    })
}

/// Decides the `handle_reuse` loan (`cpython_loans.rs`): on a listed version, unless
/// `FERROLOOP_PORTABLE=1`, checks the layouts and installs the pools. Called once, at module
/// initialisation.
pub(crate) fn install(py: Python<'_>) {
    // Taken or not, `installed()` (what `LAYOUT` and `TIMER_LAYOUT` hold) says which path
    // every handle takes.
    let _ = cpython_loans::take(py, Loan::HandleReuse, || match install_pools(py) {
        Ok(()) if installed(py) => Ok(()),
        Ok(()) => Err("Handle or TimerHandle is laid out differently".to_owned()),
        Err(e) => Err(format!("checking the layouts failed: {e}")),
    });
}

/// Checks the `Handle` type's instance layout and installs `handle_dealloc` as its `tp_dealloc`.
fn install_pools(py: Python<'_>) -> PyResult<()> {
    let tp = py.get_type::<Handle>();
    let raw = tp.as_type_ptr();
    let sample = crate::handle::detached(py)?;
    let object = sample.as_ptr() as usize;
    let value = ptr::from_ref(sample.get()) as usize - object;
    let Some(Sizes {
        basicsize,
        itemsize,
        weaklist,
        dictoffset,
    }) = sizes(raw)
    else {
        return Ok(());
    };
    // SAFETY: we hold the GIL; `raw` is the live `Handle` type; the slot is only read here.
    let dealloc = unsafe { (*raw).tp_dealloc };
    let ptr_size = size_of::<*mut ffi::PyObject>();
    let value_end = value + size_of::<Handle>();
    // The value, then (after padding to a pointer's alignment) the weak reference list, then
    // nothing: any other field PyO3 might add would make the sizes disagree.
    let as_expected = itemsize == 0
        && dictoffset == 0
        && value >= size_of::<ffi::PyObject>()
        && weaklist == value_end.next_multiple_of(align_of::<*mut ffi::PyObject>())
        && basicsize == weaklist + ptr_size;
    let Some(pyo3_dealloc) = dealloc.filter(|_| as_expected) else {
        return Ok(());
    };
    if LAYOUT
        .set(
            py,
            Layout {
                tp: tp.unbind(),
                value,
                weaklist,
                pyo3_dealloc,
            },
        )
        .is_ok()
    {
        // SAFETY: `Handle` is a heap type created by PyO3; its slots are ours to set, with the
        // GIL held. `handle_dealloc` frees any instance that PyO3's `tp_dealloc` would (the
        // layout was checked above), and hands other types to that one.
        unsafe { (*raw).tp_dealloc = Some(handle_dealloc) };
        install_timer(py)?;
    }
    Ok(())
}

/// Checks the `TimerHandle` type's instance layout against `Handle`'s and installs
/// `timer_dealloc` as its `tp_dealloc`. Called by `install` once `Handle`'s layout is known.
fn install_timer(py: Python<'_>) -> PyResult<()> {
    let Some(layout) = LAYOUT.get(py) else {
        return Ok(());
    };
    let tp = py.get_type::<TimerHandle>();
    let raw = tp.as_type_ptr();
    let sample = Py::new(
        py,
        PyClassInitializer::from(crate::handle::Handle::inert(py))
            .add_subclass(TimerHandle::new(0.0)),
    )?;
    let sample = sample.bind(py);
    let object = sample.as_ptr() as usize;
    let handle_value = ptr::from_ref(sample.as_super().get()) as usize - object;
    let value = ptr::from_ref(sample.get()) as usize - object;
    let (
        Some(Sizes {
            basicsize,
            itemsize,
            weaklist,
            dictoffset,
        }),
        Some(handle),
    ) = (sizes(raw), sizes(layout.tp.as_ptr().cast()))
    else {
        return Ok(());
    };
    // A `Handle` instance as checked in `install`, then the `TimerHandle` value, then nothing.
    let as_expected = itemsize == 0
        && dictoffset == 0
        && handle_value == layout.value
        && weaklist == layout.weaklist
        && value == handle.basicsize
        && basicsize == value + size_of::<TimerHandle>();
    if !as_expected {
        return Ok(());
    }
    if TIMER_LAYOUT
        .set(
            py,
            TimerLayout {
                tp: tp.unbind(),
                value,
            },
        )
        .is_ok()
    {
        // SAFETY: `TimerHandle` is a heap type created by PyO3 (not subclassable); its slots are
        // ours to set, with the GIL held. `timer_dealloc` frees its instances as PyO3's would
        // (the layout was checked above).
        unsafe { (*raw).tp_dealloc = Some(timer_dealloc) };
    }
    Ok(())
}

/// Whether `install` found the layout it expects and pooling is on (`_native.HANDLE_POOL`, so a
/// test notices when a PyO3 upgrade turns it off).
pub(crate) fn installed(py: Python<'_>) -> bool {
    LAYOUT.get(py).is_some() && TIMER_LAYOUT.get(py).is_some()
}

/// Live `Handle`s that ran and that nothing else referenced, kept whole for the next
/// `new_handle` (see the module invariants).
static LIVE: LoopCell<Pool> = LoopCell::new(Pool {
    len: 0,
    blocks: [const { None }; POOL_CAPACITY],
});

/// Releases a handle leaving the ready queue untracked by the collector (`Queued`'s drop) whose
/// reference is the last: its value is dropped and the object kept, alive, in `LIVE` for the
/// next `new_handle`, without the dealloc and re-initialisation a pooled block goes through. A
/// handle of another type, or one with weak references, is released as usual.
#[inline]
pub(crate) fn release_sole(handle: Bound<'_, Handle>) {
    let py = handle.py();
    let obj = handle.as_ptr();
    let Some(layout) = LAYOUT.get(py) else {
        return drop(handle);
    };
    // SAFETY: the GIL is held and `obj` is alive (we hold a reference); only its header, its GC
    // header and the weak reference list word are read.
    let sole = unsafe {
        ffi::Py_REFCNT(obj) == 1
            && ffi::Py_TYPE(obj) == layout.tp.as_ptr().cast()
            && !crate::gc_head::is_tracked(obj)
            && (*obj.byte_add(layout.weaklist).cast::<*mut ffi::PyObject>()).is_null()
    };
    if !sole || pool_len(&LIVE) == POOL_CAPACITY {
        return drop(handle);
    }
    let handle = std::mem::ManuallyDrop::new(handle);
    // SAFETY: our reference is the only one to this exact, untracked `Handle` without weak
    // references (checked): no Python code can reach it, so its value can be dropped in place
    // (once; dropping it can run arbitrary code, which cannot reach the object either).
    unsafe { ptr::drop_in_place(obj.byte_add(layout.value).cast::<Handle>()) };
    // SAFETY: `obj` is still ours alone, with its value dropped; its block is not referenced
    // anywhere else (module invariants for `LIVE`).
    if !pool_block_in(&LIVE, unsafe { NonNull::new_unchecked(obj) }) {
        // Code run by the drop filled the pool: an inert value makes it an ordinary handle
        // again, freed by the usual dealloc.
        // SAFETY: as above; the value slot holds a dropped value, overwritten without a drop.
        unsafe {
            ptr::write(
                obj.byte_add(layout.value).cast::<Handle>(),
                Handle::inert(py),
            );
        }
        drop(std::mem::ManuallyDrop::into_inner(handle));
    }
}

/// How many blocks `pool` holds (full if it is borrowed: never, as no Python code runs while it
/// is).
fn pool_len(pool: &LoopCell<Pool>) -> usize {
    pool.try_borrow_for_gc().map_or(POOL_CAPACITY, |p| p.len)
}

/// `Py::new(py, handle)`, in a pooled block when there is one; tracked by the collector if
/// `track` (else the caller keeps it where it is visited in place: handle.rs's invariants).
#[allow(
    clippy::inline_always,
    reason = "the handle is written straight into the block: -77 instructions per call_soon under callgrind, with make_handle's"
)]
#[inline(always)]
pub(crate) fn new_handle(py: Python<'_>, handle: Handle, track: bool) -> PyResult<Py<Handle>> {
    let Some(layout) = LAYOUT.get(py) else {
        return Py::new(py, handle).inspect(|h| untrack_unless(h.as_ptr(), track));
    };
    if let Some(live) = take_block(&LIVE) {
        let obj = live.as_ptr();
        // SAFETY: `obj` is a live, untracked `Handle` (exact type) that only `LIVE` referenced,
        // with its value dropped and no weak references (module invariants): writing the value
        // makes it a new handle, whose one reference becomes the caller's.
        unsafe {
            ptr::write(obj.byte_add(layout.value).cast::<Handle>(), handle);
            if track {
                ffi::PyObject_GC_Track(obj.cast());
            }
            return Ok(Bound::from_owned_ptr(py, obj)
                .cast_into_unchecked()
                .unbind());
        }
    }
    let (obj, pooled) = obtain(py, &POOL, layout.tp.as_ptr().cast())?;
    // SAFETY: `obj` is a live `Handle` instance (exact type) laid out as `layout` says (checked
    // at `install`), whose fields are ours to initialise before any Python code runs.
    unsafe {
        ptr::write(obj.byte_add(layout.value).cast::<Handle>(), handle);
        Ok(finish(py, obj, layout.weaklist, pooled, track))
    }
}

/// The `Handle` type's `tp_dealloc` (see the module invariants). Dropping the value cannot
/// panic: `Drop for Handle` only releases references.
unsafe extern "C" fn handle_dealloc(obj: *mut ffi::PyObject) {
    // SAFETY: CPython calls `tp_dealloc` with the GIL held.
    let py = unsafe { Python::assume_attached() };
    let Some(layout) = LAYOUT.get(py) else {
        return;
    };
    // SAFETY: CPython calls `tp_dealloc` once, on an object whose last reference is gone.
    let tp = unsafe { ffi::Py_TYPE(obj) };
    if tp != layout.tp.as_ptr().cast() {
        // SAFETY: a Python subclass's instance: PyO3's `tp_dealloc` frees it as before.
        unsafe { (layout.pyo3_dealloc)(obj) };
        return;
    }
    // SAFETY: an exact `Handle` instance laid out as `layout` says (checked at `install`), whose
    // last reference is gone: untracked before its fields are touched; weak references cleared
    // while the value is intact, as CPython's own types do; the value dropped once (it is never
    // read again); then the memory is pooled or freed with the type's `tp_free` (which pairs
    // with `PyType_GenericAlloc`), and the instance's reference to its heap type released last.
    unsafe {
        dispose(obj, layout.weaklist, &POOL, || {
            ptr::drop_in_place(obj.byte_add(layout.value).cast::<Handle>());
        });
    }
}

/// A new `TimerHandle` (`handle` its `Handle` part), in a pooled block when there is one, else
/// allocated directly by the type's `tp_alloc` (PyO3's two-level initialiser cost about 750
/// instructions per timer under callgrind); tracked by the collector if `track`, as for
/// `new_handle`.
pub(crate) fn new_timer_handle(
    py: Python<'_>,
    handle: Handle,
    timer: TimerHandle,
    track: bool,
) -> PyResult<Py<TimerHandle>> {
    let (Some(layout), Some(timer_layout)) = (LAYOUT.get(py), TIMER_LAYOUT.get(py)) else {
        return Py::new(py, PyClassInitializer::from(handle).add_subclass(timer))
            .inspect(|h| untrack_unless(h.as_ptr(), track));
    };
    let tp = timer_layout.tp.as_ptr().cast::<ffi::PyTypeObject>();
    let (obj, pooled) = obtain(py, &TIMER_POOL, tp)?;
    // SAFETY: `obj` is a live `TimerHandle` instance laid out as the layouts say (checked at
    // `install`), whose fields are ours to initialise; a pooled block is tracked by the
    // collector once they are written, as `new_handle` does; a new one already is.
    unsafe {
        ptr::write(obj.byte_add(layout.value).cast::<Handle>(), handle);
        ptr::write(
            obj.byte_add(timer_layout.value).cast::<TimerHandle>(),
            timer,
        );
        Ok(finish(py, obj, layout.weaklist, pooled, track))
    }
}

/// A live object of type `tp` (one reference, ours) whose values are not written yet, and
/// whether it came from `pool` (then untracked, from a dead instance of `tp`) or from the type's
/// `tp_alloc` (`PyType_GenericAlloc`: zeroed and already tracked; no Python code may run before
/// its values are written, so the collector never sees them zeroed).
fn obtain(
    py: Python<'_>,
    pool: &LoopCell<Pool>,
    tp: *mut ffi::PyTypeObject,
) -> PyResult<(*mut ffi::PyObject, bool)> {
    if let Some(block) = take_block(pool) {
        let obj = block.as_ptr();
        // SAFETY: we hold the GIL; `block` is the memory of a dead instance of `tp` that nothing
        // else points to (module invariants): `PyObject_Init` makes it a live object of the
        // type with one reference (ours), as `PyType_GenericAlloc` would.
        unsafe { ffi::PyObject_Init(obj, tp) };
        return Ok((obj, true));
    }
    // SAFETY: we hold the GIL; `tp` is a live heap type whose instances `PyType_GenericAlloc`
    // makes (PyO3's own path uses it too); a new reference or NULL with an exception set.
    let obj = unsafe { ffi::PyType_GenericAlloc(tp, 0) };
    if obj.is_null() {
        return Err(PyErr::fetch(py));
    }
    Ok((obj, false))
}

/// Untracks a handle PyO3 made (tracked) unless `track`.
fn untrack_unless(obj: *mut ffi::PyObject, track: bool) {
    if !track {
        // SAFETY: the caller holds the GIL and a reference to `obj`, a new handle (a GC type)
        // that no Python code has seen yet; untracking an object is always allowed.
        unsafe { ffi::PyObject_GC_UnTrack(obj.cast()) };
    }
}

/// The common end of `new_handle` and `new_timer_handle`: an empty weak reference list, the
/// collector's tracking as `track` asks (a block from a pool is untracked;
/// `PyType_GenericAlloc` tracks what it returns), and the object as a `Py<T>` owning the one
/// reference.
///
/// # Safety
/// `obj` is a live instance of `T` (reference count 1, ours) whose values are written, with its
/// weak reference list at `weaklist`, untracked exactly when `pooled` is true.
unsafe fn finish<T>(
    py: Python<'_>,
    obj: *mut ffi::PyObject,
    weaklist: usize,
    pooled: bool,
    track: bool,
) -> Py<T> {
    // SAFETY: see the function's contract.
    unsafe {
        ptr::write(
            obj.byte_add(weaklist).cast::<*mut ffi::PyObject>(),
            ptr::null_mut(),
        );
        if pooled && track {
            ffi::PyObject_GC_Track(obj.cast());
        } else if !pooled && !track {
            ffi::PyObject_GC_UnTrack(obj.cast());
        }
        Bound::from_owned_ptr(py, obj)
            .cast_into_unchecked()
            .unbind()
    }
}

/// The `TimerHandle` type's `tp_dealloc` once `TIMER_LAYOUT` is set: as `handle_dealloc`, for
/// the one type (`TimerHandle` cannot be subclassed), into `TIMER_POOL`.
unsafe extern "C" fn timer_dealloc(obj: *mut ffi::PyObject) {
    // SAFETY: CPython calls `tp_dealloc` with the GIL held.
    let py = unsafe { Python::assume_attached() };
    let (Some(layout), Some(timer_layout)) = (LAYOUT.get(py), TIMER_LAYOUT.get(py)) else {
        return;
    };
    // SAFETY: CPython calls `tp_dealloc` once, on a `TimerHandle` whose last reference is gone,
    // laid out as the layouts say: untracked before its fields are touched; weak references
    // cleared while the values are intact; both values dropped once; then the memory pooled or
    // freed with the type's `tp_free`, and the instance's reference to its type released last.
    unsafe {
        dispose(obj, layout.weaklist, &TIMER_POOL, || {
            ptr::drop_in_place(obj.byte_add(timer_layout.value).cast::<TimerHandle>());
            ptr::drop_in_place(obj.byte_add(layout.value).cast::<Handle>());
        });
    }
}

/// A dead handle's memory from `pool`, if it has any.
#[inline]
fn take_block(pool: &LoopCell<Pool>) -> Option<NonNull<ffi::PyObject>> {
    let mut pool = pool.try_borrow_for_gc()?;
    let len = pool.len.checked_sub(1)?;
    pool.len = len;
    pool.blocks[len].take().map(|Block(block)| block)
}

/// The common end of `handle_dealloc` and `timer_dealloc`: untracks `obj`, clears its weak
/// references while its values are intact (as CPython's own types do), drops the values
/// (`drop_values`, once), pools the memory in `pool` or frees it with the type's `tp_free` (which
/// pairs with `PyType_GenericAlloc`), and releases the instance's reference to its heap type last.
///
/// # Safety
/// `obj` is an instance, laid out as the module's layouts say, of a type whose `tp_dealloc` is
/// the caller, whose last reference is gone; `weaklist` is its weak reference list's offset;
/// `drop_values` drops exactly the values the instance holds.
unsafe fn dispose(
    obj: *mut ffi::PyObject,
    weaklist: usize,
    pool: &LoopCell<Pool>,
    drop_values: impl FnOnce(),
) {
    // SAFETY: see the function's contract; each step is valid on such an object in this order.
    unsafe {
        let tp = ffi::Py_TYPE(obj);
        ffi::PyObject_GC_UnTrack(obj.cast());
        if !(*obj.byte_add(weaklist).cast::<*mut ffi::PyObject>()).is_null() {
            ffi::PyObject_ClearWeakRefs(obj);
        }
        drop_values();
        if !pool_block_in(pool, NonNull::new_unchecked(obj)) {
            if let Some(free) = (*tp).tp_free {
                free(obj.cast());
            }
        }
        ffi::Py_DECREF(tp.cast());
    }
}

/// Puts a dead handle's memory in `pool`; `false` if it is full (or in use: never, as no Python
/// code runs while it is borrowed).
#[inline]
fn pool_block_in(pool: &LoopCell<Pool>, block: NonNull<ffi::PyObject>) -> bool {
    let Some(mut pool) = pool.try_borrow_for_gc() else {
        return false;
    };
    let len = pool.len;
    if len == POOL_CAPACITY {
        return false;
    }
    pool.blocks[len] = Some(Block(block));
    pool.len = len + 1;
    true
}
