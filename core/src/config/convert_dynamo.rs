//! Conversion of the `dynamo` section (being written: `enabled` only so far).

use super::dynamo::DynamoConfig;
use super::user_dynamo::UserDynamo;
use super::values::Ctx;

/// `dynamo`.
pub(crate) fn dynamo(ctx: &mut Ctx<'_>, u: Option<&UserDynamo>) -> DynamoConfig {
    let Some(u) = u else {
        return DynamoConfig::default();
    };
    DynamoConfig {
        enabled: ctx.bool("dynamo.enabled", u.enabled.as_ref(), false),
        ..DynamoConfig::default()
    }
}
