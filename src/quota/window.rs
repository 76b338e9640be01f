//! Quota room, windows: which period a moment falls in. A rolling window (`1h`, `1d`, `7d`, any
//! length of whole minutes) counts the spend of its last length of time, kept in 60 slices: a
//! slice's spend leaves the window a whole length after the slice began, so the window reaches
//! back its length to within one slice (a minute of an hour). A calendar window (`calendar-day`,
//! `calendar-month`) is the day or month it is now in its IANA time zone, DST included: its
//! spend goes at once at local midnight (of the month's first day).
//!
//! Pure: every function takes the moment as Unix milliseconds.

use anyhow::{anyhow, bail, Context};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan, ZonedDateTime};
use std::fmt;

/// How many slices a rolling window keeps.
pub const ROLLING_SLICES: i64 = 60;

/// A window's kind of period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Period {
    /// The last `length_ms`, in [`ROLLING_SLICES`] slices.
    Rolling { length_ms: i64 },
    /// Local midnight to midnight.
    CalendarDay,
    /// Local midnight of the 1st to that of the next 1st.
    CalendarMonth,
}

/// One quota window: its period, and for a calendar window its time zone.
#[derive(Clone, Debug)]
pub struct Window {
    period: Period,
    zone: TimeZone,
    label: String,
}

impl PartialEq for Window {
    fn eq(&self, other: &Self) -> bool {
        self.label == other.label
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label)
    }
}

impl Window {
    /// The window `window` (`"1h"`, `"7d"`, `"calendar-day"`, `"calendar-month"`) in the IANA
    /// time zone `timezone` (UTC when `None`; only calendar windows have one).
    pub fn parse(window: &str, timezone: Option<&str>) -> anyhow::Result<Self> {
        let period = match window {
            "calendar-day" => Period::CalendarDay,
            "calendar-month" => Period::CalendarMonth,
            rolling => {
                let length = humantime::parse_duration(rolling).map_err(|_| {
                    anyhow!(
                        "window {rolling:?} is neither calendar-day, calendar-month nor a length such as 1h, 1d or 7d"
                    )
                })?;
                let length_ms = i64::try_from(length.as_millis()).unwrap_or(i64::MAX);
                if length_ms % 60_000 != 0 || !(60_000..=366 * 86_400_000).contains(&length_ms) {
                    bail!(
                        "window {rolling:?}: a rolling window is whole minutes, from 1m to 366d (a calendar window is calendar-day or calendar-month)"
                    );
                }
                if let Some(zone) = timezone {
                    bail!(
                        "window {rolling:?} is a rolling length of time, the same in every time zone: timezone {zone:?} applies to calendar-day and calendar-month windows"
                    );
                }
                Period::Rolling { length_ms }
            }
        };
        let zone = match timezone {
            None | Some("UTC") => TimeZone::UTC,
            Some(name) => TimeZone::get(name).with_context(|| {
                format!("timezone {name:?} is not an IANA time zone name (such as Europe/Berlin or Asia/Shanghai)")
            })?,
        };
        let label = match timezone {
            Some(name) if name != "UTC" => format!("{window}@{name}"),
            _ => window.to_string(),
        };
        Ok(Self {
            period,
            zone,
            label,
        })
    }

    /// The window as configured: `calendar-day`, or `calendar-day@Asia/Shanghai` outside UTC.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The IANA name of the window's time zone (`UTC` for a rolling window).
    pub fn timezone(&self) -> &str {
        self.label.split_once('@').map_or("UTC", |(_, zone)| zone)
    }

    /// Whether spend leaves this window slice by slice (rolling) rather than all at once at
    /// the end of its period (calendar).
    pub fn is_rolling(&self) -> bool {
        matches!(self.period, Period::Rolling { .. })
    }

