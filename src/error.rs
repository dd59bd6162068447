//! Why a command stopped outside any lab, each with its exit code. A failure
//! inside a lab is not one of these: it fails that lab (exit 1 at the end)
//! and the next lab runs.

use crate::exit;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input found before any server started: arguments, lab files,
    /// fixtures, snapshots, output paths.
    #[error("{0:#}")]
    Usage(anyhow::Error),
    /// The environment could not be chosen or started.
    #[error("{0:#}")]
    Environment(anyhow::Error),
    /// Ctrl-C or SIGTERM; everything was torn down.
    #[error("{0}")]
    Interrupted(String),
}

impl Error {
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) | Error::Environment(_) => exit::SETUP,
            Error::Interrupted(_) => exit::INTERRUPTED,
        }
    }

    /// The lines printed on stderr: one per problem (a lab file may have several).
    pub fn lines(&self) -> Vec<String> {
        match self {
            Error::Usage(e) => match e.downcast_ref::<crate::lab::LabErrors>() {
                Some(errs) => errs.lines(),
                None => vec![format!("{e:#}")],
            },
            other => vec![other.to_string()],
        }
    }
}

/// Marks an error as bad input (exit 2 before anything starts).
pub trait UsageContext<T> {
    fn usage(self) -> Result<T, Error>;
}

impl<T, E: Into<anyhow::Error>> UsageContext<T> for Result<T, E> {
    fn usage(self) -> Result<T, Error> {
        self.map_err(|e| Error::Usage(e.into()))
    }
}
