//! WebSocket tokens: a key's right to open one session's visitor socket,
//! for browsers (which cannot set `Authorization` on a WebSocket).
//!
//! POST /v1/sessions/{id}/ws-token (Bearer key) ──▶ SessionTokens::issue ──▶ `cadt_<hex>` (60 s)
//! GET /v1/sessions/{id}/ws?token=cadt_… ──▶ auth ──▶ KeyRing::redeem_ws_token ──▶ the key's Principal
//!
//! Decisions:
//! - **Single use, short-lived, bound.** A token opens one socket, within
//!   [`WS_TOKEN_TTL`] of its issue, of the one session it was issued for;
//!   redeeming removes it first, so a second use (or a use on another
//!   session, which spends it too) is refused. It carries the principal of
//!   the key that asked for it, so the socket has exactly that key's
//!   rights (tenant, plan).
//! - **The key still decides.** At redemption the key must still be
//!   active in the ring: a revoked or expired key's tokens stop working
//!   with it. A token issued in open mode (no key) works only while the
//!   server is still open.
//! - **In the query, not a header.** `?token=` is what a browser's
//!   `new WebSocket(url)` can send. The key itself never goes in a URL;
//!   a token that a proxy's access log keeps is already spent or expires
//!   within a minute. Only its SHA-256 is kept here.
//! - **In memory, bounded.** At most [`MAX_WS_TOKENS`] outstanding tokens
//!   per process, and at most [`MAX_WS_TOKENS_PER_TENANT`] of one tenant
//!   (so one tenant, with many keys each under its own rate limit, cannot
//!   take every token and lock the others' browsers out: an attack did,
//!   in 50 s); expired ones are dropped when a cap is reached; over it
//!   issuing is refused (429 `TOO_MANY_WS_TOKENS`), never an older token
//!   evicted. Tokens are not shared between processes (a restart forgets
//!   them). In cluster mode the node a `POST …/ws-token` reaches issues
//!   the token itself (that request is never forwarded to the session's
//!   owner, `cluster::forward`), and the socket's `GET` has the same session
//!   path, so the balancer's hash brings it to the same node; one that
//!   reaches another node (the node set changed within the minute) is
//!   refused 401 and the browser asks for a new token. Decision: no shared
//!   token store, as a token lives one minute and one socket.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::error_code::{ErrorCode, PublicError};
use crate::identity::Principal;

/// How long a token may wait for its socket.
pub const WS_TOKEN_TTL: Duration = Duration::from_secs(60);
/// Outstanding (issued, not yet used or expired) tokens per process.
pub const MAX_WS_TOKENS: usize = 10_000;
/// Outstanding tokens of one tenant per process: a tenth of the whole.
pub const MAX_WS_TOKENS_PER_TENANT: usize = MAX_WS_TOKENS / 10;
const PREFIX: &str = "cadt_";

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error(
        "{MAX_WS_TOKENS} WebSocket tokens are waiting to be used: retry once some are used or expire"
    )]
    TooMany,
    #[error(
        "{MAX_WS_TOKENS_PER_TENANT} WebSocket tokens of this tenant are waiting to be used: retry once some are used or expire"
    )]
    TooManyForTenant,
}

impl PublicError for TokenError {
    fn code(&self) -> ErrorCode {
        ErrorCode::TooManyWsTokens
    }

    fn public_message(&self) -> String {
        self.to_string()
    }
}

/// Why a token did not open a socket (the reasons are logged, not sent:
/// the caller learns only that it is not valid).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRefusal {
    /// Never issued, already used, or issued for another session.
    Unknown,
    Expired,
}

/// What a token grants, until `expires`.
#[derive(Debug, Clone)]
pub struct Grant {
    pub session: String,
    pub principal: Principal,
    expires: Instant,
}

/// The outstanding tokens of this process, by the SHA-256 of the token.
#[derive(Default)]
pub struct SessionTokens {
    by_hash: Mutex<HashMap<String, Grant>>,
}

impl SessionTokens {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Grant>> {
        // No code panics while holding the lock; a poisoned one is intact.
        self.by_hash.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new token for `principal` on `session`, valid from `now` for
    /// [`WS_TOKEN_TTL`].
    pub fn issue_at(
        &self,
        principal: &Principal,
        session: &str,
        now: Instant,
    ) -> Result<String, TokenError> {
        let mut map = self.map();
        let of_tenant = |map: &HashMap<String, Grant>| {
            map.values()
                .filter(|g| g.principal.tenant == principal.tenant)
                .count()
        };
        if map.len() >= MAX_WS_TOKENS || of_tenant(&map) >= MAX_WS_TOKENS_PER_TENANT {
            map.retain(|_, g| g.expires > now);
            if map.len() >= MAX_WS_TOKENS {
                return Err(TokenError::TooMany);
            }
            if of_tenant(&map) >= MAX_WS_TOKENS_PER_TENANT {
                return Err(TokenError::TooManyForTenant);
            }
        }
        let token = format!("{PREFIX}{}", super::random_hex(32));
        map.insert(
            super::sha256_hex(&token),
            Grant {
                session: session.to_string(),
                principal: principal.clone(),
                expires: now + WS_TOKEN_TTL,
            },
        );
        Ok(token)
    }

