//! Market tools: `get_price`, `get_ohlcv`, `get_indicators`, `get_fundamentals`.
//!
//! executor ──params──▶ handler ──▶ sample data (data.rs) ──▶ indicators.rs ──▶ envelope
//!
//! Decisions:
//! - "Current" is the latest bar of the sample data: `get_price` reports its
//!   close, and its change against the previous close (daily data, so this is
//!   the day's change, not a rolling 24 h one).
//! - Timeframes keep the spec's enums so a real feed can replace the sample
//!   without changing the contract. The sample holds daily bars: `1d` is
//!   served as stored, `1w` is aggregated from them (ISO weeks; dated by the
//!   week's first trading day; the latest week may be partial), and the
//!   intraday ones (`1m` … `4h`) are refused with an error that names the
//!   timeframes that work. `get_indicators` also accepts `1w`.
//! - `get_indicators` computes from the bars (at most the latest 500 of the
//!   timeframe) with the standard periods: RSI 14, MACD 12/26/9, BB 20/2σ,
//!   SMA 20, EMA 20, ATR 14, ADX 14; VWAP is cumulative over those same bars
//!   (`bars_used`), OBV starts at 0 on the first of them. An indicator the
//!   history is too short for comes back as `{"value": null, "error": ...}`
//!   while the others are still computed.

use std::borrow::Cow;

use serde_json::{Value, json};

use super::data::{Bar, SymbolData};
use super::indicators::{self, IndicatorError};
use super::{Op, Shared, envelope, opt_str, opt_u64, req_str, round, symbol_schema};
use cadre::tools::definition::Plan;
use cadre::tools::{SideEffects, ToolDefinition, ToolError};

/// Largest `limit` of `get_ohlcv`, and the most bars indicators look at.
pub const MAX_BARS: usize = 500;

