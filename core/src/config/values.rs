//! Primitive value parsers and the error collector shared by every conversion.
//!
//! Role: turn one [`Scalar`] into one typed value (duration, size, bounded integer, finite
//! float, bool, hash, name) or a reason string, and record failures in a [`Ctx`].
//!
//! Invariants:
//! - no parser panics or stops the conversion: on failure the field's error is recorded and the
//!   caller continues with the default, so later rules still run and report;
//! - values echoed into errors are the text as written, except secrets, which the caller masks
//!   by using [`Ctx::error_masked`].

use std::fmt::Display;
use std::time::Duration;

use super::scalar::Scalar;
use super::{EnvLookup, FieldError, TokenHash, Warning};

/// What secrets are replaced with in errors and in `config show`.
pub(crate) const MASK: &str = "********";
/// How a missing required value is echoed in an error.
pub(crate) const MISSING: &str = "<missing>";

/// Collects every error and warning of one conversion.
pub(crate) struct Ctx<'e> {
    pub(crate) errors: Vec<FieldError>,
    pub(crate) warnings: Vec<Warning>,
    pub(crate) env: &'e dyn EnvLookup,
}

impl<'e> Ctx<'e> {
    pub(crate) fn new(env: &'e dyn EnvLookup) -> Self {
        Ctx {
            errors: Vec::new(),
            warnings: Vec::new(),
            env,
        }
    }

    /// Record an error for `field` whose written value is `value`.
    pub(crate) fn error(&mut self, field: &str, value: impl Display, reason: impl Into<String>) {
        self.errors.push(FieldError {
            field: field.to_owned(),
            value: value.to_string(),
            reason: reason.into(),
        });
    }

    /// Record an error for a secret field; the value is masked.
    pub(crate) fn error_masked(&mut self, field: &str, reason: impl Into<String>) {
        self.error(field, MASK, reason);
    }

    /// Record an advisory warning.
    pub(crate) fn warn(&mut self, field: &str, message: impl Into<String>) {
        self.warnings.push(Warning {
            field: field.to_owned(),
            message: message.into(),
        });
    }

    /// A boolean, or `default` when absent or invalid.
    pub(crate) fn bool(&mut self, field: &str, v: Option<&Scalar>, default: bool) -> bool {
        match v {
            None => default,
            Some(Scalar::Bool(b)) => *b,
            Some(other) => {
                self.error(field, other, "must be true or false");
                default
            }
        }
    }

    /// An integer in `min..=max`, or `default` when absent or invalid.
    pub(crate) fn uint(
        &mut self,
        field: &str,
        v: Option<&Scalar>,
        default: u64,
        min: u64,
        max: u64,
    ) -> u64 {
        self.opt_uint(field, v, min, max).unwrap_or(default)
    }

    /// An optional integer in `min..=max`.
    pub(crate) fn opt_uint(
        &mut self,
        field: &str,
        v: Option<&Scalar>,
        min: u64,
        max: u64,
    ) -> Option<u64> {
        let s = v?;
        match parse_uint(s, min, max) {
            Ok(n) => Some(n),
            Err(reason) => {
                self.error(field, s, reason);
                None
            }
        }
    }

    /// A finite number in `min..=max`, or `default`.
    pub(crate) fn float(
        &mut self,
        field: &str,
        v: Option<&Scalar>,
        default: f64,
        min: f64,
        max: f64,
    ) -> f64 {
        self.opt_float(field, v, min, max).unwrap_or(default)
    }

    /// An optional finite number in `min..=max`.
    pub(crate) fn opt_float(
        &mut self,
        field: &str,
        v: Option<&Scalar>,
        min: f64,
        max: f64,
    ) -> Option<f64> {
        let s = v?;
        let x = match s {
            Scalar::Float(x) => *x,
            Scalar::UInt(u) => *u as f64,
            Scalar::Int(i) => *i as f64,
            _ => {
                self.error(field, s, "must be a number");
                return None;
            }
        };
        if !x.is_finite() || x < min || x > max {
            self.error(
                field,
                s,
                format!("must be a finite number in {min}..={max}"),
            );
            return None;
        }
        Some(x)
    }

