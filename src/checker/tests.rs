use super::*;

fn entries(lines: &[&str]) -> Vec<Entry> {
    lines.iter().map(|l| Entry::parse(l).unwrap()).collect()
}

const CRASH: &[&str] = &[
    "[producer] messageId=mid-1 status=confirmed",
    "[consumer] messageId=mid-1 destination=q attempt=1 redelivered=false status=received",
    "[consumer] messageId=mid-1 destination=q attempt=1 status=business_committed",
    "[consumer] messageId=mid-1 destination=q attempt=1 redelivered=true status=received",
    "[consumer] messageId=mid-1 destination=q attempt=1 status=duplicate_skipped",
    "[consumer] messageId=mid-2 destination=q attempt=1 redelivered=false status=received",
];

fn eval(expr: &str, lines: &[&str], obs: &Observed) -> String {
    evaluate(&expr.parse().unwrap(), &entries(lines), obs).unwrap()
}

#[test]
fn transcript_counters() {
    let obs = Observed::default();
    assert_eq!(eval("confirmed", CRASH, &obs), "1");
    assert_eq!(eval("received", CRASH, &obs), "3");
    assert_eq!(eval("received:q", CRASH, &obs), "3");
    assert_eq!(eval("received:other", CRASH, &obs), "0");
    assert_eq!(eval("unique", CRASH, &obs), "2");
    assert_eq!(eval("redelivered", CRASH, &obs), "1");
    assert_eq!(eval("duplicatesObserved", CRASH, &obs), "1");
    assert_eq!(eval("attempts:mid-1", CRASH, &obs), "1,1");
    assert_eq!(eval("deliveries:mid-1", CRASH, &obs), "2");
    assert_eq!(eval("deliveriesBefore:mid-2", CRASH, &obs), "2");
    assert_eq!(eval("deliveriesBefore:mid-9", CRASH, &obs), "never");
    let commits = &[
        "[consumer] messageId=mid-2 destination=q status=business_committed",
        "[consumer] messageId=mid-1 destination=q status=retry_in_place",
        "[consumer] messageId=mid-1 destination=q status=business_committed",
        "[observe] messageId=mid-3 destination=p status=committed",
    ];
    assert_eq!(eval("commitOrder", commits, &obs), "mid-2,mid-1,mid-3");
    assert_eq!(eval("commitOrder:q", commits, &obs), "mid-2,mid-1");
    assert_eq!(eval("retriesInPlace", commits, &obs), "1");
}

#[test]
fn duplicates_applied_counts_extra_business_rows() {
    let row = |c: &str, e: &str| (c.to_string(), e.to_string());
    let mut obs = Observed::default();
    obs.ground.business = vec![row("a", "E1"), row("a", "E2"), row("b", "E1")];
    assert_eq!(eval("duplicatesApplied", &[], &obs), "0");
    obs.ground.business.push(row("a", "E1"));
    assert_eq!(eval("duplicatesApplied", &[], &obs), "1");
    assert_eq!(eval("businessRows", &[], &obs), "4");
}

#[test]
fn order_version_reads_each_services_state_of_that_order() {
    let state = |c: &str, o: &str, v: i64| (c.to_string(), o.to_string(), v, "paid".into());
    let mut obs = Observed::default();
    let c: CounterRef = "orderVersion:order-1".parse().unwrap();
    assert!(evaluate(&c, &[], &obs).is_err(), "not read is not `none`");
    obs.ground.states = Some(Vec::new());
    assert_eq!(eval("orderVersion:order-1", &[], &obs), "none");
    obs.ground.states = Some(vec![state("a", "order-1", 3), state("a", "order-2", 1)]);
    assert_eq!(eval("orderVersion:order-1", &[], &obs), "3");
    obs.ground
        .states
        .as_mut()
        .unwrap()
        .push(state("b", "order-1", 1));
    assert_eq!(eval("orderVersion:order-1", &[], &obs), "3,1");
    assert!(
        "orderVersion".parse::<CounterRef>().is_err(),
        "needs an order"
    );
    assert_eq!(eval("orderStatus:order-1", &[], &obs), "paid,paid");
    assert_eq!(eval("orderStatus:order-9", &[], &obs), "none");
}

