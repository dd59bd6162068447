//! What an assertion, or a variant's violation, expects a counter to print:
//! a value as written, or an integer within a bound (`{ min = 1 }`). Pure,
//! shared by the lab files, the checker and the run records.

use std::fmt;

use serde::{Deserialize, Serialize};

/// An expected value. Serialized as the string it is, or as its bound
/// (`{"min":1}`): a record written before bounds reads the same. Read
/// strictly (`mqlab check` reads records back): a bound with an unknown
/// key, with neither end, or with `min` above `max` is refused, not taken
/// as one any integer meets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
#[serde(try_from = "Raw")]
pub enum Expect {
    /// Printed exactly so (an integer as its digits, a word, a list).
    Is(String),
    /// An integer at least `min` and at most `max` (either may be open).
    Within {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<i64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<i64>,
    },
}

/// What a record holds, before the bound's ends are checked.
#[derive(Deserialize)]
#[serde(untagged)]
enum Raw {
    Is(String),
    Within(Bound),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Bound {
    min: Option<i64>,
    max: Option<i64>,
}

impl TryFrom<Raw> for Expect {
    type Error = String;
    fn try_from(raw: Raw) -> Result<Expect, String> {
        match raw {
            Raw::Is(s) => Ok(Expect::Is(s)),
            Raw::Within(Bound {
                min: None,
                max: None,
            }) => Err("a bound names `min`, `max` or both".into()),
            Raw::Within(Bound {
                min: Some(a),
                max: Some(b),
            }) if a > b => Err(format!(
                "a bound whose `min` ({a}) is above its `max` ({b})"
            )),
            Raw::Within(Bound { min, max }) => Ok(Expect::Within { min, max }),
        }
    }
}

impl Expect {
    /// Whether a counter that printed `actual` meets it.
    pub fn holds(&self, actual: &str) -> bool {
        match self {
            Expect::Is(s) => s == actual,
            Expect::Within { min, max } => actual
                .parse::<i64>()
                .is_ok_and(|v| min.is_none_or(|m| v >= m) && max.is_none_or(|m| v <= m)),
        }
    }
}

impl From<&str> for Expect {
    fn from(s: &str) -> Expect {
        Expect::Is(s.to_string())
    }
}

/// As a transcript line says it: the value, or the bound in words without
/// a space or `=` (`1-or-more`, `3-or-fewer`, `1-to-3`).
impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expect::Is(s) => f.write_str(s),
            Expect::Within {
                min: Some(a),
                max: Some(b),
            } => write!(f, "{a}-to-{b}"),
            Expect::Within { min: Some(a), .. } => write!(f, "{a}-or-more"),
            Expect::Within { max: Some(b), .. } => write!(f, "{b}-or-fewer"),
            // Refused when read (lab files and records alike).
            Expect::Within { .. } => f.write_str("any-integer"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record's bound is read as strictly as a lab file's.
    #[test]
    fn a_record_bound_is_read_strictly() {
        let read = |s: &str| serde_json::from_str::<Expect>(s);
        assert_eq!(read(r#""3""#).unwrap(), Expect::Is("3".into()));
        assert_eq!(
            read(r#"{"min":1}"#).unwrap(),
            Expect::Within {
                min: Some(1),
                max: None
            }
        );
        for bad in [r#"{}"#, r#"{"mn":1}"#, r#"{"min":5,"max":1}"#, "3"] {
            assert!(read(bad).is_err(), "{bad}");
        }
        let bound = Expect::Within {
            min: Some(1),
            max: Some(3),
        };
        let text = serde_json::to_string(&bound).unwrap();
        assert_eq!(read(&text).unwrap(), bound);
    }

    #[test]
    fn a_bound_holds_for_the_integers_within_it() {
        let at_least_1 = Expect::Within {
            min: Some(1),
            max: None,
        };
        let between = Expect::Within {
            min: Some(1),
            max: Some(3),
        };
        for (e, actual, holds) in [
            (&at_least_1, "1", true),
            (&at_least_1, "100", true),
            (&at_least_1, "0", false),
            (&at_least_1, "unknown", false),
            (&between, "3", true),
            (&between, "4", false),
            (&between, "-1", false),
        ] {
            assert_eq!(e.holds(actual), holds, "{e} on {actual}");
        }
        assert!(Expect::from("3").holds("3"));
        assert!(!Expect::from("3").holds("03"));
        assert_eq!(at_least_1.to_string(), "1-or-more");
        assert_eq!(between.to_string(), "1-to-3");
    }

    #[test]
    fn a_value_serializes_as_it_did_before_bounds() {
        assert_eq!(serde_json::to_string(&Expect::from("3")).unwrap(), "\"3\"");
        let b: Expect = serde_json::from_str("{\"min\":1}").unwrap();
        assert_eq!(
            b,
            Expect::Within {
                min: Some(1),
                max: None
            }
        );
        assert_eq!(serde_json::to_string(&b).unwrap(), "{\"min\":1}");
    }
}
