use super::*;
use proptest::prelude::*;

const MINUTE: i64 = 60_000;

fn meter(window: &str, zone: Option<&str>, unit: Unit, limit: u64) -> Meter {
    Meter {
        window: Window::parse(window, zone).expect("a window"),
        unit,
        limit,
        currency: None,
    }
}

fn at(time: &str) -> i64 {
    time.parse::<jiff::Timestamp>()
        .expect("a time")
        .as_millisecond()
}

#[test]
fn usage_in_each_unit_and_its_most_whatever_is_cached() {
    let usage = Usage {
        prompt: 1000,
        cached: 600,
        output: 50,
    };
    let weights = Weights {
        prefill: 1000,
        decode: 4000,
        cached: 100,
    };
    // $0.60, $0.06 and $3.60 per million tokens, in pico-dollars per token.
    let price = Price {
        input: 600_000,
        cached_input: 60_000,
        output: 3_600_000,
        currency: "USD".into(),
    };
    let amount = |unit| usage.amount(unit, &weights, Some(&price));
    assert_eq!(amount(Unit::Prefill), 1000);
    assert_eq!(amount(Unit::Decode), 50);
    assert_eq!(amount(Unit::Total), 1050);
    // 400 + 0.1 x 600 + 4 x 50 = 660.
    assert_eq!(amount(Unit::Weighted), 660);
    // 400 x 0.6 + 600 x 0.06 + 50 x 3.6 micro-dollars = 456 micro-dollars.
    assert_eq!(amount(Unit::Cost), 456_000_000);
    // At admission nothing is known to be cached: the most is the uncached prompt's.
    assert_eq!(usage.most(Unit::Weighted, &weights, Some(&price)), 1200);
    assert_eq!(usage.most(Unit::Cost, &weights, Some(&price)), 780_000_000);
    // A weight that rounds: 0.1 x 3 tokens is 0.3, charged 1.
    let three = Usage {
        prompt: 3,
        cached: 3,
        output: 0,
    };
    assert_eq!(three.amount(Unit::Weighted, &weights, None), 1);
    assert_eq!(three.amount(Unit::Cost, &weights, None), 0);
}

#[test]
fn a_reservation_takes_every_meter_or_none_and_settles_into_what_was_used() {
    let now = at("2026-12-01T10:00:00Z");
    let meters = [
        meter("calendar-day", None, Unit::Decode, 1000),
        meter("1h", None, Unit::Total, 5000),
    ];
    let mut state = TenantState::new();
    let readings = reserve(&mut state, &meters, &[600, 900], now).unwrap();
    assert_eq!((readings[0].reserved, readings[0].remaining()), (600, 400));
    // The second request fits the hour but not the day: nothing is taken from either.
    let denial = reserve(&mut state, &meters, &[500, 900], now).unwrap_err();
    assert_eq!(
        (
            denial.reading.meter.id().as_str(),
            denial.needed,
            denial.never
        ),
        ("calendar-day|decode", 500, false)
    );
    // Only a request in flight is in the way: it settles within its deadline.
    assert_eq!(denial.retry_after, Duration::from_secs(1));
    assert_eq!(state["1h|total"].reserved, 900);
    settle(&mut state, &meters, &[600, 900], &[100, 400], now + 5);
    let readings = read(&mut state, &meters, now + 5);
    assert_eq!(
        (readings[0].spent, readings[0].reserved, readings[1].spent),
        (100, 0, 400)
    );
    reserve(&mut state, &meters, &[500, 900], now + 5).unwrap();
}

#[test]
fn a_calendar_day_in_shanghai_resets_at_its_midnight_and_the_refusal_says_when() {
    let meters = [meter(
        "calendar-day",
        Some("Asia/Shanghai"),
        Unit::Decode,
        100,
    )];
    let mut state = TenantState::new();
    let before = at("2026-12-01T15:59:00Z");
    reserve(&mut state, &meters, &[100], before).unwrap();
    settle(&mut state, &meters, &[100], &[100], before);
    let denial = reserve(&mut state, &meters, &[1], before).unwrap_err();
    assert_eq!(denial.retry_after, Duration::from_secs(60));
    assert_eq!(denial.reading.resets_at, at("2026-12-01T16:00:00Z"));
    assert_eq!(
        denial
            .reading
            .meter
            .window
            .local_time(denial.reading.resets_at),
        "2026-12-02T00:00:00+08:00"
    );
    // Local midnight: the day is new, its spend gone.
    let after = at("2026-12-01T16:00:00Z");
    let readings = reserve(&mut state, &meters, &[100], after).unwrap();
    assert_eq!((readings[0].spent, readings[0].reserved), (0, 100));
}

