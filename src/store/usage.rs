//! Token usage: what the model calls cost, per session and per (tenant,
//! day, agent).
//!
//! conversation ──model reply──▶ WriteOp::RecordUsage, in the writes the turn makes anyway ──▶ writer
//! writer ──read, add, write (one transaction)──▶ SESSION_USAGE, TENANT_USAGE
//! session summary, `GET /v1/usage`, the budget gate ──▶ the reads below
//!
//! A usage write is an increment, applied by the one writer thread inside
//! its transaction, so concurrent turns never lose one and nothing is read
//! back by the caller. Days are UTC calendar days written `YYYY-MM-DD`,
//! which sort as they read, so a tenant's days are one key range and a
//! month is at most 31 days of rows per agent.

use super::backend::UsageReads;
use jiff::Timestamp;
use jiff::civil::Date;
use jiff::tz::TimeZone;
use redb::{ReadableDatabase, ReadableTable};
use serde::{Deserialize, Serialize};

use super::tables::{SESSION_USAGE, TENANT_BYTES, TENANT_USAGE};
use super::{RedbStore, StoreError};

/// Counters of model calls. `total_tokens` is always prompt + completion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    /// Model calls that returned a reply, whether or not it reported usage.
    pub model_calls: u64,
}

impl TokenUsage {
    /// One model call that reported these tokens.
    pub fn call(prompt_tokens: u64, completion_tokens: u64) -> Self {
        TokenUsage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            model_calls: 1,
        }
    }

    /// One model call's reply: what it reported, or zero tokens when it
    /// reported nothing.
    pub fn of_reply(usage: Option<&crate::model::Usage>) -> Self {
        usage.map_or(TokenUsage::call(0, 0), |u| {
            TokenUsage::call(u64::from(u.prompt_tokens), u64::from(u.completion_tokens))
        })
    }

    pub fn add(&mut self, other: &TokenUsage) {
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.total_tokens += other.total_tokens;
        self.model_calls += other.model_calls;
    }

    pub fn is_empty(&self) -> bool {
        *self == TokenUsage::default()
    }
}

/// The UTC calendar day of `at`: the day usage written then counts for.
pub fn day_of(at: Timestamp) -> Date {
    at.to_zoned(TimeZone::UTC).date()
}

/// One (tenant, day, agent) row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsageRow {
    pub tenant: String,
    pub day: Date,
    pub agent: String,
    #[serde(flatten)]
    pub usage: TokenUsage,
}

/// What [`super::WriteOp::RecordUsage`] adds; `session_id` is `None` for
/// calls made for a tenant outside any session (rewording a text).
#[derive(Debug)]
pub struct UsageDelta {
    pub session_id: Option<String>,
    pub tenant: String,
    pub agent: String,
    pub day: Date,
    pub usage: TokenUsage,
}

fn decode(value: Option<redb::AccessGuard<'_, &[u8]>>) -> Result<TokenUsage, StoreError> {
    match value {
        Some(v) => Ok(crate::store::codec::json(v.value())?),
        None => Ok(TokenUsage::default()),
    }
}

/// The writer's half: adds `delta` to its session's and its tenant-day-agent's rows.
pub(super) fn apply(
    sessions: &mut redb::Table<&str, &[u8]>,
    tenants: &mut redb::Table<(&str, &str, &str), &[u8]>,
    delta: &UsageDelta,
) -> Result<(), StoreError> {
    if let Some(id) = &delta.session_id {
        let mut u = decode(sessions.get(id.as_str())?)?;
        u.add(&delta.usage);
        sessions.insert(id.as_str(), serde_json::to_vec(&u)?.as_slice())?;
    }
    let day = delta.day.to_string();
    let key = (delta.tenant.as_str(), day.as_str(), delta.agent.as_str());
    let mut u = decode(tenants.get(key)?)?;
    u.add(&delta.usage);
    tenants.insert(key, serde_json::to_vec(&u)?.as_slice())?;
    Ok(())
}

#[async_trait::async_trait]
impl UsageReads for RedbStore {
    /// Every model call of a session, added up.
    async fn session_usage(&self, session_id: &str) -> Result<TokenUsage, StoreError> {
        let id = session_id.to_string();
        self.read(move |db| {
            let txn = db.begin_read()?;
            decode(txn.open_table(SESSION_USAGE)?.get(id.as_str())?)
        })
        .await
    }

