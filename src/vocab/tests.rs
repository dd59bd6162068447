use super::*;

/// A broker's version names its generation; a cluster's suffix and
/// another minor version do not fool it.
#[test]
fn generation_of_a_reported_version() {
    let of = Generation::of_version;
    assert_eq!(of("RabbitMQ 3.10.8"), Some(Generation::V3_10));
    assert_eq!(of("RabbitMQ 4.0.5 (3 nodes)"), Some(Generation::V4_0));
    assert_eq!(of("RabbitMQ 4.0"), None);
    assert_eq!(of("RabbitMQ 3.13.7"), None);
    assert_eq!(of("RabbitMQ 4.0x.1"), None);
    assert_eq!(of("4.0.5"), None);
}

fn queue(name: &str, dlx: Option<(&str, &str)>) -> QueueDecl {
    let mut arguments = std::collections::BTreeMap::new();
    if let Some((x, k)) = dlx {
        arguments.insert("x-dead-letter-exchange".into(), ArgValue::Str(x.into()));
        arguments.insert("x-dead-letter-routing-key".into(), ArgValue::Str(k.into()));
    }
    QueueDecl {
        name: name.into(),
        durable: true,
        arguments,
        bindings: vec![],
        later: false,
    }
}

/// retry-dlq's loop comes back; x-death-count's main queue hands its
/// rejections to a slow lane that loops on its own; another exchange
/// cannot be told.
#[test]
fn dead_letter_chains_are_followed_through_the_default_exchange() {
    let t = |queues| Topology {
        exchanges: vec![],
        queues,
    };
    let retry_dlq = t(vec![
        queue("work", Some(("", "retry"))),
        queue("retry", Some(("", "work"))),
    ]);
    assert_eq!(retry_dlq.dead_letters_return("work"), Some(true));
    let lanes = t(vec![
        queue("main", Some(("", "slow"))),
        queue("slow", Some(("", "slow.retry"))),
        queue("slow.retry", Some(("", "slow"))),
    ]);
    assert_eq!(lanes.dead_letters_return("main"), Some(false));
    assert_eq!(lanes.dead_letters_return("slow"), Some(true));
    assert_eq!(lanes.dead_letters_reach("main", "slow"), Some(true));
    assert_eq!(lanes.dead_letters_reach("slow", "main"), Some(false));
    assert_eq!(
        t(vec![queue("q", None)]).dead_letters_return("q"),
        Some(false)
    );
    let other = t(vec![queue("q", Some(("dlx", "q")))]);
    assert_eq!(other.dead_letters_return("q"), None);
    assert_eq!(other.dead_letters_return("undeclared"), None);
}

/// What `rabbitmqctl eval` answers for a setting, as the lab reads it.
#[test]
fn broker_settings_are_read_from_eval() {
    let s = BrokerSetting::DeadLetterConfirmTimeout;
    assert_eq!(
        s.expression(),
        "application:get_env(rabbit, dead_letter_worker_publisher_confirm_timeout)."
    );
    assert_eq!(s.value_of("{ok,1000}\n"), "1000");
    assert_eq!(s.value_of("undefined"), "undefined (RabbitMQ's default)");
    assert_eq!(s.required(), "1000");
}

#[test]
fn every_pattern_has_exactly_one_definition() {
    for (p, _, _) in Pattern::ALL {
        assert_eq!(
            PATTERNS.iter().filter(|d| d.pattern == *p).count(),
            1,
            "{p}"
        );
    }
}

#[test]
fn topic_patterns_match_as_the_broker_routes() {
    for (p, k, m) in [
        ("order.created", "order.created", true),
        ("order.#", "order.created.eu", true),
        ("order.#", "order", true),
        ("order.*", "order.created", true),
        ("order.*", "order.created.eu", false),
        ("order.created.eu", "order.created", false),
        ("#", "", true),
        ("#.eu", "order.created.eu", true),
        ("*.created.#", "order.created", true),
    ] {
        assert_eq!(topic_matches(p, k), m, "{p} against {k}");
    }
}

#[test]
fn routes_follow_bindings_and_declarations() {
    let q = |name: &str, bind: &[(&str, &str)]| QueueDecl {
        name: name.into(),
        durable: true,
        arguments: Default::default(),
        bindings: bind
            .iter()
            .map(|(x, k)| (x.to_string(), k.to_string()))
            .collect(),
        later: false,
    };
    let t = Topology {
        exchanges: vec![ExchangeDecl {
            name: "x".into(),
            kind: ExchangeKind::Topic,
            durable: true,
            later: false,
        }],
        queues: vec![
            q("a", &[("x", "order.created")]),
            q("b", &[("x", "order.#")]),
        ],
    };
    let all: BTreeSet<&str> = ["a", "b"].into();
    let only_b: BTreeSet<&str> = ["b"].into();
    assert_eq!(t.route("x", "order.created", &all), Some(["a", "b"].into()));
    assert_eq!(t.route("x", "order.created", &only_b), Some(["b"].into()));
    assert_eq!(t.route("x", "invoice.paid", &all), Some(BTreeSet::new()));
    assert_eq!(t.route("", "a", &all), Some(["a"].into()));
    assert_eq!(t.route("y", "a", &all), None);
}

