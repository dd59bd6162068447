//! The lab checker's tests. A table for the most part: its core is
//! `every_error_message_from_a_snippet`, one row per error message (about
//! 650 lines), kept whole so that every message reads beside its snippet.

use std::path::PathBuf;

use crate::lab::Action;
use crate::vocab::Then;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

const BASE: &str = r#"
name = "t"
claim = "c"

[[queue]]
name = "q"

[[step]]
publish = { routing_key = "q", messages = ["order-1001", "order-1002"] }

[[step]]
consume = { queue = "q", settle = 2 }
fault = { target = "consumer", action = "kill", window = "after-commit-before-ack", message = "mid-1", then = "restart", assert = ["crashExitCode"] }
assert = ["rows"]

[counters]
rows = "businessRows"

[expect]
crashExitCode = 137
rows = 2

[variant.v]
claim = "v"
pattern = "no-inbox"
violations = { rows = 3 }
"#;

/// A count expects an integer, a bound or a word it prints; a
/// variant's violation may also declare a bound, or `unknown` for an
/// assertion it could not read.
#[test]
fn typed_expectations_load() {
    for (from, to, variant) in [
        ("rows = 2\n", "rows = { min = 1 }\n", None),
        ("rows = 2\n", "rows = { min = 1, max = 2 }\n", None),
        (
            "violations = { rows = 3 }",
            "violations = { rows = { min = 3 }, lost = { max = 1 } }",
            Some("v"),
        ),
        (
            "violations = { rows = 3 }",
            "violations = { rows = \"unknown\" }",
            Some("v"),
        ),
    ] {
        let text = BASE.replacen(from, to, 1);
        assert_ne!(text, BASE, "{from}");
        let lab = super::super::from_str(&text, "t", &fixtures(), variant);
        assert!(lab.is_ok(), "{to}: {:?}", lab.err().map(|e| e.to_string()));
    }
    let lab = super::super::from_str(
        &BASE.replacen("rows = 2\n", "rows = { min = 1 }\n", 1),
        "t",
        &fixtures(),
        None,
    )
    .unwrap();
    let rows = lab.steps[1]
        .asserts
        .iter()
        .find(|a| a.name == "rows")
        .unwrap();
    assert_eq!(
        rows.expected,
        crate::expect::Expect::Within {
            min: Some(1),
            max: None
        }
    );
}