    /// The rows of days `from..=to`, of one tenant or (`None`) of every
    /// tenant, by tenant, day and agent. Every tenant's rows are read by
    /// seeking from one tenant's range to the next, so rows outside the
    /// days are never scanned.
    async fn usage_rows(
        &self,
        tenant: Option<&str>,
        from: Date,
        to: Date,
    ) -> Result<Vec<UsageRow>, StoreError> {
        let only = tenant.map(str::to_string);
        self.read(move |db| {
            let txn = db.begin_read()?;
            let table = txn.open_table(TENANT_USAGE)?;
            let (from, until) = (from.to_string(), day_after(to));
            let mut next = match only.clone() {
                Some(t) => Some(t),
                None => table.first()?.map(|(k, _)| k.value().0.to_string()),
            };
            let mut out = Vec::new();
            while let Some(tenant) = next.take() {
                let t = tenant.as_str();
                for row in table.range((t, from.as_str(), "")..(t, until.as_str(), ""))? {
                    let (k, v) = row?;
                    let (_, day, agent) = k.value();
                    out.push(UsageRow {
                        tenant: tenant.clone(),
                        day: day.parse().map_err(|_| corrupt_day(day))?,
                        agent: agent.to_string(),
                        usage: crate::store::codec::json(v.value())?,
                    });
                }
                if only.is_none() {
                    // The smallest id after `tenant` is `tenant` + NUL.
                    let after = format!("{tenant}\0");
                    next = table
                        .range((after.as_str(), "", "")..)?
                        .next()
                        .transpose()?
                        .map(|(k, _)| k.value().0.to_string());
                }
            }
            Ok(out)
        })
        .await
    }

    /// One tenant's usage over days `from..=to`, added up.
    async fn tenant_usage(
        &self,
        tenant: &str,
        from: Date,
        to: Date,
    ) -> Result<TokenUsage, StoreError> {
        let mut total = TokenUsage::default();
        for row in self.usage_rows(Some(tenant), from, to).await? {
            total.add(&row.usage);
        }
        Ok(total)
    }

    async fn stored_bytes(&self, tenant: &str) -> Result<u64, StoreError> {
        let tenant = tenant.to_string();
        self.read(move |db| {
            let table = db.begin_read()?.open_table(TENANT_BYTES)?;
            Ok(table.get(tenant.as_str())?.map(|v| v.value()).unwrap_or(0))
        })
        .await
    }
}

/// `YYYY-MM-DD` of the day after `day` (the exclusive end of a range).
fn day_after(day: Date) -> String {
    day.tomorrow()
        .map_or_else(|_| "9999-99-99".into(), |d| d.to_string())
}

fn corrupt_day(day: &str) -> StoreError {
    StoreError::Corrupt(serde::de::Error::custom(format!(
        "usage row with day {day:?}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use crate::store::WriteOp;
    use jiff::civil::date;

    fn record(
        session: Option<&str>,
        tenant: &str,
        day: Date,
        agent: &str,
        p: u64,
        c: u64,
    ) -> WriteOp {
        WriteOp::RecordUsage(UsageDelta {
            session_id: session.map(str::to_string),
            tenant: tenant.into(),
            agent: agent.into(),
            day,
            usage: TokenUsage::call(p, c),
        })
    }

    #[tokio::test]
    async fn increments_add_up_per_session_and_per_tenant_day_and_agent() {
        let store = Store::open_in_memory().unwrap();
        let d1 = date(2025, 6, 30);
        let d2 = date(2025, 7, 1);
        store
            .write(
                vec![
                    record(Some("s1"), "acme", d1, "assistant", 100, 10),
                    record(Some("s1"), "acme", d1, "assistant", 150, 20),
                ],
                false,
            )
            .await
            .unwrap();
        store
            .write(
                vec![
                    record(Some("s2"), "acme", d2, "analyst", 5, 5),
                    record(None, "globex", d1, "assistant", 7, 3),
                    record(Some("s3"), "zeta", d2, "assistant", 1, 1),
                ],
                false,
            )
            .await
            .unwrap();

        let s1 = store.session_usage("s1").await.unwrap();
        assert_eq!(
            s1,
            TokenUsage {
                prompt_tokens: 250,
                completion_tokens: 30,
                total_tokens: 280,
                model_calls: 2
            }
        );
        assert!(store.session_usage("none").await.unwrap().is_empty());

        let june = store.usage_rows(Some("acme"), d1, d1).await.unwrap();
        assert_eq!(june.len(), 1);
        assert_eq!(
            (june[0].agent.as_str(), june[0].usage.total_tokens),
            ("assistant", 280)
        );
        assert_eq!(
            store
                .tenant_usage("acme", d1, d2)
                .await
                .unwrap()
                .total_tokens,
            290
        );
        assert!(
            store
                .usage_rows(Some("nobody"), d1, d2)
                .await
                .unwrap()
                .is_empty()
        );

        let all = store.usage_rows(None, d2, d2).await.unwrap();
        let seen: Vec<(&str, &str)> = all
            .iter()
            .map(|r| (r.tenant.as_str(), r.agent.as_str()))
            .collect();
        assert_eq!(seen, [("acme", "analyst"), ("zeta", "assistant")]);
        let all = store.usage_rows(None, d1, d2).await.unwrap();
        assert_eq!(all.len(), 4, "{all:?}");
    }
}