#[test]
fn a_calendar_month_ends_at_local_midnight_of_the_first() {
    let meters = [meter(
        "calendar-month",
        Some("America/Los_Angeles"),
        Unit::Total,
        10,
    )];
    let mut state = TenantState::new();
    // 2027-01-01T07:59Z is Dec 31, 23:59 in Los Angeles (UTC-8).
    let last = at("2027-01-01T07:59:00Z");
    reserve(&mut state, &meters, &[10], last).unwrap();
    settle(&mut state, &meters, &[10], &[10], last);
    let denial = reserve(&mut state, &meters, &[1], last).unwrap_err();
    assert_eq!(denial.retry_after, Duration::from_secs(60));
    reserve(&mut state, &meters, &[10], at("2027-01-01T08:00:00Z")).unwrap();
}

#[test]
fn a_rolling_hour_lets_spend_go_slice_by_slice_and_says_when_enough_has() {
    let meters = [meter("1h", None, Unit::Prefill, 100)];
    let mut state = TenantState::new();
    let start = at("2026-12-01T10:00:10Z");
    for (minute, used) in [(0, 30), (10, 30), (20, 40)] {
        let now = start + minute * MINUTE;
        reserve(&mut state, &meters, &[used], now).unwrap();
        settle(&mut state, &meters, &[used], &[used], now);
    }
    let now = start + 30 * MINUTE;
    // 50 fit once the first two slices (60) have left: at 11:10.
    let denial = reserve(&mut state, &meters, &[50], now).unwrap_err();
    assert_eq!(
        denial.retry_after,
        Duration::from_millis((40 * MINUTE - 10_000) as u64)
    );
    assert_eq!(denial.reading.resets_at, at("2026-12-01T11:00:00Z"));
    let readings = reserve(&mut state, &meters, &[50], at("2026-12-01T11:10:00Z")).unwrap();
    assert_eq!((readings[0].spent, readings[0].reserved), (40, 50));
}

#[test]
fn more_than_the_limit_alone_never_fits_and_grants_raise_it_for_the_window() {
    let meters = [meter("calendar-day", None, Unit::Decode, 100)];
    let now = at("2026-12-01T10:00:00Z");
    let mut state = TenantState::new();
    let denial = reserve(&mut state, &meters, &[101], now).unwrap_err();
    assert!(denial.never);
    let reading = grant(&mut state, &meters[0], 50, now);
    assert_eq!((reading.limit, reading.granted), (150, 50));
    reserve(&mut state, &meters, &[101], now).unwrap();
    settle(&mut state, &meters, &[101], &[101], now);
    // Reset forgets spend and grants; the next day starts at the configured limit.
    let reading = reset(&mut state, &meters[0], now);
    assert_eq!((reading.spent, reading.limit), (0, 100));
    reserve(&mut state, &meters, &[100], now).unwrap();
    settle(&mut state, &meters, &[100], &[100], now);
    grant(&mut state, &meters[0], 50, now);
    let tomorrow = read(&mut state, &meters, at("2026-12-02T00:00:00Z"));
    assert_eq!((tomorrow[0].spent, tomorrow[0].limit), (0, 100));
}

#[test]
fn the_tightest_reading_is_the_least_share_left() {
    let now = at("2026-12-01T10:00:00Z");
    let meters = [
        meter("calendar-day", None, Unit::Decode, 1000),
        meter("1h", None, Unit::Total, 100),
    ];
    let mut state = TenantState::new();
    let readings = reserve(&mut state, &meters, &[500, 40], now).unwrap();
    assert_eq!(
        tightest(&readings).unwrap().meter.id(),
        "calendar-day|decode"
    );
    // 40 of 100 left in the hour is less than 500 of 1000 in the day.
    let readings = reserve(&mut state, &meters, &[0, 20], now).unwrap();
    assert_eq!(tightest(&readings).unwrap().meter.id(), "1h|total");
}

