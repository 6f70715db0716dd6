//! Python-compatible value spelling for chat templates, as the Dynamo 1.6.1 frontend registers
//! (dynamo-renderer 8.0.3 `python.rs`, `template/tokcfg.rs`).
//!
//! Role: `tojson` that writes what Python's `json.dumps` writes (`", "` and `": "` separators,
//! non-ASCII unescaped, Python float spelling, `indent=n` pretty form), the output formatter and
//! `string` filter that print floats like Python (`1.0`, `1e+16`), Python whitespace for
//! `strip`/`trim`, and a UTC `strftime_now` over an injected clock.
//!
//! Invariants: every function returns a minijinja error instead of panicking; no clock is read
//! here (the render passes the time in, keeping `core` deterministic).

use std::io;

use minijinja::value::{Kwargs, StringInput, from_args};
use minijinja::{Error, ErrorKind, Output, State, Value};
use serde::Serialize;
use serde_json::ser::Formatter;

use crate::clock::{civil_from_days, days_from_civil};

/// Python `str.isspace` for one char.
pub(crate) fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python `repr(float)`: shortest round-trip digits, scientific below 1e-4 or from 1e16.
pub(crate) fn python_float_repr(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    if v == 0.0 {
        return if v.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    // `{:e}` gives the shortest round-trip mantissa, e.g. "1.2345e-7".
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (neg, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        if exp < 0 {
            out.push_str("0.");
            for _ in 0..(-exp - 1) {
                out.push('0');
            }
            out.push_str(&digits);
        } else {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                for _ in digits.len()..int_len {
                    out.push('0');
                }
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if exp < 0 { '-' } else { '+' });
        out.push_str(&format!("{:02}", exp.abs()));
    }
    out
}

/// `json.dumps` default separators with Python floats.
struct PyCompact;

impl Formatter for PyCompact {
    fn write_f64<W: ?Sized + io::Write>(&mut self, w: &mut W, v: f64) -> io::Result<()> {
        w.write_all(python_float_repr(v).as_bytes())
    }
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }
    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
}

/// `json.dumps(indent=n)`: serde_json's pretty layout (same as Python's) with Python floats.
struct PyPretty<'a>(serde_json::ser::PrettyFormatter<'a>);

impl Formatter for PyPretty<'_> {
    fn write_f64<W: ?Sized + io::Write>(&mut self, w: &mut W, v: f64) -> io::Result<()> {
        w.write_all(python_float_repr(v).as_bytes())
    }
    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_array(w)
    }
    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array(w)
    }
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array_value(w)
    }
    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object(w)
    }
    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object(w)
    }
    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_object_key(w, first)
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object_value(w)
    }
}

fn serialization_error(e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::new(ErrorKind::BadSerialization, "cannot serialize to JSON").with_source(e)
}

/// The widest `indent` `tojson` accepts (templates use 2 or 4; a huge one is refused, never
/// allocated).
pub(crate) const MAX_TOJSON_INDENT: usize = 64;

/// A buffer that refuses to grow past the render's output cap: `tojson` of client data (deeply
/// nested tools, pretty-printed) fails at the cap instead of building the whole string first.
struct Capped(Vec<u8>);

impl std::io::Write for Capped {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.0.len().saturating_add(b.len()) > super::MAX_OUTPUT_BYTES {
            return Err(std::io::Error::other("tojson output over the render cap"));
        }
        self.0.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The `tojson` filter (1.6.1 `tokcfg::tojson`), its output capped like the render's.
pub(crate) fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let mut buf = Capped(Vec::new());
    let indent: Option<usize> = kwargs.get("indent")?;
    let result = match indent {
        Some(n) if n > MAX_TOJSON_INDENT => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: indent over 64",
            ));
        }
        Some(n) => {
            let spaces = b" ".repeat(n);
            let f = PyPretty(serde_json::ser::PrettyFormatter::with_indent(&spaces));
            value.serialize(&mut serde_json::Serializer::with_formatter(&mut buf, f))
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(
            &mut buf, PyCompact,
        )),
    };
    let buf = buf.0;
    result.map_err(serialization_error)?;
    String::from_utf8(buf)
        .map(Value::from_safe_string)
        .map_err(serialization_error)
}

/// The `fromjson` / `from_json` filters: a JSON string becomes a value; anything else passes.
pub(crate) fn fromjson(value: Value) -> Result<Value, Error> {
    let Some(text) = value.as_str() else {
        return Ok(value);
    };
    let parsed: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, "cannot parse JSON").with_source(e))?;
    Ok(Value::from_serialize(&parsed))
}

