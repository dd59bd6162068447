//! A delayed task's maximum lateness (article 002, delayed messages: the
//! clock source, the maximum lateness, what still runs after a recovery).

use crate::roles::PUBLISHED_AT;
use crate::vocab::FailureClass;

/// The lateness rule on its own: a task with a due time and a maximum
/// lateness found later than both is a business decision, recorded with
/// the inbox row (no time in the reason: the transcript prints it); a task
/// whose scheduling time is not on it cannot be judged: poison.
pub(super) fn judge(
    due: Option<u64>,
    max: Option<u64>,
    sent: Option<&str>,
    now: u128,
) -> std::result::Result<(), (FailureClass, String)> {
    let (Some(due), Some(max)) = (due, max) else {
        return Ok(());
    };
    let Some(at) = sent.and_then(|a| a.parse::<u128>().ok()) else {
        return Err((
            FailureClass::Poison,
            format!("a delayed task without `{PUBLISHED_AT}`: when it was due is unknown"),
        ));
    };
    let late = now.saturating_sub(at).saturating_sub(u128::from(due));
    if late > u128::from(max) {
        return Err((
            FailureClass::BusinessRejection,
            format!("found past its maximum lateness of {max} ms: skipped, not run"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_runs_up_to_its_maximum_lateness_and_not_after() {
        let class = |r: std::result::Result<(), (FailureClass, String)>| r.err().map(|e| e.0);
        // Sent at 1000, due 200 ms later, 500 ms of tolerance: runs until 1700.
        assert_eq!(class(judge(Some(200), Some(500), Some("1000"), 1200)), None);
        assert_eq!(class(judge(Some(200), Some(500), Some("1000"), 1700)), None);
        assert_eq!(
            class(judge(Some(200), Some(500), Some("1000"), 1701)),
            Some(FailureClass::BusinessRejection)
        );
        // Before it is due (a clock that went back): not late.
        assert_eq!(class(judge(Some(200), Some(500), Some("1000"), 900)), None);
        // No scheduling time on it: it cannot be judged.
        assert_eq!(
            class(judge(Some(200), Some(500), None, 5000)),
            Some(FailureClass::Poison)
        );
        assert_eq!(
            class(judge(Some(200), Some(500), Some("yesterday"), 5000)),
            Some(FailureClass::Poison)
        );
        // Not a delayed task: no rule.
        assert_eq!(class(judge(None, None, None, 5000)), None);
        assert_eq!(class(judge(Some(200), None, None, 5000)), None);
    }
}
