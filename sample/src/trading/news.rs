//! News tools: `get_news`, `get_sentiment`.
//!
//! executor ──params──▶ handler ──▶ sample data (data.rs) ──▶ envelope
//!
//! Decisions:
//! - `symbol` is optional for `get_news` (the spec requires it; the issue
//!   does not): without it the latest items of every symbol come back.
//!   Items are newest first; `limit` is 1..=20, default 5 (spec default).
//! - `get_sentiment` returns the sample's aggregated sentiment of the symbol
//!   and adds what the news items in the data say (count and mean score),
//!   computed here so the two stay consistent when the file is edited.

use serde_json::{Value, json};

use super::data::NewsItem;
use super::{Op, Shared, envelope, opt_str, opt_u64, req_str, round, symbol_schema};
use cadre::tools::definition::Plan;
use cadre::tools::{SideEffects, ToolDefinition, ToolError};

const MAX_NEWS: u64 = 20;

pub(super) fn definitions() -> Vec<(ToolDefinition, Op)> {
    vec![
        (
            ToolDefinition::new(
                "get_news",
                "Recent news items, newest first, each with a sentiment score (-1..1). \
                 Filter by symbol or omit it for all symbols.",
                json!({
                    "type": "object",
                    "properties": {
                        "symbol": symbol_schema(),
                        "limit": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_NEWS,
                            "default": 5,
                            "description": "Number of items (max 20)"
                        }
                    },
                    "additionalProperties": false
                }),
            )
            .with_side_effects(SideEffects::None)
            .with_category("news")
            .with_tags(&["news", "headlines", "sentiment"])
            .with_plan(Plan::Free)
            .per_minute(10)
            .with_cache_ttl(300),
            Op::GetNews,
        ),
        (
            ToolDefinition::new(
                "get_sentiment",
                "Aggregated market sentiment of a symbol (-1 bearish .. 1 bullish) from \
                 news, social media and analysts.",
                json!({
                    "type": "object",
                    "properties": {"symbol": symbol_schema()},
                    "required": ["symbol"],
                    "additionalProperties": false
                }),
            )
            .with_side_effects(SideEffects::None)
            .with_category("news")
            .with_tags(&["sentiment", "news", "social"])
            .with_plan(Plan::Pro)
            .per_minute(20)
            .with_cache_ttl(300),
            Op::GetSentiment,
        ),
    ]
}

fn item_json(n: &NewsItem) -> Value {
    json!({
        "id": n.id,
        "published_at": n.published_at.to_string(),
        "symbols": n.symbols,
        "headline": n.headline,
        "summary": n.summary,
        "source": n.source,
        "sentiment": {"score": n.sentiment_score, "label": n.sentiment_label},
    })
}

pub(super) async fn get_news(shared: &Shared, p: &Value) -> Result<Value, ToolError> {
    let data = shared.data.get().await?;
    let symbol = match opt_str(p, "symbol")? {
        Some(raw) => Some(data.symbol(raw)?.0),
        None => None,
    };
    let limit = opt_u64(p, "limit")?.unwrap_or(5);
    if !(1..=MAX_NEWS).contains(&limit) {
        return Err(ToolError::invalid(format!(
            "limit must be between 1 and {MAX_NEWS}, got {limit}"
        )));
    }
    let mut items: Vec<&NewsItem> = data
        .news
        .iter()
        .filter(|n| symbol.is_none_or(|s| n.symbols.iter().any(|x| x == s)))
        .collect();
    items.sort_by_key(|n| std::cmp::Reverse(n.published_at));
    items.truncate(limit as usize);
    let as_of = items
        .first()
        .map(|n| n.published_at.to_string())
        .unwrap_or_else(|| data.as_of.to_string());
    Ok(envelope(
        "news",
        json!({
            "symbol": symbol,
            "count": items.len(),
            "items": items.into_iter().map(item_json).collect::<Vec<_>>(),
        }),
        as_of,
    ))
}

pub(super) async fn get_sentiment(shared: &Shared, p: &Value) -> Result<Value, ToolError> {
    let data = shared.data.get().await?;
    let (symbol, s) = data.symbol(req_str(p, "symbol")?)?;
    let sentiment = s.sentiment.as_ref().ok_or_else(|| {
        ToolError::failed(format!("the sample data has no sentiment for {symbol}"))
    })?;
    let scores: Vec<f64> = data
        .news
        .iter()
        .filter(|n| n.symbols.iter().any(|x| x == symbol))
        .map(|n| n.sentiment_score)
        .collect();
    let mean =
        (!scores.is_empty()).then(|| round(scores.iter().sum::<f64>() / scores.len() as f64, 3));
    let as_of = sentiment
        .get("updated_at")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| data.as_of.to_string());
    Ok(envelope(
        "sentiment",
        json!({
            "symbol": symbol,
            "sentiment": sentiment,
            "news_items": {"count": scores.len(), "mean_score": mean},
        }),
        as_of,
    ))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{call, fixture};
    use super::*;

    #[tokio::test]
    async fn get_news_filters_by_symbol_newest_first() {
        let fx = fixture().await;
        let out = call(&fx, "get_news", json!({"symbol": "tsla", "limit": 3}), None)
            .await
            .unwrap();
        assert_eq!(out["source_id"], "tool:news:v1");
        let items = out["data"]["items"].as_array().unwrap();
        assert_eq!(items.len(), 3);
        for item in items {
            assert!(item["symbols"].as_array().unwrap().contains(&json!("TSLA")));
        }
        assert!(items[0]["published_at"].as_str() >= items[1]["published_at"].as_str());
        assert_eq!(out["as_of"], items[0]["published_at"]);
        // Without a symbol: every symbol, default limit 5.
        let out = call(&fx, "get_news", json!({}), None).await.unwrap();
        assert_eq!(out["data"]["count"], 5);
        assert!(out["data"]["symbol"].is_null());
        let err = call(&fx, "get_news", json!({"symbol": "XYZ"}), None)
            .await
            .unwrap_err();
        assert!(err.to_string().starts_with("unknown symbol 'XYZ'"));
    }

    #[tokio::test]
    async fn get_sentiment_adds_the_news_mean() {
        let fx = fixture().await;
        let out = call(&fx, "get_sentiment", json!({"symbol": "NVDA"}), None)
            .await
            .unwrap();
        assert_eq!(out["source_id"], "tool:sentiment:v1");
        assert!(out["data"]["sentiment"]["score"].is_number());
        assert!(out["data"]["news_items"]["count"].as_u64().unwrap() > 0);
        assert!(
            call(&fx, "get_sentiment", json!({"symbol": "XYZ"}), None)
                .await
                .is_err()
        );
    }
}
