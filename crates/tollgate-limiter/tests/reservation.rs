//! Reserve, then settle: what a settle promises, on random traces of the
//! reference model (the backends agree with the model decision by decision,
//! in the conformance suite).

use std::time::Duration;

use proptest::prelude::*;
use tollgate_limiter::model::{Op, Receipt, Slot};
use tollgate_limiter::{Calendar, Composite, Period, Policy, SlidingWindow, TokenBucket};

const START: u64 = 1_767_225_600_000_000;
const S: u64 = 1_000_000;

fn policies() -> impl Strategy<Value = Policy> {
    let tb = (1u64..12, 1u64..5, 1u64..4_000_000).prop_map(|(c, r, p)| {
        Policy::from(TokenBucket::new(c, r, Duration::from_micros(p)).unwrap())
    });
    let sw = (1u64..12, 1u64..6_000_000)
        .prop_map(|(l, w)| Policy::from(SlidingWindow::new(l, Duration::from_micros(w)).unwrap()));
    // Calendar quotas: days and weeks roll within a trace (steps advance
    // up to 30 hours), months now and then.
    let cal = (
        1u64..12,
        prop_oneof![Just(Period::Day), Just(Period::Week), Just(Period::Month)],
        prop_oneof![Just("UTC"), Just("Europe/Berlin"), Just("Asia/Kathmandu")],
    )
        .prop_map(|(l, p, z)| Policy::from(Calendar::new(l, p, z).unwrap()));
    let part = prop_oneof![tb.clone(), sw.clone(), cal.clone()];
    prop_oneof![
        tb,
        sw,
        cal,
        proptest::collection::vec(part, 1..=3)
            .prop_map(|parts| Policy::from(Composite::new(parts).unwrap())),
    ]
}

#[derive(Debug, Clone)]
enum Step {
    Advance(u64),
    Acquire(u64),
    Reset,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        4 => prop_oneof![1u64..1_000, 1_000u64..3_000_000].prop_map(Step::Advance),
        1 => (3_000_000u64..30 * 3_600 * S).prop_map(Step::Advance),
        6 => (1u64..6).prop_map(Step::Acquire),
        1 => Just(Step::Reset),
    ];
    proptest::collection::vec(step, 0..30)
}

/// Applies `steps` to both keys: whatever `real` admits, `cf` must admit too
/// (it never has less budget); both are charged alike.
fn run_both(
    real: &mut Slot,
    cf: &mut Slot,
    policy: &Policy,
    now: &mut u64,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    for step in steps {
        match *step {
            Step::Advance(us) => *now += us,
            Step::Acquire(c) => {
                let d = real.apply(*now, policy, Op::Acquire(c));
                if d.is_allowed() {
                    let other = cf.apply(*now, policy, Op::Acquire(c));
                    prop_assert!(other.is_allowed(), "the counterfactual refused {c}");
                }
            }
            Step::Reset => {
                real.apply(*now, policy, Op::Reset);
                cf.apply(*now, policy, Op::Reset);
                // One microsecond apart: see the module docs of reservations
                // on lives born in the same microsecond.
                *now += 1;
            }
        }
    }
    Ok(())
}

/// Reservations held: the receipt, the actual cost, whether settled.
type Held = Vec<(Receipt, u64, bool)>;