/// Each DLQ message's span between its first and its last failure, read
/// from its own headers, as a band; a message without them, or a queue not
/// read, is an error, not `no`.
#[test]
fn dlq_failed_for_is_a_band_of_each_messages_own_diagnostics() {
    let h = |first: &str, last: &str| {
        BTreeMap::from([
            ("first-failed-at".to_string(), first.to_string()),
            ("last-failed-at".to_string(), last.to_string()),
        ])
    };
    let mut obs = Observed::default();
    obs.dlq.insert(
        "q.dlq".into(),
        vec![
            h("2026-12-07T10:00:00.000Z", "2026-12-07T10:00:01.500Z"),
            h("2026-12-07T10:00:00.000Z", "2026-12-07T10:00:00.600Z"),
        ],
    );
    assert_eq!(eval("dlqFailedFor:q.dlq/1400", &[], &obs), "yes,no");
    assert_eq!(eval("dlqFailedFor:q.dlq/500", &[], &obs), "yes,yes");
    let c: CounterRef = "dlqFailedFor:other/500".parse().unwrap();
    assert!(evaluate(&c, &[], &obs).is_err(), "not read");
    obs.dlq.insert("bare".into(), vec![BTreeMap::new()]);
    let c: CounterRef = "dlqFailedFor:bare/500".parse().unwrap();
    assert!(evaluate(&c, &[], &obs).is_err(), "no diagnostics");
    assert!("dlqFailedFor:q.dlq".parse::<CounterRef>().is_err());
    assert!("dlqFailedFor:q.dlq/0".parse::<CounterRef>().is_err());
}

#[test]
fn waited_at_least_is_a_band_of_the_first_measured_delivery() {
    let lines = &[
        "[consumer] messageId=mid-1 attempt=1 delayMs=1004 status=received",
        "[consumer] messageId=mid-2 attempt=1 delayMs=1007 status=received",
        "[consumer] messageId=mid-3 attempt=1 status=received",
    ];
    let obs = Observed::default();
    assert_eq!(eval("waitedAtLeast:mid-2/500", lines, &obs), "yes");
    assert_eq!(eval("waitedAtLeast:mid-2/1008", lines, &obs), "no");
    let c: CounterRef = "waitedAtLeast:mid-3/500".parse().unwrap();
    assert!(
        evaluate(&c, &entries(lines), &obs).is_err(),
        "no measured wait"
    );
    assert!("waitedAtLeast:mid-2".parse::<CounterRef>().is_err());
    assert!("waitedAtLeast:mid-2/soon".parse::<CounterRef>().is_err());
    assert!(
        "waitedAtLeast:mid-2/0".parse::<CounterRef>().is_err(),
        "a bound of 0 cannot fail"
    );
}

#[test]
fn downstream_effects_count_per_event_and_fail_without_a_downstream() {
    let call = |e: &str, effect: bool| DownstreamCall {
        service: "a".into(),
        event_id: e.into(),
        effect,
        response_lost: false,
    };
    let mut obs = Observed::default();
    let c: CounterRef = "duplicateSideEffects".parse().unwrap();
    assert!(evaluate(&c, &[], &obs).is_err(), "no downstream ran");
    obs.downstream = Some(vec![call("e1", true), call("e1", false), call("e2", true)]);
    assert_eq!(eval("downstreamCalls", &[], &obs), "3");
    assert_eq!(eval("downstreamEffects", &[], &obs), "2");
    assert_eq!(eval("duplicateSideEffects", &[], &obs), "0");
    obs.downstream.as_mut().unwrap().push(call("e1", true));
    assert_eq!(eval("downstreamEffects", &[], &obs), "3");
    assert_eq!(eval("duplicateSideEffects", &[], &obs), "1");
    // An event a calling service applied with no effect of its own
    // call is missing; a service that calls no downstream owes none.
    obs.ground.business = vec![
        ("a".into(), "e1".into()),
        ("a".into(), "e3".into()),
        ("b".into(), "e3".into()),
        ("c".into(), "e3".into()),
    ];
    obs.downstream_callers = ["a".to_string(), "b".to_string()].into();
    assert_eq!(eval("missingSideEffects", &[], &obs), "2");
    obs.downstream.as_mut().unwrap().push(call("e3", false));
    assert_eq!(
        eval("missingSideEffects", &[], &obs),
        "2",
        "a replay is no effect"
    );
    obs.downstream.as_mut().unwrap().push(call("e3", true));
    assert_eq!(
        eval("missingSideEffects", &[], &obs),
        "1",
        "a's effect is not b's"
    );
}

