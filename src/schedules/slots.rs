//! When a schedule fires: its slots (cron in a time zone, or a fixed
//! interval) and, after a wake-up or a downtime, which slots to fire now.
//!
//! Pure: no clock, no store. [`Timing::due`] is the one decision the
//! firing loop asks for, so every catch-up rule is unit-tested here with
//! made-up times instead of minutes of waiting.

use std::time::Duration;

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

/// Most slots one wake-up fires under [`CatchUp::All`]: the latest ones.
pub const MAX_CATCH_UP: usize = 100;

/// How late a slot may be fired and still count as on time (a wake-up
/// late by scheduling jitter, a slow store): under [`CatchUp::None`] a
/// slot later than this is skipped.
pub const ON_TIME_GRACE: Duration = Duration::from_secs(5);

/// What a schedule does with the slots it missed (the server was down).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum CatchUp {
    /// Fires once for all of them: the latest (the default).
    #[default]
    One,
    /// Skips them: the next fire is the next slot to come.
    None,
    /// Fires each of them, oldest first, at most [`MAX_CATCH_UP`] (the
    /// latest ones).
    All,
}

/// Why a cron expression, interval or time zone is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    #[error(
        "'cron' is not a cron expression ({reason}): 5 fields (minute hour day month weekday), or 6 with seconds first"
    )]
    Cron { reason: String },
    #[error("'cron' matches no time")]
    CronNeverFires,
    #[error("'interval_s' must be at least 1 and at most {max}")]
    Interval { max: u64 },
    #[error("'timezone' is not a known IANA time zone name (e.g. 'Europe/Paris', 'UTC')")]
    TimeZone,
}

/// Longest interval: a year.
pub const MAX_INTERVAL_S: u64 = 366 * 24 * 3600;

/// A schedule's timing, parsed.
#[derive(Debug, Clone)]
pub enum Timing {
    /// Slots where `cron` matches the wall clock of `tz`.
    Cron { cron: Box<Cron>, tz: TimeZone },
    /// Slots `anchor + k * every`, for every whole `k` (time zones do not
    /// matter).
    Interval { every: u64, anchor: Timestamp },
}

/// What to do at `now` with a schedule whose next slot was `next`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// The slots to fire now, oldest first (possibly none: all skipped).
    pub fire: Vec<Timestamp>,
    /// The first slot after `now`: the next to wait for.
    pub next: Timestamp,
}

impl Timing {
    /// A cron expression (5 fields, or 6 with seconds first; no year
    /// field) in time zone `timezone`.
    pub fn cron(expr: &str, timezone: &str) -> Result<Timing, TimingError> {
        let tz = time_zone(timezone)?;
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(expr)
            .map_err(|e| TimingError::Cron {
                reason: e.to_string(),
            })?;
        let timing = Timing::Cron {
            cron: Box::new(cron),
            tz,
        };
        // `0 0 30 2 *` parses and never matches.
        if timing.next_after(Timestamp::UNIX_EPOCH).is_none() {
            return Err(TimingError::CronNeverFires);
        }
        Ok(timing)
    }

    /// Every `every` seconds from `anchor`.
    pub fn interval(every: u64, anchor: Timestamp) -> Result<Timing, TimingError> {
        if every == 0 || every > MAX_INTERVAL_S {
            return Err(TimingError::Interval {
                max: MAX_INTERVAL_S,
            });
        }
        Ok(Timing::Interval { every, anchor })
    }