/// An acquire, a reservation (of at most the policy's limit, whose actual
/// cost the counterfactual charges at once) or a settle (of a held
/// receipt, once), on both keys: whatever `real` admits, `cf` must too.
fn charge_both(
    ev: &Ev,
    real: &mut Slot,
    cf: &mut Slot,
    policy: &Policy,
    now: u64,
    held: &mut Held,
) -> Result<(), TestCaseError> {
    match *ev {
        Ev::Acquire(c) => {
            if real.apply(now, policy, Op::Acquire(c)).is_allowed() {
                prop_assert!(cf.apply(now, policy, Op::Acquire(c)).is_allowed());
            }
        }
        Ev::Reserve { max, used } => {
            let max = max.min(policy.max_cost().unwrap());
            let actual = max * used / 100;
            let (d, receipt) = real.reserve(now, policy, max);
            if d.is_allowed() {
                if actual > 0 {
                    prop_assert!(cf.apply(now, policy, Op::Acquire(actual)).is_allowed());
                }
                held.push((receipt, actual, false));
            }
        }
        Ev::Settle(which) => {
            let n = held.len().max(1);
            if let Some((receipt, actual, settled)) = held.get_mut(which % n)
                && !*settled
            {
                *settled = true;
                real.apply(
                    now,
                    policy,
                    Op::Settle {
                        receipt: *receipt,
                        actual: *actual,
                    },
                );
            }
        }
        Ev::Advance(_) | Ev::Reset => {}
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// A settle never mints budget: after reserving `max`, whatever happens
    /// (charges, time, resets, windows rolling, buckets refilling), settling
    /// with `actual <= max` leaves the key with no more budget than if only
    /// `actual` had been charged at the reservation's instant, now and for
    /// every later request.
    #[test]
    fn a_settle_never_gives_more_than_charging_the_actual_cost(
        policy in policies(),
        before in steps(),
        between in steps(),
        after in steps(),
        max in 1u64..12,
        used in 0u64..=100,
    ) {
        let max = max.min(policy.max_cost().unwrap());
        let actual = max * used / 100;
        let (mut real, mut cf) = (Slot::fresh(&policy), Slot::fresh(&policy));
        let mut now = START;
        run_both(&mut real, &mut cf, &policy, &mut now, &before)?;
        let (d, receipt) = real.reserve(now, &policy, max);
        if d.is_allowed() {
            prop_assert_eq!(receipt.units, max);
            if actual > 0 {
                prop_assert!(cf.apply(now, &policy, Op::Acquire(actual)).is_allowed());
            }
        } else {
            prop_assert_eq!(receipt, Receipt::NONE);
        }
        run_both(&mut real, &mut cf, &policy, &mut now, &between)?;
        let settled = real.apply(now, &policy, Op::Settle { receipt, actual });
        let mut peek_cf = cf.clone();
        prop_assert!(settled.remaining() <= peek_cf.apply(now, &policy, Op::PEEK).remaining());
        for cost in 1..=policy.max_cost().unwrap() {
            let (mut r, mut c) = (real.clone(), cf.clone());
            if r.apply(now, &policy, Op::Peek(cost)).is_allowed() {
                prop_assert!(c.apply(now, &policy, Op::Peek(cost)).is_allowed());
            }
        }
        run_both(&mut real, &mut cf, &policy, &mut now, &after)?;
    }

    /// Several reservations in flight, settled in any order between other
    /// charges, time and resets: at every step, whatever the key admits,
    /// it would also admit had each reservation charged only its actual
    /// cost when it was made. Settling never mints budget.
    #[test]
    fn interleaved_reservations_never_give_more_than_their_actual_costs(
        policy in policies(),
        steps in proptest::collection::vec(
            prop_oneof![
                3 => prop_oneof![1u64..1_000, 1_000u64..3_000_000].prop_map(Ev::Advance),
                1 => (3_000_000u64..30 * 3_600 * S).prop_map(Ev::Advance),
                3 => (1u64..6).prop_map(Ev::Acquire),
                4 => (1u64..12, 0u64..=100).prop_map(|(max, used)| Ev::Reserve { max, used }),
                4 => (0usize..16).prop_map(Ev::Settle),
                1 => Just(Ev::Reset),
            ],
            1..60,
        ),
    ) {
        let limit = policy.max_cost().unwrap();
        let (mut real, mut cf) = (Slot::fresh(&policy), Slot::fresh(&policy));
        let mut now = START;
        let mut held = Held::new();
        for ev in steps {
            match ev {
                Ev::Advance(us) => now += us,
                Ev::Acquire(_) | Ev::Reserve { .. } | Ev::Settle(_) => {
                    charge_both(&ev, &mut real, &mut cf, &policy, now, &mut held)?;
                }
                Ev::Reset => {
                    real.apply(now, &policy, Op::Reset);
                    cf.apply(now, &policy, Op::Reset);
                    now += 1;
                }
            }
            for cost in 1..=limit {
                let (mut r, mut c) = (real.clone(), cf.clone());
                if r.apply(now, &policy, Op::Peek(cost)).is_allowed() {
                    prop_assert!(
                        c.apply(now, &policy, Op::Peek(cost)).is_allowed(),
                        "{cost} fits the key, not the counterfactual"
                    );
                }
            }
        }
    }

    /// Reservations and charges at one instant (nothing drips back), the
    /// reservations settled in any order: once all are settled, the key
    /// holds exactly what charging only the actual costs leaves. A settle
    /// gives back everything unused, whichever reservations above or below
    /// it were settled first (`tests/cost.rs` settles them in whatever
    /// order the responses end).
    #[test]
    fn settled_at_one_instant_in_any_order_the_key_holds_the_actual_costs(
        policy in policies(),
        steps in proptest::collection::vec(
            prop_oneof![
                1 => (1u64..4).prop_map(Ev::Acquire),
                3 => (1u64..6, 0u64..=100).prop_map(|(max, used)| Ev::Reserve { max, used }),
                2 => (0usize..8).prop_map(Ev::Settle),
            ],
            1..20,
        ),
        order in any::<u64>(),
    ) {
        let (mut real, mut cf) = (Slot::fresh(&policy), Slot::fresh(&policy));
        let now = START;
        let mut held = Held::new();
        for ev in steps {
            match ev {
                Ev::Reserve { .. } if held.len() >= 8 => {}
                _ => charge_both(&ev, &mut real, &mut cf, &policy, now, &mut held)?,
            }
        }
        // The rest, in a shuffled order.
        let mut rest: Vec<_> = held.iter().filter(|h| !h.2).map(|h| (h.0, h.1)).collect();
        let mut seed = order;
        while !rest.is_empty() {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let (receipt, actual) = rest.swap_remove((seed >> 33) as usize % rest.len());
            real.apply(now, &policy, Op::Settle { receipt, actual });
        }
        let got = real.apply(now, &policy, Op::PEEK).remaining();
        let want = cf.apply(now, &policy, Op::PEEK).remaining();
        prop_assert_eq!(got, want);
    }

    /// A settle with the estimate itself changes nothing, and a refund
    /// never leaves more than the policy's limit.
    #[test]
    fn settling_the_estimate_changes_nothing(
        policy in policies(),
        before in steps(),
        max in 1u64..12,
        wait in 0u64..10_000_000,
    ) {
        let max = max.min(policy.max_cost().unwrap());
        let mut key = Slot::fresh(&policy);
        let mut now = START;
        let mut other = Slot::fresh(&policy);
        run_both(&mut key, &mut other, &policy, &mut now, &before)?;
        let (d, receipt) = key.reserve(now, &policy, max);
        if d.is_denied() {
            return Ok(());
        }
        now += wait;
        let mut copy = key.clone();
        let want = copy.apply(now, &policy, Op::PEEK);
        prop_assert_eq!(key.apply(now, &policy, Op::Settle { receipt, actual: max }), want);
        let refunded = key.apply(now, &policy, Op::Settle { receipt, actual: 0 });
        prop_assert!(refunded.remaining() <= policy.limit());
    }
}

#[derive(Debug, Clone)]
enum Ev {
    Advance(u64),
    Acquire(u64),
    Reserve { max: u64, used: u64 },
    Settle(usize),
    Reset,
}

fn tb(capacity: u64, per_sec: u64) -> Policy {
    TokenBucket::per_second(capacity, per_sec).unwrap().into()
}

fn sw(limit: u64, secs: u64) -> Policy {
    SlidingWindow::new(limit, Duration::from_secs(secs))
        .unwrap()
        .into()
}

#[test]
fn unused_units_come_back_at_once() {
    for policy in [
        tb(1_000, 10),
        sw(1_000, 60),
        Composite::new([tb(1_000, 10), sw(5_000, 3600)])
            .unwrap()
            .into(),
    ] {
        let mut key = Slot::fresh(&policy);
        let (d, receipt) = key.reserve(START, &policy, 800);
        assert_eq!(d.remaining(), 200, "{policy:?}");
        let after = key.apply(
            START + 1,
            &policy,
            Op::Settle {
                receipt,
                actual: 300,
            },
        );
        assert_eq!(after.remaining(), 700, "{policy:?}");
    }
}

#[test]
fn a_token_bucket_does_not_refund_what_already_dripped_back() {
    // 10 tokens, one a second.
    let policy = tb(10, 1);
    let mut key = Slot::fresh(&policy);
    let (_, receipt) = key.reserve(START, &policy, 10);
    // 7 s later, 7 tokens are back; of the 10 unused, only the 3 still
    // out can come back.
    let d = key.apply(START + 7 * S, &policy, Op::Settle { receipt, actual: 0 });
    assert_eq!(d.remaining(), 10);
    let mut key = Slot::fresh(&policy);
    let (_, receipt) = key.reserve(START, &policy, 10);
    assert!(
        key.apply(START + 7 * S, &policy, Op::Acquire(7))
            .is_allowed()
    );
    let d = key.apply(START + 7 * S, &policy, Op::Settle { receipt, actual: 0 });
    // Had only 0 been reserved: 10 - 7 = 3 left; and so it is.
    assert_eq!(d.remaining(), 3);
}

/// The case `interleaved_reservations_never_give_more_than_their_actual_costs`
/// shrank to: the refund of an earlier reservation moved a later one's
/// units down, and the later refund must count from there.
#[test]
fn a_refund_counts_the_refunds_made_since_its_reservation() {
    // 11 tokens, one every 364,877 µs.
    let policy: Policy = TokenBucket::new(11, 3, Duration::from_micros(1_094_629))
        .unwrap()
        .into();
    let t = 364_877;
    let settle = |key: &mut Slot, now, receipt, actual| {
        key.apply(now, &policy, Op::Settle { receipt, actual })
    };
    let (mut real, mut cf) = (Slot::fresh(&policy), Slot::fresh(&policy));
    let (_, first) = real.reserve(START, &policy, 2);
    let (_, second) = real.reserve(START, &policy, 7);
    assert!(cf.apply(START, &policy, Op::Acquire(1)).is_allowed());
    settle(&mut real, START, first, 1);
    let later = START + 2 * t;
    assert!(real.apply(later, &policy, Op::Acquire(1)).is_allowed());
    assert!(cf.apply(later, &policy, Op::Acquire(1)).is_allowed());
    let d = settle(&mut real, later, second, 0);
    let want = cf.apply(later, &policy, Op::PEEK);
    assert_eq!((d.remaining(), want.remaining()), (10, 10));
}

/// A receipt settled twice (the model does not remember receipts; a
/// `Limiter` cannot do it) refunds once: the first refund is counted.
#[test]
fn a_second_settle_of_a_token_bucket_receipt_refunds_nothing_more() {
    let policy = tb(20, 1);
    let mut key = Slot::fresh(&policy);
    let (_, receipt) = key.reserve(START, &policy, 10);
    assert!(key.apply(START, &policy, Op::Acquire(5)).is_allowed());
    let settle = Op::Settle { receipt, actual: 0 };
    assert_eq!(key.apply(START, &policy, settle).remaining(), 15);
    assert_eq!(key.apply(START, &policy, settle).remaining(), 15);
}

#[test]
fn a_window_that_rolled_refunds_nothing() {
    let policy = sw(10, 60);
    let mut key = Slot::fresh(&policy);
    let (_, receipt) = key.reserve(START, &policy, 10);
    assert!(
        key.apply(START + 30 * S, &policy, Op::Acquire(1))
            .is_denied()
    );
    assert!(
        key.apply(START + 60 * S, &policy, Op::Acquire(4))
            .is_allowed()
    );
    // The reservation's entry left the window at 60 s.
    let d = key.apply(START + 61 * S, &policy, Op::Settle { receipt, actual: 0 });
    assert_eq!(d.remaining(), 6);
}

#[test]
fn a_refund_after_a_reset_mints_nothing() {
    for policy in [tb(10, 1), sw(10, 60)] {
        let mut key = Slot::fresh(&policy);
        let (_, receipt) = key.reserve(START, &policy, 10);
        key.apply(START + 1, &policy, Op::Reset);
        assert!(key.apply(START + 2, &policy, Op::Acquire(10)).is_allowed());
        let d = key.apply(START + 3, &policy, Op::Settle { receipt, actual: 0 });
        assert_eq!(d.remaining(), 0, "{policy:?}");
    }
}

#[test]
fn the_excess_is_charged_into_overdraft_bounded() {
    let policy = tb(10, 1);
    let mut key = Slot::fresh(&policy);
    let (_, receipt) = key.reserve(START, &policy, 10);
    // Used 25: 15 more, capped at the capacity (10), the debt at two full
    // refills (20 s).
    let d = key.apply(
        START,
        &policy,
        Op::Settle {
            receipt,
            actual: 25,
        },
    );
    assert!(d.is_denied());
    assert_eq!(d.retry_after(), Duration::from_secs(11));
    let d = key.apply(
        START,
        &policy,
        Op::Settle {
            receipt,
            actual: u64::MAX,
        },
    );
    assert_eq!(d.retry_after(), Duration::from_secs(11));

    let policy = sw(10, 60);
    let mut key = Slot::fresh(&policy);
    let (_, receipt) = key.reserve(START, &policy, 10);
    let d = key.apply(
        START + S,
        &policy,
        Op::Settle {
            receipt,
            actual: 14,
        },
    );
    assert_eq!(
        (d.remaining(), d.retry_after()),
        (0, Duration::from_secs(59))
    );
    // The 4 extra units were recorded at 1 s: they stay a window from then.
    let d = key.apply(START + 60 * S, &policy, Op::PEEK);
    assert_eq!(
        (d.remaining(), d.reset_after()),
        (6, Duration::from_secs(1))
    );
}

#[test]
fn a_composite_settles_every_part() {
    let policy: Policy = Composite::new([tb(100, 1), sw(50, 60)]).unwrap().into();
    let mut key = Slot::fresh(&policy);
    let (d, receipt) = key.reserve(START, &policy, 40);
    assert_eq!((d.part(), d.remaining()), (1, 10));
    let d = key.apply(
        START,
        &policy,
        Op::Settle {
            receipt,
            actual: 10,
        },
    );
    assert_eq!((d.part(), d.remaining()), (1, 40));
    let Slot { state, .. } = &key;
    let tollgate_limiter::model::State::Composite(c) = state else {
        panic!("a composite")
    };
    let bucket = c.parts[0].clone().apply(START, &tb(100, 1), Op::PEEK);
    assert_eq!(bucket.remaining(), 90);
}

fn month(limit: u64) -> Policy {
    Calendar::new(limit, Period::Month, "UTC").unwrap().into()
}

#[test]
fn a_calendar_quota_refunds_within_its_window() {
    // START is 1 January 2026, 00:00 UTC.
    let policy = month(1_000);
    let mut key = Slot::fresh(&policy);
    let (d, receipt) = key.reserve(START + S, &policy, 800);
    assert_eq!(d.remaining(), 200);
    let mark = receipt.marks[0].unwrap();
    assert_eq!(mark.born, START, "the month's start");
    assert_eq!(mark.at, START + S, "when its count began");
    let d = key.apply(
        START + 3_600 * S,
        &policy,
        Op::Settle {
            receipt,
            actual: 300,
        },
    );
    assert_eq!(d.remaining(), 700);
    // The key still expires at the end of January.
    assert_eq!(key.expires_at, START + 31 * 86_400 * S);
    // Refunding everything empties the count: the key reads as fresh.
    let (_, receipt) = key.reserve(START + 3_600 * S, &policy, 100);
    let d = key.apply(
        START + 3_600 * S,
        &policy,
        Op::Settle { receipt, actual: 0 },
    );
    assert_eq!(d.remaining(), 700);
}

#[test]
fn a_calendar_window_that_rolled_refunds_nothing() {
    let policy = month(1_000);
    let mut key = Slot::fresh(&policy);
    let jan_31 = START + 30 * 86_400 * S;
    let (_, receipt) = key.reserve(jan_31, &policy, 800);
    let feb = START + 31 * 86_400 * S;
    assert!(key.apply(feb, &policy, Op::Acquire(100)).is_allowed());
    let d = key.apply(feb + S, &policy, Op::Settle { receipt, actual: 0 });
    assert_eq!(d.remaining(), 900, "February owes January nothing");
}

#[test]
fn a_calendar_refund_after_a_reset_mints_nothing() {
    let policy = month(10);
    let mut key = Slot::fresh(&policy);
    let (_, receipt) = key.reserve(START, &policy, 10);
    key.apply(START + 1, &policy, Op::Reset);
    // The same window, another count.
    assert!(key.apply(START + 2, &policy, Op::Acquire(10)).is_allowed());
    let d = key.apply(START + 3, &policy, Op::Settle { receipt, actual: 0 });
    assert_eq!(d.remaining(), 0);
}

#[test]
fn a_calendar_excess_is_charged_in_the_current_window_bounded() {
    let policy = Policy::from(Calendar::new(10, Period::Day, "UTC").unwrap());
    let mut key = Slot::fresh(&policy);
    let (_, receipt) = key.reserve(START, &policy, 4);
    // Used 30: 26 more, at most the limit (10): 14 counted, 4 over.
    let d = key.apply(
        START + S,
        &policy,
        Op::Settle {
            receipt,
            actual: 30,
        },
    );
    assert!(d.is_denied());
    assert_eq!(d.remaining(), 0);
    assert_eq!(d.retry_after(), Duration::from_secs(86_399));
    // Settled the next day: the excess is today's.
    let mut key = Slot::fresh(&policy);
    let (_, receipt) = key.reserve(START, &policy, 4);
    let d = key.apply(
        START + 86_400 * S,
        &policy,
        Op::Settle { receipt, actual: 7 },
    );
    assert_eq!(d.remaining(), 7);
    assert_eq!(key.expires_at, START + 2 * 86_400 * S);
}

#[test]
fn a_composite_settles_its_calendar_part() {
    let policy: Policy = Composite::new([tb(1_000, 10), month(1_000)])
        .unwrap()
        .into();
    let mut key = Slot::fresh(&policy);
    let (_, receipt) = key.reserve(START, &policy, 800);
    assert!(receipt.marks[0].is_some() && receipt.marks[1].is_some());
    let d = key.apply(
        START + 1,
        &policy,
        Op::Settle {
            receipt,
            actual: 300,
        },
    );
    assert_eq!(d.remaining(), 700);
}

/// A settle of a receipt id the key remembers changes nothing, until
/// `SETTLED_FOR` after the first; then the key forgets it, and the record
/// alone no longer keeps the key.
#[test]
fn a_settle_id_is_remembered_for_settled_for() {
    use tollgate_limiter::model::SETTLED_FOR;
    let policy = Policy::from(TokenBucket::new(1_000, 1, Duration::from_secs(1)).unwrap());
    // A key with 100 reserved at START, and the settle of `actual`.
    let reserved = |id, actual| {
        let mut key = Slot::fresh(&policy);
        let (_, receipt) = key.reserve(START, &policy, 100);
        let receipt = Receipt { id, ..receipt };
        (key, Op::Settle { receipt, actual })
    };
    let (mut key, settle) = reserved(7, 150);
    // The excess, charged once.
    assert_eq!(key.apply(START, &policy, settle).remaining(), 850);
    assert_eq!(key.apply(START, &policy, settle).remaining(), 850);
    // One microsecond before it is forgotten, still a replay.
    let late = START + SETTLED_FOR - 1;
    let full = key.apply(late, &policy, Op::PEEK).remaining();
    assert_eq!(key.apply(late, &policy, settle).remaining(), full);
    assert!(key.is_live(late));
    // Forgotten: the key holds nothing else, and the settle applies again.
    let after = START + SETTLED_FOR;
    assert!(!key.is_live(after));
    assert_eq!(key.apply(after, &policy, settle).remaining(), 950);

    // A settle at the estimate changes nothing: not remembered.
    let (mut key, exact) = reserved(8, 100);
    assert_eq!(key.apply(START, &policy, exact).remaining(), 900);
    assert!(key.settled.is_empty());
}

/// A settle whose caller gives up before it reaches the backend (a client
/// gone, a timeout or a `select!` around the handler's last step) still
/// settles: the excess of a call that cost more than its estimate is
/// charged. Before, the dropped settle never ran: the call was charged its
/// estimate only, so a client that hung up at that moment spent more than
/// its budget.
#[tokio::test(start_paused = true)]
async fn a_settle_given_up_by_its_caller_still_charges_the_excess() {
    use tollgate_limiter::{Key, Limiter, MockClock};
    use tollgate_memory::MemoryBackend;

    let backend = MemoryBackend::with_clock(MockClock::new());
    let llm = Limiter::new("llm", tb(100, 1), backend.clone());
    let key = Key::new("tenant");
    let (verdict, reservation) = llm.reserve(&key, 10).await;
    assert!(verdict.is_allowed());
    // Every backend call now takes 10 ms: the caller gives up at 5.
    backend.set_delay(Duration::from_millis(10));
    let gave_up = tokio::time::timeout(Duration::from_millis(5), reservation.settle(60)).await;
    assert!(gave_up.is_err(), "settled before the caller gave up");
    tokio::time::sleep(Duration::from_millis(100)).await;
    backend.clear_faults();
    // 60 spent of 100 (the mock clock stood still: nothing dripped back).
    let left = llm.try_peek(&key, 1).await.unwrap().remaining();
    assert_eq!(left, 40);
}

#[test]
fn a_token_buckets_life_is_named_by_its_first_reservation() {
    // 10 tokens, one a second.
    let policy = tb(10, 1);
    let mut key = Slot::fresh(&policy);
    // Charged, never reserved: unnamed.
    assert!(key.apply(START, &policy, Op::Acquire(4)).is_allowed());
    // A receipt naming no life (0, as a release before this rule could
    // write) refunds nothing in it.
    let unnamed = Receipt {
        units: 4,
        marks: [
            Some(tollgate_limiter::strategy::reservation::Mark {
                born: 0,
                at: START + 4_000_000,
                per: 1_000_000,
            }),
            None,
            None,
            None,
        ],
        id: 0,
    };
    let d = key.apply(
        START,
        &policy,
        Op::Settle {
            receipt: unnamed,
            actual: 0,
        },
    );
    assert_eq!(d.remaining(), 6);
    // The first reservation names the life, later, when it is made.
    let (_, first) = key.reserve(START + 7, &policy, 2);
    assert_eq!(first.marks[0].unwrap().born, START + 7);
    let (_, second) = key.reserve(START + 9, &policy, 1);
    assert_eq!(second.marks[0].unwrap().born, START + 7);
    // Its receipts refund in it.
    let d = key.apply(
        START + 10,
        &policy,
        Op::Settle {
            receipt: first,
            actual: 0,
        },
    );
    assert_eq!(d.remaining(), 5);
}