#[test]
fn orders_without_event_are_the_committed_orders_no_service_handled() {
    let mut obs = Observed::default();
    let c: CounterRef = "ordersWithoutEvent".parse().unwrap();
    assert!(evaluate(&c, &[], &obs).is_err(), "no order service ran");
    obs.ground.orders = vec!["e1".into(), "e2".into(), "e3".into()];
    obs.ground.business = vec![("a".into(), "e1".into())];
    obs.ground.rejected = vec![("b".into(), "e2".into())];
    assert_eq!(eval("ordersCommitted", &[], &obs), "3");
    assert_eq!(eval("ordersWithoutEvent", &[], &obs), "1");
    // A committed order owes its event to the total-queue checks.
    let lines = entries(&["[producer] messageId=mid-3 status=order_committed"]);
    let events = Events([("mid-3".to_string(), "e3".to_string())].into());
    let lost = total_queue(
        &lines,
        &obs.ground,
        &BTreeSet::new(),
        &events,
        &Owed::default(),
        &Queued::default(),
    );
    assert!(lost.contains(&(Check::Lost, 1)), "{lost:?}");
}

#[test]
fn missing_observations_fail_instead_of_defaulting() {
    let c: CounterRef = "crashExitCode".parse().unwrap();
    assert!(evaluate(&c, &[], &Observed::default()).is_err());
    let d: CounterRef = "depthAfter:q".parse().unwrap();
    assert!(evaluate(&d, &[], &Observed::default()).is_err());
    let (line, pass) = assert_line(
        "crashExitCode",
        &"137".into(),
        &Err("no crash was observed".into()),
    );
    assert!(!pass);
    assert!(line.contains("FAIL"));
}

/// A wait is owed by the lab's tier for its attempt, not by the tier
/// the consumer chose: a consumer that always uses the first tier
/// honours the first wait only.
#[test]
fn retry_delays_are_owed_by_the_labs_tier_for_the_attempt() {
    let lines = entries(&[
        "[consumer] messageId=mid-2 attempt=1 tier=t1 ttlMs=200 status=retry_scheduled",
        "[consumer] messageId=mid-2 attempt=2 delayMs=210 status=received",
        "[consumer] messageId=mid-2 attempt=2 tier=t1 ttlMs=200 status=retry_scheduled",
        "[consumer] messageId=mid-2 attempt=3 delayMs=205 status=received",
        "[consumer] messageId=mid-2 attempt=3 tier=t1 ttlMs=200 status=retry_scheduled",
        "[consumer] messageId=mid-2 attempt=4 delayMs=820 status=received",
    ]);
    let c: CounterRef = "retryDelaysHonoured:mid-2".parse().unwrap();
    let mut obs = Observed::default();
    assert_eq!(
        evaluate(&c, &lines, &obs).unwrap(),
        "2",
        "no tiers stored: the line's TTL, and under twice it (820 is not)"
    );
    obs.retry_tiers = vec![200, 400, 800];
    assert_eq!(evaluate(&c, &lines, &obs).unwrap(), "2");
    obs.retry_tiers = vec![200, 400, 900];
    assert_eq!(evaluate(&c, &lines, &obs).unwrap(), "1");
    // Every retry in the last tier: long enough, and too long for the
    // first two attempts (as long as the next tier's TTL, or longer).
    let last = entries(&[
        "[consumer] messageId=mid-2 attempt=1 tier=t3 ttlMs=800 status=retry_scheduled",
        "[consumer] messageId=mid-2 attempt=2 delayMs=805 status=received",
        "[consumer] messageId=mid-2 attempt=2 tier=t3 ttlMs=800 status=retry_scheduled",
        "[consumer] messageId=mid-2 attempt=3 delayMs=800 status=received",
        "[consumer] messageId=mid-2 attempt=3 tier=t3 ttlMs=800 status=retry_scheduled",
        "[consumer] messageId=mid-2 attempt=4 delayMs=810 status=received",
    ]);
    obs.retry_tiers = vec![200, 400, 800];
    assert_eq!(evaluate(&c, &last, &obs).unwrap(), "1");
}

