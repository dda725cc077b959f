//! The trading sample data: `agents/data/trading.json`, loaded on first use
//! and re-read whenever its modification time or size changes.
//!
//! handler ──DataSource::get──▶ stat (every call) ──changed?──▶ read + parse + check
//!    ◀──────────── Arc<TradingData> (shared snapshot) ◀──────────┘
//!
//! Decisions:
//! - The file is checked as a whole when it is loaded (bars in date order,
//!   low ≤ open/close ≤ high, prices > 0, portfolio and news symbols known),
//!   so handlers index it without further checks and bad data surfaces as
//!   one clear error naming the file and the fault.
//! - A file that fails to load is not cached: the next call reads it again
//!   (an editor may have been half-way through writing it). There is no
//!   fallback to the previous good version; a stale answer that looks fresh
//!   is worse than an error.
//! - Fundamentals, sentiment and ML objects are passed through as JSON: the
//!   tools only add to them; bars, news and the starting portfolio are typed
//!   because the tools compute with them.
//! - The data is synthetic (deterministic generator, not committed) and says
//!   so in its `notice` field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use jiff::Timestamp;
use jiff::civil::Date;
use serde::Deserialize;
use serde_json::Value;

use cadre::tools::ToolError;

/// Why the sample data could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("the trading sample data {path} cannot be read: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the trading sample data {path} is not valid: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("the trading sample data {path} is inconsistent: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

