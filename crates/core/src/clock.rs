//! The loop's clock: `CLOCK_MONOTONIC` as float seconds, the same clock as `time.monotonic()`,
//! so `loop.time()` can be compared with it exactly as asyncio's can.

/// Seconds on `CLOCK_MONOTONIC`.
pub fn monotonic() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux, so the
    // call cannot fail and its return value carries no information.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

#[cfg(test)]
mod tests {
    #[test]
    fn monotonic_never_goes_back() {
        let a = super::monotonic();
        let b = super::monotonic();
        assert!(b >= a);
        assert!(a > 0.0);
    }
}