/// Every lab-file error, from a small edit of a valid lab: the edit, the
/// variant to load, and the one line it must produce. A table, long by
/// design: one row per error kind.
#[test]
fn every_error_message_from_a_snippet() {
    let cases: &[(&str, &str, Option<&str>, &str)] = &[
        (
            "[counters]",
            "[[step]]\ndelete = [\"nope\"]\n\n[counters]",
            None,
            "step[2].delete[0]: no queue `nope` is declared",
        ),
        (
            "[counters]",
            "[[step]]\ndelete = [\"q\"]\n\n[[step]]\ndelete = [\"q\"]\n\n[[step]]\ndeclare = [\"q\"]\n\n[counters]",
            None,
            "step[3].delete[0]: `q` does not exist at this step (a `later` queue no `declare` step declared yet, or one deleted already): nothing to delete",
        ),
        (
            "[counters]",
            "[[step]]\ndelete = [\"q\"]\n\n[[step]]\ninspect = [\"business_rows\"]\n\n[[step]]\ndeclare = [\"q\"]\n\n[counters]",
            None,
            "step[3]: `q` is deleted (step[2]) until a `declare` step declares it again",
        ),
        (
            "[counters]",
            "[[step]]\ndelete = [\"q\"]\nassert = [\"rows\"]\n\n[[step]]\ndeclare = [\"q\"]\n\n[counters]",
            None,
            "step[2].assert: `q` is deleted (step[2]) until a `declare` step declares it again",
        ),
        (
            "[counters]",
            "[[step]]\ndelete = [\"q\"]\n\n[counters]",
            None,
            "step[2]: `q` is deleted here and never declared again",
        ),
        (
            "[counters]",
            "[[step]]\ndeclare = [\"q\"]\n\n[counters]",
            None,
            "step[2].declare[0]: `q` is not an exchange or queue marked `later = true`, nor a queue a `delete` step deleted",
        ),
        (
            "[counters]",
            "[[step]]\nreplay = { from = \"q\", to = \"q\" }\n\n[counters]",
            None,
            "step[2].replay.to: a replay moves a queue's messages into another queue: `from` and `to` are the same queue, which it would never empty",
        ),
        (
            r#"then = "restart", assert"#,
            r#"then = "restart", restart_drain = true, restart_settle = 1, assert"#,
            None,
            "step[1].fault.restart_drain: `restart_drain` settles what the queue holds after the kill: it takes no `restart_settle` beside it",
        ),
        (r#"name = "t""#, r#"name = "u""#, None, "t.toml:2:8: name: `name` is `u` but the file is `t.toml`"),
        (
            r#"name = "t""#,
            "name = \"t\"\nbroker = \"kafka\"",
            None,
            "broker: unknown broker `kafka` (known: rabbitmq)",
        ),
        (
            r#"target = "consumer", action = "kill""#,
            r#"target = "database", action = "power-loss""#,
            None,
            "t.toml:13:20: step[1].fault.target: a database fault acts on a PostgreSQL of the run's own: set the lab's `database`",
        ),
        (
            r#"name = "t""#,
            "name = \"t\"\ntopic = \"kafka\"",
            None,
            "topic: unknown topic `kafka` (known: consuming, publishing, failure-handling, ordering-and-time, brokers-and-clusters, your-own-program)",
        ),
        (
            "rows = 2\n",
            "rows = \"two\"\n",
            None,
            "t.toml:21:8: expect.rows: `rows` is a count: an integer or a bound (`{ min = 1 }`, `{ max = 3 }`)",
        ),
        (
            "rows = 2\n",
            "rows = \"unknown\"\n",
            None,
            "expect.rows: `rows` is a count: an integer or a bound",
        ),
        (
            "violations = { rows = 3 }",
            "violations = { rows = true }",
            Some("v"),
            "variant.v.violations.rows: `rows` is a count: an integer or a bound (`{ min = 1 }`, `{ max = 3 }`), or `unknown` (not read)",
        ),
        (
            "violations = { rows = 3 }",
            "violations = { rows = 3, lost = \"unknown\" }",
            Some("v"),
            "variant.v.violations.lost: `lost` is a count: an integer or a bound (`{ min = 1 }`, `{ max = 3 }`)",
        ),
        (
            "rows = \"businessRows\"\n\n[expect]\ncrashExitCode = 137\nrows = 2\n",
            "rows = \"attempts:mid-1\"\n\n[expect]\ncrashExitCode = 137\nrows = { min = 1 }\n",
            None,
            "expect.rows: `rows` prints a text (a list, a name): a bound cannot hold",
        ),
        ("rows = 2\n", "rows = { min = 3, max = 1 }\n", None, "a bound whose `min` (3) is above its `max` (1)"),
        ("rows = 2\n", "rows = {}\n", None, "a bound names `min`, `max` or both"),
        (
            "rows = 2\n",
            "rows = { min = 0 }\n",
            None,
            "expect.rows: `rows`: a bound with no `max` and a `min` of 0 or less holds for every count: it cannot fail",
        ),
        (
            r#"window = "after-commit-before-ack""#,
            r#"window = "after-lunch""#,
            None,
            "t.toml:13:58: step[1].fault.window: unknown fault window `after-lunch` (known: after-receive,",
        ),
        (
            r#"messages = ["order-1001", "order-1002"] }"#,
            r#"messages = ["order-1001", "order-1002"], batch = 1 }"#,
            None,
            "step[0].publish.batch: a batch holds at least 2 messages",
        ),
        (
            r#"messages = ["order-1001", "order-1002"] }"#,
            "messages = [\"order-1001\", \"order-1002\"], batch = 10 }\nfault = { target = \"producer\", action = \"kill\", window = \"after-confirm\", message = \"mid-1\", then = \"restart\" }",
            None,
            "step[0].fault: a batching producer keeps no journal across a restart",
        ),
        (
            r#"consume = { queue = "q", settle = 2 }"#,
            r#"consume = { queue = "q", settle = 2, commits_first = true }"#,
            None,
            "step[1].consume.commits_first: `commits_first` declares the order of one program",
        ),
        (
            "[variant.v]",
            "[variant.v]\nflush = false",
            Some("v"),
            "variant.v.flush: no publish step of this lab sets `batch`",
        ),
        (
            r#"messages = ["order-1001", "order-1002"] }"#,
            r#"messages = ["order-1001", "order-1002"], flush = false }"#,
            None,
            "step[0].publish.flush: `flush = false` is for a batching producer: set `batch` too",
        ),
        (
            r#"settle = 2 }"#,
            r#"settle = 0 }"#,
            None,
            "step[1].consume.settle: `0`: settle is a positive number of messages, or \"drain\"",
        ),
        (
            r#"consume = { queue = "q""#,
            r#"consume = { queue = "r""#,
            None,
            "t.toml:12:21: step[1].consume.queue: no queue `r` is declared (hint: declare it in a [[queue]] table)",
        ),
        (
            r#"message = "mid-1""#,
            r#"message = "mid-9""#,
            None,
            "step[1].fault.message: `mid-9` is not published before this step (published: mid-1, mid-2)",
        ),
        (
            r#""order-1002"]"#,
            r#""order-9999"]"#,
            None,
            "step[0].publish.messages[1]: fixture `",
        ),
        (
            r#""order-1002"]"#,
            r#""order-4001-payment-reminder"]"#,
            None,
            "step[0].publish.messages[1]: fixture `order-4001-payment-reminder` is a delayed task (`dueInMs` 200, published with no `expiration_ms`): give it `dueInMs` and `maxLatenessMs`, and publish it with `expiration_ms` equal to `dueInMs`",
        ),
        (
            r#""order-1002"]"#,
            r#"{ fixture = "order-4001-payment-reminder", expiration_ms = 300 }]"#,
            None,
            "step[0].publish.messages[1]: fixture `order-4001-payment-reminder` is a delayed task (`dueInMs` 200, published with `expiration_ms = 300`)",
        ),
        (
            r#"routing_key = "q", "#,
            "",
            None,
            "t.toml:9:25: step[0].publish.messages[0]: no `routing_key` (set it on the message or the step)",
        ),
        (
            "rows = 2\n",
            "rows = { at_least = 2 }\n",
            None,
            "expect.rows: unknown key `at_least` in a bound: `min`, `max`",
        ),
        (
            "rows = 2\n",
            "rows = 2.5\n",
            None,
            "expect.rows: invalid type: floating point `2.5`, expected an integer, `true`/`false`, a string (what the assertion prints) or a bound",
        ),
        (
            r#"assert = ["rows"]"#,
            r#"assert = ["rows", "nope"]"#,
            None,
            "step[1].assert[1]: `nope`: unknown counter `nope` (known: confirmed,",
        ),
        (
            r#"assert = ["rows"]"#,
            r#"assert = ["rows", "confirmed"]"#,
            None,
            "step[1].assert[1]: `confirmed` has no expected value in [expect] (hint: add `confirmed = <value>` under [expect])",
        ),
        (r#"rows = 2"#, "rows = 2\nlost = 0", None, "expect.lost: `lost` is never asserted by a step"),
        (
            r#"rows = "businessRows""#,
            "rows = \"businessRows\"\nother = \"unique\"",
            None,
            "counters.other: alias `other` is never asserted (no [expect] value)",
        ),
        (
            r#"window = "after-commit-before-ack""#,
            r#"window = "after-inbox-commit""#,
            None,
            "step[1].fault.window: pattern `inbox` never reaches window `after-inbox-commit` (it passes: after-receive, before-commit, after-commit-before-ack, after-ack)",
        ),
        (
            r#"pattern = "no-inbox""#,
            r#"pattern = "inbox""#,
            Some("v"),
            "variant.v.pattern: `inbox` is a safe pattern, but a counterexample runs a consumer missing a safety step (hint: unsafe patterns: no-inbox,",
        ),
        (r#"violations = { rows = 3 }"#, "violations = {}", Some("v"), "variant.v.violations: a counterexample declares at least one violation"),
        (
            r#"violations = { rows = 3 }"#,
            "violations = { row = 3 }",
            Some("v"),
            "variant.v.violations.row: `row` is neither an assertion of this lab nor a check (lost, duplicatesApplied, unexpected)",
        ),
        (r#"claim = "v""#, r#"claim = "v""#, Some("w"), "t.toml: unknown variant `w` of lab `t` (known: v)"),
        (
            r#"violations = { rows = 3 }"#,
            "violations = { rows = 3 }\n[variant.v.rabbitmq.\"4.1\"]\ncause = \"c\"\nsource = \"https://x\"\nviolations = { rows = 4 }",
            Some("v"),
            "variant.v.rabbitmq.4.1: unknown RabbitMQ generation `4.1` (known: 3.10, 4.0)",
        ),
        (
            r#"violations = { rows = 3 }"#,
            "violations = { rows = 3 }\n[variant.v.rabbitmq.\"4.0\"]\ncause = \" \"\nsource = \"https://x\"\nviolations = { rows = 4 }",
            Some("v"),
            "variant.v.rabbitmq.4.0.cause: say which broker change causes the difference, in a sentence (or \"cause not identified\")",
        ),
        (
            r#"violations = { rows = 3 }"#,
            "violations = { rows = 3 }\n[variant.v.rabbitmq.\"3.10\"]\ncause = \"c\"\nsource = \"https://x\"\nviolations = { rows = 4 }",
            Some("v"),
            "variant.v.rabbitmq.3.10: 3.10 is the generation the stored snapshots come from: declare a difference on another one",
        ),
        (
            r#"violations = { rows = 3 }"#,
            "violations = { rows = 3 }\n[variant.v.rabbitmq.\"4.0\"]\ncause = \"c\"\nsource = \"a guess\"\nviolations = { rows = 4 }",
            Some("v"),
            "variant.v.rabbitmq.4.0.source: name the release note or doc page of the broker change (a URL), or say \"cause not identified\"",
        ),
        (
            r#"violations = { rows = 3 }"#,
            "violations = { rows = 3 }\n[variant.v.rabbitmq.\"4.0\"]\ncause = \"c\"\nsource = \"https://x\"\nviolations = {  }",
            Some("v"),
            "variant.v.rabbitmq.4.0.violations: a counterexample declares at least one violation",
        ),
        (
            r#"violations = { rows = 3 }"#,
            "violations = { rows = 3 }\n[variant.v.rabbitmq.\"4.0\"]\ncause = \"c\"\nsource = \"https://x\"\nviolations = { row = 4 }",
            Some("v"),
            "variant.v.rabbitmq.4.0.violations.row: `row` is neither an assertion of this lab nor a check (lost, duplicatesApplied, unexpected)",
        ),
        (
            "[[queue]]\nname = \"q\"",
            "[[queue]]\nname = \"q\"\narguments = { \"x-message-ttl\" = \"1s\" }",
            None,
            "queue[0].arguments.x-message-ttl: `x-message-ttl` takes a non-negative integer, not \"1s\"",
        ),
        (
            "[[queue]]\nname = \"q\"",
            "[[queue]]\nname = \"q\"\narguments = { \"x-mesage-ttl\" = 5 }",
            None,
            "queue[0].arguments.x-mesage-ttl: unknown queue argument `x-mesage-ttl` (known: x-message-ttl,",
        ),
        (
            "[[queue]]\nname = \"q\"",
            "[[queue]]\nname = \"q\"\ndurable = false\narguments = { \"x-queue-type\" = \"quorum\" }",
            None,
            "queue[0].durable: a quorum queue is always durable (hint: drop `durable = false`)",
        ),
        (
            "[[queue]]\nname = \"q\"",
            "[[queue]]\nname = \"q\"\n[[queue]]\nname = \"q\"",
            None,
            "queue[1].name: queue `q` is declared twice",
        ),
        (
            "[[queue]]\nname = \"q\"",
            "[[queue]]\nname = \"q\"\nbind = [{ exchange = \"x\", key = \"k\" }]",
            None,
            "queue[0].bind[0].exchange: no exchange `x` is declared",
        ),
        (
            r#"publish = { routing_key"#,
            r#"publish = { exchange = "x", routing_key"#,
            None,
            "step[0].publish.exchange: no exchange `x` is declared",
        ),
        (
            r#"target = "consumer""#,
            r#"target = "postman""#,
            None,
            "step[1].fault.target: unknown fault target `postman` (known: producer, consumer, broker, network, node, database)",
        ),
        (
            "[[step]]\nconsume = { queue = \"q\", settle = 2 }",
            "[[step]]\ninspect = [\"business_rows\"]\nconsume = { queue = \"q\", settle = 2 }",
            None,
            "step[1]: a step has exactly one of `publish`, `consume`, `inspect`",
        ),
        (r#"claim = "c""#, "claim = \"c\"\ncolour = \"red\"", None, "unknown field `colour`"),
        (
            r#"fault = { target = "consumer""#,
            r#"fault = { target = "producer""#,
            None,
            "step[1].fault.action: `kill` of the producer does not belong on this step",
        ),
        (
            r#"fault = { target = "consumer", action = "kill""#,
            r#"fault = { target = "network", action = "hold""#,
            None,
            "step[1].fault.action: `hold` of the network does not belong on this step",
        ),
        (
            r#"fault = { target = "consumer", action = "kill""#,
            r#"fault = { target = "network", action = "hold""#,
            None,
            "(producer: kill on a publish step; consumer: kill, rendezvous or stall (built-in consumer) on a consume step; broker: pause on a publish step, restart in a step of its own; network: cut (built-in consumer) on a consume step, cut or hold on a publish step; node: kill on a publish step, kill, restart, partition or heal in a step of its own; database: kill (built-in consumer) or power-loss (built-in consumer) on a consume step)",
        ),
        (
            r#"settle = 2 }"#,
            r#"settle = 2, instances = 2 }"#,
            None,
            "t.toml:12:50: step[1].consume.instances: `instances = 2` runs competing consumers, whose order only a `rendezvous` or `stall` fault fixes",
        ),
        (
            "settle = 2 }\nfault = { target = \"consumer\", action = \"kill\", window = \"after-commit-before-ack\", message = \"mid-1\", then = \"restart\",",
            "settle = 2 }\nfault = { target = \"consumer\", action = \"rendezvous\", window = \"before-commit\", message = \"mid-1\",",
            None,
            "step[1].fault: a rendezvous holds one copy of the event per instance: set `instances` to 2 or more on the step",
        ),
        (
            "settle = 2 }\nfault = { target = \"consumer\", action = \"kill\", window = \"after-commit-before-ack\", message = \"mid-1\", then = \"restart\",",
            "settle = 2, instances = 2 }\nfault = { target = \"consumer\", action = \"rendezvous\", window = \"before-commit\", message = \"mid-1\",",
            None,
            "step[1].fault.message: `instances = 2` needs as many copies of `mid-1`'s event published before this step (found 1: mid-1)",
        ),
        (
            "settle = 2 }\nfault = { target = \"consumer\", action = \"kill\", window = \"after-commit-before-ack\", message = \"mid-1\", then = \"restart\",",
            "settle = 2, instances = 2, command = \"true\" }\nfault = { target = \"consumer\", action = \"rendezvous\", window = \"after-commit-before-ack\", message = \"mid-1\",",
            None,
            "t.toml:13:64: step[1].fault.window: `rendezvous` of the consumer never passes window `after-commit-before-ack` (it passes: before-commit)",
        ),
        (
            "settle = 2 }\nfault = { target = \"consumer\", action = \"kill\", window = \"after-commit-before-ack\", message = \"mid-1\", then = \"restart\",",
            "settle = 2, prefetch = 2, instances = 2 }\nfault = { target = \"consumer\", action = \"rendezvous\", window = \"before-commit\", message = \"mid-1\",",
            None,
            "step[1].fault: competing consumers under a rendezvous take one message at a time: set `prefetch = 1`",
        ),
        (
            r#"pattern = "no-inbox""#,
            "pattern = \"no-inbox\"\narguments = { \"nope\" = { \"x-overflow\" = \"drop-head\" } }",
            Some("v"),
            "variant.v.arguments.nope: no queue `nope` is declared",
        ),
        (
            "pattern = \"no-inbox\"",
            "pattern = \"no-inbox\"\nbind = { \"nope\" = [{ exchange = \"x\", key = \"k\" }] }",
            Some("v"),
            "variant.v.bind.nope: no queue `nope` is declared",
        ),
        (
            "pattern = \"no-inbox\"",
            "pattern = \"no-inbox\"\nunset = { \"q\" = [\"x-max-length\"] }",
            Some("v"),
            "variant.v.unset.q: queue `q` sets no argument `x-max-length` to remove",
        ),
        (
            "pattern = \"no-inbox\"",
            "pattern = \"no-inbox\"\nunset = { \"nope\" = [\"x-max-length\"] }",
            Some("v"),
            "variant.v.unset.nope: no queue `nope` is declared",
        ),
        (
            "[[step]]\nconsume",
            "[[step]]\npurge_inbox = { retention_ms = 0 }\nconsume",
            None,
            "step[1]: a step has exactly one of `publish`, `consume`, `inspect`, `declare`, `delete`, `await`, `purge_inbox`, `policy`, `replay` (or only a broker `fault`)",
        ),
        (
            "[[step]]\nconsume",
            "[[step]]\nawait = { queue = \"q\", depth = 1, within_secs = 1, from = \"nope\" }\n\n[[step]]\nconsume",
            None,
            "step[1].await.from: no queue `nope` is declared",
        ),
        (
            "name = \"q\"\n\n[[step]]\npublish",
            "name = \"q\"\n\n[[queue]]\nname = \"e\"\n\n[[queue]]\nname = \"d\"\n\n[[step]]\nawait = { queue = \"d\", depth = 1, within_secs = 1, from = \"q\" }\n\n[[step]]\npublish",
            None,
            "step[0].await.from: `q` does not dead-letter straight into `d`",
        ),
        (
            "name = \"q\"\n\n[[step]]\npublish",
            "name = \"q\"\narguments = { \"x-dead-letter-exchange\" = \"\", \"x-dead-letter-routing-key\" = \"e\" }\n\n[[queue]]\nname = \"e\"\narguments = { \"x-dead-letter-exchange\" = \"\", \"x-dead-letter-routing-key\" = \"d\" }\n\n[[queue]]\nname = \"d\"\n\n[[step]]\nawait = { queue = \"d\", depth = 1, within_secs = 1, from = \"q\" }\n\n[[step]]\npublish",
            None,
            "step[0].await.from: `q` does not dead-letter straight into `d`",
        ),
        (
            "name = \"q\"\n\n[[step]]\npublish",
            "name = \"q\"\narguments = { \"x-dead-letter-exchange\" = \"\", \"x-dead-letter-routing-key\" = \"d\" }\n\n[[queue]]\nname = \"e\"\n\n[[queue]]\nname = \"d\"\n\n[[step]]\nawait = { queue = \"d\", depth = 1, within_secs = 1, from = \"q\" }\n\n[[step]]\npublish",
            None,
            "(no error)",
        ),
        (
            "name = \"q\"\n\n[[step]]\npublish",
            "name = \"q\"\narguments = { \"x-dead-letter-exchange\" = \"x\", \"x-dead-letter-routing-key\" = \"k\" }\n\n[[exchange]]\nname = \"x\"\nkind = \"fanout\"\n\n[[queue]]\nname = \"e\"\nbind = [{ exchange = \"x\", key = \"k\" }]\n\n[[queue]]\nname = \"d\"\nbind = [{ exchange = \"x\", key = \"k\" }]\n\n[[step]]\nawait = { queue = \"d\", depth = 1, within_secs = 1, from = \"q\" }\n\n[[step]]\npublish",
            None,
            "step[0].await.from: `q` does not dead-letter straight into `d`",
        ),
        (
            "[[step]]\nconsume",
            "[[step]]\nawait = { queue = \"q\", depth = 1, within_secs = 1, from = \"q\" }\n\n[[step]]\nconsume",
            None,
            "step[1].await.from: `q` does not dead-letter straight into `q`",
        ),
        (
            "[[step]]\nconsume",
            "[[step]]\npolicy = { name = \"p\", queue = \"nope\", definition = { \"dead-letter-exchange\" = \"\" } }\n\n[[step]]\nconsume",
            None,
            "step[1].policy.queue: no queue `nope` is declared",
        ),
        (
            "name = \"q\"\n\n[[step]]\n",
            "name = \"q\"\narguments = { \"x-queue-type\" = \"quorum\" }\n\n[[step]]\npolicy = { name = \"p\", queue = \"q\", definition = { \"dead-letter-exchange\" = \"\" } }\n\n[[step]]\n",
            None,
            "step[0].policy.queue: a policy step waits for a classic queue to apply the policy; `q` is a quorum queue",
        ),
        (
            "[[step]]\nconsume",
            "[[step]]\npolicy = { name = \"p\", queue = \"q\", definition = { \"dead-letter-exchange\" = \"\" } }\nconsume",
            None,
            "step[1]: a step has exactly one of",
        ),
        (
            r#"claim = "c""#,
            "claim = \"c\"\nfacts = [\"nope\"]",
            None,
            "facts[0]: `nope` is no assertion of this lab (its assertions: rows, crashExitCode)",
        ),
        (
            r#"claim = "c""#,
            "claim = \"c\"\nfacts = [\"rows\"]",
            None,
            "facts[0]: `rows` is falsified by the variant `v`: it is evidence of the claim, not a fact",
        ),
        (
            r#"claim = "c""#,
            "claim = \"c\"\nbroker_facts = [\"rows\"]",
            None,
            "broker_facts[0]: `rows` is falsified by the variant `v`: it is evidence of the claim, not a fact",
        ),
        (
            r#"claim = "c""#,
            "claim = \"c\"\nfacts = [\"crashExitCode\"]\nbroker_facts = [\"crashExitCode\"]",
            None,
            "broker_facts[0]: `crashExitCode` is in `facts` and in `broker_facts`: a fact is fixed by the harness or given by the broker, one of the two",
        ),
        (
            r#"window = "after-commit-before-ack", message"#,
            r#"window = "after-commit-before-ack", commit = 2, message"#,
            None,
            "t.toml:13:94: step[1].fault.commit: `commit` picks which of a program's COMMITs for the message `before-commit` holds (1: the first): it needs `window = \"before-commit\"` on a consume step that runs a program, and a value of 1 or more",
        ),
        (
            "consume = { queue = \"q\", settle = 2 }\nfault = { target = \"consumer\", action = \"kill\"",
            "consume = { queue = \"q\", settle = 2, command = \"true\" }\nfault = { target = \"network\", action = \"cut\"",
            None,
            "t.toml:13:40: step[1].fault.action: `cut` of the network acts on the built-in consumer's own frames, not on a program's",
        ),
        (
            r#"publish = { routing_key = "q", messages = ["order-1001", "order-1002"] }"#,
            r#"publish = { routing_key = "q", confirm = false, confirm_timeout_ms = 500, messages = ["order-1001", "order-1002"] }
fault = { target = "network", action = "hold", window = "after-publish-before-confirm", message = "mid-1" }"#,
            None,
            "step[0].fault: `hold` of the network holds the confirm until the producer gives up on it",
        ),
        (
            r#"messages = ["order-1001", "order-1002"] }"#,
            r#"messages = ["order-1001", "order-1002"] }
fault = { target = "network", action = "hold", window = "after-publish-before-confirm", message = "mid-1" }"#,
            None,
            "t.toml:10:9: step[0].fault: `hold` of the network holds the confirm until the producer gives up on it: the publish step needs `confirm = true` and a `confirm_timeout_ms`",
        ),
        (
            r#"messages = ["order-1001", "order-1002"] }"#,
            r#"messages = ["order-1001", "order-1002"] }
fault = { target = "broker", action = "pause", window = "after-publish-before-confirm", message = "mid-1" }"#,
            None,
            "t.toml:10:9: step[0].fault: `pause` of the broker holds the confirm until the producer gives up on it: the publish step needs `confirm = true` and a `confirm_timeout_ms`",
        ),
        (
            r#"fault = { target = "consumer", action = "kill""#,
            r#"fault = { target = "broker", action = "pause""#,
            None,
            "step[1].fault.action: `pause` of the broker does not belong on this step",
        ),
        (
            "[[step]]\nconsume",
            "[[step]]\nfault = { target = \"broker\", action = \"pause\" }\n\n[[step]]\nconsume",
            None,
            "step[1].fault.target: `pause` of the broker does not belong on this step",
        ),
        (
            r#"fault = { target = "consumer", action = "kill", window = "after-commit-before-ack""#,
            r#"fault = { target = "network", action = "cut", window = "after-receive""#,
            None,
            "step[1].fault.window: `cut` of the network never passes window `after-receive` (it passes: before-commit, after-commit-before-ack)",
        ),
        (
            "settle = 2 }\nfault = { target = \"consumer\", action = \"kill\", window = \"after-commit-before-ack\", message = \"mid-1\", then = \"restart\"",
            "settle = \"drain\", instances = 2 }\nfault = { target = \"consumer\", action = \"stall\", window = \"after-commit-before-ack\", message = \"mid-1\"",
            None,
            "step[1].fault.window: a stall holds its instance before the message's commit and ack",
        ),
        (
            "settle = 2 }\nfault = { target = \"consumer\", action = \"kill\", window = \"after-commit-before-ack\", message = \"mid-1\", then = \"restart\"",
            "settle = 2, instances = 2 }\nfault = { target = \"consumer\", action = \"stall\", window = \"after-receive\", message = \"mid-1\"",
            None,
            "step[1].fault: a stall holds the instance that takes the message while one other settles the rest of the queue",
        ),
        (
            r#"then = "restart""#,
            r#"then = "reconnect""#,
            None,
            "step[1].fault.then: `reconnect` does not follow `kill` of the consumer: `restart` does",
        ),
        (
            r#"window = "after-commit-before-ack", message = "mid-1", "#,
            "",
            None,
            "step[1].fault: the consumer acts at a window, for one message: set `window` and `message`",
        ),
        (
            "[[step]]\nconsume",
            "[[step]]\nfault = { target = \"broker\", action = \"restart\", window = \"after-ack\" }\n\n[[step]]\nconsume",
            None,
            "step[1].fault.window: a broker restart happens between steps: it has no window and no message",
        ),
        (
            "[[step]]\nconsume",
            "[[step]]\nfault = { target = \"node\", node = 2, action = \"kill\" }\n\n[[step]]\nconsume",
            None,
            "step[1].fault.target: a `node` fault needs a cluster: set `nodes = 3`",
        ),
        (
            r#"then = "restart", "#,
            r#"then = "restart", node = 2, "#,
            None,
            "step[1].fault.node: `node` belongs to a fault on target `node`, not `consumer`",
        ),
        (
            r#"settle = 2 }"#,
            r#"settle = 2, node = 3 }"#,
            None,
            "step[1].consume.node: node 3 does not exist: the lab has 1",
        ),
        (
            "[[step]]\nconsume",
            "[[step]]\nfault = { target = \"consumer\", action = \"kill\" }\n\n[[step]]\nconsume",
            None,
            "step[1].fault.target: the consumer is faulted inside a publish or consume step, not in a step of its own",
        ),
        (
            r#"messages = ["order-1001", "order-1002"] }"#,
            r#"messages = ["order-1001", "order-1002"] }
fault = { target = "producer", action = "kill", window = "after-confirm", message = "mid-3" }"#,
            None,
            "step[0].fault.message: `mid-3` is not one of this step's messages (mid-1, mid-2)",
        ),
        (
            r#"messages = ["order-1001", "order-1002"] }"#,
            r#"messages = ["order-1001", "order-1002"] }
fault = { target = "producer", action = "kill", window = "before-commit", message = "mid-1" }"#,
            None,
            "step[0].fault.window: `kill` of the producer never passes window `before-commit` (it passes: after-publish-before-confirm, after-confirm)",
        ),
        (
            r#"publish = { routing_key = "q","#,
            r#"publish = { routing_key = "q", park = "q", confirm = false,"#,
            None,
            "step[0].publish.park: a publish without confirms never sees a return or a nack: nothing would be parked",
        ),
        (
            r#"publish = { routing_key = "q","#,
            r#"publish = { routing_key = "q", park = "q","#,
            None,
            "step[0].publish.park: only a `mandatory` publish is returned, and only a queue with `x-overflow = reject-publish` nacks one: nothing would be parked",
        ),
        (
            r#"settle = 2 }"#,
            r#"settle = "all" }"#,
            None,
            "step[1].consume.settle: `all`: settle is a positive number of messages, or \"drain\"",
        ),
        (
            r#"consume = { queue = "q","#,
            r#"consume = { queue = "q", downstream = { timeout_ms = 500 },"#,
            None,
            "step[1].consume.downstream: pattern `inbox` never calls a downstream service: drop `downstream`, or use a pattern that calls one (side-effect-key, no-idempotency-key, effect-intent, call-without-intent, intent-unkeyed, intent-mark-first)",
        ),
        (
            r#"pattern = "no-inbox""#,
            r#"pattern = "no-idempotency-key""#,
            Some("v"),
            "step[1].consume.downstream: pattern `no-idempotency-key` calls a downstream service: set `downstream` (timeout_ms, lose_response)",
        ),
        (
            r#"consume = { queue = "q","#,
            r#"consume = { queue = "q", pattern = "side-effect-key", retry = { max_attempts = 2, dlq = "q", tiers = ["q"] }, downstream = { timeout_ms = 500, lose_response = ["mid-7"] },"#,
            None,
            "step[1].consume.downstream.lose_response: `mid-7` is not published before this step",
        ),
        (
            r#"consume = { queue = "q","#,
            r#"consume = { queue = "q", retry = { max_attempts = 2, max_duration_ms = 500, dlq = "q" },"#,
            None,
            "step[1].consume.retry.max_duration_ms: `max_duration_ms` is a time budget the built-in classified patterns keep; pattern `inbox` would never look at it: drop it, or choose a classified pattern",
        ),
        (
            r#"consume = { queue = "q","#,
            r#"consume = { queue = "q", command = "true", downstream = { timeout_ms = 500 },"#,
            None,
            "step[1].consume.command: a program's behaviour is its own: `pattern`, `retry`, `transient_failures`, `max_deliveries` and `downstream` are for the built-in consumer",
        ),
        (
            r#"publish = { routing_key = "q","#,
            r#"publish = { routing_key = "q", orders = "outbox", mandatory = true, park = "q","#,
            None,
            "step[0].publish.orders: an outbox relay keeps a nacked row in its outbox: `park` does not apply to a step with `orders = \"outbox\"`",
        ),
        (
            r#"publish = { routing_key = "q","#,
            r#"publish = { routing_key = "q", orders = "direct", relay = true,"#,
            None,
            "step[0].publish.relay: `relay = true` is an outbox relay's next pass: set `orders` to an outbox handoff (outbox, outbox-after-commit, outbox-mark-first), without `reconcile`",
        ),
        (
            r#"publish = { routing_key = "q","#,
            r#"publish = { routing_key = "q", orders = "outbox", relay = true,"#,
            None,
            "step[0].publish.relay: `relay = true` is a later pass of the relay of an earlier publish step's outbox: no step before it commits orders with an outbox",
        ),
        (
            r#"publish = { routing_key = "q","#,
            r#"publish = { routing_key = "q", reconcile = true,"#,
            None,
            "step[0].publish.reconcile: a reconciliation job is an order service's that publishes directly: set `orders = \"direct\"` on the step, and keep `resend`",
        ),
        (
            r#"messages = ["order-1001", "order-1002"] }"#,
            r#"messages = ["order-1001", "order-1002"], orders = "direct", confirm = false }
fault = { target = "network", action = "cut", window = "after-publish-before-broker", message = "mid-1", then = "restart" }"#,
            None,
            "step[0].fault.action: an order service without confirms marks or moves on as soon as a publish is written",
        ),
        (
            "messages = [\"order-1001\", \"order-1002\"] }\n\n[[step]]\nconsume = { queue = \"q\",",
            "messages = [\"order-1001\", \"order-1002\"], orders = \"direct\", reconcile = true }\n\n[[step]]\nconsume = { queue = \"q\", command = \"true\",",
            None,
            "step: a reconciliation job compares the orders with the built-in consumer's business rows",
        ),
        (
            r#"pattern = "no-inbox""#,
            r#"pattern = "no-inbox"
reconcile = false"#,
            Some("v"),
            "variant.v.reconcile: no publish step of this lab sets `reconcile = true`: a variant's `reconcile = false` would change nothing",
        ),
        (
            r#"pattern = "no-inbox""#,
            r#"pattern = "no-inbox"
relay = false"#,
            Some("v"),
            "variant.v.relay: no publish step of this lab sets `relay = true`: a variant's `relay = false` would change nothing",
        ),
        (
            r#"pattern = "no-inbox""#,
            r#"pattern = "no-inbox"
orders = "direct""#,
            Some("v"),
            "variant.v.orders: no publish step of this lab sets `orders`: a variant's `orders` would change nothing",
        ),
        (
            r#"window = "after-commit-before-ack""#,
            r#"window = "after-order-commit""#,
            None,
            "step[1].fault.window: ",
        ),
    ];
    let mut wrong = Vec::new();
    for (from, to, variant, want) in cases {
        let text = BASE.replacen(from, to, 1);
        assert!(
            text != BASE || variant.is_some(),
            "edit `{from}` did not apply"
        );
        let lines = match super::super::from_str(&text, "t", &fixtures(), *variant) {
            Ok(_) => vec!["(no error)".to_string()],
            Err(e) => e.lines(),
        };
        if !lines.iter().any(|l| l.contains(want)) {
            wrong.push(format!("want `{want}`, got:\n  {}", lines.join("\n  ")));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A variant whose handoff has no outbox, on a lab with relay passes, is
/// refused at its own key, once.
#[test]
fn a_direct_variant_of_a_relay_lab_names_its_key() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("labs/reject-publish-resend.toml");
    let text = std::fs::read_to_string(path).unwrap()
        + "\n[variant.direct]\nclaim = \"x\"\norders = \"direct\"\nviolations = { lost = 1 }\n";
    let e = super::super::from_str(&text, "reject-publish-resend", &fixtures(), Some("direct"))
        .unwrap_err()
        .lines();
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].contains("variant.direct.orders: `orders = \"direct\"` leaves the lab's relay passes"),
        "{e:?}"
    );
}

/// A variant's prefetch on a lab with a stall is refused at its key.
#[test]
fn a_prefetch_variant_of_a_stall_lab_names_its_key() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("labs/per-key-workers.toml");
    let text = std::fs::read_to_string(path).unwrap()
        + "\n[variant.p]\nclaim = \"x\"\nprefetch = 10\nviolations = { orderVersion = \"1\" }\n";
    let e = super::super::from_str(&text, "per-key-workers", &fixtures(), Some("p"))
        .unwrap_err()
        .lines();
    assert!(
        e.iter()
            .any(|l| l
                .contains("variant.p.prefetch: competing consumers under a rendezvous or a stall")),
        "{e:?}"
    );
}

/// `depthAtKill` is read at a consumer kill: on any other fault it
/// would never be read, and is refused. Long: each edit of the lab file
/// and the error it must give, in turn.
#[test]
fn depth_at_kill_only_on_a_consumer_kill() {
    let at_kill = BASE
        .replacen(
            r#"assert = ["crashExitCode"]"#,
            r#"assert = ["crashExitCode", "d"]"#,
            1,
        )
        .replacen(
            "rows = \"businessRows\"",
            "rows = \"businessRows\"\nd = \"depthAtKill:q\"",
            1,
        )
        .replacen("rows = 2", "rows = 2\nd = 0", 1);
    assert!(super::super::from_str(&at_kill, "t", &fixtures(), None).is_ok());
    let cut = at_kill
        .replacen(
            r#"target = "consumer", action = "kill""#,
            r#"target = "network", action = "cut""#,
            1,
        )
        .replacen(r#"then = "restart", "#, "", 1);
    let step = at_kill.replacen(r#"assert = ["rows"]"#, r#"assert = ["rows", "d"]"#, 1);
    let e = super::super::from_str(&step, "t", &fixtures(), None).unwrap_err();
    assert!(
        e.to_string()
            .contains("step[1].assert[1]: `depthAtKill` is read at a kill"),
        "got {e}"
    );
    let e = super::super::from_str(&cut, "t", &fixtures(), None).unwrap_err();
    assert!(
        e.to_string().contains(
            "step[1].fault.assert: `depthAtKill` is read at a kill of the built-in consumer"
        ),
        "got {e}"
    );
    // The broker's unacked count is read at the same moment, from a
    // classic queue only.
    let fault_unacked = at_kill.replacen("depthAtKill:q", "unackedAtKill:q", 1);
    assert!(super::super::from_str(&fault_unacked, "t", &fixtures(), None).is_ok());
    let quorum = fault_unacked.replacen(
        "name = \"q\"\n",
        "name = \"q\"\narguments = { \"x-queue-type\" = \"quorum\" }\n",
        1,
    );
    let e = super::super::from_str(&quorum, "t", &fixtures(), None).unwrap_err();
    assert!(
        e.to_string().contains(
            "step[1].fault.assert[1]: `unackedAtKill` reads a classic queue's own process: `q` is a quorum queue"
        ),
        "got {e}"
    );
    // So is the age of its oldest message.
    let aged = quorum.replacen("unackedAtKill:q", "oldestAgeShownAtKill:q", 1);
    let e = super::super::from_str(&aged, "t", &fixtures(), None).unwrap_err();
    assert!(
        e.to_string().contains(
            "step[1].fault.assert[1]: `oldestAgeShownAtKill` reads a classic queue's own process"
        ),
        "got {e}"
    );
    let unacked = step.replacen("depthAtKill:q", "unackedAtKill:q", 1);
    let e = super::super::from_str(&unacked, "t", &fixtures(), None).unwrap_err();
    assert!(
        e.to_string()
            .contains("step[1].assert[1]: `unackedAtKill` is read at a kill"),
        "got {e}"
    );
    // The age of the oldest message: `yes` or `no`, never on a lazy queue.
    let aged = at_kill
        .replacen("depthAtKill:q", "oldestAgeShownAtKill:q", 1)
        .replacen("d = 0", "d = \"yes\"", 1);
    assert!(super::super::from_str(&aged, "t", &fixtures(), Some("v")).is_ok());
    let cases = [
        (
            aged.replacen("d = \"yes\"", "d = true", 1),
            None,
            "expect.d: `d` is `yes` or `no`",
        ),
        (
            aged.replacen("violations = { rows = 3 }", "violations = { rows = 3, d = 1 }", 1),
            Some("v"),
            "variant.v.violations.d: `d` is `yes` or `no`",
        ),
        (
            aged.replacen(
                "name = \"q\"\n",
                "name = \"q\"\narguments = { \"x-queue-mode\" = \"lazy\" }\n",
                1,
            ),
            None,
            "step[1].fault.assert[1]: `oldestAgeShownAtKill` reads the oldest message a queue holds in memory: `q` sets `x-queue-mode`",
        ),
    ];
    for (text, variant, line) in cases {
        let e = super::super::from_str(&text, "t", &fixtures(), variant).unwrap_err();
        assert!(e.to_string().contains(line), "{line}: got {e}");
    }
}

#[test]
fn the_base_lab_and_its_variant_load() {
    let lab = super::super::from_str(BASE, "t", &fixtures(), None).unwrap();
    assert_eq!(lab.steps.len(), 2);
    let v = super::super::from_str(BASE, "t", &fixtures(), Some("v")).unwrap();
    assert_eq!(v.run_name(), "t@v");
    assert_eq!(v.violations.get("rows"), Some(&"3".into()));
}

/// `{ fixture, count = N }`: N events from one fixture, each its own
/// eventId and order, with consecutive message ids a fault can name.
#[test]
fn a_series_of_events_from_one_fixture() {
    let text = BASE
        .replacen(
            r#"messages = ["order-1001", "order-1002"]"#,
            r#"messages = ["order-1002", { fixture = "order-1001", count = 3 }]"#,
            1,
        )
        .replacen(r#"message = "mid-1""#, r#"message = "mid-4""#, 1);
    let lab = super::super::from_str(&text, "t", &fixtures(), None).unwrap();
    let Action::Publish(p) = &lab.steps[0].action else {
        panic!("a publish step");
    };
    let ids: Vec<&str> = p
        .messages
        .iter()
        .map(|m| m.meta.message_id.as_str())
        .collect();
    assert_eq!(ids, ["mid-1", "mid-2", "mid-3", "mid-4"]);
    let events: Vec<String> = p
        .messages
        .iter()
        .map(|m| crate::store::event_id(m.body.as_bytes(), ""))
        .collect();
    assert_eq!(events[1], "01J7X8A6YQ4Q9M6Q4QG7H2J8F1-1");
    assert_eq!(events[3], "01J7X8A6YQ4Q9M6Q4QG7H2J8F1-3");
    assert_eq!(p.messages[2].meta.aggregate_id, "order-1001-2");
    for wrong in ["count = 0", "cuont = 3"] {
        let e = super::super::from_str(
            &text.replacen("count = 3", wrong, 1),
            "t",
            &fixtures(),
            None,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("step[0].publish.messages[1]"),
            "{wrong}: {e}"
        );
    }
}

/// A node killed at a producer's window: only on a publish step of a
/// cluster lab, at `after-publish-before-confirm`, naming its node.
#[test]
fn a_node_kill_at_a_producer_window() {
    let lab = |fault: &str, nodes: &str| {
        format!(
            "name = \"t\"\nclaim = \"c\"\n{nodes}\n[[queue]]\nname = \"q\"\n\n[[step]]\npublish = {{ routing_key = \"q\", messages = [\"order-1001\", \"order-1002\"] }}\nfault = {fault}\n"
        )
    };
    let good = r#"{ target = "node", node = 1, action = "kill", window = "after-publish-before-confirm", message = "mid-2" }"#;
    let l = super::super::from_str(&lab(good, "nodes = 3"), "t", &fixtures(), None).unwrap();
    let f = l.steps[0].fault.as_ref().unwrap();
    assert_eq!((f.node, f.then), (Some(1), Then::Reconnect));
    assert!(l.has_broker_fault());
    let cases = [
        (good.to_string(), "", "a `node` fault needs a cluster"),
        (good.replace("node = 1, ", ""), "nodes = 3", "a `node` fault names its node"),
        (
            good.replace("after-publish-before-confirm", "after-confirm"),
            "nodes = 3",
            "`kill` of the node never passes window `after-confirm` (it passes: after-publish-before-confirm)",
        ),
        (good.replace("mid-2", "mid-7"), "nodes = 3", "`mid-7` is not one of this step's messages"),
        (
            good.replace("\"kill\"", "\"partition\""),
            "nodes = 3",
            "`partition` of the node does not belong on this step",
        ),
        (
            good.replace(" }", r#", then = "restart" }"#),
            "nodes = 3",
            "`restart` does not follow `kill` of the node: `reconnect` does",
        ),
        (
            good.replace("node = 1", "node = 2"),
            "nodes = 3",
            "node 2 is killed at the producer's window, but the producer talks to node 1",
        ),
    ];
    for (fault, nodes, want) in cases {
        let e = super::super::from_str(&lab(&fault, nodes), "t", &fixtures(), None).unwrap_err();
        assert!(e.to_string().contains(want), "want `{want}`, got {e}");
    }
}

/// A fault's other errors are still reported when one of them is wrong,
/// and all semantic errors come at once.
#[test]
fn all_semantic_errors_at_once() {
    let text = BASE
        .replacen(r#"message = "mid-1""#, r#"message = "mid-9""#, 1)
        .replacen(r#""order-1002"]"#, r#""order-9999"]"#, 1)
        .replacen(
            r#"consume = { queue = "q""#,
            r#"consume = { queue = "r""#,
            1,
        );
    let e = super::super::from_str(&text, "t", &fixtures(), None).unwrap_err();
    assert_eq!(e.errors.len(), 3, "{e}");
}

/// Every lab in the project loads, with each of its variants.
#[test]
fn the_projects_labs_load() {
    let project = super::super::Project {
        root: PathBuf::from(env!("CARGO_MANIFEST_DIR")),
    };
    for name in project.lab_names().unwrap() {
        for run in project.runs_of(&name).unwrap() {
            project.load(&run).unwrap_or_else(|e| panic!("{run}: {e}"));
        }
    }
}

/// An administrator's `delete` step, then a `declare` of the same queue:
/// accepted, in that order only (the second `declare` is refused above,
/// with no `delete` before it).
#[test]
fn a_deleted_queue_may_be_declared_again() {
    let text = BASE.replacen(
        "[counters]",
        "[[step]]\ndelete = [\"q\"]\n\n[[step]]\ndeclare = [\"q\"]\n\n[counters]",
        1,
    );
    let lab = super::super::from_str(&text, "t", &fixtures(), None).unwrap();
    let phases: Vec<String> = lab.steps.iter().map(|s| s.action.phase()).collect();
    assert_eq!(phases[2..], ["delete(q)", "declare(q)"]);
    let twice = BASE.replacen(
        "[counters]",
        "[[step]]\ndelete = [\"q\"]\n\n[[step]]\ndeclare = [\"q\"]\n\n[[step]]\ndeclare = [\"q\"]\n\n[counters]",
        1,
    );
    let e = super::super::from_str(&twice, "t", &fixtures(), None).unwrap_err();
    assert!(e.to_string().contains("step[4].declare[0]"), "{e}");
}