    /// A duration in `min..=max`, or `default`.
    pub(crate) fn duration(
        &mut self,
        field: &str,
        v: Option<&Scalar>,
        default: Duration,
        min: Duration,
        max: Duration,
    ) -> Duration {
        self.ranged(field, v, default, (min, max), parse_duration, fmt_duration)
    }

    /// A byte size in `min..=max`, or `default`.
    pub(crate) fn size(
        &mut self,
        field: &str,
        v: Option<&Scalar>,
        default: u64,
        min: u64,
        max: u64,
    ) -> u64 {
        self.ranged(field, v, default, (min, max), parse_size, fmt_size)
    }

    /// A value parsed by `parse` that must lie in `range` (inclusive), or `default`; every
    /// failure is recorded as an error on `field`.
    fn ranged<T: PartialOrd + Copy>(
        &mut self,
        field: &str,
        v: Option<&Scalar>,
        default: T,
        (min, max): (T, T),
        parse: impl Fn(&Scalar) -> Result<T, String>,
        show: impl Fn(T) -> String,
    ) -> T {
        let Some(s) = v else { return default };
        match parse(s) {
            Ok(x) if x >= min && x <= max => x,
            Ok(_) => {
                self.error(
                    field,
                    s,
                    format!("must lie in {}..={}", show(min), show(max)),
                );
                default
            }
            Err(reason) => {
                self.error(field, s, reason);
                default
            }
        }
    }

    /// A string; `None` (with an error) when the scalar is not one.
    pub(crate) fn string(&mut self, field: &str, v: Option<&Scalar>) -> Option<String> {
        match v? {
            Scalar::Str(s) => Some(s.clone()),
            other => {
                self.error(field, other, "must be a string");
                None
            }
        }
    }

    /// A required string: `None` with a "required" error when absent.
    pub(crate) fn required_string(&mut self, field: &str, v: Option<&Scalar>) -> Option<String> {
        if v.is_none() {
            self.error(field, MISSING, "is required");
            return None;
        }
        self.string(field, v)
    }

    /// A non-empty path string (files are not opened here).
    pub(crate) fn path(&mut self, field: &str, v: Option<&Scalar>) -> Option<String> {
        let s = self.string(field, v)?;
        if s.trim().is_empty() {
            self.error(field, &s, "must not be empty");
            return None;
        }
        Some(s)
    }

    /// A `sha256:<64 lowercase hex>` token hash (BUS-39); echoed masked in errors.
    pub(crate) fn token_hash(&mut self, field: &str, v: Option<&Scalar>) -> Option<TokenHash> {
        let s = v?;
        match s.as_str().and_then(|t| parse_hex_digest(t, "sha256:")) {
            Some(bytes) => Some(TokenHash(bytes)),
            None => {
                self.error(
                    field,
                    mask_digest(s),
                    "must be \"sha256:\" followed by 64 lowercase hex digits (e.g. the output of \
                     `printf %s \"$TOKEN\" | sha256sum`); never the token itself",
                );
                None
            }
        }
    }
}

/// Echo a mistyped token hash without leaking what may be a plaintext token.
fn mask_digest(s: &Scalar) -> String {
    match s.as_str() {
        Some(t) if t.starts_with("sha256:") => format!("sha256:{MASK}"),
        _ => MASK.to_owned(),
    }
}

/// `<prefix><64 lowercase hex>` into 32 bytes.
pub(crate) fn parse_hex_digest(s: &str, prefix: &str) -> Option<[u8; 32]> {
    let hex = s.strip_prefix(prefix)?;
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
        let hi = hex_val(pair[0])?;
        let lo = hex_val(pair[1])?;
        out[i] = (hi << 4) | lo;
    }
    Some(out)
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