/// Jepsen-style: literal histories for each verdict. Long because it
/// is a table: each history beside the verdict it must get.
#[test]
fn total_queue_verdicts() {
    let row = |e: &str| ("svc".to_string(), e.to_string());
    let events = Events(
        [
            ("mid-1", "E1"),
            ("mid-2", "E2"),
            ("mid-3", "E3"),
            ("mid-4", "E1"),
        ]
        .iter()
        .map(|(m, e)| (m.to_string(), e.to_string()))
        .collect(),
    );
    let confirmed = entries(&[
        "[producer] messageId=mid-1 status=confirmed",
        "[producer] messageId=mid-2 status=confirmed",
        "[producer] messageId=mid-3 status=confirmed",
    ]);
    let get = |lines: &[Entry], ground: &Ground, queued: &[&str]| {
        let queued = queued.iter().map(|s| s.to_string()).collect();
        total_queue(
            lines,
            ground,
            &queued,
            &events,
            &Owed::default(),
            &Queued::default(),
        )
        .into_iter()
        .map(|(_, n)| n)
        .collect::<Vec<_>>()
    };
    let mut g = Ground {
        business: vec![row("E1"), row("E2"), row("E3")],
        processed_rows: 3,
        rejected: Vec::new(),
        states: None,
        orders: Vec::new(),
    };
    assert_eq!(get(&confirmed, &g, &[]), vec![0, 0, 0]);
    g.business.push(row("E1"));
    assert_eq!(
        get(&confirmed, &g, &[]),
        vec![0, 1, 0],
        "a second effect is a duplicate"
    );
    g.business = vec![row("E2"), row("E3")];
    assert_eq!(
        get(&confirmed, &g, &[]),
        vec![1, 0, 0],
        "E1 confirmed, never applied"
    );
    assert_eq!(
        get(&confirmed, &g, &["E1"]),
        vec![0, 0, 0],
        "still queued (a DLQ) is not lost"
    );
    g.business.push(row("E9"));
    assert_eq!(
        get(&confirmed, &g, &["E1"]),
        vec![0, 0, 1],
        "applied, never published"
    );

    // An upstream resend: mid-4 carries E1 again. The inbox applied E1
    // once: nothing lost (the message id is transport detail).
    let resent = entries(&[
        "[producer] messageId=mid-1 status=confirmed",
        "[producer] messageId=mid-2 status=confirmed",
        "[producer] messageId=mid-3 status=confirmed",
        "[producer] messageId=mid-4 status=confirmed",
    ]);
    let once = Ground {
        business: vec![row("E1"), row("E2"), row("E3")],
        processed_rows: 3,
        rejected: Vec::new(),
        states: None,
        orders: Vec::new(),
    };
    assert_eq!(get(&resent, &once, &[]), vec![0, 0, 0]);
    // A consumer that applied both copies: one duplicate of E1.
    let twice = Ground {
        business: vec![row("E1"), row("E2"), row("E3"), row("E1")],
        processed_rows: 0,
        rejected: Vec::new(),
        states: None,
        orders: Vec::new(),
    };
    assert_eq!(get(&resent, &twice, &[]), vec![0, 1, 0]);
    // Two services each applying E1 once are not duplicates.
    let two = Ground {
        business: vec![
            row("E1"),
            ("other".into(), "E1".into()),
            row("E2"),
            row("E3"),
        ],
        processed_rows: 0,
        rejected: Vec::new(),
        states: None,
        orders: Vec::new(),
    };
    assert_eq!(get(&resent, &two, &[]), vec![0, 0, 0]);
    // A producer resend after a lost confirm: `mid-2.2` is E2.
    let producer_resend = entries(&[
        "[producer] messageId=mid-1 status=confirmed",
        "[producer] messageId=mid-2.2 status=confirmed",
        "[producer] messageId=mid-3 status=confirmed",
    ]);
    assert_eq!(get(&producer_resend, &once, &[]), vec![0, 0, 0]);
    // Sent without confirms, never applied: lost all the same.
    let unconfirmed = entries(&["[producer] messageId=mid-1 status=unconfirmed"]);
    let none = Ground::default();
    assert_eq!(get(&unconfirmed, &none, &[]), vec![1, 0, 0]);
    // Returned and parked: in a queue, not lost; returned and dropped: lost.
    let returned = entries(&["[producer] messageId=mid-1 status=returned"]);
    assert_eq!(get(&returned, &none, &["E1"]), vec![0, 0, 0]);
    assert_eq!(get(&returned, &none, &[]), vec![1, 0, 0]);
}

