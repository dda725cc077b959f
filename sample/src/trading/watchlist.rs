//! Watchlist tools: `get_watchlist`, `add_to_watchlist`,
//! `remove_from_watchlist` (free).
//!
//! handler ──lock user──▶ trading.watchlist/<user> (one document) ──▶ put_doc (durable)
//!
//! Decisions:
//! - Category `portfolio` (the spec files them under `market`): they are the
//!   user's own state, like the portfolio, not shared market data.
//! - A new user's watchlist is empty. Only symbols the data knows can be
//!   added; adding one already there is a no-op reported as `added: false`.
//!   Removing a symbol that is not on the list is an error that shows the
//!   list; any listed symbol can be removed, even one the data has dropped.
//! - At most 50 symbols; the list keeps insertion order.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::data::TradingData;
use super::user_docs::{self, WATCHLIST, lock_user, user_key};
use super::{NO_CACHE, Op, Shared, envelope, req_str, round, symbol_schema};
use cadre::tools::definition::Plan;
use cadre::tools::{SideEffects, ToolDefinition, ToolError};

const MAX_SYMBOLS: usize = 50;
const WHAT: &str = "watchlist";

/// The `trading.watchlist` document of one user.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Watchlist {
    symbols: Vec<String>,
}

fn one_symbol(description: &str) -> Value {
    json!({
        "type": "object",
        "properties": {"symbol": symbol_schema()},
        "required": ["symbol"],
        "additionalProperties": false,
        "description": description
    })
}

pub(super) fn definitions() -> Vec<(ToolDefinition, Op)> {
    vec![
        (
            ToolDefinition::new(
                "get_watchlist",
                "The user's watchlist with each symbol's current price and daily change.",
                json!({"type": "object", "properties": {}, "additionalProperties": false}),
            )
            .with_side_effects(SideEffects::None)
            .with_category("portfolio")
            .with_tags(&["watchlist", "favorites", "tracked symbols"])
            .with_plan(Plan::Free)
            .per_minute(60)
            .with_cache_ttl(NO_CACHE),
            Op::GetWatchlist,
        ),
        (
            ToolDefinition::new(
                "add_to_watchlist",
                "Add a symbol to the user's watchlist.",
                one_symbol("The symbol to add"),
            )
            .with_side_effects(SideEffects::Idempotent)
            .with_category("portfolio")
            .with_tags(&["watchlist", "add", "track"])
            .with_plan(Plan::Free)
            .per_minute(30)
            .with_cache_ttl(NO_CACHE),
            Op::AddToWatchlist,
        ),
        (
            ToolDefinition::new(
                "remove_from_watchlist",
                "Remove a symbol from the user's watchlist.",
                one_symbol("The symbol to remove"),
            )
            .with_side_effects(SideEffects::Idempotent)
            .with_category("portfolio")
            .with_tags(&["watchlist", "remove", "untrack"])
            .with_plan(Plan::Free)
            .per_minute(30)
            .with_cache_ttl(NO_CACHE),
            Op::RemoveFromWatchlist,
        ),
    ]
}

fn entries(list: &Watchlist, data: &TradingData) -> Vec<Value> {
    list.symbols
        .iter()
        .map(|sym| {
            let bars = data
                .symbols
                .get(sym)
                .map(|s| s.bars.as_slice())
                .unwrap_or(&[]);
            let last = bars.last().map(|b| b.close);
            let prev = bars
                .len()
                .checked_sub(2)
                .and_then(|i| bars.get(i))
                .map(|b| b.close);
            let change = last.zip(prev).map(|(l, p)| round((l / p - 1.0) * 100.0, 2));
            json!({"symbol": sym, "price": last, "change_percent": change})
        })
        .collect()
}

fn reply(list: &Watchlist, data: &TradingData, extra: Value) -> Value {
    let mut body = json!({
        "count": list.symbols.len(),
        "symbols": entries(list, data),
        "prices_as_of": data.as_of.to_string(),
    });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    envelope("watchlist", body, Timestamp::now())
}

pub(super) async fn get_watchlist(shared: &Shared, user: &str) -> Result<Value, ToolError> {
    let data = shared.data.get().await?;
    let list: Watchlist = user_docs::load(&shared.store, WATCHLIST, &user_key(user), WHAT).await?;
    Ok(reply(&list, &data, json!({})))
}

