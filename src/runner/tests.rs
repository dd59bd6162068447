use super::*;
use crate::vocab::BrokerSetting::DeadLetterConfirmTimeout as T;

/// The mismatch hint never says "accept with --update" where --update
/// would write nothing.
#[test]
fn a_mismatch_says_why_update_would_not_rewrite_it() {
    use crate::vocab::Generation::{V3_10, V4_0};
    assert_eq!(update_refused(true, true, Some(V3_10), None), None);
    assert_eq!(update_refused(true, true, Some(V4_0), Some("v")), None);
    let said = |passed, may, g, v| update_refused(passed, may, g, v).unwrap();
    assert!(said(false, true, Some(V3_10), None).contains("the run failed"));
    assert!(said(true, false, Some(V4_0), Some("classic-queue"))
        .contains("[variant.classic-queue.rabbitmq.\"4.0\"]"));
    assert!(said(true, false, Some(V4_0), None).contains("a finding, not a declaration"));
    assert!(said(true, false, None, Some("v")).contains("this broker's version is neither"));
}

/// A lab relying on a setting runs only where the broker has it at the
/// value its bounds need; RabbitMQ's default, another value or an
/// unreadable broker refuse the run, with the value named.
#[test]
fn a_broker_setting_is_checked_before_the_lab() {
    let with = |v: std::result::Result<&str, &str>| {
        BTreeMap::from([(T, v.map(str::to_string).map_err(str::to_string))])
    };
    let (read, refused) = settings_of(&with(Ok("1000")), &[T]);
    assert_eq!(read, [(T.name().to_string(), "1000".to_string())]);
    assert_eq!(refused, None);
    for (value, why) in [
        (Ok("180000"), "is 180000; this lab's bounds rely on 1000"),
        (
            Ok("undefined (RabbitMQ's default)"),
            "is undefined (RabbitMQ's default);",
        ),
        (Err("cannot read"), "cannot read; this lab's bounds rely on"),
    ] {
        let (_, refused) = settings_of(&with(value), &[T]);
        let refused = refused.expect("refused");
        assert!(refused.contains(why), "{refused}");
    }
    let (_, refused) = settings_of(&BTreeMap::new(), &[T]);
    assert!(refused.is_some());
    assert_eq!(settings_of(&BTreeMap::new(), &[]), (Vec::new(), None));
}
