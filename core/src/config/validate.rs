//! The conversion pipeline and the cross-section rules: user model → [`Config`].
//!
//! Role: run every section conversion (each records its own field errors), then the rules that
//! need several sections at once (backend references of the shim, BUS-07 port overlap, ...).
//!
//! Invariant: the returned [`Config`] is meaningful only when the context holds no error; the
//! caller ([`super::parse`]) enforces that.

use super::user::UserConfig;
use super::values::Ctx;
use super::{Config, convert, convert_dynamo};

/// Convert and validate the whole document, recording every finding in `ctx`.
pub(crate) fn convert(ctx: &mut Ctx<'_>, u: &UserConfig) -> Config {
    let server = convert::server(ctx, u.server.as_ref());
    let admin = convert::admin(ctx, u.admin.as_ref());
    let backends = convert::backends(ctx, u.backends.as_ref());
    let disaggregated_serving = convert::disaggregated(ctx, u.disaggregated_serving.as_ref());
    let dynamo = convert_dynamo::dynamo(ctx, u.dynamo.as_ref());
    Config {
        server,
        admin,
        backends,
        disaggregated_serving,
        dynamo,
    }
}