pub(super) async fn add_to_watchlist(
    shared: &Shared,
    p: &Value,
    user: &str,
) -> Result<Value, ToolError> {
    let data = shared.data.get().await?;
    let (symbol, _) = data.symbol(req_str(p, "symbol")?)?;
    let key = user_key(user);
    let _guard = lock_user(&shared.store, user).await;
    let mut list: Watchlist = user_docs::load(&shared.store, WATCHLIST, &key, WHAT).await?;
    if list.symbols.iter().any(|s| s == symbol) {
        return Ok(reply(
            &list,
            &data,
            json!({"added": false, "symbol": symbol}),
        ));
    }
    if list.symbols.len() >= MAX_SYMBOLS {
        return Err(ToolError::invalid(format!(
            "your watchlist holds {MAX_SYMBOLS} symbols, the most allowed; remove one first"
        )));
    }
    list.symbols.push(symbol.to_string());
    user_docs::save(&shared.store, WATCHLIST, &key, &list, WHAT).await?;
    Ok(reply(
        &list,
        &data,
        json!({"added": true, "symbol": symbol}),
    ))
}

pub(super) async fn remove_from_watchlist(
    shared: &Shared,
    p: &Value,
    user: &str,
) -> Result<Value, ToolError> {
    let data = shared.data.get().await?;
    let symbol = req_str(p, "symbol")?.trim().to_ascii_uppercase();
    let key = user_key(user);
    let _guard = lock_user(&shared.store, user).await;
    let mut list: Watchlist = user_docs::load(&shared.store, WATCHLIST, &key, WHAT).await?;
    let Some(i) = list.symbols.iter().position(|s| *s == symbol) else {
        let holds = if list.symbols.is_empty() {
            "it is empty".to_string()
        } else {
            format!("it holds {}", list.symbols.join(", "))
        };
        return Err(ToolError::invalid(format!(
            "'{symbol}' is not on your watchlist; {holds}"
        )));
    };
    list.symbols.remove(i);
    user_docs::save(&shared.store, WATCHLIST, &key, &list, WHAT).await?;
    Ok(reply(
        &list,
        &data,
        json!({"removed": true, "symbol": symbol}),
    ))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{call, fixture, reopen};
    use super::*;

    #[tokio::test]
    async fn watchlists_are_per_user_and_persist() {
        let fx = fixture().await;
        let out = call(&fx, "get_watchlist", json!({}), Some("u1"))
            .await
            .unwrap();
        assert_eq!(out["source_id"], "tool:watchlist:v1");
        assert_eq!(out["data"]["count"], 0);
        for s in ["nvda", "AAPL", "NVDA"] {
            call(&fx, "add_to_watchlist", json!({"symbol": s}), Some("u1"))
                .await
                .unwrap();
        }
        call(&fx, "add_to_watchlist", json!({"symbol": "TSLA"}), None)
            .await
            .unwrap();
        let fx = reopen(fx).await;
        let mine = call(&fx, "get_watchlist", json!({}), Some("u1"))
            .await
            .unwrap();
        let symbols: Vec<_> = mine["data"]["symbols"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["symbol"].as_str().unwrap())
            .collect();
        assert_eq!(symbols, ["NVDA", "AAPL"]);
        assert!(mine["data"]["symbols"][0]["price"].is_number());
        let anon = call(&fx, "get_watchlist", json!({}), None).await.unwrap();
        assert_eq!(anon["data"]["symbols"][0]["symbol"], "TSLA");
        let out = call(
            &fx,
            "remove_from_watchlist",
            json!({"symbol": "nvda"}),
            Some("u1"),
        )
        .await
        .unwrap();
        assert_eq!(out["data"]["count"], 1);
    }

    #[tokio::test]
    async fn watchlist_errors_name_the_problem() {
        let fx = fixture().await;
        let err = call(
            &fx,
            "add_to_watchlist",
            json!({"symbol": "XYZ"}),
            Some("u1"),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().starts_with("unknown symbol 'XYZ'"));
        let err = call(
            &fx,
            "remove_from_watchlist",
            json!({"symbol": "AAPL"}),
            Some("u1"),
        )
        .await
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "'AAPL' is not on your watchlist; it is empty"
        );
        let out = call(
            &fx,
            "add_to_watchlist",
            json!({"symbol": "SPY"}),
            Some("u1"),
        )
        .await
        .unwrap();
        assert_eq!(out["data"]["added"], true);
        let out = call(
            &fx,
            "add_to_watchlist",
            json!({"symbol": "SPY"}),
            Some("u1"),
        )
        .await
        .unwrap();
        assert_eq!(out["data"]["added"], false);
    }
}