/// `raise_exception(msg)`: the template rejects the request.
pub(crate) fn raise_exception(msg: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

fn python_float_of(value: &Value) -> Option<String> {
    if !value.is_number() || value.is_integer() {
        return None;
    }
    f64::try_from(value.clone()).ok().map(python_float_repr)
}

/// The output formatter: floats as Python prints them, everything else as minijinja does.
pub(crate) fn python_formatter(
    out: &mut Output<'_>,
    state: &State<'_, '_>,
    value: &Value,
) -> Result<(), Error> {
    match python_float_of(value) {
        Some(text) => out.write_str(&text).map_err(Error::from),
        None => minijinja::escape_formatter(out, state, value),
    }
}

/// The `string` filter with Python float spelling.
pub(crate) fn python_string(state: &State<'_, '_>, value: &Value) -> Result<Value, Error> {
    match python_float_of(value) {
        Some(text) => Ok(Value::from(text)),
        None => Ok(minijinja::filters::string(state, value)?),
    }
}

/// The `trim` filter: Python whitespace when no characters are given.
pub(crate) fn python_trim(
    value: StringInput<'_>,
    chars: Option<std::borrow::Cow<'_, str>>,
) -> Value {
    match chars {
        Some(chars) => minijinja::filters::trim(value, Some(chars)),
        None => {
            let trimmed = value.as_str().trim_matches(is_python_space).to_owned();
            value.preserve_safety(trimmed)
        }
    }
}

/// Unknown-method callback: Python whitespace `strip`/`lstrip`/`rstrip`/`isspace`, then
/// minijinja-contrib's pycompat (as 1.6.1 `python_methods`, minus its `split`/`splitlines`
/// refinements, which fall through to pycompat here).
pub(crate) fn python_methods(
    state: &State<'_, '_>,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        match method {
            "strip" | "lstrip" | "rstrip" => {
                let (chars,): (Option<&str>,) = from_args(args)?;
                if chars.is_none() {
                    let t = match method {
                        "strip" => s.trim_matches(is_python_space),
                        "lstrip" => s.trim_start_matches(is_python_space),
                        _ => s.trim_end_matches(is_python_space),
                    };
                    return Ok(StringInput::new(state, value)?.preserve_safety(t.to_owned()));
                }
            }
            "isspace" => {
                let () = from_args(args)?;
                return Ok(Value::from(!s.is_empty() && s.chars().all(is_python_space)));
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// The context variable holding the render's clock (seconds since the Unix epoch, UTC).
pub(crate) const NOW_VAR: &str = "__continuum_now_unix";

/// `strftime_now(fmt)`: the injected time, UTC (1.6.1 uses the frontend's local time).
pub(crate) fn strftime_now(state: &State<'_, '_>, fmt: &str) -> Result<Value, Error> {
    let now = state
        .lookup(NOW_VAR)
        .and_then(|v| i64::try_from(v).ok())
        .unwrap_or(0);
    strftime_utc(now, fmt).map(Value::from_safe_string)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A strftime subset (`%Y %y %m %d %e %B %b %h %A %a %H %I %M %S %p %j %F %T %%`) over UTC.
pub(crate) fn strftime_utc(unix: i64, fmt: &str) -> Result<String, Error> {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let (hh, mm, ss) = (secs / 3600, secs / 60 % 60, secs % 60);
    let month = MONTHS.get((m - 1) as usize).copied().unwrap_or("");
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let piece = match chars.next() {
            Some('Y') => y.to_string(),
            Some('y') => format!("{:02}", y.rem_euclid(100)),
            Some('m') => format!("{m:02}"),
            Some('d') => format!("{d:02}"),
            Some('e') => format!("{d:>2}"),
            Some('B') => month.to_string(),
            Some('b') | Some('h') => month.chars().take(3).collect(),
            Some('A') => DAYS[weekday].to_string(),
            Some('a') => DAYS[weekday].chars().take(3).collect(),
            Some('H') => format!("{hh:02}"),
            Some('I') => format!("{:02}", if hh % 12 == 0 { 12 } else { hh % 12 }),
            Some('M') => format!("{mm:02}"),
            Some('S') => format!("{ss:02}"),
            Some('p') => (if hh < 12 { "AM" } else { "PM" }).to_string(),
            Some('j') => format!("{yday:03}"),
            Some('F') => format!("{y}-{m:02}-{d:02}"),
            Some('T') => format!("{hh:02}:{mm:02}:{ss:02}"),
            Some('%') => "%".to_string(),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: unsupported directive %{}",
                        other.unwrap_or(' ')
                    ),
                ));
            }
        };
        out.push_str(&piece);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_like_python() {
        for (v, s) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-2.25, "-2.25"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.6, "123456789012345.6"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (100.0, "100.0"),
        ] {
            assert_eq!(python_float_repr(v), s);
        }
    }

    #[test]
    fn strftime_subset() {
        // 2024-02-29T13:05:09Z, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime_utc(t, "%d %b %Y").unwrap(), "29 Feb 2024");
        assert_eq!(
            strftime_utc(t, "%A %B %j %H:%M:%S %I%p %%").unwrap(),
            "Thursday February 060 13:05:09 01PM %"
        );
        assert_eq!(
            strftime_utc(0, "%F %T %a").unwrap(),
            "1970-01-01 00:00:00 Thu"
        );
        assert!(strftime_utc(0, "%Q").is_err());
    }
}
