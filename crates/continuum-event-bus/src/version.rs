//! Protocol versions (BUS-18): the `continuum-bus-version` request header every bus request
//! carries, and the version a session runs, which its data streams must use too (BUS-26).
//!
//! The header is a decimal integer ≥ 1. A client lists the versions it speaks in its `hello`; the
//! session runs the highest one both sides speak.

/// The request header naming the protocol version a request speaks.
pub const HEADER: &str = "continuum-bus-version";

/// The versions this build speaks, oldest first.
pub const SUPPORTED: &[u32] = &[1];

/// The newest version this build speaks.
pub const CURRENT: u32 = 1;

/// Why a `continuum-bus-version` header was refused (`400 unsupported_protocol_version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// No header.
    #[error("the continuum-bus-version header is missing")]
    Missing,
    /// Not a decimal integer ≥ 1.
    #[error("the continuum-bus-version header is not a version number")]
    Malformed,
    /// A version this build does not speak.
    #[error("protocol version {0} is not supported")]
    Unsupported(u32),
}

/// Read the header's value (`None`: absent) as a version this build speaks.
pub fn parse_header(value: Option<&[u8]>) -> Result<u32, VersionError> {
    let raw = value.ok_or(VersionError::Missing)?.trim_ascii();
    if raw.is_empty() || raw.len() > 9 || !raw.iter().all(u8::is_ascii_digit) {
        return Err(VersionError::Malformed);
    }
    let v = raw
        .iter()
        .fold(0u32, |acc, d| acc * 10 + u32::from(d - b'0'));
    if v == 0 {
        return Err(VersionError::Malformed);
    }
    if SUPPORTED.contains(&v) {
        Ok(v)
    } else {
        Err(VersionError::Unsupported(v))
    }
}

/// The version a session runs: the highest of `offered` this build speaks, if any.
pub fn negotiate(offered: &[u32]) -> Option<u32> {
    offered
        .iter()
        .copied()
        .filter(|v| SUPPORTED.contains(v))
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values() {
        assert_eq!(parse_header(Some(b"1")), Ok(1));
        assert_eq!(parse_header(Some(b" 1 ")), Ok(1));
        assert_eq!(parse_header(None), Err(VersionError::Missing));
        for bad in [&b""[..], b"0", b"-1", b"+1", b"1.0", b"one", b"9999999999"] {
            assert_eq!(
                parse_header(Some(bad)),
                Err(VersionError::Malformed),
                "{bad:?}"
            );
        }
        assert_eq!(parse_header(Some(b"2")), Err(VersionError::Unsupported(2)));
    }

    #[test]
    fn negotiation_takes_the_highest_common_version() {
        assert_eq!(negotiate(&[1]), Some(1));
        assert_eq!(negotiate(&[7, 1, 3]), Some(1));
        assert_eq!(negotiate(&[2, 3]), None);
        assert_eq!(negotiate(&[]), None);
    }
}
