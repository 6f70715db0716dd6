//! The `dynamo` section (stub; being written).

/// Validated `dynamo` section.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DynamoConfig {
    /// `dynamo.enabled`.
    pub enabled: bool,
}
