use super::*;

/// Broker, network and producer faults appear as notes on participants
/// of their own; no `;` (Mermaid's statement separator) in any note.
#[test]
fn mermaid_shows_broker_network_and_producer_faults() {
    let lines: Vec<String> = [
        "[producer] messageId=mid-1 destination=q routingKey=q status=confirmed",
        "[producer] messageId=mid-2 destination=q status=crash_injected",
        "[fault] target=broker action=restart status=injected",
        "[fault] target=broker action=restart status=healed",
        "[consumer] messageId=mid-1 destination=q attempt=1 redelivered=false status=received",
        "[fault] target=network action=cut window=after-commit-before-ack messageId=mid-1 status=injected",
        "[consumer] consumer=consumer-1 queue=q status=connection_lost",
        "[producer] messageId=mid-3 destination=q routingKey=q status=published",
        "[fault] target=network action=cut window=after-publish-before-broker messageId=mid-3 status=injected",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let m = mermaid(&lines);
    assert!(m.contains("participant B as RabbitMQ node"), "{m}");
    assert!(m.contains("participant N as network"), "{m}");
    assert!(m.contains("Note over B: broker restart"), "{m}");
    assert!(
        m.contains("Note over N: after-commit-before-ack of mid-1: the consumer's connection cut"),
        "{m}"
    );
    // A cut publish is the publish dropped, not an ack (publish-lost).
    assert!(
        m.contains("Note over N: the publish of mid-3 dropped"),
        "{m}"
    );
    assert!(
        !m.contains("of mid-3: the consumer's connection cut"),
        "{m}"
    );
    assert!(
        m.contains("Note over P: SIGKILL at the fault window (mid-2)"),
        "{m}"
    );
    assert!(m.contains("Note over C1: connection lost"), "{m}");
    assert!(!m.contains(';'), "{m}");
}

/// A broker pause is drawn from the registry's note, not as a restart.
#[test]
fn mermaid_draws_a_broker_pause_as_a_pause() {
    let lines: Vec<String> = [
        "[fault] target=broker action=pause window=after-publish-before-confirm messageId=mid-2 status=injected",
        "[producer] messageId=mid-2 destination=q routingKey=q status=confirm_timeout",
        "[fault] target=broker action=pause window=after-publish-before-confirm messageId=mid-2 status=healed",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let m = mermaid(&lines);
    assert!(
        m.contains("Note over B: the broker paused, the confirm of mid-2 held back"),
        "{m}"
    );
    assert!(m.contains("Note over B: resumed: it answers again"), "{m}");
    assert!(!m.contains("SIGKILL"), "{m}");
}

#[test]
fn mermaid_marks_the_kill_and_the_second_process() {
    let lines: Vec<String> = [
        "[producer] messageId=mid-1 destination=orders.crash routingKey=orders.crash status=confirmed",
        "[consumer] messageId=mid-1 destination=orders.crash attempt=1 redelivered=false status=received",
        "[consumer] messageId=mid-1 destination=orders.crash attempt=1 status=business_committed",
        "[consumer] messageId=mid-1 destination=orders.crash status=crash_injected",
        "[assert] crashExitCode=137 PASS",
        "[consumer] messageId=mid-1 destination=orders.crash attempt=1 redelivered=true status=received",
        "[consumer] messageId=mid-1 destination=orders.crash attempt=1 status=duplicate_skipped",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let m = mermaid(&lines);
    assert!(m.starts_with("sequenceDiagram\n"));
    assert!(m.contains("participant Q1 as orders.crash"));
    assert!(m.contains("participant C2 as consumer process 2"));
    assert!(m.contains("Note over C1: SIGKILL at the fault window (mid-1)"));
    assert!(m.contains("Q1->>C2: mid-1 (attempt 1, redelivered)"));
    assert!(m.contains("C2->>DB: inbox hit for mid-1"));
}

/// A program's competing instances: each observed line is drawn on the
/// instance it names.
#[test]
fn mermaid_draws_each_program_instance() {
    let lines: Vec<String> = [
        "[observe] messageId=mid-1 destination=q consumer=consumer-1 redelivered=false status=delivered",
        "[observe] messageId=mid-1 destination=q consumer=consumer-1 status=at_rendezvous",
        "[observe] messageId=mid-2 destination=q consumer=consumer-2 redelivered=false status=delivered",
        "[observe] messageId=mid-1 destination=q consumer=consumer-1 status=committed",
        "[observe] messageId=mid-2 destination=q consumer=consumer-2 status=committed",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let m = mermaid(&lines);
    assert!(m.contains("participant C2 as consumer process 2"), "{m}");
    assert!(m.contains("Q1->>C2: mid-2"), "{m}");
    assert!(m.contains("C1->>DB: COMMIT (mid-1)"), "{m}");
    assert!(m.contains("C2->>DB: COMMIT (mid-2)"), "{m}");
    assert!(
        m.contains("Note over C1: held at its COMMIT (mid-1)"),
        "{m}"
    );
}

/// A `;` ends a Mermaid statement: none may reach a diagram raw, from
/// the notes' own words or from the run's values.
#[test]
fn mermaid_writes_no_raw_semicolon() {
    let lines: Vec<String> = [
        "[producer] messageId=a;b destination=q routingKey=q status=confirmed",
        "[consumer] messageId=a;b destination=q attempt=1 redelivered=false status=received",
        "[fault] target=node node=1 action=kill status=injected",
        "[fault] target=consumer action=rendezvous messageId=a;b onLock=consumer-2 status=injected",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let m = mermaid(&lines);
    assert_eq!(m.matches(';').count(), m.matches("#59;").count(), "{m}");
    assert!(m.contains("a#59;b"), "{m}");
}
