//! Epoch milliseconds as a UTC calendar date and time of day (proleptic Gregorian), for the
//! timestamps we print: the agent's `ts` meta (`MM/DD/YY HH:MM:SS UTC`) and the operator
//! verbs' `YYYY-MM-DD HH:MM:SS UTC`. The one place the calendar arithmetic lives.

/// A UTC date and time of day, to the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtcDateTime {
    /// The year (may be before 1970 or negative).
    pub year: i64,
    /// 1–12.
    pub month: u32,
    /// 1–31.
    pub day: u32,
    /// 0–23.
    pub hour: u32,
    /// 0–59.
    pub minute: u32,
    /// 0–59.
    pub second: u32,
}

impl UtcDateTime {
    /// The second `ms` (milliseconds since 1970-01-01T00:00:00Z) falls in; times before the
    /// epoch round down, as a clock would show them.
    pub fn from_epoch_ms(ms: i64) -> UtcDateTime {
        let secs = ms.div_euclid(1000);
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400) as u32;
        let (year, month, day) = civil_from_days(days);
        UtcDateTime {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem % 3600 / 60,
            second: rem % 60,
        }
    }
}

/// Days since 1970-01-01 to (year, month, day) (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::UtcDateTime;

    fn at(ms: i64) -> (i64, u32, u32, u32, u32, u32) {
        let t = UtcDateTime::from_epoch_ms(ms);
        (t.year, t.month, t.day, t.hour, t.minute, t.second)
    }

    #[test]
    fn known_instants() {
        assert_eq!(at(0), (1970, 1, 1, 0, 0, 0));
        assert_eq!(at(-1), (1969, 12, 31, 23, 59, 59));
        assert_eq!(at(951_782_400_000), (2000, 2, 29, 0, 0, 0));
        assert_eq!(at(1_713_190_000_000), (2024, 4, 15, 14, 6, 40));
        assert_eq!(at(4_102_444_799_000), (2099, 12, 31, 23, 59, 59));
        assert_eq!(at(-62_135_596_800_000), (1, 1, 1, 0, 0, 0));
    }
}
