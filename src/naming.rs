//! The names a lab run gets on the shared servers (its vhost and its
//! database), and how a name is written into a URL. A leaf, so that the
//! environments (the external one creates and removes them) and the brokers
//! need nothing of the runner.

/// The isolated names a lab run gets on the shared servers.
pub fn vhost_for(run: &str) -> String {
    run.to_string()
}

/// The run's database: `lab_` and the run name with every other character
/// than a letter or a digit made `_`; a name past PostgreSQL's 63 bytes is
/// cut and made unique by a hash of the whole.
pub fn database_for(run: &str) -> String {
    let name: String = format!("lab_{run}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if name.len() <= 63 {
        return name;
    }
    let hash = run.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    format!("{}_{:012x}", &name[..50], hash & 0xffff_ffff_ffff)
}

/// `s` as a URL's user, password or path segment: every byte but the
/// unreserved ones (RFC 3986) percent-encoded.
pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn vhost_names_are_escaped() {
        assert_eq!(super::url_encode("/"), "%2F");
        assert_eq!(super::url_encode("consumer-crash"), "consumer-crash");
    }
}
