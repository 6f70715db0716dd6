//! Which sessions the listener holds, and whether it may take another (BUS-19..23), sans-IO.
//!
//! A session request (`POST /bus/v1/session`) of an authenticated entry goes through two steps:
//! [`Sessions::begin`] before its `hello` arrives, then [`Sessions::establish`] with the hello (or
//! [`Sessions::abandon`] when none came). The rules:
//! - one pre-hello handshake per entry at a time; a second is `too_many_sessions` (BUS-19), so one
//!   broker cannot hold every slot;
//! - at most `max_sessions` sessions and handshakes router-wide, a request beyond is
//!   `too_many_sessions` (429); an entry's own active session does not count against it, since its
//!   new session supersedes it (BUS-23);
//! - the hello must keep the contract ([`continuum_event_bus::message::Hello::validate`]) and match
//!   its entry: role and `client_id` (BUS-20), a broker's namespaces within the entry's allow list
//!   (empty allows all, BUS-21), a kv_listener's sources within its `backends` (BUS-22, BUS-41);
//!   otherwise `forbidden` (or the contract's code);
//! - a new session of an entry ends its old one (`session_superseded`, BUS-23).
//!
//! Invariant: `active + handshakes <= max_sessions` after every call that succeeds, and an entry
//! has at most one handshake and at most one active session.

use std::collections::{HashMap, HashSet};

use continuum_event_bus::code::Code;
use continuum_event_bus::ids::SessionId;
use continuum_event_bus::message::{Hello, Role};

use crate::config::dynamo::{BrokerConfig, BrokerRole, EventBusConfig};

/// The most TCP connections the listener holds: `4 × max_sessions`, at least 16 (BUS-23).
pub fn connection_limit(max_sessions: u32) -> usize {
    (4 * max_sessions as usize).max(16)
}

/// Whether `hello` may open a session as `entry`: the session's protocol version, or the code.
pub fn authorize(entry: &BrokerConfig, hello: &Hello) -> Result<u32, Code> {
    let version = hello.validate().map_err(|e| e.code())?;
    let role_matches = matches!(
        (entry.role, hello.role),
        (BrokerRole::Broker, Role::Broker) | (BrokerRole::KvListener, Role::KvListener)
    );
    if !role_matches || hello.client_id != entry.id {
        return Err(Code::Forbidden);
    }
    let allowed = match hello.role {
        Role::Broker => {
            entry.namespaces.is_empty()
                || hello
                    .dynamo_namespaces
                    .iter()
                    .all(|n| entry.namespaces.contains(n))
        }
        Role::KvListener => hello
            .sources
            .iter()
            .all(|s| entry.backends.contains(&s.backend)),
    };
    if allowed {
        Ok(version)
    } else {
        Err(Code::Forbidden)
    }
}

/// An established session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// Its id.
    pub id: SessionId,
    /// Its role.
    pub role: Role,
    /// The protocol version it runs.
    pub version: u32,
    /// A broker's declared namespaces.
    pub namespaces: Vec<String>,
    /// A kv_listener's announced backends.
    pub backends: Vec<String>,
}

/// The sessions and pre-hello handshakes of the listener, by entry id.
#[derive(Debug, Default)]
pub struct Sessions {
    max_sessions: usize,
    handshakes: HashSet<String>,
    active: HashMap<String, Session>,
}

impl Sessions {
    /// No sessions, at most `max_sessions`.
    pub fn new(max_sessions: u32) -> Self {
        Self {
            max_sessions: max_sessions as usize,
            ..Self::default()
        }
    }

    /// A reload changed `max_sessions`: sessions above it stay (they end on their own); new ones
    /// wait for room.
    pub fn set_max_sessions(&mut self, max_sessions: u32) {
        self.max_sessions = max_sessions as usize;
    }

    /// Entry `id` asks for a session; its hello is still to come.
    pub fn begin(&mut self, id: &str) -> Result<(), Code> {
        if self.handshakes.contains(id) {
            return Err(Code::TooManySessions);
        }
        let own = usize::from(self.active.contains_key(id));
        if self.active.len() - own + self.handshakes.len() >= self.max_sessions {
            return Err(Code::TooManySessions);
        }
        self.handshakes.insert(id.to_owned());
        Ok(())
    }

    /// Entry `id`'s handshake ended without a session (no hello, a refused hello, a closed
    /// connection).
    pub fn abandon(&mut self, id: &str) {
        self.handshakes.remove(id);
    }

    /// Entry `entry`'s hello arrived: the session it opens under `session_id`, and the session it
    /// supersedes, if any. A refused hello ends the handshake.
    pub fn establish(
        &mut self,
        entry: &BrokerConfig,
        hello: &Hello,
        session_id: SessionId,
    ) -> Result<Option<SessionId>, Code> {
        if !self.handshakes.remove(&entry.id) {
            return Err(Code::BadRequest);
        }
        let version = authorize(entry, hello)?;
        let session = Session {
            id: session_id,
            role: hello.role,
            version,
            namespaces: hello.dynamo_namespaces.clone(),
            backends: hello.sources.iter().map(|s| s.backend.clone()).collect(),
        };
        Ok(self
            .active
            .insert(entry.id.clone(), session)
            .map(|old| old.id))
    }

    /// Session `session_id` of entry `id` ended (a superseded session's end changes nothing).
    pub fn end(&mut self, id: &str, session_id: SessionId) {
        if self.active.get(id).is_some_and(|s| s.id == session_id) {
            self.active.remove(id);
        }
    }

    /// The sessions a reload to `bus` no longer allows (BUS-42): their entry is gone or has
    /// another role, or a namespace or source they declared is outside its new lists. The
    /// listener ends each with `forbidden`.
    pub fn disallowed_by(&self, bus: &EventBusConfig) -> Vec<(String, SessionId)> {
        let mut out: Vec<(String, SessionId)> = self
            .active
            .iter()
            .filter(|(id, s)| {
                let Some(entry) = bus.brokers.iter().find(|b| &b.id == *id) else {
                    return true;
                };
                match (entry.role, s.role) {
                    (BrokerRole::Broker, Role::Broker) => {
                        !entry.namespaces.is_empty()
                            && !s.namespaces.iter().all(|n| entry.namespaces.contains(n))
                    }
                    (BrokerRole::KvListener, Role::KvListener) => {
                        !s.backends.iter().all(|b| entry.backends.contains(b))
                    }
                    _ => true,
                }
            })
            .map(|(id, s)| (id.clone(), s.id))
            .collect();
        out.sort();
        out
    }

    /// The active session of entry `id`.
    pub fn session(&self, id: &str) -> Option<&Session> {
        self.active.get(id)
    }

    /// Active sessions (BUS-36 `session_count`).
    pub fn session_count(&self) -> usize {
        self.active.len()
    }

    /// Whether an active broker session declared `namespace` (BUS-36 `covers`).
    pub fn covers(&self, namespace: &str) -> bool {
        self.active
            .values()
            .any(|s| s.role == Role::Broker && s.namespaces.iter().any(|n| n == namespace))
    }

    /// Every namespace an active broker session declared, sorted, once each (BUS-36).
    pub fn covered_namespaces(&self) -> Vec<&str> {
        let mut all: Vec<&str> = self
            .active
            .values()
            .filter(|s| s.role == Role::Broker)
            .flat_map(|s| s.namespaces.iter().map(String::as_str))
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }
}

#[cfg(test)]
mod tests;
