//! The answers: a parsed [`Master`] and typed parameters in, an [`Answer`]
//! (domain, data, as_of) out. Pure, so every tool's behaviour is tested
//! without files or a runtime.
//!
//! Values a model would otherwise work out itself (market value, cost basis,
//! unrealised and daily P/L, weights, account totals, quote changes) are
//! computed here from quantities and prices, rounded to cents and to
//! hundredths of a percent, so an answer can cite them instead of doing
//! arithmetic, and they cannot disagree with the prices they come from.

use serde_json::{Value, json};

use super::master::{ActivityKind, AssetClass, Master, Position, Quote, Timeframe, ValuePoint};
use cadre::tools::ToolError;

/// One tool's result before it is wrapped as `{source_id, data, as_of}`.
#[derive(Debug)]
pub struct Answer {
    /// The `<domain>` of `tool:<domain>:v1`.
    pub domain: &'static str,
    pub data: Value,
    pub as_of: String,
}

impl Answer {
    pub fn source_id(&self) -> String {
        format!("tool:{}:v1", self.domain)
    }
}

pub fn activity(m: &Master, limit: usize, kind: Option<ActivityKind>) -> Result<Answer, ToolError> {
    let mut entries: Vec<_> = m
        .activity
        .entries
        .iter()
        .filter(|e| kind.is_none_or(|k| e.kind == k))
        .collect();
    entries.sort_by_key(|e| std::cmp::Reverse(e.timestamp));
    let total_matching = entries.len();
    entries.truncate(limit);
    Ok(Answer {
        domain: "activity",
        data: json!({
            "account": m.account_summary.account,
            "type_filter": kind,
            "entries": entries,
            "count": entries.len(),
            "total_matching": total_matching,
        }),
        as_of: m.as_of(&m.activity.as_of).into(),
    })
}

pub fn position(m: &Master, symbol: &str) -> Result<Answer, ToolError> {
    let symbol = symbol.trim();
    let Some(p) = m.position(symbol) else {
        let held = symbols(m.positions.positions.iter().map(|p| &p.symbol));
        let mut message = format!("no position in '{symbol}'; positions: {held}");
        if let Some(q) = m.quote(symbol) {
            message.push_str(&format!(" (get_quotes has a quote for {})", q.symbol));
        }
        return Err(ToolError::invalid(message));
    };
    let total = account_totals(m)?.total_value;
    Ok(Answer {
        domain: "positions",
        data: json!({
            "account": m.account_summary.account,
            "position": valued(m, p)?.to_json(total),
        }),
        as_of: m.as_of(&m.positions.as_of).into(),
    })
}

pub fn positions_list(m: &Master, asset_class: Option<AssetClass>) -> Result<Answer, ToolError> {
    let total = account_totals(m)?.total_value;
    let mut listed = m
        .positions
        .positions
        .iter()
        .filter(|p| asset_class.is_none_or(|c| p.asset_class == c))
        .map(|p| valued(m, p))
        .collect::<Result<Vec<_>, _>>()?;
    listed.sort_by(|a, b| b.market_value.total_cmp(&a.market_value));
    let listed_value: f64 = listed.iter().map(|v| v.market_value).sum();
    Ok(Answer {
        domain: "positions",
        data: json!({
            "account": m.account_summary.account,
            "asset_class_filter": asset_class,
            "positions": listed.iter().map(|v| v.to_json(total)).collect::<Vec<_>>(),
            "count": listed.len(),
            "market_value": money(listed_value),
        }),
        as_of: m.as_of(&m.positions.as_of).into(),
    })
}

pub fn performance(m: &Master, timeframe: Timeframe) -> Result<Answer, ToolError> {
    let window = m.performance.timeframes.get(&timeframe).ok_or_else(|| {
        ToolError::failed(format!(
            "brokerage.json has no '{}' performance",
            timeframe.as_str()
        ))
    })?;
    let (Some(first), Some(last)) = (window.series.first(), window.series.last()) else {
        return Err(ToolError::failed(format!(
            "brokerage.json has an empty '{}' performance series",
            timeframe.as_str()
        )));
    };
    let change = last.value - first.value;
    let net_flows = window.contributions - window.withdrawals;
    Ok(Answer {
        domain: "performance",
        data: json!({
            "account": m.account_summary.account,
            "timeframe": timeframe,
            "start_date": first.date,
            "end_date": last.date,
            "start_value": money(first.value),
            "end_value": money(last.value),
            "change": money(change),
            "contributions": money(window.contributions),
            "withdrawals": money(window.withdrawals),
            "investment_gain": money(change - net_flows),
            "return_pct": window.return_pct,
            "series": window.series.iter().map(|ValuePoint { date, value }| {
                json!({"date": date, "value": money(*value)})
            }).collect::<Vec<_>>(),
        }),
        as_of: m.as_of(&m.performance.as_of).into(),
    })
}