/// One step of a random history: reserve a request's most, or settle one in flight with some
/// part of it used (or, `over`, a bit more: the backend counted a longer prompt).
#[derive(Clone, Debug)]
enum Step {
    Reserve(u64),
    Settle { which: usize, used_permille: u64 },
    Wait(i64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1u64..400).prop_map(Step::Reserve),
        (0usize..64, 0u64..=1000).prop_map(|(which, used_permille)| Step::Settle {
            which,
            used_permille
        }),
        (0i64..30 * MINUTE).prop_map(Step::Wait),
    ]
}

proptest! {
    /// Whatever the order of reservations, settlements and waits, a window's spend and what is
    /// held together never pass its limit, and a refused reservation changes nothing.
    #[test]
    fn spend_and_reservations_never_pass_the_limit(steps in prop::collection::vec(step(), 1..200)) {
        let meters = [
            meter("calendar-day", Some("Europe/Berlin"), Unit::Decode, 1000),
            meter("1h", None, Unit::Total, 1500),
        ];
        let mut state = TenantState::new();
        let mut now = at("2026-03-28T22:30:00Z");
        let mut in_flight: Vec<[u64; 2]> = Vec::new();
        for step in steps {
            match step {
                Step::Reserve(most) => {
                    let amounts = [most, most + 10];
                    let before = state.clone();
                    match reserve(&mut state, &meters, &amounts, now) {
                        Ok(_) => in_flight.push(amounts),
                        Err(_) => prop_assert_eq!(&state, &before.into_iter().map(|(k, mut v)| {
                            let w = if k.starts_with("1h") { &meters[1].window } else { &meters[0].window };
                            v.slices.retain(|s| w.leaves_at(s.start) > now);
                            (k, v)
                        }).collect::<TenantState>()),
                    }
                }
                Step::Settle { which, used_permille } if !in_flight.is_empty() => {
                    let held = in_flight.remove(which % in_flight.len());
                    let used = held.map(|h| h * used_permille / 1000);
                    settle(&mut state, &meters, &held, &used, now);
                }
                Step::Settle { .. } => {}
                Step::Wait(ms) => now += ms,
            }
            for reading in read(&mut state, &meters, now) {
                prop_assert!(reading.spent + reading.reserved <= reading.limit,
                    "{} spent {} + reserved {} > limit {}", reading.meter.id(), reading.spent, reading.reserved, reading.limit);
            }
        }
    }
}

/// Two grants of 2^63 in two slices of a rolling hour, and spend as large: the limit, what is
/// granted and what is spent stay at u64::MAX instead of wrapping (1000 + 2^64 wrapped is 1000
/// again, and a debug build panics), and what a full window has left is none.
#[test]
fn grants_and_spend_saturate_instead_of_wrapping() {
    let m = meter("1h", None, Unit::Total, 1000);
    let mut state = TenantState::new();
    let t0 = at("2026-12-01T10:00:00Z");
    grant(&mut state, &m, 1 << 63, t0);
    let granted = grant(&mut state, &m, 1 << 63, t0 + MINUTE);
    assert_eq!((granted.limit, granted.granted), (u64::MAX, u64::MAX));
    let huge = [u64::MAX - 10];
    reserve(&mut state, std::slice::from_ref(&m), &huge, t0 + MINUTE).unwrap();
    settle(
        &mut state,
        std::slice::from_ref(&m),
        &huge,
        &huge,
        t0 + MINUTE,
    );
    reserve(&mut state, std::slice::from_ref(&m), &[10], t0 + 2 * MINUTE).unwrap();
    settle(
        &mut state,
        std::slice::from_ref(&m),
        &[10],
        &[10],
        t0 + 2 * MINUTE,
    );
    reserve(&mut state, std::slice::from_ref(&m), &[0], t0 + 2 * MINUTE).unwrap();
    let full = &read(&mut state, std::slice::from_ref(&m), t0 + 2 * MINUTE)[0];
    assert_eq!((full.spent, full.remaining()), (u64::MAX, 0));
    let refused = reserve(&mut state, std::slice::from_ref(&m), &[1], t0 + 2 * MINUTE);
    assert!(refused.is_err());
}
