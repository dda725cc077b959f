//! The brokerage master file: its shape, its checks, and the cache that
//! re-reads it when it changes.
//!
//! ```text
//! agents/data/brokerage.json ──stat (every call)──▶ same (mtime, size)? ──▶ cached Arc<Master>
//!                                                    └─ changed ──▶ read · parse · check ──▶ swap
//! ```
//!
//! The file is parsed into typed sections (`deny_unknown_fields`), so a typo
//! or a missing field is reported where it is, with line and column, instead
//! of surfacing later as a wrong answer. After parsing, [`Master::check`]
//! rejects what serde cannot see: a position without a quote (its value could
//! not be computed), a symbol listed twice, a performance timeframe missing
//! or with an empty series.
//!
//! Each section may carry its own `as_of`; without one it inherits the file's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::SystemTime;

use jiff::Timestamp;
use jiff::civil::Date;
use serde::{Deserialize, Serialize};

/// The file's name inside the builtin data folder.
pub const FILE_NAME: &str = "brokerage.json";

/// A closed set of names, written in the file and in tool parameters as
/// strings. `ALL` is the order used in schemas and in error messages.
macro_rules! named_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name { $($variant),+ }

        impl $name {
            pub const ALL: &[$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            /// Case-insensitive; surrounding blanks ignored.
            pub fn parse(s: &str) -> Option<$name> {
                let s = s.trim();
                Self::ALL.iter().copied().find(|v| v.as_str().eq_ignore_ascii_case(s))
            }

            /// `"a, b, c"`, for error messages.
            pub fn names() -> String {
                Self::ALL.iter().map(|v| v.as_str()).collect::<Vec<_>>().join(", ")
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                $name::parse(&s).ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        "unknown {} '{s}', expected one of: {}",
                        stringify!($name),
                        $name::names()
                    ))
                })
            }
        }
    };
}

named_enum!(AssetClass {
    Equity = "equity",
    Etf = "etf",
    MutualFund = "mutual_fund",
    Bond = "bond",
    Crypto = "crypto",
    Cash = "cash",
});

named_enum!(ActivityKind {
    Buy = "buy",
    Sell = "sell",
    Dividend = "dividend",
    Interest = "interest",
    Fee = "fee",
});

named_enum!(TransferKind {
    Deposit = "deposit",
    Withdrawal = "withdrawal",
});

named_enum!(TransferStatus {
    Pending = "pending",
    Completed = "completed",
    Failed = "failed",
    Canceled = "canceled",
});

named_enum!(
    /// Performance windows, each ending at the data's `as_of`.
    Timeframe {
        OneWeek = "1W",
        OneMonth = "1M",
        ThreeMonths = "3M",
        YearToDate = "YTD",
        OneYear = "1Y",
        All = "ALL",
    }
);

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Master {
    /// Default `as_of` of every section.
    pub as_of: String,
    pub account_summary: AccountSection,
    pub positions: PositionsSection,
    pub quotes: QuotesSection,
    pub activity: ActivitySection,
    pub transfers: TransfersSection,
    pub performance: PerformanceSection,
    pub facts: FactsSection,
}