pub(super) fn definitions() -> Vec<(ToolDefinition, Op)> {
    vec![
        (
            ToolDefinition::new(
                "get_price",
                "Current price of a symbol (latest close) with its change against the \
                 previous close, the day's range and volume.",
                json!({
                    "type": "object",
                    "properties": {"symbol": symbol_schema()},
                    "required": ["symbol"],
                    "additionalProperties": false
                }),
            )
            .with_side_effects(SideEffects::None)
            .with_category("market")
            .with_tags(&["price", "quote", "market", "stock"])
            .with_plan(Plan::Free)
            .per_minute(60)
            .with_cache_ttl(5),
            Op::GetPrice,
        ),
        (
            ToolDefinition::new(
                "get_ohlcv",
                "Historical OHLCV candles of a symbol, oldest first. The sample data has \
                 daily bars: use timeframe '1d', or '1w' for weekly candles built from them.",
                json!({
                    "type": "object",
                    "properties": {
                        "symbol": symbol_schema(),
                        "timeframe": {
                            "type": "string",
                            "enum": ["1m", "5m", "15m", "1h", "4h", "1d", "1w"],
                            "description": "Candle interval; only '1d' and '1w' are available"
                        },
                        "limit": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_BARS,
                            "default": 100,
                            "description": "Number of most recent candles (max 500)"
                        }
                    },
                    "required": ["symbol", "timeframe"],
                    "additionalProperties": false
                }),
            )
            .with_side_effects(SideEffects::None)
            .with_category("market")
            .with_tags(&["ohlcv", "candles", "history", "chart", "market"])
            .with_plan(Plan::Free)
            .per_minute(30)
            .with_cache_ttl(5),
            Op::GetOhlcv,
        ),
        (
            ToolDefinition::new(
                "get_indicators",
                "Technical indicators computed from a symbol's candles: RSI(14), \
                 MACD(12,26,9), BB (Bollinger 20, 2σ), SMA(20), EMA(20), ATR(14), VWAP, \
                 OBV, ADX(14). Returns the latest value of each.",
                json!({
                    "type": "object",
                    "properties": {
                        "symbol": symbol_schema(),
                        "indicators": {
                            "type": "array",
                            "items": {
                                "type": "string",
                                "enum": ["RSI", "MACD", "BB", "SMA", "EMA", "ATR", "VWAP", "OBV", "ADX"]
                            },
                            "minItems": 1,
                            "maxItems": 9,
                            "uniqueItems": true
                        },
                        "timeframe": {
                            "type": "string",
                            "enum": ["1h", "4h", "1d", "1w"],
                            "default": "1d",
                            "description": "Candle interval; only '1d' and '1w' are available"
                        }
                    },
                    "required": ["symbol", "indicators"],
                    "additionalProperties": false
                }),
            )
            .with_side_effects(SideEffects::None)
            .with_category("market")
            .with_tags(&["indicators", "technical", "rsi", "macd", "market"])
            .with_plan(Plan::Free)
            .per_minute(30)
            .with_cache_ttl(5),
            Op::GetIndicators,
        ),
        (
            ToolDefinition::new(
                "get_fundamentals",
                "Fundamental data of a stock (market cap, P/E, EPS, revenue, margins, \
                 dividend yield, beta) or of an ETF (AUM, expense ratio, holdings).",
                json!({
                    "type": "object",
                    "properties": {"symbol": symbol_schema()},
                    "required": ["symbol"],
                    "additionalProperties": false
                }),
            )
            .with_side_effects(SideEffects::None)
            .with_category("market")
            .with_tags(&["fundamentals", "valuation", "earnings", "market"])
            .with_plan(Plan::Free)
            .per_minute(20)
            .with_cache_ttl(5),
            Op::GetFundamentals,
        ),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timeframe {
    Daily,
    Weekly,
}

impl Timeframe {
    pub(super) fn parse(raw: &str) -> Result<Timeframe, ToolError> {
        match raw {
            "1d" => Ok(Timeframe::Daily),
            "1w" => Ok(Timeframe::Weekly),
            "1m" | "5m" | "15m" | "1h" | "4h" => Err(ToolError::invalid(format!(
                "timeframe '{raw}' is not available: the sample data holds daily bars only; \
                 use '1d' or '1w'"
            ))),
            other => Err(ToolError::invalid(format!(
                "unknown timeframe '{other}'; use '1d' or '1w'"
            ))),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Timeframe::Daily => "1d",
            Timeframe::Weekly => "1w",
        }
    }

    fn bars(self, daily: &[Bar]) -> Cow<'_, [Bar]> {
        match self {
            Timeframe::Daily => Cow::Borrowed(daily),
            Timeframe::Weekly => Cow::Owned(weekly(daily)),
        }
    }
}

/// Daily bars grouped by ISO week: first open, highest high, lowest low,
/// last close, summed volume, dated by the week's first trading day.
fn weekly(daily: &[Bar]) -> Vec<Bar> {
    let mut out: Vec<Bar> = Vec::new();
    let mut current_week = None;
    for b in daily {
        let iso = b.date.iso_week_date();
        let week = (iso.year(), iso.week());
        match out.last_mut() {
            Some(w) if current_week == Some(week) => {
                w.high = w.high.max(b.high);
                w.low = w.low.min(b.low);
                w.close = b.close;
                w.volume = w.volume.saturating_add(b.volume);
            }
            _ => {
                out.push(*b);
                current_week = Some(week);
            }
        }
    }
    out
}

fn bar_json(b: &Bar) -> Value {
    json!({
        "date": b.date.to_string(),
        "open": b.open,
        "high": b.high,
        "low": b.low,
        "close": b.close,
        "volume": b.volume,
    })
}

fn last_bar(symbol: &str, s: &SymbolData) -> Result<Bar, ToolError> {
    s.last_bar()
        .copied()
        .ok_or_else(|| ToolError::failed(format!("the sample data has no bars for {symbol}")))
}