/// A service that consumes an event from two queues owes it once, and
/// a copy held for either of them keeps it.
#[test]
fn a_service_on_two_routed_queues_owes_the_event_once() {
    let events = Events(BTreeMap::from([("mid-1".to_string(), "E1".to_string())]));
    let sent = entries(&["[producer] messageId=mid-1 status=confirmed"]);
    let a = || BTreeSet::from(["A".to_string()]);
    let owed = Owed(BTreeMap::from([(
        "E1".to_string(),
        BTreeMap::from([("q1".to_string(), a()), ("q2".to_string(), a())]),
    )]));
    let none = Ground::default();
    let check = |queued_in: Queued| {
        let queued = queued_in.0.values().flatten().cloned().collect();
        total_queue(&sent, &none, &queued, &events, &owed, &queued_in)[0].1
    };
    assert_eq!(check(Queued::default()), 1);
    let in_q2 = Queued(BTreeMap::from([(
        "q2".to_string(),
        BTreeSet::from(["E1".to_string()]),
    )]));
    assert_eq!(check(in_q2), 0);
}

/// An event routed to two services is owed by each: one that never
/// applied it loses it, whatever the other did.
#[test]
fn lost_counts_each_service_an_event_was_owed_to() {
    let events = Events(BTreeMap::from([
        ("mid-1".to_string(), "E1".to_string()),
        ("mid-2".to_string(), "E2".to_string()),
    ]));
    let sent = entries(&[
        "[producer] messageId=mid-1 status=confirmed",
        "[producer] messageId=mid-2 status=confirmed",
    ]);
    let svc = |q: &str, s: &[&str]| (q.to_string(), s.iter().map(|s| s.to_string()).collect());
    // E1 to queues a (service A) and b (service B); E2 to a only, and to
    // a queue c nobody consumes.
    let owed = Owed(BTreeMap::from([
        (
            "E1".to_string(),
            BTreeMap::from([svc("a", &["A"]), svc("b", &["B"])]),
        ),
        (
            "E2".to_string(),
            BTreeMap::from([svc("a", &["A"]), svc("c", &[])]),
        ),
    ]));
    let row = |s: &str, e: &str| (s.to_string(), e.to_string());
    let lost = |business: Vec<(String, String)>, queued_in: &[(&str, &str)]| {
        let queued_in = Queued(queued_in.iter().fold(BTreeMap::new(), |mut m, (q, e)| {
            m.entry(q.to_string())
                .or_insert_with(BTreeSet::new)
                .insert(e.to_string());
            m
        }));
        let queued = queued_in.0.values().flatten().cloned().collect();
        let ground = Ground {
            business,
            processed_rows: 0,
            rejected: Vec::new(),
            states: None,
            orders: Vec::new(),
        };
        total_queue(&sent, &ground, &queued, &events, &owed, &queued_in)[0].1
    };
    let all = vec![row("A", "E1"), row("B", "E1"), row("A", "E2")];
    assert_eq!(lost(all.clone(), &[("c", "E2")]), 0);
    assert_eq!(
        lost(vec![row("A", "E1"), row("A", "E2")], &[]),
        1,
        "B never applied E1, though A did"
    );
    assert_eq!(
        lost(vec![row("A", "E1"), row("A", "E2")], &[("b", "E1")]),
        0,
        "still held for B's queue (in it, or a DLQ copy from it)"
    );
    assert_eq!(
        lost(vec![row("A", "E1"), row("B", "E1")], &[("c", "E2")]),
        1,
        "a copy in another routed queue does not stand for A's"
    );
    assert_eq!(
        lost(vec![row("A", "E1"), row("A", "E2")], &[("parked", "E1")]),
        1,
        "a copy held for no queue of B's does not stand for B's"
    );
    assert_eq!(
        lost(vec![row("B", "E1")], &[]),
        2,
        "one per service: A owes E1 and E2"
    );
}