impl From<DataError> for ToolError {
    fn from(e: DataError) -> Self {
        tracing::error!(error = %e, "trading sample data unavailable");
        ToolError::failed(e.to_string())
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct TradingData {
    /// Date of the latest bar: what "current" means for every data tool.
    pub as_of: Date,
    #[serde(default = "usd")]
    pub currency: String,
    pub symbols: BTreeMap<String, SymbolData>,
    #[serde(default)]
    pub news: Vec<NewsItem>,
    pub starting_portfolio: StartingPortfolio,
}

fn usd() -> String {
    "USD".into()
}

#[derive(Debug, Clone, Deserialize)]
pub struct SymbolData {
    pub name: String,
    #[serde(default)]
    pub exchange: Option<String>,
    #[serde(default)]
    pub asset_type: Option<String>,
    #[serde(default)]
    pub fundamentals: Option<Value>,
    #[serde(default)]
    pub sentiment: Option<Value>,
    #[serde(default)]
    pub ml_signals: Option<Value>,
    #[serde(default)]
    pub ml_features: Option<Value>,
    /// Daily bars, oldest first, dates strictly increasing (checked on load).
    pub bars: Vec<Bar>,
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct Bar {
    pub date: Date,
    pub open: f64,
    pub high: f64,
    pub low: f64,
    pub close: f64,
    pub volume: u64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct NewsItem {
    pub id: String,
    pub published_at: Timestamp,
    pub symbols: Vec<String>,
    pub headline: String,
    #[serde(default)]
    pub summary: String,
    #[serde(default)]
    pub source: String,
    pub sentiment_score: f64,
    #[serde(default)]
    pub sentiment_label: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct StartingPortfolio {
    pub cash: f64,
    #[serde(default)]
    pub positions: Vec<StartingPosition>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct StartingPosition {
    pub symbol: String,
    pub quantity: f64,
    pub avg_price: f64,
}

impl SymbolData {
    /// The latest bar; every symbol has one (checked on load).
    pub fn last_bar(&self) -> Option<&Bar> {
        self.bars.last()
    }

    /// The latest close: the price paper orders fill at.
    pub fn last_price(&self) -> Option<f64> {
        self.last_bar().map(|b| b.close)
    }
}

impl TradingData {
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<TradingData, DataError> {
        let data: TradingData =
            serde_json::from_slice(bytes).map_err(|source| DataError::Parse {
                path: path.to_path_buf(),
                source,
            })?;
        data.check().map_err(|reason| DataError::Invalid {
            path: path.to_path_buf(),
            reason,
        })?;
        Ok(data)
    }

    fn check(&self) -> Result<(), String> {
        if self.symbols.is_empty() {
            return Err("no symbols".into());
        }
        for (sym, s) in &self.symbols {
            if sym.is_empty() || *sym != sym.to_ascii_uppercase() {
                return Err(format!("symbol '{sym}' must be upper case"));
            }
            if s.bars.is_empty() {
                return Err(format!("{sym} has no bars"));
            }
            for (i, b) in s.bars.iter().enumerate() {
                let prices = [b.open, b.high, b.low, b.close];
                if prices.iter().any(|p| !p.is_finite() || *p <= 0.0) {
                    return Err(format!("{sym} bar {} has a non-positive price", b.date));
                }
                if b.low > b.open.min(b.close) || b.high < b.open.max(b.close) {
                    return Err(format!(
                        "{sym} bar {} is not low ≤ open, close ≤ high",
                        b.date
                    ));
                }
                if i > 0 && s.bars[i - 1].date >= b.date {
                    return Err(format!("{sym} bars are not in date order at {}", b.date));
                }
            }
        }
        for n in &self.news {
            if let Some(unknown) = n.symbols.iter().find(|s| !self.symbols.contains_key(*s)) {
                return Err(format!("news {} names unknown symbol '{unknown}'", n.id));
            }
            if !n.sentiment_score.is_finite() {
                return Err(format!("news {} has a non-finite sentiment score", n.id));
            }
        }
        let p = &self.starting_portfolio;
        if !p.cash.is_finite() || p.cash < 0.0 {
            return Err("starting_portfolio.cash must be ≥ 0".into());
        }
        for pos in &p.positions {
            if !self.symbols.contains_key(&pos.symbol) {
                return Err(format!(
                    "starting_portfolio names unknown symbol '{}'",
                    pos.symbol
                ));
            }
            if ![pos.quantity, pos.avg_price]
                .iter()
                .all(|x| x.is_finite() && *x > 0.0)
            {
                return Err(format!(
                    "starting_portfolio position {} needs quantity and avg_price > 0",
                    pos.symbol
                ));
            }
        }
        Ok(())
    }

    /// The symbol's canonical name and data; unknown symbols are the model's
    /// mistake, so the error lists what exists.
    pub fn symbol(&self, raw: &str) -> Result<(&str, &SymbolData), ToolError> {
        let wanted = raw.trim().to_ascii_uppercase();
        self.symbols
            .get_key_value(wanted.as_str())
            .map(|(k, v)| (k.as_str(), v))
            .ok_or_else(|| {
                ToolError::invalid(format!(
                    "unknown symbol '{}'; known: {}",
                    raw.trim(),
                    self.known_symbols()
                ))
            })
    }

    pub fn known_symbols(&self) -> String {
        self.symbols.keys().cloned().collect::<Vec<_>>().join(", ")
    }

    /// The latest price of a symbol, `None` for symbols the data no longer has.
    pub fn price(&self, symbol: &str) -> Option<f64> {
        self.symbols.get(symbol).and_then(SymbolData::last_price)
    }
}

/// Identifies one version of the file on disk.
type Stamp = (Option<SystemTime>, u64);

/// The data file and its last good parse.
pub struct DataSource {
    path: PathBuf,
    // std Mutex: held only to compare a stamp and clone an Arc, never across
    // an await.
    cached: Mutex<Option<(Stamp, Arc<TradingData>)>>,
}

impl DataSource {
    pub fn new(path: PathBuf) -> Self {
        DataSource {
            path,
            cached: Mutex::new(None),
        }
    }

    /// The current data: one `stat` per call, a re-read when the file changed.
    pub async fn get(&self) -> Result<Arc<TradingData>, DataError> {
        let read_err = |source| DataError::Read {
            path: self.path.clone(),
            source,
        };
        let meta = tokio::fs::metadata(&self.path).await.map_err(read_err)?;
        let stamp: Stamp = (meta.modified().ok(), meta.len());
        if let Some((cached_stamp, data)) = self.lock().as_ref()
            && *cached_stamp == stamp
        {
            return Ok(data.clone());
        }
        let bytes = tokio::fs::read(&self.path).await.map_err(read_err)?;
        let data = Arc::new(TradingData::parse(&self.path, &bytes)?);
        *self.lock() = Some((stamp, data.clone()));
        Ok(data)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Stamp, Arc<TradingData>)>> {
        // The guarded value is replaced whole, so a poisoned lock holds
        // nothing half-written.
        self.cached.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The shipped sample data.
    pub(crate) fn shipped_path() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../agents/data/trading.json")
    }

    #[test]
    fn shipped_sample_data_loads_and_is_large_enough() {
        let path = shipped_path();
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() < 1_000_000, "keep the sample under 1 MB");
        let data = TradingData::parse(&path, &bytes).unwrap();
        assert_eq!(data.known_symbols(), "AAPL, MSFT, NVDA, SPY, TSLA");
        for (sym, s) in &data.symbols {
            assert!(s.bars.len() >= 300, "{sym}");
            assert_eq!(s.last_bar().unwrap().date, data.as_of, "{sym}");
            assert!(s.fundamentals.is_some() && s.sentiment.is_some(), "{sym}");
            assert!(s.ml_signals.is_some() && s.ml_features.is_some(), "{sym}");
        }
        assert!(data.news.len() >= 10);
    }

    #[test]
    fn inconsistent_data_is_refused_with_the_reason() {
        let path = Path::new("t.json");
        let bad = br#"{"as_of": "2026-01-02", "symbols": {"AAPL": {"name": "A", "bars": [
            {"date": "2026-01-02", "open": 10, "high": 9, "low": 8, "close": 9, "volume": 1}]}},
            "starting_portfolio": {"cash": 1}}"#;
        let err = TradingData::parse(path, bad).unwrap_err().to_string();
        assert!(err.contains("low ≤ open, close ≤ high"), "{err}");
        let unknown = br#"{"as_of": "2026-01-02", "symbols": {"AAPL": {"name": "A", "bars": [
            {"date": "2026-01-02", "open": 9, "high": 9, "low": 8, "close": 9, "volume": 1}]}},
            "starting_portfolio": {"cash": 1, "positions": [{"symbol": "ZZZ", "quantity": 1, "avg_price": 1}]}}"#;
        let err = TradingData::parse(path, unknown).unwrap_err().to_string();
        assert!(err.contains("unknown symbol 'ZZZ'"), "{err}");
        let err = TradingData::parse(path, b"{").unwrap_err();
        assert!(matches!(err, DataError::Parse { .. }));
    }

    #[test]
    fn symbols_are_matched_case_insensitively_and_unknown_ones_listed() {
        let path = shipped_path();
        let data = TradingData::parse(&path, &std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(data.symbol(" aapl ").unwrap().0, "AAPL");
        let err = data.symbol("XYZ").unwrap_err().to_string();
        assert_eq!(
            err,
            "unknown symbol 'XYZ'; known: AAPL, MSFT, NVDA, SPY, TSLA"
        );
    }

    #[tokio::test]
    async fn the_file_is_re_read_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trading.json");
        let v1 = br#"{"as_of": "2026-01-02", "symbols": {"AAPL": {"name": "A", "bars": [
            {"date": "2026-01-02", "open": 9, "high": 9, "low": 8, "close": 9, "volume": 1}]}},
            "starting_portfolio": {"cash": 1}}"#;
        std::fs::write(&path, v1).unwrap();
        let source = DataSource::new(path.clone());
        assert_eq!(source.get().await.unwrap().price("AAPL"), Some(9.0));
        let first = source.get().await.unwrap();
        assert!(Arc::ptr_eq(&first, &source.get().await.unwrap()));
        // A different size changes the stamp even within one mtime tick.
        let v2 = String::from_utf8_lossy(v1).replace("\"close\": 9", "\"close\": 8.5");
        std::fs::write(&path, v2).unwrap();
        assert_eq!(source.get().await.unwrap().price("AAPL"), Some(8.5));
        std::fs::write(&path, b"{ broken").unwrap();
        assert!(matches!(source.get().await, Err(DataError::Parse { .. })));
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(source.get().await, Err(DataError::Read { .. })));
    }
}
