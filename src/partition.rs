//! `--partition K/N`: a deterministic share of a suite's runs, so CI's own
//! parallel jobs split them (as cargo-nextest does). The N shares of one
//! suite cover every run exactly once.

use std::fmt;
use std::str::FromStr;

/// How runs are dealt to the N shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Run i (in the suite's order) goes to share i mod N: shares as even
    /// as can be, but a run moves when runs are added before it.
    Count,
    /// By a hash of the run's name: a run stays in its share whatever else
    /// is added or removed; shares are only about even.
    Hash,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    pub scheme: Scheme,
    /// 1-based, as CI matrices count.
    pub k: usize,
    pub n: usize,
}

impl FromStr for Partition {
    type Err = String;

    /// `K/N`, `count:K/N` or `hash:K/N`, with 1 ≤ K ≤ N.
    fn from_str(s: &str) -> Result<Partition, String> {
        let (scheme, kn) = match s.split_once(':') {
            None => (Scheme::Count, s),
            Some(("count", kn)) => (Scheme::Count, kn),
            Some(("hash", kn)) => (Scheme::Hash, kn),
            Some((other, _)) => {
                return Err(format!(
                    "unknown partition scheme `{other}` (known: count, hash)"
                ))
            }
        };
        let bad = || format!("`{s}` is not K/N with 1 <= K <= N (e.g. 1/3, hash:2/4)");
        let (k, n) = kn.split_once('/').ok_or_else(bad)?;
        let k: usize = k.trim().parse().map_err(|_| bad())?;
        let n: usize = n.trim().parse().map_err(|_| bad())?;
        if k == 0 || n == 0 || k > n {
            return Err(bad());
        }
        Ok(Partition { scheme, k, n })
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.scheme {
            Scheme::Count => "count",
            Scheme::Hash => "hash",
        };
        write!(f, "{scheme}:{}/{}", self.k, self.n)
    }
}

impl Partition {
    /// Whether the run at `index` (in the suite's order) named `name` is ours.
    pub fn has(&self, index: usize, name: &str) -> bool {
        let slot = match self.scheme {
            Scheme::Count => index % self.n,
            Scheme::Hash => (fnv1a(name) % self.n as u64) as usize,
        };
        slot + 1 == self.k
    }

    /// Our share of `items`, in their order.
    pub fn share<T>(&self, items: Vec<T>, name: impl Fn(&T) -> String) -> Vec<T> {
        items
            .into_iter()
            .enumerate()
            .filter(|(i, t)| self.has(*i, &name(t)))
            .map(|(_, t)| t)
            .collect()
    }
}

/// FNV-1a, 64 bits: stable across Rust versions and machines, unlike the
/// standard library's hasher.
pub fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("lab-{i}@v{}", i % 3)).collect()
    }

    /// For N = 1..5 and both schemes, the N shares of a suite hold every
    /// run exactly once.
    #[test]
    fn the_shares_cover_every_run_exactly_once() {
        for scheme in ["count", "hash"] {
            for total in [0, 1, 7, 38, 100] {
                let all = names(total);
                for n in 1..=5 {
                    let mut seen: Vec<String> = Vec::new();
                    for k in 1..=n {
                        let p: Partition = format!("{scheme}:{k}/{n}").parse().unwrap();
                        seen.extend(p.share(all.clone(), |s| s.clone()));
                    }
                    let mut sorted = seen.clone();
                    sorted.sort();
                    sorted.dedup();
                    assert_eq!(seen.len(), total, "{scheme} {n}: a run twice or missing");
                    assert_eq!(sorted.len(), total, "{scheme} {n}: a run twice");
                }
            }
        }
    }

    #[test]
    fn count_shares_are_even_and_keep_the_order() {
        let all = names(38);
        let p: Partition = "2/4".parse().unwrap();
        let share = p.share(all.clone(), |s| s.clone());
        assert_eq!(share.len(), 10);
        assert_eq!(share[0], all[1]);
        assert_eq!(share[1], all[5]);
    }

    #[test]
    fn hash_shares_do_not_move_when_runs_are_added() {
        let p: Partition = "hash:3/4".parse().unwrap();
        let before = p.share(names(20), |s| s.clone());
        let mut more = vec!["new-lab".to_string()];
        more.extend(names(20));
        let after = p.share(more, |s| s.clone());
        for r in &before {
            assert!(after.contains(r), "{r} moved");
        }
    }

    #[test]
    fn bad_partitions_are_refused() {
        for bad in ["0/3", "4/3", "3", "a/b", "1/0", "mod:1/2", "1/ 2x"] {
            assert!(bad.parse::<Partition>().is_err(), "{bad} accepted");
        }
        assert_eq!(
            "hash:2/4".parse::<Partition>().unwrap().to_string(),
            "hash:2/4"
        );
        assert_eq!("1/2".parse::<Partition>().unwrap().to_string(), "count:1/2");
    }
}