#[test]
fn verdicts() {
    let o = |n: &str, a: &str, pass| Outcome {
        kind: OutcomeKind::Assert,
        name: n.into(),
        expected: "0".into(),
        actual: a.into(),
        pass,
    };
    let v = BTreeMap::from([("duplicatesApplied".to_string(), Expect::from("1"))]);
    let pass = [o("duplicatesApplied", "0", true)];
    let dup = [
        o("duplicatesApplied", "1", false),
        o("duplicatesApplied", "1", false),
    ];
    assert_eq!(lab_verdict(&pass, None), LabVerdict::Holds);
    assert!(matches!(lab_verdict(&dup, None), LabVerdict::Failed(_)));
    assert_eq!(
        lab_verdict(&dup, Some(&v)),
        LabVerdict::CounterexampleConfirmed
    );
    assert!(
        matches!(lab_verdict(&pass, Some(&v)), LabVerdict::Failed(m) if m.contains("NOT confirmed"))
    );
    let other = [o("duplicatesApplied", "2", false)];
    assert!(
        matches!(lab_verdict(&other, Some(&v)), LabVerdict::Failed(m) if m.contains("differs"))
    );
    // A bound: every failing value within it.
    let some = BTreeMap::from([(
        "duplicatesApplied".to_string(),
        Expect::Within {
            min: Some(1),
            max: None,
        },
    )]);
    assert_eq!(
        lab_verdict(&other, Some(&some)),
        LabVerdict::CounterexampleConfirmed
    );
    let unread = [o("duplicatesApplied", "unknown", false)];
    assert!(
        matches!(lab_verdict(&unread, Some(&some)), LabVerdict::Failed(m) if m.contains("declared duplicatesApplied=1-or-more"))
    );
    let disagree = [
        o("duplicatesApplied", "1", false),
        o("duplicatesApplied", "2", false),
    ];
    assert!(matches!(
        lab_verdict(&disagree, Some(&v)),
        LabVerdict::Failed(_)
    ));
}

#[test]
fn assert_lines() {
    assert_eq!(
        assert_line("x", &"1".into(), &Ok("1".into())),
        ("x=1 PASS".into(), true)
    );
    assert_eq!(
        assert_line("x", &"0".into(), &Ok("1".into())),
        ("x=1 FAIL expected=0".into(), false)
    );
}
