//! The `continuum-router` binary (stub).
fn main() {}