pub fn quote(m: &Master, symbol: &str) -> Result<Answer, ToolError> {
    let symbol = symbol.trim();
    let q = m.quote(symbol).ok_or_else(|| {
        ToolError::invalid(format!(
            "no quote for '{symbol}'; quotes: {}",
            symbols(m.quotes.quotes.iter().map(|q| &q.symbol))
        ))
    })?;
    let change = q.price - q.previous_close;
    Ok(Answer {
        domain: "quotes",
        data: json!({
            "quote": {
                "symbol": q.symbol,
                "name": q.name,
                "price": q.price,
                "previous_close": q.previous_close,
                "change": money(change),
                "change_pct": pct(change, q.previous_close),
            },
            "held": m.position(&q.symbol).is_some(),
        }),
        as_of: m.as_of(&m.quotes.as_of).into(),
    })
}

/// By topic key or alias, compared case-insensitively with blanks and
/// hyphens read as underscores (`Roth IRA` finds `roth_ira`). No fuzzy
/// matching: an unknown topic lists the known ones, and the caller picks.
pub fn fact(m: &Master, topic: &str) -> Result<Answer, ToolError> {
    let wanted = normalize_topic(topic);
    let found = m.facts.topics.iter().find(|(key, fact)| {
        normalize_topic(key) == wanted || fact.aliases.iter().any(|a| normalize_topic(a) == wanted)
    });
    let Some((key, fact)) = found else {
        let topics = m
            .facts
            .topics
            .keys()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        return Err(ToolError::invalid(format!(
            "no facts on '{}'; topics: {topics}",
            topic.trim()
        )));
    };
    Ok(Answer {
        domain: "facts",
        data: json!({
            "topic": key,
            "title": fact.title,
            "snippet": fact.text,
            "source": format!("facts/{key}"),
        }),
        as_of: m.as_of(&m.facts.as_of).into(),
    })
}

pub fn transfers(m: &Master, limit: usize) -> Result<Answer, ToolError> {
    let mut transfers: Vec<_> = m.transfers.transfers.iter().collect();
    transfers.sort_by_key(|t| std::cmp::Reverse(t.timestamp));
    let total = transfers.len();
    transfers.truncate(limit);
    Ok(Answer {
        domain: "transfers",
        data: json!({
            "account": m.account_summary.account,
            "transfers": transfers,
            "count": transfers.len(),
            "total": total,
        }),
        as_of: m.as_of(&m.transfers.as_of).into(),
    })
}

pub fn account_summary(m: &Master) -> Result<Answer, ToolError> {
    let a = &m.account_summary;
    let t = account_totals(m)?;
    let allocation: Vec<Value> = AssetClass::ALL
        .iter()
        .filter_map(|&class| {
            let value: f64 = t
                .valued
                .iter()
                .filter(|v| v.position.asset_class == class)
                .map(|v| v.market_value)
                .sum();
            let held = t.valued.iter().any(|v| v.position.asset_class == class);
            held.then(|| {
                json!({
                    "asset_class": class,
                    "market_value": money(value),
                    "weight_pct": pct(value, t.total_value),
                })
            })
        })
        .collect();
    let previous_value = t.total_value - t.day_change;
    Ok(Answer {
        domain: "account_summary",
        data: json!({
            "account": a.account,
            "account_number": a.account_number,
            "account_type": a.account_type,
            "total_value": money(t.total_value),
            "invested_value": money(t.total_value - t.total_cash),
            "total_cash": money(t.total_cash),
            "settled_cash": money(a.settled_cash),
            "unsettled_cash": money(t.total_cash - a.settled_cash),
            "day_change": money(t.day_change),
            "day_change_pct": pct(t.day_change, previous_value),
            "unrealized_pl": money(t.unrealized_pl),
            "positions_count": t.valued.len(),
            "allocation": allocation,
        }),
        as_of: m.as_of(&a.as_of).into(),
    })
}

/// A position with its quote and what follows from them.
struct Valued<'a> {
    position: &'a Position,
    quote: &'a Quote,
    cost_basis: f64,
    market_value: f64,
    day_change: f64,
}

impl Valued<'_> {
    fn to_json(&self, total_value: f64) -> Value {
        let p = self.position;
        let unrealized = self.market_value - self.cost_basis;
        json!({
            "symbol": p.symbol,
            "name": p.name,
            "asset_class": p.asset_class,
            "quantity": p.quantity,
            "average_cost": p.average_cost,
            "price": self.quote.price,
            "cost_basis": money(self.cost_basis),
            "market_value": money(self.market_value),
            "unrealized_pl": money(unrealized),
            "unrealized_pl_pct": pct(unrealized, self.cost_basis),
            "day_change": money(self.day_change),
            "day_change_pct": pct(self.quote.price - self.quote.previous_close, self.quote.previous_close),
            "portfolio_weight_pct": pct(self.market_value, total_value),
        })
    }
}