    /// The first slot strictly after `t` (`None`: no more slots, which a
    /// checked cron expression never says within jiff's years).
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        match self {
            Timing::Cron { cron, tz } => {
                let zoned = t.to_zoned(tz.clone());
                cron.find_next_occurrence(&zoned, false)
                    .ok()
                    .map(|z| z.timestamp())
            }
            Timing::Interval { every, anchor } => {
                let every_ms = i128::from(*every) * 1000;
                let since = i128::from(t.as_millisecond()) - i128::from(anchor.as_millisecond());
                let k = since.div_euclid(every_ms) + 1;
                from_ms(i128::from(anchor.as_millisecond()) + k * every_ms)
            }
        }
    }

    /// The last slot at or before `t`.
    pub fn at_or_before(&self, t: Timestamp) -> Option<Timestamp> {
        match self {
            Timing::Cron { cron, tz } => {
                let zoned = t.to_zoned(tz.clone());
                cron.find_previous_occurrence(&zoned, true)
                    .ok()
                    .map(|z| z.timestamp())
            }
            Timing::Interval { every, anchor } => {
                let every_ms = i128::from(*every) * 1000;
                let since = i128::from(t.as_millisecond()) - i128::from(anchor.as_millisecond());
                let k = since.div_euclid(every_ms);
                from_ms(i128::from(anchor.as_millisecond()) + k * every_ms)
            }
        }
    }

    /// The slot before `slot` (which is one).
    fn before(&self, slot: Timestamp) -> Option<Timestamp> {
        self.at_or_before(slot.checked_sub(SignedDuration::from_millis(1)).ok()?)
    }

    /// What to fire at `now` when the next slot not yet fired is `next`;
    /// `None` while `next` is still to come. The latest slot at or before
    /// `now` fires under every policy when it is at most [`ON_TIME_GRACE`]
    /// late; older ones are missed slots, which `catch_up` decides.
    pub fn due(&self, next: Timestamp, now: Timestamp, catch_up: CatchUp) -> Option<Due> {
        if next > now {
            return None;
        }
        let following = self.next_after(now).unwrap_or(Timestamp::MAX);
        let Some(latest) = self.at_or_before(now).filter(|l| *l >= next) else {
            // `next` was not a slot of this timing (it changed): nothing
            // between it and now is one.
            return Some(Due {
                fire: Vec::new(),
                next: following,
            });
        };
        let late = now.duration_since(latest);
        let on_time = late <= SignedDuration::try_from(ON_TIME_GRACE).unwrap_or_default();
        let fire = match catch_up {
            CatchUp::One => vec![latest],
            CatchUp::None if on_time => vec![latest],
            CatchUp::None => Vec::new(),
            CatchUp::All => {
                let mut slots = vec![latest];
                while slots.len() < MAX_CATCH_UP {
                    match self.before(*slots.last().expect("one at least")) {
                        Some(s) if s >= next => slots.push(s),
                        _ => break,
                    }
                }
                slots.reverse();
                slots
            }
        };
        Some(Due {
            fire,
            next: following,
        })
    }
}

/// A known IANA time zone (`UTC` included).
pub fn time_zone(name: &str) -> Result<TimeZone, TimingError> {
    if name.is_empty() || name.len() > 64 {
        return Err(TimingError::TimeZone);
    }
    TimeZone::get(name).map_err(|_| TimingError::TimeZone)
}