pub(super) async fn get_price(shared: &Shared, p: &Value) -> Result<Value, ToolError> {
    let data = shared.data.get().await?;
    let (symbol, s) = data.symbol(req_str(p, "symbol")?)?;
    let last = last_bar(symbol, s)?;
    let previous_close = s
        .bars
        .len()
        .checked_sub(2)
        .and_then(|i| s.bars.get(i))
        .map(|b| b.close);
    let change = previous_close.map(|pc| round(last.close - pc, 2));
    let change_percent = previous_close.map(|pc| round((last.close / pc - 1.0) * 100.0, 2));
    Ok(envelope(
        "price",
        json!({
            "symbol": symbol,
            "name": s.name,
            "exchange": s.exchange,
            "currency": data.currency,
            "price": last.close,
            "previous_close": previous_close,
            "change": change,
            "change_percent": change_percent,
            "open": last.open,
            "high": last.high,
            "low": last.low,
            "volume": last.volume,
            "date": last.date.to_string(),
        }),
        last.date,
    ))
}

pub(super) async fn get_ohlcv(shared: &Shared, p: &Value) -> Result<Value, ToolError> {
    let data = shared.data.get().await?;
    let (symbol, s) = data.symbol(req_str(p, "symbol")?)?;
    let timeframe = Timeframe::parse(req_str(p, "timeframe")?)?;
    let limit = opt_u64(p, "limit")?.unwrap_or(100);
    if !(1..=MAX_BARS as u64).contains(&limit) {
        return Err(ToolError::invalid(format!(
            "limit must be between 1 and {MAX_BARS}, got {limit}"
        )));
    }
    let bars = timeframe.bars(&s.bars);
    let start = bars.len().saturating_sub(limit as usize);
    let window = &bars[start..];
    let as_of = window
        .last()
        .map(|b| b.date.to_string())
        .unwrap_or_else(|| data.as_of.to_string());
    Ok(envelope(
        "ohlcv",
        json!({
            "symbol": symbol,
            "timeframe": timeframe.as_str(),
            "count": window.len(),
            "available": bars.len(),
            "bars": window.iter().map(bar_json).collect::<Vec<_>>(),
        }),
        as_of,
    ))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Indicator {
    Rsi,
    Macd,
    Bb,
    Sma,
    Ema,
    Atr,
    Vwap,
    Obv,
    Adx,
}

impl Indicator {
    fn parse(raw: &str) -> Result<Indicator, ToolError> {
        Ok(match raw.trim().to_ascii_uppercase().as_str() {
            "RSI" => Indicator::Rsi,
            "MACD" => Indicator::Macd,
            "BB" => Indicator::Bb,
            "SMA" => Indicator::Sma,
            "EMA" => Indicator::Ema,
            "ATR" => Indicator::Atr,
            "VWAP" => Indicator::Vwap,
            "OBV" => Indicator::Obv,
            "ADX" => Indicator::Adx,
            _ => {
                return Err(ToolError::invalid(format!(
                    "unknown indicator '{raw}'; use RSI, MACD, BB, SMA, EMA, ATR, VWAP, OBV or ADX"
                )));
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            Indicator::Rsi => "RSI",
            Indicator::Macd => "MACD",
            Indicator::Bb => "BB",
            Indicator::Sma => "SMA",
            Indicator::Ema => "EMA",
            Indicator::Atr => "ATR",
            Indicator::Vwap => "VWAP",
            Indicator::Obv => "OBV",
            Indicator::Adx => "ADX",
        }
    }
}

/// Column views of a bar window, as the indicator functions take them.
struct Columns {
    high: Vec<f64>,
    low: Vec<f64>,
    close: Vec<f64>,
    volume: Vec<f64>,
}

impl Columns {
    fn of(bars: &[Bar]) -> Columns {
        Columns {
            high: bars.iter().map(|b| b.high).collect(),
            low: bars.iter().map(|b| b.low).collect(),
            close: bars.iter().map(|b| b.close).collect(),
            volume: bars.iter().map(|b| b.volume as f64).collect(),
        }
    }
}

fn latest<T: Copy>(series: &[Option<T>]) -> Option<T> {
    series.last().copied().flatten()
}

fn r4(x: f64) -> f64 {
    round(x, 4)
}

/// The latest value(s) of one indicator over the window.
fn compute(ind: Indicator, c: &Columns) -> Result<Value, IndicatorError> {
    Ok(match ind {
        Indicator::Rsi => {
            json!({"period": 14, "value": latest(&indicators::rsi(&c.close, 14)?).map(r4)})
        }
        Indicator::Macd => {
            let p = latest(&indicators::macd(&c.close, 12, 26, 9)?);
            json!({
                "fast": 12, "slow": 26, "signal_period": 9,
                "macd": p.map(|p| r4(p.macd)),
                "signal": p.map(|p| r4(p.signal)),
                "histogram": p.map(|p| r4(p.histogram)),
            })
        }
        Indicator::Bb => {
            let b = latest(&indicators::bollinger(&c.close, 20, 2.0)?);
            json!({
                "period": 20, "std_dev": 2,
                "upper": b.map(|b| r4(b.upper)),
                "middle": b.map(|b| r4(b.middle)),
                "lower": b.map(|b| r4(b.lower)),
            })
        }
        Indicator::Sma => {
            json!({"period": 20, "value": latest(&indicators::sma(&c.close, 20)?).map(r4)})
        }
        Indicator::Ema => {
            json!({"period": 20, "value": latest(&indicators::ema(&c.close, 20)?).map(r4)})
        }
        Indicator::Atr => json!({
            "period": 14,
            "value": latest(&indicators::atr(&c.high, &c.low, &c.close, 14)?).map(r4),
        }),
        Indicator::Vwap => json!({
            "window_bars": c.close.len(),
            "value": latest(&indicators::vwap(&c.high, &c.low, &c.close, &c.volume)?).map(r4),
        }),
        Indicator::Obv => json!({
            "window_bars": c.close.len(),
            "value": indicators::obv(&c.close, &c.volume)?.last().map(|v| v.round() as i64),
        }),
        Indicator::Adx => {
            let p = latest(&indicators::adx(&c.high, &c.low, &c.close, 14)?);
            json!({
                "period": 14,
                "adx": p.map(|p| r4(p.adx)),
                "plus_di": p.map(|p| r4(p.plus_di)),
                "minus_di": p.map(|p| r4(p.minus_di)),
            })
        }
    })
}

pub(super) async fn get_indicators(shared: &Shared, p: &Value) -> Result<Value, ToolError> {
    let data = shared.data.get().await?;
    let (symbol, s) = data.symbol(req_str(p, "symbol")?)?;
    let timeframe = Timeframe::parse(opt_str(p, "timeframe")?.unwrap_or("1d"))?;
    let requested = p
        .get("indicators")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
        .ok_or_else(|| ToolError::invalid("indicators must be a non-empty list"))?;
    let mut wanted = Vec::new();
    for item in requested {
        let name = item
            .as_str()
            .ok_or_else(|| ToolError::invalid("indicators must be names such as \"RSI\""))?;
        let ind = Indicator::parse(name)?;
        if !wanted.contains(&ind) {
            wanted.push(ind);
        }
    }
    let bars = timeframe.bars(&s.bars);
    let window = &bars[bars.len().saturating_sub(MAX_BARS)..];
    let (Some(first), Some(last)) = (window.first(), window.last()) else {
        return Err(ToolError::failed(format!(
            "the sample data has no bars for {symbol}"
        )));
    };
    let columns = Columns::of(window);
    let mut out = serde_json::Map::new();
    for ind in wanted {
        let value = compute(ind, &columns)
            .unwrap_or_else(|e| json!({"value": null, "error": e.to_string()}));
        out.insert(ind.name().into(), value);
    }
    Ok(envelope(
        "indicators",
        json!({
            "symbol": symbol,
            "timeframe": timeframe.as_str(),
            "bars_used": window.len(),
            "from": first.date.to_string(),
            "to": last.date.to_string(),
            "last_close": last.close,
            "indicators": out,
        }),
        last.date,
    ))
}

pub(super) async fn get_fundamentals(shared: &Shared, p: &Value) -> Result<Value, ToolError> {
    let data = shared.data.get().await?;
    let (symbol, s) = data.symbol(req_str(p, "symbol")?)?;
    let fundamentals = s.fundamentals.as_ref().ok_or_else(|| {
        ToolError::failed(format!("the sample data has no fundamentals for {symbol}"))
    })?;
    let as_of = fundamentals
        .get("as_of")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| data.as_of.to_string());
    Ok(envelope(
        "fundamentals",
        json!({
            "symbol": symbol,
            "name": s.name,
            "exchange": s.exchange,
            "asset_type": s.asset_type,
            "currency": data.currency,
            "fundamentals": fundamentals,
        }),
        as_of,
    ))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{call, call_unchecked, fixture};
    use super::*;
    use jiff::civil::date;

    fn bar(d: jiff::civil::Date, o: f64, h: f64, l: f64, c: f64, v: u64) -> Bar {
        Bar {
            date: d,
            open: o,
            high: h,
            low: l,
            close: c,
            volume: v,
        }
    }

    #[test]
    fn weekly_bars_aggregate_iso_weeks() {
        // 2026-10-29 Thu, 10-30 Fri (week 44); 11-02 Mon (week 45).
        let daily = [
            bar(date(2026, 10, 29), 10.0, 12.0, 9.0, 11.0, 100),
            bar(date(2026, 10, 30), 11.0, 13.0, 10.0, 12.5, 200),
            bar(date(2026, 11, 2), 12.0, 12.5, 11.0, 11.5, 50),
        ];
        let w = weekly(&daily);
        assert_eq!(
            w,
            vec![
                bar(date(2026, 10, 29), 10.0, 13.0, 9.0, 12.5, 300),
                bar(date(2026, 11, 2), 12.0, 12.5, 11.0, 11.5, 50),
            ]
        );
    }

    #[tokio::test]
    async fn get_price_reports_the_latest_close_and_its_change() {
        let fx = fixture().await;
        let out = call(&fx, "get_price", json!({"symbol": "aapl"}), None)
            .await
            .unwrap();
        assert_eq!(out["source_id"], "tool:price:v1");
        assert_eq!(out["as_of"], "2026-10-30");
        let d = &out["data"];
        assert_eq!(d["symbol"], "AAPL");
        let price = d["price"].as_f64().unwrap();
        let prev = d["previous_close"].as_f64().unwrap();
        assert!((d["change"].as_f64().unwrap() - round(price - prev, 2)).abs() < 1e-9);
        let err = call(&fx, "get_price", json!({"symbol": "XYZ"}), None)
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::InvalidInput { .. }));
        assert_eq!(
            err.to_string(),
            "unknown symbol 'XYZ'; known: AAPL, MSFT, NVDA, SPY, TSLA"
        );
    }

    #[tokio::test]
    async fn get_ohlcv_returns_the_latest_bars_oldest_first() {
        let fx = fixture().await;
        let out = call(
            &fx,
            "get_ohlcv",
            json!({"symbol": "MSFT", "timeframe": "1d", "limit": 3}),
            None,
        )
        .await
        .unwrap();
        assert_eq!(out["source_id"], "tool:ohlcv:v1");
        let bars = out["data"]["bars"].as_array().unwrap();
        assert_eq!(bars.len(), 3);
        assert_eq!(bars[2]["date"], "2026-10-30");
        assert!(bars[0]["date"].as_str() < bars[1]["date"].as_str());
        assert!(bars[0]["volume"].is_u64());
        // More than available: everything there is.
        let out = call(
            &fx,
            "get_ohlcv",
            json!({"symbol": "MSFT", "timeframe": "1d", "limit": 500}),
            None,
        )
        .await
        .unwrap();
        assert_eq!(out["data"]["count"], 320);
        let out = call(
            &fx,
            "get_ohlcv",
            json!({"symbol": "MSFT", "timeframe": "1w", "limit": 2}),
            None,
        )
        .await
        .unwrap();
        assert_eq!(out["data"]["bars"][1]["date"], "2026-10-26");
    }

    #[tokio::test]
    async fn intraday_timeframes_and_bad_limits_are_refused_clearly() {
        let fx = fixture().await;
        let err = call(
            &fx,
            "get_ohlcv",
            json!({"symbol": "MSFT", "timeframe": "1h"}),
            None,
        )
        .await
        .unwrap_err();
        assert!(matches!(err, ToolError::InvalidInput { .. }));
        assert!(err.to_string().contains("daily bars only"), "{err}");
        let over = json!({"symbol": "MSFT", "timeframe": "1d", "limit": 501});
        let err = call(&fx, "get_ohlcv", over.clone(), None)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("maximum of 500"), "{err}");
        // The handler checks too, should a caller skip the schema.
        let err = call_unchecked(&fx, "get_ohlcv", over, None)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("between 1 and 500"), "{err}");
    }

    #[tokio::test]
    async fn get_indicators_computes_from_the_bars() {
        let fx = fixture().await;
        let out = call(
            &fx,
            "get_indicators",
            json!({"symbol": "NVDA", "indicators": ["RSI", "SMA", "MACD", "BB", "EMA", "ATR", "VWAP", "OBV", "ADX"]}),
            None,
        )
        .await
        .unwrap();
        assert_eq!(out["source_id"], "tool:indicators:v1");
        let d = &out["data"];
        assert_eq!(d["bars_used"], 320);
        // SMA(20) equals the mean of the last 20 closes from get_ohlcv.
        let bars = call(
            &fx,
            "get_ohlcv",
            json!({"symbol": "NVDA", "timeframe": "1d", "limit": 20}),
            None,
        )
        .await
        .unwrap();
        let closes: Vec<f64> = bars["data"]["bars"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["close"].as_f64().unwrap())
            .collect();
        let mean = closes.iter().sum::<f64>() / 20.0;
        let sma = d["indicators"]["SMA"]["value"].as_f64().unwrap();
        assert!((sma - round(mean, 4)).abs() < 1e-9);
        let rsi = d["indicators"]["RSI"]["value"].as_f64().unwrap();
        assert!((0.0..=100.0).contains(&rsi));
        let bb = &d["indicators"]["BB"];
        assert!(bb["lower"].as_f64() < bb["middle"].as_f64());
        assert!(d["indicators"]["MACD"]["histogram"].is_number());
        assert!(d["indicators"]["ADX"]["adx"].is_number());
        assert!(d["indicators"]["OBV"]["value"].is_number());
        assert!(d["indicators"]["VWAP"]["value"].is_number());
    }

    #[tokio::test]
    async fn too_short_a_history_gives_null_with_the_reason() {
        // Five daily bars: SMA(20) cannot be computed, OBV can.
        let fx = super::super::tests::fixture_with(|data| {
            let bars = data["symbols"]["AAPL"]["bars"].as_array_mut().unwrap();
            let keep = bars.split_off(bars.len() - 5);
            *bars = keep;
        })
        .await;
        let out = call(
            &fx,
            "get_indicators",
            json!({"symbol": "AAPL", "indicators": ["SMA", "OBV"], "timeframe": "1d"}),
            None,
        )
        .await
        .unwrap();
        let ind = &out["data"]["indicators"];
        assert!(ind["SMA"]["value"].is_null());
        assert_eq!(ind["SMA"]["error"], "SMA needs at least 20 bars, got 5");
        assert!(ind["OBV"]["value"].is_number());
        let err = call(
            &fx,
            "get_indicators",
            json!({"symbol": "AAPL", "indicators": ["RSI"], "timeframe": "4h"}),
            None,
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("daily bars only"));
    }

    #[tokio::test]
    async fn get_fundamentals_passes_the_sample_through() {
        let fx = fixture().await;
        let out = call(&fx, "get_fundamentals", json!({"symbol": "SPY"}), None)
            .await
            .unwrap();
        assert_eq!(out["source_id"], "tool:fundamentals:v1");
        assert_eq!(out["data"]["fundamentals"]["asset_type"], "etf");
        let out = call(&fx, "get_fundamentals", json!({"symbol": "TSLA"}), None)
            .await
            .unwrap();
        assert!(out["data"]["fundamentals"]["pe_ratio"].is_number());
        assert!(
            call(&fx, "get_fundamentals", json!({"symbol": "BTC"}), None)
                .await
                .is_err()
        );
    }
}
