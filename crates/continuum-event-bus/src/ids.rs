//! Session and stream ids: `sess-<32 lowercase hex>` (BUS-03) and `strm-<32 lowercase hex>`, 128
//! random bits each. The router mints them from randomness its caller injects; a client only echoes
//! them, and an id from the wire is parsed strictly (exact length, lowercase hex) before any lookup.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why an id from the wire was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not a {0} id")]
pub struct BadId(&'static str);

fn parse_hex128(s: &str, prefix: &str) -> Option<u128> {
    let hex = s.strip_prefix(prefix)?;
    if hex.len() != 32 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u128::from_str_radix(hex, 16).ok()
}

macro_rules! hex_id {
    ($name:ident, $prefix:literal, $what:literal, $doc:literal) => {
        #[doc = $doc]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(u128);

        impl $name {
            /// The id of 128 random bits (the caller's randomness).
            pub const fn from_random(bits: u128) -> Self {
                Self(bits)
            }

            /// Parse the wire form.
            pub fn parse(s: &str) -> Result<Self, BadId> {
                parse_hex128(s, $prefix).map(Self).ok_or(BadId($what))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{:032x}"), self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self, f)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                Self::parse(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

hex_id!(
    SessionId,
    "sess-",
    "session",
    "A control session's id, `sess-<32 hex>`."
);
hex_id!(
    StreamId,
    "strm-",
    "stream",
    "A data stream's id, `strm-<32 hex>`: the `{stream_id}` of `POST /bus/v1/streams/{stream_id}`."
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_print_and_parse() {
        let s = SessionId::from_random(0xabc);
        assert_eq!(s.to_string(), "sess-00000000000000000000000000000abc");
        assert_eq!(SessionId::parse(&s.to_string()), Ok(s));
        let t = StreamId::from_random(u128::MAX);
        assert_eq!(t.to_string(), format!("strm-{}", "f".repeat(32)));
        assert_eq!(StreamId::parse(&t.to_string()), Ok(t));
        assert_eq!(serde_json::to_string(&t).unwrap(), format!("\"{t}\""));
        assert_eq!(
            serde_json::from_str::<StreamId>(&format!("\"{t}\"")).unwrap(),
            t
        );
    }

    #[test]
    fn wire_ids_are_parsed_strictly() {
        let good = "0123456789abcdef0123456789abcdef";
        assert!(SessionId::parse(&format!("sess-{good}")).is_ok());
        for bad in [
            format!("strm-{good}"),
            format!("sess-{}", good.to_uppercase()),
            format!("sess-{}", &good[1..]),
            format!("sess-{good}0"),
            format!("sess-+{}", &good[1..]),
            "sess-".to_owned(),
            String::new(),
        ] {
            assert!(SessionId::parse(&bad).is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<StreamId>("\"strm-xyz\"").is_err());
    }
}
