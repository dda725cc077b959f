//! Price-alert tools: `create_alert`, `list_alerts`, `delete_alert` (all pro).
//!
//! handler ──lock user──▶ trading.alerts/<user> (one document) ──▶ put_doc (durable)
//!
//! Decisions:
//! - Conditions are `above` / `below` (the issue), not the spec's `>=`,
//!   `<=`, `==`; `above` means "price ≥ level", `below` "price ≤ level".
//! - cadre has no notifier: an alert is stored, and `list_alerts` reports
//!   for each whether the current sample price meets it (`triggered`).
//! - At most 50 alerts per user; creating an alert identical to an existing
//!   one (symbol, condition, price) returns the existing one.
//! - Ids are `alt_` + a v7 UUID.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::data::TradingData;
use super::user_docs::{self, ALERTS, lock_user, user_key};
use super::{NO_CACHE, Op, Shared, envelope, opt_str, req_f64, req_str, symbol_schema};
use cadre::tools::definition::Plan;
use cadre::tools::{SideEffects, ToolDefinition, ToolError};

const MAX_ALERTS: usize = 50;
const WHAT: &str = "price alerts";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Condition {
    Above,
    Below,
}

impl Condition {
    fn parse(raw: &str) -> Result<Condition, ToolError> {
        match raw {
            "above" => Ok(Condition::Above),
            "below" => Ok(Condition::Below),
            other => Err(ToolError::invalid(format!(
                "condition must be 'above' or 'below', got '{other}'"
            ))),
        }
    }