/// [`Master::check`] guarantees every position a quote; the error is only
/// there so that a broken invariant is a failed call, not a panic.
fn valued<'a>(m: &'a Master, position: &'a Position) -> Result<Valued<'a>, ToolError> {
    let quote = m.quote(&position.symbol).ok_or_else(|| {
        ToolError::failed(format!(
            "brokerage.json has no quote for position '{}'",
            position.symbol
        ))
    })?;
    Ok(Valued {
        position,
        quote,
        cost_basis: position.quantity * position.average_cost,
        market_value: position.quantity * quote.price,
        day_change: position.quantity * (quote.price - quote.previous_close),
    })
}

struct Totals<'a> {
    valued: Vec<Valued<'a>>,
    total_value: f64,
    total_cash: f64,
    day_change: f64,
    /// Of invested positions; cash has none.
    unrealized_pl: f64,
}

fn account_totals(m: &Master) -> Result<Totals<'_>, ToolError> {
    let valued = m
        .positions
        .positions
        .iter()
        .map(|p| valued(m, p))
        .collect::<Result<Vec<_>, _>>()?;
    let sum = |f: &dyn Fn(&Valued) -> f64| valued.iter().map(f).sum::<f64>();
    let total_value = sum(&|v| v.market_value);
    let total_cash = sum(&|v| {
        if v.position.asset_class == AssetClass::Cash {
            v.market_value
        } else {
            0.0
        }
    });
    let day_change = sum(&|v| v.day_change);
    let unrealized_pl = sum(&|v| v.market_value - v.cost_basis);
    Ok(Totals {
        valued,
        total_value,
        total_cash,
        day_change,
        unrealized_pl,
    })
}

fn symbols<'a>(symbols: impl Iterator<Item = &'a String>) -> String {
    symbols.map(String::as_str).collect::<Vec<_>>().join(", ")
}

fn normalize_topic(topic: &str) -> String {
    topic
        .trim()
        .to_lowercase()
        .split(|c: char| c.is_whitespace() || c == '-' || c == '_')
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join("_")
}

