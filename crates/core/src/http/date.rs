//! The `Date` header value: IMF-fixdate (RFC 9110 §5.6.7), e.g. `Sun, 06 Nov 1994 08:49:37 GMT`.
//!
//! Invariant: [`DateCache`] is owned by one connection layer (one loop thread); it reformats only
//! when the wall-clock second changes, so the per-response cost is one clock read.

use std::time::{SystemTime, UNIX_EPOCH};

const WEEKDAYS: [&[u8; 3]; 7] = [b"Sun", b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat"];
const MONTHS: [&[u8; 3]; 12] = [
    b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec",
];
/// 9999-12-31T23:59:59Z: the last second with a four-digit year; later times are clamped to it.
const LAST_FORMATTABLE: u64 = 253_402_300_799;

/// Formats `unix_secs` (seconds since 1970-01-01T00:00:00Z) as an IMF-fixdate.
pub fn format_http_date(unix_secs: u64) -> [u8; 29] {
    let secs = unix_secs.min(LAST_FORMATTABLE);
    let days = secs / 86_400;
    let in_day = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday.
    let weekday = WEEKDAYS[((days + 4) % 7) as usize];

    let mut out = *b"Thu, 01 Jan 1970 00:00:00 GMT";
    out[..3].copy_from_slice(weekday);
    put_two(&mut out[5..7], day);
    out[8..11].copy_from_slice(MONTHS[(month - 1) as usize]);
    put_two(&mut out[12..14], year / 100);
    put_two(&mut out[14..16], year % 100);
    put_two(&mut out[17..19], in_day / 3600);
    put_two(&mut out[20..22], in_day / 60 % 60);
    put_two(&mut out[23..25], in_day % 60);
    out
}

fn put_two(out: &mut [u8], n: u64) {
    out[0] = b'0' + (n / 10) as u8;
    out[1] = b'0' + (n % 10) as u8;
}

/// (year, month 1..=12, day 1..=31) of the proleptic Gregorian calendar, `days` after 1970-01-01.
///
/// Counts in 400-year eras starting on 0000-03-01, so that the leap day is the last day of its
/// "year" and every era has the same 146097 days; months are counted from March, when each has a
/// length that the 153-days-per-5-months rule produces.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Days from 0000-03-01 to 1970-01-01.
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    // Years into the era: remove the leap days (every 4th year, not every 100th, but every 400th).
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    // Month from March = 0; 153 days per 5 months.
    let march_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * march_month + 2) / 5 + 1;
    let month = if march_month < 10 {
        march_month + 3
    } else {
        march_month - 9
    };
    let year = era * 400 + year_of_era + u64::from(month <= 2);
    (year, month, day)
}

/// The current `Date` value, reformatted only when the second changes.
#[derive(Debug, Clone)]
pub struct DateCache {
    second: u64,
    value: [u8; 29],
}

impl DateCache {
    pub fn new() -> Self {
        let second = now_secs();
        Self {
            second,
            value: format_http_date(second),
        }
    }

    /// The IMF-fixdate of the current wall-clock second.
    pub fn get(&mut self) -> &[u8; 29] {
        let now = now_secs();
        if now != self.second {
            self.second = now;
            self.value = format_http_date(now);
        }
        &self.value
    }
}

impl Default for DateCache {
    fn default() -> Self {
        Self::new()
    }
}

fn now_secs() -> u64 {
    // A clock before 1970 is a misconfigured host; 1970 is as good a date as any then.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_timestamps() {
        let cases: &[(u64, &str)] = &[
            (0, "Thu, 01 Jan 1970 00:00:00 GMT"),
            (784_111_777, "Sun, 06 Nov 1994 08:49:37 GMT"),
            // Leap years: a 29 February divisible by 4, by 400, and the day after.
            (951_782_400, "Tue, 29 Feb 2000 00:00:00 GMT"),
            (951_868_799, "Tue, 29 Feb 2000 23:59:59 GMT"),
            (951_868_800, "Wed, 01 Mar 2000 00:00:00 GMT"),
            (1_709_164_800, "Thu, 29 Feb 2024 00:00:00 GMT"),
            // 2100 is not a leap year: 28 February is followed by 1 March.
            (4_107_456_000, "Sun, 28 Feb 2100 00:00:00 GMT"),
            (4_107_542_400, "Mon, 01 Mar 2100 00:00:00 GMT"),
            (1_735_689_599, "Tue, 31 Dec 2024 23:59:59 GMT"),
            (1_735_689_600, "Wed, 01 Jan 2025 00:00:00 GMT"),
            (2_147_483_647, "Tue, 19 Jan 2038 03:14:07 GMT"),
            (LAST_FORMATTABLE, "Fri, 31 Dec 9999 23:59:59 GMT"),
            (u64::MAX, "Fri, 31 Dec 9999 23:59:59 GMT"),
        ];
        for &(secs, want) in cases {
            let got = format_http_date(secs);
            assert_eq!(std::str::from_utf8(&got).unwrap(), want, "{secs}");
        }
    }

    #[test]
    fn every_day_follows_the_previous_one() {
        // Walk 1970..2400 day by day: the day of month increments or wraps to 1 with the month,
        // and the weekday cycles.
        let mut prev = civil_from_days(0);
        for days in 1..(430 * 366) {
            let (y, m, d) = civil_from_days(days);
            let (py, pm, pd) = prev;
            let next_day = (y, m, d) == (py, pm, pd + 1);
            let next_month = (y, m, d) == (py, pm + 1, 1);
            let next_year = (y, m, d) == (py + 1, 1, 1) && (pm, pd) == (12, 31);
            assert!(
                next_day || next_month || next_year,
                "{prev:?} -> {:?}",
                (y, m, d)
            );
            let leap = (py % 4 == 0 && py % 100 != 0) || py % 400 == 0;
            if next_month {
                let len = [
                    31,
                    if leap { 29 } else { 28 },
                    31,
                    30,
                    31,
                    30,
                    31,
                    31,
                    30,
                    31,
                    30,
                    31,
                ];
                assert_eq!(pd, len[(pm - 1) as usize], "{prev:?}");
            }
            prev = (y, m, d);
        }
    }

    #[test]
    fn cache_matches_the_clock() {
        let mut cache = DateCache::new();
        let before = now_secs();
        let got = cache.get().to_vec();
        let after = now_secs();
        assert!(got == format_http_date(before) || got == format_http_date(after));
    }
}