/// Lowercase hex of 32 bytes.
pub(crate) fn to_hex(bytes: &[u8; 32]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An integer in `min..=max`.
pub(crate) fn parse_uint(s: &Scalar, min: u64, max: u64) -> Result<u64, String> {
    match s {
        Scalar::UInt(n) if (min..=max).contains(n) => Ok(*n),
        Scalar::UInt(_) | Scalar::Int(_) => Err(format!("must be an integer in {min}..={max}")),
        _ => Err(format!("must be an integer in {min}..={max}")),
    }
}

/// `<integer><unit>` with unit `ms`, `s`, `m` or `h` (e.g. `500ms`, `30s`, `5m`).
pub(crate) fn parse_duration(s: &Scalar) -> Result<Duration, String> {
    const REASON: &str = "must be a duration written <integer><unit> with unit ms, s, m or h (e.g. \"500ms\", \"30s\", \"5m\")";
    let Scalar::Str(text) = s else {
        return Err(REASON.to_owned());
    };
    let digits_end = text
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() || digits.len() > 12 {
        return Err(REASON.to_owned());
    }
    let n: u64 = digits.parse().map_err(|_| REASON.to_owned())?;
    let millis_per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(REASON.to_owned()),
    };
    n.checked_mul(millis_per)
        .map(Duration::from_millis)
        .ok_or_else(|| REASON.to_owned())
}

/// Render a duration in the config syntax (largest exact unit).
pub(crate) fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0ms".to_owned();
    }
    for (per, unit) in [(3_600_000u128, "h"), (60_000, "m"), (1_000, "s")] {
        if ms.is_multiple_of(per) {
            return format!("{}{unit}", ms / per);
        }
    }
    format!("{ms}ms")
}

/// A byte size: a non-negative integer, or `<integer><unit>` with unit B, KiB, MiB or GiB.
pub(crate) fn parse_size(s: &Scalar) -> Result<u64, String> {
    const REASON: &str = "must be a byte count: an integer, or <integer><unit> with unit B, KiB, MiB or GiB (e.g. \"8MiB\")";
    match s {
        Scalar::UInt(n) => Ok(*n),
        Scalar::Str(text) => {
            let t = text.trim();
            let digits_end = t
                .bytes()
                .position(|b| !b.is_ascii_digit())
                .unwrap_or(t.len());
            let (digits, unit) = t.split_at(digits_end);
            if digits.is_empty() || digits.len() > 15 {
                return Err(REASON.to_owned());
            }
            let n: u64 = digits.parse().map_err(|_| REASON.to_owned())?;
            let mul: u64 = match unit.trim_start() {
                "" | "B" => 1,
                "KiB" => 1 << 10,
                "MiB" => 1 << 20,
                "GiB" => 1 << 30,
                _ => return Err(REASON.to_owned()),
            };
            n.checked_mul(mul).ok_or_else(|| REASON.to_owned())
        }
        _ => Err(REASON.to_owned()),
    }
}

/// Render a byte size with the largest exact binary unit.
pub(crate) fn fmt_size(n: u64) -> String {
    for (shift, unit) in [(30u32, "GiB"), (20, "MiB"), (10, "KiB")] {
        let per = 1u64 << shift;
        if n >= per && n.is_multiple_of(per) {
            return format!("{}{unit}", n / per);
        }
    }
    format!("{n}B")
}

/// Dotted path helpers: `join("a", "b")` = `a.b`, `index("a", 2)` = `a[2]`.
pub(crate) fn join(base: &str, key: &str) -> String {
    format!("{base}.{key}")
}

/// `base[i]`.
pub(crate) fn index(base: &str, i: usize) -> String {
    format!("{base}[{i}]")
}

/// `${NAME}` (the whole value) → the variable through the injected lookup; anything else is
/// taken literally. An empty result is an error.
pub(crate) fn interpolate(ctx: &mut Ctx<'_>, field: &str, s: &str) -> Option<String> {
    let value = match s.strip_prefix("${").and_then(|r| r.strip_suffix('}')) {
        Some(name) => {
            let valid = name
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid {
                ctx.error_masked(
                    field,
                    format!("\"{name}\" is not a valid environment variable name"),
                );
                return None;
            }
            match ctx.env.var(name) {
                Some(v) => v,
                None => {
                    ctx.error_masked(field, format!("environment variable {name} is not set"));
                    return None;
                }
            }
        }
        None => s.to_owned(),
    };
    if value.is_empty() {
        ctx.error_masked(field, "must not be empty");
        return None;
    }
    Some(value)
}