    /// The start of the slice (rolling) or period (calendar) that `now` is in: spend made at
    /// `now` is kept under it.
    pub fn slice_start(&self, now: i64) -> i64 {
        match self.period {
            Period::Rolling { length_ms } => {
                let slice = length_ms / ROLLING_SLICES;
                now - now.rem_euclid(slice)
            }
            Period::CalendarDay | Period::CalendarMonth => self.period_bounds(now).0,
        }
    }

    /// When the spend kept under the slice or period that began at `slice_start` leaves the
    /// window.
    pub fn leaves_at(&self, slice_start: i64) -> i64 {
        match self.period {
            Period::Rolling { length_ms } => slice_start.saturating_add(length_ms),
            Period::CalendarDay | Period::CalendarMonth => self.period_bounds(slice_start).1,
        }
    }

    /// Whether the spend kept under `slice_start` is in the window at `now`.
    pub fn holds(&self, slice_start: i64, now: i64) -> bool {
        slice_start <= now && self.leaves_at(slice_start) > now
    }

    /// The window's length at `now`, in seconds: a rolling window's length, or the current
    /// day's or month's (a DST day is 23 or 25 hours).
    pub fn length_seconds(&self, now: i64) -> u64 {
        let (start, end) = match self.period {
            Period::Rolling { length_ms } => (0, length_ms),
            Period::CalendarDay | Period::CalendarMonth => self.period_bounds(now),
        };
        ((end - start) / 1000).max(0) as u64
    }

    /// The day or month that `now` is in, as Unix milliseconds `[start, end)`.
    fn period_bounds(&self, now: i64) -> (i64, i64) {
        let at = Timestamp::from_millisecond(now)
            .unwrap_or(Timestamp::UNIX_EPOCH)
            .to_zoned_datetime(self.zone.clone());
        let (start, end) = match self.period {
            Period::CalendarMonth => {
                let first = at.first_of_month().and_then(|d| d.start_of_day());
                let next = first.as_ref().ok().map(|f| f.checked_add(1.month()));
                (first, next)
            }
            _ => {
                let start = at.start_of_day();
                let next = at.tomorrow().and_then(|d| d.start_of_day());
                (start, Some(next))
            }
        };
        let ms = |z: &ZonedDateTime| z.timestamp().as_millisecond();
        match (start, end) {
            (Ok(start), Some(Ok(end))) => (ms(&start), ms(&end)),
            // The end of jiff's range (the year 9999): one period that never ends.
            _ => (now, i64::MAX),
        }
    }

