//! Why a run ended before its checks, as a kind its record keeps: `explore`
//! tells a window never reached (no verdict either way) from a run that
//! broke, and the summary names the kind. The error's text stays the run's
//! error, word for word: the kind travels beside it, inside the
//! `anyhow::Error` the run returns, under whatever context it gains.

/// The kind of a run's harness failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// A step's deadline passed (`phase P exceeded N s`).
    Deadline,
    /// The fault's window was never reached (its message never got there,
    /// or the program's order never passes it): why, for explore's cell.
    Unreachable(String),
    /// A role or a user's program exited before its work was done.
    RoleExited,
    /// A broker setting the lab's bounds rely on differs, or cannot be read:
    /// refused before the first step.
    Refused,
    /// Anything else: the environment, the setup, a bug.
    Other,
}

impl Failure {
    /// The run's error, said as `message`, of this kind.
    pub fn error(self, message: String) -> anyhow::Error {
        anyhow::Error::new(RunError {
            failure: self,
            message,
        })
    }

    /// A window never reached, said as `why`.
    pub fn unreachable(why: String) -> anyhow::Error {
        Failure::Unreachable(why.clone()).error(why)
    }

    /// The kind of a run's error (under any context it gained on its way
    /// up); an error no run site typed is [`Failure::Other`].
    pub fn of(e: &anyhow::Error) -> Failure {
        e.chain()
            .find_map(|c| c.downcast_ref::<RunError>())
            .map_or(Failure::Other, |r| r.failure.clone())
    }

    /// The summary's word for it, after `FAIL`.
    pub fn label(&self) -> &'static str {
        match self {
            Failure::Deadline => "deadline",
            Failure::Unreachable(_) => "unreachable",
            Failure::RoleExited => "role exited",
            Failure::Refused => "refused",
            Failure::Other => "error",
        }
    }
}

/// The error a run site returns: its message, and its kind beside it.
#[derive(Debug)]
struct RunError {
    failure: Failure,
    message: String,
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RunError {}

#[cfg(test)]
mod tests {
    use super::Failure;
    use anyhow::Context;

    /// The kind survives the context a run's error gains on its way up,
    /// and the text is the site's own.
    #[test]
    fn the_kind_is_read_through_context() {
        let e = Err::<(), _>(Failure::Deadline.error("phase p exceeded 1 s".into()))
            .context("step 2")
            .unwrap_err();
        assert_eq!(Failure::of(&e), Failure::Deadline);
        assert_eq!(format!("{e:#}"), "step 2: phase p exceeded 1 s");
        let why = Failure::unreachable("never there".into());
        assert_eq!(
            Failure::of(&why),
            Failure::Unreachable("never there".into())
        );
        assert_eq!(Failure::of(&anyhow::anyhow!("other")), Failure::Other);
        assert_eq!(Failure::Other.label(), "error");
    }
}