/// Rounded to cents.
fn money(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// `part / whole` in percent, two decimals; `None` (JSON null) when the
/// whole is zero.
fn pct(part: f64, whole: f64) -> Option<f64> {
    (whole.abs() > f64::EPSILON).then(|| money(part / whole * 100.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = include_str!("../../../agents/data/brokerage.json");

    fn sample() -> Master {
        Master::parse(SAMPLE).unwrap()
    }

    fn close(a: &Value, b: f64) -> bool {
        a.as_f64().is_some_and(|a| (a - b).abs() < 0.005)
    }

    #[test]
    fn a_position_is_valued_from_its_quote() {
        let a = position(&sample(), "aapl").unwrap();
        assert_eq!(a.source_id(), "tool:positions:v1");
        let p = &a.data["position"];
        assert_eq!(p["symbol"], "AAPL");
        // 42 × 193.12 and 42 × 150.25
        assert!(close(&p["market_value"], 8111.04), "{p}");
        assert!(close(&p["cost_basis"], 6310.50), "{p}");
        assert!(close(&p["unrealized_pl"], 1800.54), "{p}");
        assert!(close(&p["day_change"], 88.20), "{p}");
    }

    #[test]
    fn an_unknown_position_lists_the_held_symbols_and_points_to_a_quote() {
        let err = position(&sample(), "TSLA").unwrap_err();
        assert!(matches!(err, ToolError::InvalidInput { .. }));
        assert_eq!(
            err.to_string(),
            "no position in 'TSLA'; positions: AAPL, MSFT, VOO, BND, BTC, SPAXX \
             (get_quotes has a quote for TSLA)"
        );
        let err = position(&sample(), "XYZ").unwrap_err().to_string();
        assert!(!err.contains("get_quotes"), "{err}");
    }

    #[test]
    fn the_account_summary_adds_up_its_positions() {
        let m = sample();
        let s = account_summary(&m).unwrap().data;
        let list = positions_list(&m, None).unwrap().data;
        assert!(close(&s["total_value"], 54742.54), "{s}");
        assert_eq!(s["total_value"], list["market_value"]);
        assert!(close(&s["total_cash"], 12340.10), "{s}");
        assert!(close(&s["unsettled_cash"], 2109.00), "{s}");
        let weights: f64 = s["allocation"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["weight_pct"].as_f64().unwrap())
            .sum();
        assert!((weights - 100.0).abs() < 0.05, "{weights}");
    }

    #[test]
    fn every_performance_series_ends_at_the_account_value() {
        let m = sample();
        let total = account_summary(&m).unwrap().data["total_value"].clone();
        for &t in Timeframe::ALL {
            let data = performance(&m, t).unwrap().data;
            assert_eq!(data["timeframe"], t.as_str());
            assert_eq!(data["end_value"], total, "{}", t.as_str());
            assert_eq!(data["end_date"], "2026-01-15");
        }
    }

    #[test]
    fn performance_derives_change_and_gain_from_series_and_flows() {
        let d = performance(&sample(), Timeframe::OneWeek).unwrap().data;
        // 54742.54 − 52630.18, of which 1500 was deposited
        assert!(close(&d["change"], 2112.36), "{d}");
        assert!(close(&d["investment_gain"], 612.36), "{d}");
        assert_eq!(d["series"].as_array().unwrap().len(), 6);
    }

    #[test]
    fn positions_are_listed_largest_first_and_filtered_by_class() {
        let m = sample();
        let all = positions_list(&m, None).unwrap().data;
        let values: Vec<f64> = all["positions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["market_value"].as_f64().unwrap())
            .collect();
        assert!(values.windows(2).all(|w| w[0] >= w[1]), "{values:?}");
        assert_eq!(all["asset_class_filter"], Value::Null);

        let etfs = positions_list(&m, Some(AssetClass::Etf)).unwrap().data;
        assert_eq!(etfs["asset_class_filter"], "etf");
        let syms: Vec<&str> = etfs["positions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["symbol"].as_str().unwrap())
            .collect();
        assert_eq!(syms, ["VOO", "BND"]);

        let bonds = positions_list(&m, Some(AssetClass::Bond)).unwrap().data;
        assert_eq!(bonds["count"], 0);
        assert_eq!(bonds["positions"], json!([]));
    }

    #[test]
    fn activity_is_newest_first_filtered_and_limited() {
        let m = sample();
        let d = activity(&m, 3, None).unwrap().data;
        let stamps: Vec<&str> = d["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["timestamp"].as_str().unwrap())
            .collect();
        assert_eq!(stamps.len(), 3);
        assert!(stamps.windows(2).all(|w| w[0] >= w[1]), "{stamps:?}");
        assert_eq!(stamps[0], "2026-01-15T15:02:00Z");
        assert_eq!(d["total_matching"], m.activity.entries.len());

        let d = activity(&m, 50, Some(ActivityKind::Dividend)).unwrap().data;
        let entries = d["entries"].as_array().unwrap();
        assert!(!entries.is_empty());
        assert!(entries.iter().all(|e| e["type"] == "dividend"));
        assert_eq!(d["type_filter"], "dividend");
    }

    #[test]
    fn transfers_are_newest_first_and_limited() {
        let d = transfers(&sample(), 2).unwrap().data;
        assert_eq!(d["count"], 2);
        assert_eq!(d["transfers"][0]["status"], "pending");
        assert_eq!(d["transfers"][1]["type"], "deposit");
        assert!(d["total"].as_u64().unwrap() > 2);
    }

    #[test]
    fn a_quote_carries_its_change_and_whether_it_is_held() {
        let m = sample();
        let d = quote(&m, " tsla ").unwrap().data;
        assert_eq!(d["quote"]["symbol"], "TSLA");
        assert!(close(&d["quote"]["change"], 5.58), "{d}");
        assert_eq!(d["held"], false);
        assert_eq!(quote(&m, "VOO").unwrap().data["held"], true);
        let err = quote(&m, "XYZ").unwrap_err().to_string();
        assert!(
            err.starts_with("no quote for 'XYZ'; quotes: AAPL, MSFT"),
            "{err}"
        );
    }

    #[test]
    fn facts_are_found_by_key_or_alias_in_any_spelling() {
        let m = sample();
        assert_eq!(fact(&m, "Roth IRA").unwrap().data["topic"], "roth_ira");
        assert_eq!(fact(&m, "roth").unwrap().data["topic"], "roth_ira");
        assert_eq!(fact(&m, "T+1").unwrap().data["topic"], "settlement");
        let d = fact(&m, "fees").unwrap().data;
        assert_eq!(d["source"], "facts/fees");
        assert!(d["snippet"].as_str().unwrap().contains("commission"));
        let err = fact(&m, "options trading").unwrap_err().to_string();
        assert!(
            err.starts_with("no facts on 'options trading'; topics: crypto, dividends"),
            "{err}"
        );
    }

    #[test]
    fn sections_without_as_of_inherit_the_files() {
        let m = sample();
        assert_eq!(quote(&m, "AAPL").unwrap().as_of, "2026-01-15T21:00:00Z");
        assert_eq!(transfers(&m, 1).unwrap().as_of, "2026-01-15");
    }
}