    fn met(self, price: f64, level: f64) -> bool {
        match self {
            Condition::Above => price >= level,
            Condition::Below => price <= level,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    pub id: String,
    pub symbol: String,
    pub condition: Condition,
    pub price: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub created_at: Timestamp,
}

/// The `trading.alerts` document of one user.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct AlertBook {
    alerts: Vec<Alert>,
}

pub(super) fn definitions() -> Vec<(ToolDefinition, Op)> {
    vec![
        (
            ToolDefinition::new(
                "create_alert",
                "Create a price alert: notify when a symbol's price goes above or below a level.",
                json!({
                    "type": "object",
                    "properties": {
                        "symbol": symbol_schema(),
                        "condition": {"type": "string", "enum": ["above", "below"]},
                        "price": {"type": "number", "exclusiveMinimum": 0, "maximum": 1.0e9},
                        "message": {
                            "type": "string",
                            "maxLength": 200,
                            "description": "Optional note shown with the alert"
                        }
                    },
                    "required": ["symbol", "condition", "price"],
                    "additionalProperties": false
                }),
            )
            .with_side_effects(SideEffects::AtMostOnce)
            .with_category("alerts")
            .with_tags(&["alert", "notify", "price level"])
            .with_plan(Plan::Pro)
            .per_minute(20)
            .with_cache_ttl(NO_CACHE),
            Op::CreateAlert,
        ),
        (
            ToolDefinition::new(
                "list_alerts",
                "The user's price alerts, each with the current price and whether it is met.",
                json!({
                    "type": "object",
                    "properties": {"symbol": symbol_schema()},
                    "additionalProperties": false
                }),
            )
            .with_side_effects(SideEffects::None)
            .with_category("alerts")
            .with_tags(&["alerts", "list"])
            .with_plan(Plan::Pro)
            .per_minute(30)
            .with_cache_ttl(NO_CACHE),
            Op::ListAlerts,
        ),
        (
            ToolDefinition::new(
                "delete_alert",
                "Delete one of the user's price alerts.",
                json!({
                    "type": "object",
                    "properties": {
                        "alert_id": {
                            "type": "string",
                            "pattern": "^alt_[0-9a-f]{32}$",
                            "description": "Id from list_alerts"
                        }
                    },
                    "required": ["alert_id"],
                    "additionalProperties": false
                }),
            )
            .with_side_effects(SideEffects::Idempotent)
            .with_category("alerts")
            .with_tags(&["alert", "delete", "remove"])
            .with_plan(Plan::Pro)
            .per_minute(20)
            .with_cache_ttl(NO_CACHE),
            Op::DeleteAlert,
        ),
    ]
}

fn alert_json(a: &Alert, data: &TradingData) -> Value {
    let current = data.price(&a.symbol);
    json!({
        "id": a.id,
        "symbol": a.symbol,
        "condition": a.condition,
        "price": a.price,
        "message": a.message,
        "created_at": a.created_at.to_string(),
        "current_price": current,
        "triggered": current.map(|c| a.condition.met(c, a.price)),
    })
}

pub(super) async fn create_alert(
    shared: &Shared,
    p: &Value,
    user: &str,
) -> Result<Value, ToolError> {
    let data = shared.data.get().await?;
    let (symbol, _) = data.symbol(req_str(p, "symbol")?)?;
    let condition = Condition::parse(req_str(p, "condition")?)?;
    let price = req_f64(p, "price")?;
    if price <= 0.0 {
        return Err(ToolError::invalid(format!(
            "price must be > 0, got {price}"
        )));
    }
    let message = opt_str(p, "message")?.map(str::to_string);
    let key = user_key(user);
    let _guard = lock_user(&shared.store, user).await;
    let mut book: AlertBook = user_docs::load(&shared.store, ALERTS, &key, WHAT).await?;
    if let Some(existing) = book
        .alerts
        .iter()
        .find(|a| a.symbol == symbol && a.condition == condition && a.price == price)
    {
        return Ok(envelope(
            "alerts",
            json!({"alert": alert_json(existing, &data), "created": false,
                   "message": "an identical alert already exists"}),
            Timestamp::now(),
        ));
    }
    if book.alerts.len() >= MAX_ALERTS {
        return Err(ToolError::invalid(format!(
            "you have {MAX_ALERTS} alerts, the most allowed; delete one first"
        )));
    }
    let alert = Alert {
        id: format!("alt_{}", uuid::Uuid::now_v7().simple()),
        symbol: symbol.to_string(),
        condition,
        price,
        message,
        created_at: Timestamp::now(),
    };
    book.alerts.push(alert.clone());
    user_docs::save(&shared.store, ALERTS, &key, &book, WHAT).await?;
    Ok(envelope(
        "alerts",
        json!({"alert": alert_json(&alert, &data), "created": true}),
        alert.created_at,
    ))
}

pub(super) async fn list_alerts(
    shared: &Shared,
    p: &Value,
    user: &str,
) -> Result<Value, ToolError> {
    let data = shared.data.get().await?;
    let symbol = match opt_str(p, "symbol")? {
        Some(raw) => Some(data.symbol(raw)?.0),
        None => None,
    };
    let book: AlertBook = user_docs::load(&shared.store, ALERTS, &user_key(user), WHAT).await?;
    let alerts: Vec<Value> = book
        .alerts
        .iter()
        .filter(|a| symbol.is_none_or(|s| a.symbol == s))
        .map(|a| alert_json(a, &data))
        .collect();
    Ok(envelope(
        "alerts",
        json!({"count": alerts.len(), "alerts": alerts, "prices_as_of": data.as_of.to_string()}),
        Timestamp::now(),
    ))
}

pub(super) async fn delete_alert(
    shared: &Shared,
    p: &Value,
    user: &str,
) -> Result<Value, ToolError> {
    let id = req_str(p, "alert_id")?.trim();
    let key = user_key(user);
    let _guard = lock_user(&shared.store, user).await;
    let mut book: AlertBook = user_docs::load(&shared.store, ALERTS, &key, WHAT).await?;
    let Some(i) = book.alerts.iter().position(|a| a.id == id) else {
        return Err(ToolError::invalid(format!(
            "no alert '{id}' on your account; list_alerts shows your {} alert(s)",
            book.alerts.len()
        )));
    };
    let removed = book.alerts.remove(i);
    user_docs::save(&shared.store, ALERTS, &key, &book, WHAT).await?;
    Ok(envelope(
        "alerts",
        json!({"deleted": removed.id, "remaining": book.alerts.len()}),
        Timestamp::now(),
    ))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{call, fixture};
    use super::*;

    #[tokio::test]
    async fn alerts_are_created_listed_and_deleted_per_user() {
        let fx = fixture().await;
        let out = call(
            &fx,
            "create_alert",
            json!({"symbol": "spy", "condition": "above", "price": 1.0}),
            Some("u1"),
        )
        .await
        .unwrap();
        assert_eq!(out["source_id"], "tool:alerts:v1");
        assert_eq!(out["data"]["created"], true);
        let id = out["data"]["alert"]["id"].as_str().unwrap().to_string();
        // Same alert again: the existing one.
        let again = call(
            &fx,
            "create_alert",
            json!({"symbol": "SPY", "condition": "above", "price": 1.0}),
            Some("u1"),
        )
        .await
        .unwrap();
        assert_eq!(again["data"]["created"], false);
        assert_eq!(again["data"]["alert"]["id"], id);
        call(
            &fx,
            "create_alert",
            json!({"symbol": "TSLA", "condition": "below", "price": 1.0, "message": "crash"}),
            Some("u1"),
        )
        .await
        .unwrap();
        let list = call(&fx, "list_alerts", json!({}), Some("u1"))
            .await
            .unwrap();
        assert_eq!(list["data"]["count"], 2);
        // SPY ≥ 1 is met; TSLA ≤ 1 is not.
        assert_eq!(list["data"]["alerts"][0]["triggered"], true);
        assert_eq!(list["data"]["alerts"][1]["triggered"], false);
        let only_spy = call(&fx, "list_alerts", json!({"symbol": "SPY"}), Some("u1"))
            .await
            .unwrap();
        assert_eq!(only_spy["data"]["count"], 1);
        let other = call(&fx, "list_alerts", json!({}), Some("u2"))
            .await
            .unwrap();
        assert_eq!(other["data"]["count"], 0);
        let err = call(&fx, "delete_alert", json!({"alert_id": id}), Some("u2"))
            .await
            .unwrap_err();
        assert!(err.to_string().starts_with("no alert"), "{err}");
        let out = call(&fx, "delete_alert", json!({"alert_id": id}), Some("u1"))
            .await
            .unwrap();
        assert_eq!(out["data"]["remaining"], 1);
    }

    #[tokio::test]
    async fn bad_alerts_are_refused() {
        let fx = fixture().await;
        let err = call(
            &fx,
            "create_alert",
            json!({"symbol": "XYZ", "condition": "above", "price": 1.0}),
            Some("u1"),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().starts_with("unknown symbol"));
        // The schema refuses the spec's operators.
        let err = call(
            &fx,
            "create_alert",
            json!({"symbol": "SPY", "condition": ">=", "price": 1.0}),
            Some("u1"),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("condition"), "{err}");
    }
}
