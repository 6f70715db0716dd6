//! Validation errors and warnings, each naming the field, the offending value and the reason.

use std::fmt;

/// One validation error: `field: value: reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path of the field, with indices (`dynamo.shim.pools[1].namespace`).
    pub field: String,
    /// The offending value as written (secrets masked).
    pub value: String,
    /// Why it is rejected.
    pub reason: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.field, self.value, self.reason)
    }
}

/// An advisory finding: the config is valid but probably not what the operator wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// Dotted path of the field concerned.
    pub field: String,
    /// What to look at.
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Every error found in one config document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} configuration error(s); first: {}", .errors.len(), .errors.first().map(ToString::to_string).unwrap_or_default())]
pub struct ConfigErrors {
    /// All errors, in field order.
    pub errors: Vec<FieldError>,
    /// Warnings found alongside (still reported when the config is invalid).
    pub warnings: Vec<Warning>,
}
