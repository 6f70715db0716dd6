//! Identifier newtypes and wall-clock timestamps of the discovery reducer.
//!
//! Role: [`InstanceId`] (a worker's etcd lease id, the `worker_id` of Dynamo), [`PublisherId`] (an
//! event-channel publisher incarnation, never a worker id, LOAD-CHAN-05) and [`UnixMillis`].
//!
//! Invariants:
//! - ids are exact `u64`s: JSON numbers are read without any `f64` step and every JSON string is
//!   read as hexadecimal, even when it holds only digits (DISC-REC-05, Q-46);
//! - `hex()` is lowercase without prefix (the etcd key form and ADMIN-03 `instance_id`), `Display`
//!   is decimal (the frontend's `x-dynamo-worker-instance-id` and ADMIN-03 `worker_id`);
//! - [`UnixMillis::rfc3339`] is hand-written, total (never panics) and always ends in `+00:00`.

use std::fmt;

use serde_json::Value;
use thiserror::Error;

/// Why a JSON value or key segment is not an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum IdError {
    /// The value is absent or `null`.
    #[error("missing id")]
    Missing,
    /// A JSON number that is not a non-negative integer fitting in 64 bits.
    #[error("id number is not an exact u64")]
    NotU64,
    /// A string that is empty, holds a non-hex character or overflows 64 bits.
    #[error("id string is not 1 to 16 hex digits")]
    BadHex,
    /// Neither a number nor a string.
    #[error("id has the wrong JSON type")]
    WrongType,
}

/// Parses `s` as bare hexadecimal (no sign, no `0x`, either case) into an exact `u64`.
///
/// Leading zeros are allowed; the value must fit in 64 bits.
pub fn parse_hex_u64(s: &str) -> Result<u64, IdError> {
    if s.is_empty() {
        return Err(IdError::BadHex);
    }
    let mut acc: u64 = 0;
    for b in s.bytes() {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return Err(IdError::BadHex),
        };
        acc = acc
            .checked_mul(16)
            .and_then(|v| v.checked_add(u64::from(digit)))
            .ok_or(IdError::BadHex)?;
    }
    Ok(acc)
}

/// Reads an id from a JSON value: a number must be an exact u64, a string is always hex.
pub fn id_from_json(v: Option<&Value>) -> Result<u64, IdError> {
    match v {
        None | Some(Value::Null) => Err(IdError::Missing),
        // `as_u64` is `Some` only for integers parsed as such; floats and negatives are refused.
        Some(Value::Number(n)) => n.as_u64().ok_or(IdError::NotU64),
        Some(Value::String(s)) => parse_hex_u64(s),
        Some(_) => Err(IdError::WrongType),
    }
}

macro_rules! hex_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(u64);

        impl $name {
            /// Wraps a raw 64-bit id.
            pub const fn new(raw: u64) -> Self {
                Self(raw)
            }

            /// The raw 64-bit id.
            pub const fn get(self) -> u64 {
                self.0
            }

            /// Lowercase hexadecimal without prefix, the etcd key form.
            pub fn hex(self) -> String {
                format!("{:x}", self.0)
            }

            /// Parses bare hexadecimal (the etcd key form).
            pub fn from_hex(s: &str) -> Result<Self, IdError> {
                parse_hex_u64(s).map(Self)
            }

            /// Reads a JSON id: exact u64 number or hex string (DISC-REC-05, Q-46).
            pub fn from_json(v: Option<&Value>) -> Result<Self, IdError> {
                id_from_json(v).map(Self)
            }
        }

        impl fmt::Display for $name {
            /// Decimal, as the frontend and the admin `worker_id` show it.
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

hex_id!(
    /// A worker's instance id (its etcd lease id, Dynamo's `worker_id`).
    InstanceId
);
hex_id!(
    /// An event-channel publisher incarnation id (LOAD-CHAN-05); not a worker id.
    PublisherId
);

/// Wall-clock milliseconds since the Unix epoch, injected by the caller (core reads no clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct UnixMillis(pub u64);

impl UnixMillis {
    /// RFC 3339 at second precision in UTC with an explicit offset, e.g.
    /// `2026-09-23T04:11:02+00:00` (ADMIN-03).
    pub fn rfc3339(self) -> String {
        let secs = self.0 / 1000;
        let days = secs / 86_400;
        let rem = secs % 86_400;
        // Days fit an i64 for every u64 of milliseconds.
        let (year, month, day) = crate::clock::civil_from_days(i64::try_from(days).unwrap_or(0));
        format!(
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}+00:00",
            rem / 3600,
            (rem % 3600) / 60,
            rem % 60
        )
    }
}

impl fmt::Display for UnixMillis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.rfc3339())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn number_and_hex_string_join() {
        let a = InstanceId::from_json(Some(&json!(7465265302745285u64))).unwrap();
        let b = InstanceId::from_json(Some(&json!("1a859e868630c5"))).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.hex(), "1a859e868630c5");
        assert_eq!(a.to_string(), "7465265302745285");
    }

    #[test]
    fn digit_only_string_is_hex_q46() {
        let id = InstanceId::from_json(Some(&json!("1736491"))).unwrap();
        assert_eq!(id.get(), 0x1736491);
        assert_ne!(id.get(), 1_736_491);
    }

    #[test]
    fn numbers_are_exact_u64_without_f64() {
        // 2^63 + 11 is not representable as f64; it must survive exactly.
        let v: Value = serde_json::from_str("9223372036854775819").unwrap();
        assert_eq!(id_from_json(Some(&v)), Ok(9_223_372_036_854_775_819));
        let max: Value = serde_json::from_str("18446744073709551615").unwrap();
        assert_eq!(id_from_json(Some(&max)), Ok(u64::MAX));
        for bad in ["18446744073709551616", "-1", "1.0", "1e3"] {
            let v: Value = serde_json::from_str(bad).unwrap();
            assert_eq!(id_from_json(Some(&v)), Err(IdError::NotU64), "{bad}");
        }
    }

    #[test]
    fn bad_hex_strings_are_refused() {
        for bad in ["", "+1", "0x1f", "1g", " 1", "10000000000000000"] {
            assert_eq!(parse_hex_u64(bad), Err(IdError::BadHex), "{bad:?}");
        }
        assert_eq!(parse_hex_u64("FFFFFFFFFFFFFFFF"), Ok(u64::MAX));
        assert_eq!(parse_hex_u64("000000000000000001"), Ok(1));
        assert_eq!(id_from_json(None), Err(IdError::Missing));
        assert_eq!(id_from_json(Some(&json!(true))), Err(IdError::WrongType));
    }

    #[test]
    fn rfc3339_formats_with_offset() {
        assert_eq!(UnixMillis(0).rfc3339(), "1970-01-01T00:00:00+00:00");
        // 2026-09-23T04:11:02Z = 1790136662 s.
        assert_eq!(
            UnixMillis(1_790_136_662_999).rfc3339(),
            "2026-09-23T04:11:02+00:00"
        );
        assert_eq!(
            UnixMillis(951_782_400_000).rfc3339(),
            "2000-02-29T00:00:00+00:00"
        );
        // Total on any input.
        let _ = UnixMillis(u64::MAX).rfc3339();
    }
}