    /// Spends `token` for `session` at `now`: the grant, once.
    pub fn redeem_at(
        &self,
        token: &str,
        session: &str,
        now: Instant,
    ) -> Result<Grant, TokenRefusal> {
        if !token.starts_with(PREFIX) {
            return Err(TokenRefusal::Unknown);
        }
        let grant = self
            .map()
            .remove(&super::sha256_hex(token))
            .ok_or(TokenRefusal::Unknown)?;
        if grant.session != session {
            return Err(TokenRefusal::Unknown);
        }
        if grant.expires <= now {
            return Err(TokenRefusal::Expired);
        }
        Ok(grant)
    }

    /// Outstanding tokens, expired ones not yet dropped included.
    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_opens_its_session_once_and_only_before_it_expires() {
        let tokens = SessionTokens::default();
        let now = Instant::now();
        let principal = Principal::open();
        let token = tokens.issue_at(&principal, "s1", now).unwrap();
        assert!(token.starts_with(PREFIX));
        let grant = tokens.redeem_at(&token, "s1", now).unwrap();
        assert_eq!(grant.principal, principal);
        assert_eq!(
            tokens.redeem_at(&token, "s1", now).unwrap_err(),
            TokenRefusal::Unknown,
            "single use"
        );

        let other = tokens.issue_at(&principal, "s1", now).unwrap();
        assert_eq!(
            tokens.redeem_at(&other, "s2", now).unwrap_err(),
            TokenRefusal::Unknown,
            "bound to its session"
        );
        assert_eq!(
            tokens.redeem_at(&other, "s1", now).unwrap_err(),
            TokenRefusal::Unknown,
            "a use on another session spends it"
        );

        let late = tokens.issue_at(&principal, "s1", now).unwrap();
        let expiry = now + WS_TOKEN_TTL;
        assert_eq!(
            tokens.redeem_at(&late, "s1", expiry).unwrap_err(),
            TokenRefusal::Expired
        );
        let just_in_time = tokens.issue_at(&principal, "s1", now).unwrap();
        assert!(
            tokens
                .redeem_at(&just_in_time, "s1", expiry - Duration::from_millis(1))
                .is_ok()
        );
        assert!(tokens.is_empty());
    }

    #[test]
    fn one_tenant_cannot_take_every_token() {
        let tokens = SessionTokens::default();
        let now = Instant::now();
        let loud = Principal {
            tenant: "loud".into(),
            ..Principal::open()
        };
        for _ in 0..MAX_WS_TOKENS_PER_TENANT {
            tokens.issue_at(&loud, "s", now).unwrap();
        }
        assert!(matches!(
            tokens.issue_at(&loud, "s", now),
            Err(TokenError::TooManyForTenant)
        ));
        let quiet = Principal {
            tenant: "quiet".into(),
            ..Principal::open()
        };
        assert!(tokens.issue_at(&quiet, "s", now).is_ok());
        assert!(tokens.issue_at(&loud, "s", now + WS_TOKEN_TTL).is_ok());
    }

    #[test]
    fn outstanding_tokens_are_capped_and_expired_ones_make_room() {
        let tokens = SessionTokens::default();
        let now = Instant::now();
        // Ten tenants' worth: no one of them over its own cap.
        let principals: Vec<Principal> = (0..10)
            .map(|i| Principal {
                tenant: format!("t{i}"),
                ..Principal::open()
            })
            .collect();
        for i in 0..MAX_WS_TOKENS {
            tokens.issue_at(&principals[i % 10], "s", now).unwrap();
        }
        let principal = Principal::open();
        assert!(matches!(
            tokens.issue_at(&principal, "s", now),
            Err(TokenError::TooMany)
        ));
        assert_eq!(tokens.len(), MAX_WS_TOKENS, "no token was evicted");
        let later = now + WS_TOKEN_TTL;
        assert!(tokens.issue_at(&principal, "s", later).is_ok());
        assert_eq!(tokens.len(), 1);
    }
}
