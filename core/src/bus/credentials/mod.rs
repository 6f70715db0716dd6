//! Who a bus request's credentials name (BUS-12..17, Q-30).
//!
//! A request presents a bearer token, a client certificate its TLS connection verified, both or
//! neither. [`Credentials::authenticate`] answers with the `brokers[]` entry they name or the
//! refusal code:
//! - a token is hashed once and its digest compared with every entry's `token_hash` in constant
//!   time, without an early exit (BUS-12); a token wins over a certificate, and a certificate
//!   (of the current CA generation) that does not name the token's entry is `forbidden` (BUS-14);
//! - a certificate alone names the entry whose `id` equals one of its DNS SANs, exactly (ids are
//!   lowercase and wildcard-free, BUS-13);
//! - a certificate is bound to the CA generation that verified its connection (BUS-17): after a
//!   `client_ca` reload it names no one, and its requests get `credential_revoked`;
//! - a token or an id a reload removed gets `credential_revoked` (401), remembered for the last
//!   [`REVOKED_MEMORY`] removals (BUS-16); anything else unknown is `unauthenticated` (BUS-15).
//!
//! Invariant: the revoked memory never holds a credential the current entries accept (re-adding
//! a credential forgets its revocation), and never more than [`REVOKED_MEMORY`] items.

use std::collections::VecDeque;

use continuum_event_bus::code::Code;
use sha2::Digest;

use crate::config::dynamo::{BrokerRole, EventBusConfig};

/// How many removed credentials the listener remembers (BUS-16).
pub const REVOKED_MEMORY: usize = 256;

/// A `brokers[]` entry as the listener authenticates it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    id: String,
    role: BrokerRole,
    token: Option<[u8; 32]>,
}

/// A removed credential.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Removed {
    Token([u8; 32]),
    Id(String),
}

/// A client certificate the connection's TLS handshake verified against `tls.client_ca`.
#[derive(Debug, Clone, Copy)]
pub struct VerifiedCert<'a> {
    /// Its DNS subject alternative names.
    pub dns_sans: &'a [String],
    /// The CA generation that verified it ([`Credentials::ca_generation`] when it connected).
    pub ca_generation: u64,
}

/// What one request presents.
#[derive(Debug, Clone, Copy, Default)]
pub struct Presented<'a> {
    /// The `Authorization: Bearer` token.
    pub bearer: Option<&'a [u8]>,
    /// The connection's verified client certificate.
    pub cert: Option<VerifiedCert<'a>>,
}

/// The entry a request authenticated as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Authenticated<'c> {
    /// Its index in `brokers[]`.
    pub index: usize,
    /// Its id.
    pub id: &'c str,
    /// Its role.
    pub role: BrokerRole,
}

/// The listener's credentials under one config, and the memory of removed ones.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    entries: Vec<Entry>,
    ca_generation: u64,
    revoked: VecDeque<Removed>,
}

impl Credentials {
    /// The credentials of `bus`, whose `client_ca` is generation `ca_generation`.
    pub fn new(bus: &EventBusConfig, ca_generation: u64) -> Self {
        Self {
            entries: entries(bus),
            ca_generation,
            revoked: VecDeque::new(),
        }
    }

    /// The credentials after a reload to `bus` (`ca_generation` moves when `client_ca` changed):
    /// every token and id the reload removed is remembered as revoked.
    pub fn reloaded(&self, bus: &EventBusConfig, ca_generation: u64) -> Self {
        let new = entries(bus);
        let mut revoked = self.revoked.clone();
        for old in &self.entries {
            if let Some(t) = old.token
                && !new.iter().any(|e| e.token == Some(t))
            {
                remember(&mut revoked, Removed::Token(t));
            }
            if !new.iter().any(|e| e.id == old.id) {
                remember(&mut revoked, Removed::Id(old.id.clone()));
            }
        }
        revoked.retain(|r| match r {
            Removed::Token(t) => !new.iter().any(|e| e.token == Some(*t)),
            Removed::Id(id) => !new.iter().any(|e| &e.id == id),
        });
        Self {
            entries: new,
            ca_generation,
            revoked,
        }
    }

    /// The CA generation certificates must have been verified under to name an entry.
    pub fn ca_generation(&self) -> u64 {
        self.ca_generation
    }

    /// How many removed credentials are remembered.
    pub fn revoked_len(&self) -> usize {
        self.revoked.len()
    }

    /// The entry `p` names, or why not.
    pub fn authenticate(&self, p: Presented<'_>) -> Result<Authenticated<'_>, Code> {
        let cert = p.cert.filter(|c| c.ca_generation == self.ca_generation);
        if let Some(token) = p.bearer {
            let digest: [u8; 32] = sha2::Sha256::digest(token).into();
            let Some(i) = self.by_digest(&digest) else {
                return Err(if self.revoked.contains(&Removed::Token(digest)) {
                    Code::CredentialRevoked
                } else {
                    Code::Unauthenticated
                });
            };
            let entry = &self.entries[i];
            if let Some(c) = cert
                && !c.dns_sans.contains(&entry.id)
            {
                return Err(Code::Forbidden);
            }
            return Ok(self.authenticated(i));
        }
        match p.cert {
            Some(c) if c.ca_generation != self.ca_generation => Err(Code::CredentialRevoked),
            Some(c) => match self.entries.iter().position(|e| c.dns_sans.contains(&e.id)) {
                Some(i) => Ok(self.authenticated(i)),
                None if c
                    .dns_sans
                    .iter()
                    .any(|s| self.revoked.contains(&Removed::Id(s.clone()))) =>
                {
                    Err(Code::CredentialRevoked)
                }
                None => Err(Code::Unauthenticated),
            },
            None => Err(Code::Unauthenticated),
        }
    }

    fn authenticated(&self, i: usize) -> Authenticated<'_> {
        let e = &self.entries[i];
        Authenticated {
            index: i,
            id: &e.id,
            role: e.role,
        }
    }

    /// The entry whose token hash is `digest`: every hash compared, in constant time, with a
    /// branch-free select (hashes are unique per config, so at most one matches).
    fn by_digest(&self, digest: &[u8; 32]) -> Option<usize> {
        let mut found = usize::MAX;
        for (i, e) in self.entries.iter().enumerate() {
            let Some(t) = e.token else { continue };
            let mut diff = 0u8;
            for (a, b) in digest.iter().zip(t.iter()) {
                diff |= a ^ b;
            }
            let eq = usize::from(diff == 0);
            found = found * (1 - eq) + i * eq;
        }
        (found != usize::MAX).then_some(found)
    }
}

fn entries(bus: &EventBusConfig) -> Vec<Entry> {
    bus.brokers
        .iter()
        .map(|b| Entry {
            id: b.id.clone(),
            role: b.role,
            token: b.token_hash.as_ref().map(|t| t.0),
        })
        .collect()
}

fn remember(revoked: &mut VecDeque<Removed>, r: Removed) {
    if revoked.contains(&r) {
        return;
    }
    if revoked.len() == REVOKED_MEMORY {
        revoked.pop_front();
    }
    revoked.push_back(r);
}

#[cfg(test)]
mod tests;