fn from_ms(ms: i128) -> Option<Timestamp> {
    Timestamp::from_millisecond(i64::try_from(ms).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn every_minute_from(anchor: &str) -> Timing {
        Timing::interval(60, at(anchor)).unwrap()
    }

    #[test]
    fn an_interval_counts_from_its_anchor() {
        let t = every_minute_from("2026-01-01T00:00:30Z");
        assert_eq!(
            t.next_after(at("2026-01-01T00:00:30Z")),
            Some(at("2026-01-01T00:01:30Z"))
        );
        assert_eq!(
            t.next_after(at("2026-01-01T00:05:00Z")),
            Some(at("2026-01-01T00:05:30Z"))
        );
        assert_eq!(
            t.at_or_before(at("2026-01-01T00:05:30Z")),
            Some(at("2026-01-01T00:05:30Z"))
        );
        assert_eq!(
            t.at_or_before(at("2026-01-01T00:05:29Z")),
            Some(at("2026-01-01T00:04:30Z"))
        );
    }

    #[test]
    fn a_slot_still_to_come_is_not_due() {
        let t = every_minute_from("2026-01-01T00:00:00Z");
        assert_eq!(
            t.due(
                at("2026-01-01T00:02:00Z"),
                at("2026-01-01T00:01:59Z"),
                CatchUp::One
            ),
            None
        );
    }

    #[test]
    fn an_on_time_slot_fires_under_every_policy() {
        let t = every_minute_from("2026-01-01T00:00:00Z");
        for policy in [CatchUp::One, CatchUp::None, CatchUp::All] {
            let due = t
                .due(
                    at("2026-01-01T00:02:00Z"),
                    at("2026-01-01T00:02:00.020Z"),
                    policy,
                )
                .unwrap();
            assert_eq!(due.fire, vec![at("2026-01-01T00:02:00Z")], "{policy:?}");
            assert_eq!(due.next, at("2026-01-01T00:03:00Z"));
        }
    }

    #[test]
    fn after_downtime_one_fires_once_for_every_missed_slot() {
        let t = every_minute_from("2026-01-01T00:00:00Z");
        // Down from 00:02 to 00:10:30: nine slots missed.
        let due = t
            .due(
                at("2026-01-01T00:02:00Z"),
                at("2026-01-01T00:10:30Z"),
                CatchUp::One,
            )
            .unwrap();
        assert_eq!(due.fire, vec![at("2026-01-01T00:10:00Z")]);
        assert_eq!(due.next, at("2026-01-01T00:11:00Z"));
    }

    #[test]
    fn after_downtime_none_skips_to_the_next_slot() {
        let t = every_minute_from("2026-01-01T00:00:00Z");
        let due = t
            .due(
                at("2026-01-01T00:02:00Z"),
                at("2026-01-01T00:10:30Z"),
                CatchUp::None,
            )
            .unwrap();
        assert!(due.fire.is_empty());
        assert_eq!(due.next, at("2026-01-01T00:11:00Z"));
    }

    #[test]
    fn after_downtime_all_fires_each_missed_slot_at_most_the_bound() {
        let t = every_minute_from("2026-01-01T00:00:00Z");
        let due = t
            .due(
                at("2026-01-01T00:02:00Z"),
                at("2026-01-01T00:04:30Z"),
                CatchUp::All,
            )
            .unwrap();
        assert_eq!(
            due.fire,
            vec![
                at("2026-01-01T00:02:00Z"),
                at("2026-01-01T00:03:00Z"),
                at("2026-01-01T00:04:00Z")
            ]
        );
        // A week down with a one-second interval: the latest 100 only.
        let t = Timing::interval(1, at("2026-01-01T00:00:00Z")).unwrap();
        let due = t
            .due(
                at("2026-01-01T00:00:01Z"),
                at("2026-01-08T00:00:00Z"),
                CatchUp::All,
            )
            .unwrap();
        assert_eq!(due.fire.len(), MAX_CATCH_UP);
        assert_eq!(due.fire.last(), Some(&at("2026-01-08T00:00:00Z")));
        assert!(due.fire.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn cron_slots_follow_the_wall_clock_of_the_time_zone() {
        // 09:00 on weekdays in Paris: 08:00 UTC in winter.
        let t = Timing::cron("0 9 * * 1-5", "Europe/Paris").unwrap();
        // Friday 2026-01-02 10:00 UTC -> Monday 2026-01-05 08:00 UTC.
        assert_eq!(
            t.next_after(at("2026-01-02T10:00:00Z")),
            Some(at("2026-01-05T08:00:00Z"))
        );
        // Summer: 07:00 UTC.
        assert_eq!(
            t.next_after(at("2026-07-01T12:00:00Z")),
            Some(at("2026-07-02T07:00:00Z"))
        );
        // Down over the weekend and Monday morning: once, Monday's.
        let due = t
            .due(
                at("2026-01-02T08:00:00Z"),
                at("2026-01-05T12:00:00Z"),
                CatchUp::One,
            )
            .unwrap();
        assert_eq!(due.fire, vec![at("2026-01-05T08:00:00Z")]);
        assert_eq!(due.next, at("2026-01-06T08:00:00Z"));
    }

    #[test]
    fn cron_takes_an_optional_seconds_field() {
        let t = Timing::cron("*/10 * * * * *", "UTC").unwrap();
        assert_eq!(
            t.next_after(at("2026-01-01T00:00:01Z")),
            Some(at("2026-01-01T00:00:10Z"))
        );
        let t = Timing::cron("*/5 * * * *", "UTC").unwrap();
        assert_eq!(
            t.next_after(at("2026-01-01T00:00:01Z")),
            Some(at("2026-01-01T00:05:00Z"))
        );
    }

    #[test]
    fn bad_timings_are_refused_with_a_reason() {
        assert!(matches!(
            Timing::cron("every day", "UTC"),
            Err(TimingError::Cron { .. })
        ));
        assert!(matches!(
            Timing::cron("0 9 * * * * 2030", "UTC"),
            Err(TimingError::Cron { .. })
        ));
        assert_eq!(
            Timing::cron("0 0 30 2 *", "UTC").unwrap_err(),
            TimingError::CronNeverFires
        );
        assert_eq!(
            Timing::cron("0 9 * * *", "Mars/Olympus").unwrap_err(),
            TimingError::TimeZone
        );
        assert!(matches!(
            Timing::interval(0, Timestamp::UNIX_EPOCH),
            Err(TimingError::Interval { .. })
        ));
    }
}