/// What the account summary states that positions cannot tell; its values
/// (total, cash, day change) are computed from positions and quotes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountSection {
    pub as_of: Option<String>,
    pub account: String,
    pub account_number: String,
    pub account_type: String,
    /// Cash that has settled; the rest of the cash positions is unsettled
    /// sale proceeds.
    pub settled_cash: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PositionsSection {
    pub as_of: Option<String>,
    pub positions: Vec<Position>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Position {
    pub symbol: String,
    pub name: String,
    pub asset_class: AssetClass,
    pub quantity: f64,
    /// Per unit; the total cost basis is `quantity * average_cost`.
    pub average_cost: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotesSection {
    pub as_of: Option<String>,
    pub quotes: Vec<Quote>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quote {
    pub symbol: String,
    pub name: String,
    pub price: f64,
    pub previous_close: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActivitySection {
    pub as_of: Option<String>,
    pub entries: Vec<ActivityEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActivityEntry {
    pub timestamp: Timestamp,
    #[serde(rename = "type")]
    pub kind: ActivityKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symbol: Option<String>,
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantity: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<f64>,
    /// Signed cash effect: negative for buys and fees.
    pub amount: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settlement_date: Option<Date>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransfersSection {
    pub as_of: Option<String>,
    pub transfers: Vec<Transfer>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Transfer {
    pub timestamp: Timestamp,
    #[serde(rename = "type")]
    pub kind: TransferKind,
    pub method: String,
    pub external_account: String,
    /// Always positive; `type` says the direction.
    pub amount: f64,
    pub status: TransferStatus,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerformanceSection {
    pub as_of: Option<String>,
    pub timeframes: BTreeMap<Timeframe, PerformanceWindow>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerformanceWindow {
    /// As reported (time-weighted), not derivable from the series alone.
    pub return_pct: f64,
    pub contributions: f64,
    pub withdrawals: f64,
    /// Account value over the window, oldest first; never empty.
    pub series: Vec<ValuePoint>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValuePoint {
    pub date: Date,
    pub value: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FactsSection {
    pub as_of: Option<String>,
    /// By topic key (`fees`, `roth_ira`...), sorted so listings are stable.
    pub topics: BTreeMap<String, Fact>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fact {
    pub title: String,
    /// Other names a caller may use for the topic (`roth` for `roth_ira`).
    #[serde(default)]
    pub aliases: Vec<String>,
    pub text: String,
}

/// Why the master file cannot be used. The messages name the file, not its
/// path: they reach the model; the path goes to the log.
#[derive(Debug, thiserror::Error)]
pub enum MasterError {
    #[error("{FILE_NAME} is missing")]
    Missing,
    #[error("{FILE_NAME} cannot be read: {source}")]
    Read { source: std::io::Error },
    #[error("{FILE_NAME} is not valid: {source}")]
    Invalid { source: serde_json::Error },
    #[error("{FILE_NAME} is not valid: position '{symbol}' has no quote")]
    NoQuote { symbol: String },
    #[error("{FILE_NAME} is not valid: '{symbol}' is listed twice in {section}")]
    DuplicateSymbol {
        section: &'static str,
        symbol: String,
    },
    #[error("{FILE_NAME} is not valid: performance has no '{}' timeframe", timeframe.as_str())]
    MissingTimeframe { timeframe: Timeframe },
    #[error("{FILE_NAME} is not valid: the '{}' performance series is empty", timeframe.as_str())]
    EmptySeries { timeframe: Timeframe },
}

impl Master {
    pub fn parse(text: &str) -> Result<Master, MasterError> {
        let master: Master =
            serde_json::from_str(text).map_err(|source| MasterError::Invalid { source })?;
        master.check()?;
        Ok(master)
    }

    /// What the types cannot express. Symbols compare case-insensitively,
    /// as the tools look them up.
    pub fn check(&self) -> Result<(), MasterError> {
        unique_symbols("quotes", self.quotes.quotes.iter().map(|q| &q.symbol))?;
        unique_symbols(
            "positions",
            self.positions.positions.iter().map(|p| &p.symbol),
        )?;
        if let Some(p) = self
            .positions
            .positions
            .iter()
            .find(|p| self.quote(&p.symbol).is_none())
        {
            return Err(MasterError::NoQuote {
                symbol: p.symbol.clone(),
            });
        }
        for &timeframe in Timeframe::ALL {
            match self.performance.timeframes.get(&timeframe) {
                None => return Err(MasterError::MissingTimeframe { timeframe }),
                Some(w) if w.series.is_empty() => {
                    return Err(MasterError::EmptySeries { timeframe });
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// A section's `as_of`, or the file's.
    pub fn as_of<'a>(&'a self, section: &'a Option<String>) -> &'a str {
        section.as_deref().unwrap_or(&self.as_of)
    }

    pub fn quote(&self, symbol: &str) -> Option<&Quote> {
        let symbol = symbol.trim();
        self.quotes
            .quotes
            .iter()
            .find(|q| q.symbol.eq_ignore_ascii_case(symbol))
    }

    pub fn position(&self, symbol: &str) -> Option<&Position> {
        let symbol = symbol.trim();
        self.positions
            .positions
            .iter()
            .find(|p| p.symbol.eq_ignore_ascii_case(symbol))
    }
}

fn unique_symbols<'a>(
    section: &'static str,
    symbols: impl Iterator<Item = &'a String>,
) -> Result<(), MasterError> {
    let mut seen = BTreeSet::new();
    for s in symbols {
        if !seen.insert(s.to_ascii_uppercase()) {
            return Err(MasterError::DuplicateSymbol {
                section,
                symbol: s.clone(),
            });
        }
    }
    Ok(())
}

/// What identifies a version of the file without reading it. The size is
/// there for file systems with coarse mtimes, where two quick writes may
/// share a timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: SystemTime,
    len: u64,
}

/// The master file and its last good parse. Shared by every brokerage tool.
pub struct MasterFile {
    path: PathBuf,
    /// A std lock: held only to clone or swap an `Arc`, never across an
    /// await, and `load` runs on a blocking thread anyway. A failed parse
    /// leaves the previous entry in place, but it is not served: its stamp
    /// no longer matches, so every call reports the broken file until it is
    /// fixed.
    cached: RwLock<Option<(Stamp, Arc<Master>)>>,
}

impl MasterFile {
    pub fn new(path: PathBuf) -> Self {
        MasterFile {
            path,
            cached: RwLock::new(None),
        }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The current contents: stats the file on every call and parses it
    /// again only when its mtime or size changed. Blocking; call it from a
    /// blocking thread.
    pub fn load(&self) -> Result<Arc<Master>, MasterError> {
        let meta = std::fs::metadata(&self.path).map_err(io_error)?;
        let stamp = Stamp {
            modified: meta.modified().map_err(io_error)?,
            len: meta.len(),
        };
        if let Some((cached_stamp, master)) = self
            .cached
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            && *cached_stamp == stamp
        {
            return Ok(master.clone());
        }
        // Stamped before reading: a write racing this read changes the stamp
        // again, so the next call re-reads.
        let text = std::fs::read_to_string(&self.path).map_err(io_error)?;
        let master = Arc::new(Master::parse(&text)?);
        *self.cached.write().unwrap_or_else(PoisonError::into_inner) =
            Some((stamp, master.clone()));
        Ok(master)
    }
}

fn io_error(source: std::io::Error) -> MasterError {
    if source.kind() == std::io::ErrorKind::NotFound {
        MasterError::Missing
    } else {
        MasterError::Read { source }
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::time::Duration;

    use super::*;

    const SAMPLE: &str = include_str!("../../../agents/data/brokerage.json");

    fn write(path: &std::path::Path, text: &str, modified: SystemTime) {
        std::fs::write(path, text).unwrap();
        File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(modified)
            .unwrap();
    }

    #[test]
    fn shipped_sample_parses_and_passes_its_checks() {
        let master = Master::parse(SAMPLE).unwrap();
        assert_eq!(master.positions.positions.len(), 6);
        assert!(master.quotes.quotes.len() > master.positions.positions.len());
        assert!(master.activity.entries.len() >= 15);
    }

    #[test]
    fn an_unchanged_file_is_parsed_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        write(&path, SAMPLE, SystemTime::now());
        let file = MasterFile::new(path);
        let first = file.load().unwrap();
        let second = file.load().unwrap();
        assert!(Arc::ptr_eq(&first, &second));
    }

    #[test]
    fn a_rewrite_of_the_same_size_is_seen_through_its_mtime() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let t0 = SystemTime::now() - Duration::from_secs(60);
        write(&path, SAMPLE, t0);
        let file = MasterFile::new(path.clone());
        assert_eq!(file.load().unwrap().quote("AAPL").unwrap().price, 193.12);

        let edited = SAMPLE.replacen("193.12", "199.99", 1);
        assert_eq!(edited.len(), SAMPLE.len());
        write(&path, &edited, t0 + Duration::from_secs(5));
        assert_eq!(file.load().unwrap().quote("AAPL").unwrap().price, 199.99);
    }

    #[test]
    fn a_missing_file_is_reported_as_missing() {
        let dir = tempfile::tempdir().unwrap();
        let file = MasterFile::new(dir.path().join(FILE_NAME));
        let err = file.load().unwrap_err();
        assert!(matches!(err, MasterError::Missing), "{err:?}");
        assert_eq!(err.to_string(), "brokerage.json is missing");
    }

    #[test]
    fn a_corrupt_file_is_an_error_until_fixed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let t0 = SystemTime::now() - Duration::from_secs(60);
        write(&path, SAMPLE, t0);
        let file = MasterFile::new(path.clone());
        file.load().unwrap();

        write(&path, "{\"as_of\": ", t0 + Duration::from_secs(1));
        let err = file.load().unwrap_err();
        assert!(matches!(err, MasterError::Invalid { .. }), "{err:?}");
        assert!(err.to_string().contains("line 1"), "{err}");
        // Not served from the cache on the next call either.
        assert!(file.load().is_err());

        write(&path, SAMPLE, t0 + Duration::from_secs(2));
        assert!(file.load().is_ok());
    }

    #[test]
    fn an_unknown_field_is_reported_with_its_place() {
        let text = SAMPLE.replacen("\"average_cost\"", "\"avg_cost\"", 1);
        let err = Master::parse(&text).unwrap_err().to_string();
        assert!(err.contains("avg_cost") && err.contains("line"), "{err}");
    }

    #[test]
    fn an_unknown_asset_class_in_the_file_names_the_valid_ones() {
        let text = SAMPLE.replacen(
            "\"asset_class\": \"equity\"",
            "\"asset_class\": \"stocks\"",
            1,
        );
        let err = Master::parse(&text).unwrap_err().to_string();
        assert!(
            err.contains("'stocks'") && err.contains("equity, etf, mutual_fund"),
            "{err}"
        );
    }

    #[test]
    fn a_position_without_a_quote_is_rejected() {
        let mut value: serde_json::Value = serde_json::from_str(SAMPLE).unwrap();
        let quotes = value["quotes"]["quotes"].as_array_mut().unwrap();
        quotes.retain(|q| q["symbol"] != "BND");
        let err = Master::parse(&value.to_string()).unwrap_err();
        assert!(matches!(&err, MasterError::NoQuote { symbol } if symbol == "BND"));
    }

    #[test]
    fn a_symbol_listed_twice_is_rejected_whatever_its_case() {
        let mut value: serde_json::Value = serde_json::from_str(SAMPLE).unwrap();
        let positions = value["positions"]["positions"].as_array_mut().unwrap();
        let mut twin = positions[0].clone();
        twin["symbol"] = "aapl".into();
        positions.push(twin);
        let err = Master::parse(&value.to_string()).unwrap_err();
        assert!(matches!(
            err,
            MasterError::DuplicateSymbol {
                section: "positions",
                ..
            }
        ));
    }

    #[test]
    fn every_timeframe_must_be_present() {
        let mut value: serde_json::Value = serde_json::from_str(SAMPLE).unwrap();
        value["performance"]["timeframes"]
            .as_object_mut()
            .unwrap()
            .remove("3M");
        let err = Master::parse(&value.to_string()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "brokerage.json is not valid: performance has no '3M' timeframe"
        );
    }

    #[test]
    fn named_enums_round_trip_through_their_names() {
        for &t in Timeframe::ALL {
            let json = serde_json::to_value(t).unwrap();
            assert_eq!(json, t.as_str());
            assert_eq!(serde_json::from_value::<Timeframe>(json).unwrap(), t);
        }
        assert_eq!(Timeframe::parse(" ytd "), Some(Timeframe::YearToDate));
        assert_eq!(AssetClass::parse("ETF"), Some(AssetClass::Etf));
        assert_eq!(AssetClass::parse("stocks"), None);
    }
}