    /// `at` (Unix milliseconds) as an RFC 3339 time in the window's zone.
    pub fn local_time(&self, at: i64) -> String {
        match Timestamp::from_millisecond(at) {
            Ok(t) => t
                .to_zoned_datetime(self.zone.clone())
                .strftime("%Y-%m-%dT%H:%M:%S%:z")
                .to_string(),
            Err(_) => "never".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unix milliseconds of an RFC 3339 time.
    fn at(time: &str) -> i64 {
        time.parse::<Timestamp>().expect("a time").as_millisecond()
    }

    #[test]
    fn a_calendar_day_in_a_zone_starts_at_its_local_midnight() {
        let day = Window::parse("calendar-day", Some("Asia/Shanghai")).unwrap();
        assert_eq!(day.label(), "calendar-day@Asia/Shanghai");
        // 23:59 UTC on the 1st is 07:59 on the 2nd in Shanghai (UTC+8).
        let now = at("2026-12-01T23:59:00Z");
        assert_eq!(day.slice_start(now), at("2026-12-01T16:00:00Z"));
        assert_eq!(
            day.leaves_at(day.slice_start(now)),
            at("2026-12-02T16:00:00Z")
        );
        assert_eq!(
            day.local_time(day.slice_start(now)),
            "2026-12-02T00:00:00+08:00"
        );
        // One millisecond before local midnight the day is the old one; at it, the new one.
        assert!(day.holds(day.slice_start(now), at("2026-12-02T15:59:59.999Z")));
        assert!(!day.holds(day.slice_start(now), at("2026-12-02T16:00:00Z")));
        assert_eq!(day.length_seconds(now), 86_400);
    }

    #[test]
    fn a_dst_day_is_23_or_25_hours_long() {
        let day = Window::parse("calendar-day", Some("Europe/Berlin")).unwrap();
        // 2026-03-29: clocks go from 02:00 to 03:00 CET -> CEST.
        let spring = at("2026-03-29T12:00:00Z");
        assert_eq!(day.slice_start(spring), at("2026-03-28T23:00:00Z"));
        assert_eq!(
            day.leaves_at(day.slice_start(spring)),
            at("2026-03-29T22:00:00Z")
        );
        assert_eq!(day.length_seconds(spring), 23 * 3600);
        // 2026-10-25: back from 03:00 to 02:00.
        assert_eq!(day.length_seconds(at("2026-10-25T12:00:00Z")), 25 * 3600);
    }

    #[test]
    fn a_calendar_month_ends_at_the_next_firsts_local_midnight() {
        let month = Window::parse("calendar-month", Some("America/New_York")).unwrap();
        // 2027-01-01T03:00Z is still Dec 31, 22:00 in New York (UTC-5).
        let now = at("2027-01-01T03:00:00Z");
        assert_eq!(month.slice_start(now), at("2026-12-01T05:00:00Z"));
        assert_eq!(
            month.leaves_at(month.slice_start(now)),
            at("2027-01-01T05:00:00Z")
        );
        assert_eq!(month.length_seconds(now), 31 * 86_400);
        // February 2028 (a leap year) has 29 days; March starts in EST, ends in EDT.
        let feb = at("2028-02-10T00:00:00Z");
        assert_eq!(month.length_seconds(feb), 29 * 86_400);
        let march = at("2028-03-10T00:00:00Z");
        assert_eq!(month.length_seconds(march), 31 * 86_400 - 3600);
        let utc = Window::parse("calendar-month", None).unwrap();
        assert_eq!(utc.label(), "calendar-month");
        assert_eq!(utc.slice_start(now), at("2027-01-01T00:00:00Z"));
    }

    #[test]
    fn a_rolling_window_keeps_sixty_slices_each_leaving_a_length_after_it_began() {
        let hour = Window::parse("1h", None).unwrap();
        assert!(hour.is_rolling());
        let now = at("2026-12-01T10:30:45Z");
        assert_eq!(hour.slice_start(now), at("2026-12-01T10:30:00Z"));
        assert_eq!(
            hour.leaves_at(hour.slice_start(now)),
            at("2026-12-01T11:30:00Z")
        );
        assert!(hour.holds(at("2026-12-01T09:31:00Z"), now));
        assert!(!hour.holds(at("2026-12-01T09:30:00Z"), now));
        assert_eq!(hour.length_seconds(now), 3600);
        let week = Window::parse("7d", None).unwrap();
        assert_eq!(week.slice_start(now) % (7 * 86_400_000 / 60), 0);
    }

    #[test]
    fn windows_that_cannot_be_are_refused_naming_what_is_wrong() {
        let e = |w: &str, z: Option<&str>| Window::parse(w, z).unwrap_err().to_string();
        assert_eq!(
            e("weekly", None),
            "window \"weekly\" is neither calendar-day, calendar-month nor a length such as 1h, 1d or 7d"
        );
        assert_eq!(
            e("90s", None),
            "window \"90s\": a rolling window is whole minutes, from 1m to 366d (a calendar window is calendar-day or calendar-month)"
        );
        assert_eq!(
            e("1d", Some("Europe/Berlin")),
            "window \"1d\" is a rolling length of time, the same in every time zone: timezone \"Europe/Berlin\" applies to calendar-day and calendar-month windows"
        );
        assert_eq!(
            e("calendar-day", Some("Mars/Olympus")),
            "timezone \"Mars/Olympus\" is not an IANA time zone name (such as Europe/Berlin or Asia/Shanghai)"
        );
    }
}
