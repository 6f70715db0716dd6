//! The `config validate` report: one line per finding, errors first.
//!
//! Format (stable; scripts may parse it):
//! - an error: `field: value: reason`
//! - a warning: `warning: field: message`
//!
//! Invariant: values in the report are the ones in [`FieldError::value`], so secrets are already
//! masked; the exit status is 0 for a valid config (warnings allowed) and 1 for an invalid one.

use super::{Config, ConfigErrors, FieldError, Warning};

/// The outcome of [`Config::from_yaml`], as `config validate` receives it.
pub type ValidationResult = Result<(Config, Vec<Warning>), ConfigErrors>;

/// Render errors and warnings as report lines (each ending in `\n`).
pub fn render_lines(errors: &[FieldError], warnings: &[Warning]) -> String {
    let mut out = String::new();
    for e in errors {
        out.push_str(&format!("{}: {}: {}\n", e.field, e.value, e.reason));
    }
    for w in warnings {
        out.push_str(&format!("warning: {}: {}\n", w.field, w.message));
    }
    out
}

/// Render a validation result: every error and warning, one per line.
pub fn render(result: &ValidationResult) -> String {
    match result {
        Ok((_, warnings)) => render_lines(&[], warnings),
        Err(e) => render_lines(&e.errors, &e.warnings),
    }
}

/// The process exit status of `config validate`: 0 valid, 1 invalid.
pub fn exit_code(result: &ValidationResult) -> i32 {
    i32::from(result.is_err())
}