/// The windows each pattern passes, derived from its steps.
#[test]
fn windows_follow_from_the_steps() {
    use Window::*;
    // On a consume step without a DLQ (no `retry`).
    let w = |p: Pattern| p.def().windows_for(false);
    assert_eq!(
        w(Pattern::Inbox),
        [AfterReceive, BeforeCommit, AfterCommitBeforeAck, AfterAck]
    );
    // With one, the seed DLQ move's window comes last; the wrong order
    // has its own; none without a confirm, for autoAck, or for an inbox
    // committed on its own.
    let dlq = |p: Pattern| p.def().windows_for(true);
    assert_eq!(
        dlq(Pattern::Inbox),
        [
            AfterReceive,
            BeforeCommit,
            AfterCommitBeforeAck,
            AfterAck,
            AfterDlqConfirmBeforeAck
        ]
    );
    assert_eq!(
        dlq(Pattern::DlqAckFirst).last(),
        Some(&AfterAckBeforeDlqPublish)
    );
    for p in [
        Pattern::DlqNoConfirm,
        Pattern::AutoAck,
        Pattern::DedupOutsideTx,
    ] {
        assert_eq!(dlq(p), w(p), "{p}");
    }
    assert_eq!(
        w(Pattern::AckBeforeCommit),
        [AfterReceive, BeforeCommit, AfterAckBeforeCommit, AfterAck]
    );
    assert_eq!(
        w(Pattern::AutoAck),
        [AfterReceive, AfterAckBeforeCommit, AfterAck]
    );
    // The outbox of intents: after the ack, the call, then the mark.
    assert_eq!(
        w(Pattern::EffectIntent),
        [
            AfterReceive,
            BeforeCommit,
            AfterCommitBeforeAck,
            AfterAck,
            AfterDownstreamCall,
            AfterIntentDone
        ]
    );
    assert_eq!(
        w(Pattern::CallWithoutIntent),
        [
            AfterReceive,
            BeforeCommit,
            AfterCommitBeforeAck,
            AfterAck,
            AfterDownstreamCall
        ]
    );
    assert_eq!(
        w(Pattern::DedupOutsideTx),
        [
            AfterReceive,
            AfterInboxCommit,
            BeforeCommit,
            AfterCommitBeforeAck,
            AfterAck
        ]
    );
    assert_eq!(
        Pattern::Inbox.def().path(),
        "receive → inbox-insert → write → commit → ack"
    );
}

#[test]
fn names_round_trip_and_unknown_names_list_the_known_ones() {
    for (w, n, _) in Window::ALL {
        assert_eq!(n.parse::<Window>().unwrap(), *w);
        assert_eq!(w.to_string(), *n);
    }
    let e = "after-lunch".parse::<Window>().unwrap_err();
    assert!(
        e.starts_with("unknown fault window `after-lunch` (known: after-receive,"),
        "{e}"
    );
}

#[test]
fn counter_refs() {
    let c: CounterRef = "depthAfter:orders.dlq".parse().unwrap();
    assert_eq!(c.counter, Counter::DepthAfter);
    assert_eq!(c.arg.as_deref(), Some("orders.dlq"));
    assert_eq!(c.to_string(), "depthAfter:orders.dlq");
    assert!("nope"
        .parse::<CounterRef>()
        .unwrap_err()
        .contains("unknown counter"));
    assert!("depthAfter"
        .parse::<CounterRef>()
        .unwrap_err()
        .contains("needs an argument"));
    assert!("confirmed:q"
        .parse::<CounterRef>()
        .unwrap_err()
        .contains("takes no"));
    assert!("received".parse::<CounterRef>().is_ok());
    assert!("received:q".parse::<CounterRef>().is_ok());
}

#[test]
fn queue_arguments() {
    assert!(check_queue_argument("x-message-ttl", &ArgValue::Int(1000)).is_ok());
    assert!(
        check_queue_argument("x-message-ttl", &ArgValue::Str("1s".into()))
            .unwrap_err()
            .contains("non-negative integer")
    );
    assert!(check_queue_argument("x-mesage-ttl", &ArgValue::Int(1))
        .unwrap_err()
        .contains("unknown queue argument `x-mesage-ttl`"));
    assert!(check_queue_argument("x-queue-type", &ArgValue::Str("quorum".into())).is_ok());
    assert!(
        check_queue_argument("x-queue-type", &ArgValue::Str("fast".into()))
            .unwrap_err()
            .contains("one of classic, quorum, stream")
    );
}
