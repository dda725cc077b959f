//! Brokerage data tools: a simulated account's positions, quotes, activity,
//! transfers, performance and facts, for grounding a brokerage agent.
//!
//! ```text
//! executor ──validated params──▶ Brokerage handler ──spawn_blocking──▶ MasterFile::load
//!                                      │ query::<tool>(master, typed params)
//!                                      ▼
//!            {"source_id": "tool:<domain>:v1", "data": {..}, "as_of": ".."}
//! ```
//!
//! A builtin family like the others: the executor validates, limits and
//! records the calls; these handlers only read. The brokerage agent's answers
//! cite the `source_id`s (the executor copies `source_id` and `as_of` into
//! the result metadata), so they are part of the interface:
//!
//! | tool | source_id | category |
//! |---|---|---|
//! | `get_account_summary {}` | `tool:account_summary:v1` | portfolio |
//! | `get_positions {symbol}` | `tool:positions:v1` | portfolio |
//! | `get_positions_list {asset_class?}` | `tool:positions:v1` | portfolio |
//! | `get_activity {limit?, type?}` | `tool:activity:v1` | portfolio |
//! | `get_transfers {limit?}` | `tool:transfers:v1` | portfolio |
//! | `get_performance {timeframe}` | `tool:performance:v1` | portfolio |
//! | `get_quotes {symbol}` | `tool:quotes:v1` | market |
//! | `get_facts {topic}` | `tool:facts:v1` | education |
//!
//! Decisions, against the data layer these tools come from:
//! - One master file, `<data_dir>/brokerage.json` (`master.rs`), stat'ed on
//!   every call and re-parsed when its mtime or size changes, so it can be
//!   edited while cadre runs. Missing or invalid, it is a `Failed` call that
//!   says what is wrong (line and column for bad JSON); never a panic, never
//!   stale data.
//! - `get_positions_list` cites `tool:positions:v1`, not the original's
//!   `tool:positions_list:v1`: both tools return positions, and an answer
//!   about holdings cites one id whichever tool it used.
//! - `get_positions` and `get_quotes` return the one symbol asked for (the
//!   original returned everything and left filtering to a later stage), and
//!   an unknown symbol is `InvalidInput` listing the known ones, so the model
//!   can correct itself instead of reading an empty success as "zero shares".
//! - Unknown `asset_class`, `type`, `timeframe` or `topic` are `InvalidInput`
//!   listing the valid values; a known asset class with no holdings is an
//!   empty list, a true answer.
//! - Topics match by key or alias, not by substring as in the original (where
//!   anything unknown fell back to "rebalancing").
//! - Derived figures (values, P/L, weights, totals, changes) are computed
//!   from quantities and prices in `query.rs` rather than stored, so the file
//!   cannot contradict itself.
//! - No `account` parameter: the data holds one account, and a parameter
//!   that changes nothing would only mislead the model.
//! - No executor cache TTL: the data layer has none beyond its mtime check,
//!   and a cached answer would hide an edit of the file.
//! - Whole numbers are written as JSON integers (`"quantity": 42`, not
//!   `42.0`), so the model repeats them as people write them.

mod master;
mod query;

use std::sync::Arc;

use serde_json::{Value, json};

use self::master::{ActivityKind, AssetClass, FILE_NAME, MasterFile, Timeframe};
use self::query::Answer;
use cadre::tools::builtin::{BuiltinContext, ToolEntry};
use cadre::tools::{ExecutionContext, SideEffects, ToolDefinition, ToolError, ToolHandler};

/// Default and largest `limit` of `get_activity` and `get_transfers`.
const DEFAULT_LIMIT: u64 = 10;
const MAX_LIMIT: u64 = 50;
const MAX_SYMBOL_LEN: usize = 20;
const MAX_TOPIC_LEN: usize = 100;

/// Every brokerage tool, sharing one `MasterFile` (one cache) over
/// `<ctx.data_dir>/brokerage.json`.
pub fn tools(ctx: &BuiltinContext) -> Vec<ToolEntry> {
    let master = Arc::new(MasterFile::new(ctx.data_dir.join(FILE_NAME)));
    Op::ALL
        .iter()
        .map(|&op| {
            let handler: Arc<dyn ToolHandler> = Arc::new(Brokerage {
                op,
                master: master.clone(),
            });
            (op.definition(), handler)
        })
        .collect()
}

/// Which tool a [`Brokerage`] handler is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    AccountSummary,
    Positions,
    PositionsList,
    Activity,
    Transfers,
    Performance,
    Quotes,
    Facts,
}

impl Op {
    const ALL: &[Op] = &[
        Op::AccountSummary,
        Op::Positions,
        Op::PositionsList,
        Op::Activity,
        Op::Transfers,
        Op::Performance,
        Op::Quotes,
        Op::Facts,
    ];

    fn definition(self) -> ToolDefinition {
        let (name, description, parameters, category, tags): (_, _, _, _, &[&str]) = match self {
            Op::AccountSummary => (
                "get_account_summary",
                "The brokerage account's totals: total value, invested value, cash \
                 (settled and unsettled), today's change, unrealized P/L and allocation \
                 by asset class.",
                object(json!({}), &[]),
                "portfolio",
                &[
                    "account",
                    "balance",
                    "value",
                    "cash",
                    "buying power",
                    "allocation",
                ],
            ),
            Op::Positions => (
                "get_positions",
                "One holding of the account, by symbol: quantity, average cost, price, \
                 market value, unrealized and daily P/L, portfolio weight. An unknown \
                 symbol is an error that lists the held ones.",
                object(json!({"symbol": symbol_schema()}), &["symbol"]),
                "portfolio",
                &["position", "holding", "shares", "own", "profit", "loss"],
            ),
            Op::PositionsList => (
                "get_positions_list",
                "Every holding of the account, largest first, optionally of one asset \
                 class, each valued as in get_positions.",
                object(
                    json!({"asset_class": {
                        "type": "string",
                        "enum": names(AssetClass::ALL.iter().map(|c| c.as_str())),
                        "description": "Only positions of this asset class"
                    }}),
                    &[],
                ),
                "portfolio",
                &[
                    "positions",
                    "holdings",
                    "portfolio",
                    "best",
                    "worst",
                    "largest",
                ],
            ),
            Op::Activity => (
                "get_activity",
                "Recent account activity, newest first: trades, dividends, interest and \
                 fees, with amounts (negative when cash left the account).",
                object(
                    json!({
                        "limit": limit_schema("entries"),
                        "type": {
                            "type": "string",
                            "enum": names(ActivityKind::ALL.iter().map(|k| k.as_str())),
                            "description": "Only activity of this type"
                        }
                    }),
                    &[],
                ),
                "portfolio",
                &[
                    "activity",
                    "trades",
                    "orders",
                    "history",
                    "dividends",
                    "fees",
                ],
            ),
            Op::Transfers => (
                "get_transfers",
                "Deposits and withdrawals between the account and outside accounts, \
                 newest first, with method and status.",
                object(json!({"limit": limit_schema("transfers")}), &[]),
                "portfolio",
                &["transfers", "deposit", "withdrawal", "ach", "wire"],
            ),
            Op::Performance => (
                "get_performance",
                "The account's performance over a timeframe: start and end value, \
                 change, contributions, withdrawals, investment gain, return percent and \
                 the value series.",
                object(
                    json!({"timeframe": {
                        "type": "string",
                        "enum": names(Timeframe::ALL.iter().map(|t| t.as_str())),
                        "description": "1W, 1M, 3M, YTD (year to date), 1Y, or ALL (since the account opened)"
                    }}),
                    &["timeframe"],
                ),
                "portfolio",
                &["performance", "return", "gain", "growth", "ytd"],
            ),
            Op::Quotes => (
                "get_quotes",
                "The market quote of one symbol: price, previous close, change and \
                 change percent, and whether the account holds it. An unknown symbol is \
                 an error that lists the quoted ones.",
                object(json!({"symbol": symbol_schema()}), &["symbol"]),
                "market",
                &["quote", "price", "stock", "market", "ticker"],
            ),
            Op::Facts => (
                "get_facts",
                "A short explanation of a brokerage topic (fees, margin, settlement, \
                 roth_ira, etf_basics, dividends, ...). An unknown topic is an error that \
                 lists the known ones.",
                object(
                    json!({"topic": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": MAX_TOPIC_LEN,
                        "description": "The topic, e.g. 'fees' or 'roth ira'"
                    }}),
                    &["topic"],
                ),
                "education",
                &["explain", "what is", "how does", "fees", "rules"],
            ),
        };
        ToolDefinition::new(
            name,
            &format!(
                "{description} Returns {{source_id: \"{}\", data, as_of}}; cite the source_id.",
                self.source_id()
            ),
            parameters,
        )
        .with_category(category)
        .with_tags(tags)
        // Every brokerage tool reads the account; none changes it.
        .with_side_effects(SideEffects::None)
        .with_cache_ttl(cache_ttl(category))
    }

    fn source_id(self) -> &'static str {
        match self {
            Op::AccountSummary => "tool:account_summary:v1",
            Op::Positions | Op::PositionsList => "tool:positions:v1",
            Op::Activity => "tool:activity:v1",
            Op::Transfers => "tool:transfers:v1",
            Op::Performance => "tool:performance:v1",
            Op::Quotes => "tool:quotes:v1",
            Op::Facts => "tool:facts:v1",
        }
    }

    /// Parameters are read leniently (defaults when absent) since the
    /// executor has validated them; what the schema cannot say (a value of
    /// an enum in another case, a direct call) is checked here.
    fn answer(self, m: &master::Master, params: &Value) -> Result<Answer, ToolError> {
        match self {
            Op::AccountSummary => query::account_summary(m),
            Op::Positions => query::position(m, required_str(params, "symbol")?),
            Op::PositionsList => query::positions_list(
                m,
                optional_name(params, "asset_class", AssetClass::parse, AssetClass::names)?,
            ),
            Op::Activity => query::activity(
                m,
                limit(params),
                optional_name(params, "type", ActivityKind::parse, ActivityKind::names)?,
            ),
            Op::Transfers => query::transfers(m, limit(params)),
            Op::Performance => {
                let timeframe =
                    optional_name(params, "timeframe", Timeframe::parse, Timeframe::names)?
                        .ok_or_else(|| ToolError::invalid("timeframe is required"))?;
                query::performance(m, timeframe)
            }
            Op::Quotes => query::quote(m, required_str(params, "symbol")?),
            Op::Facts => query::fact(m, required_str(params, "topic")?),
        }
    }
}

/// The handler of every brokerage tool; `op` says which.
struct Brokerage {
    op: Op,
    master: Arc<MasterFile>,
}

#[async_trait::async_trait]
impl ToolHandler for Brokerage {
    async fn call(&self, params: Value, _ctx: &ExecutionContext) -> Result<Value, ToolError> {
        let file = self.master.clone();
        let loaded = tokio::task::spawn_blocking(move || file.load())
            .await
            .map_err(|e| ToolError::failed(format!("loading {FILE_NAME} did not finish: {e}")))?;
        let master = loaded.map_err(|e| {
            tracing::warn!(path = %self.master.path().display(), error = %e, "brokerage data unavailable");
            ToolError::failed(format!("brokerage data unavailable: {e}"))
        })?;
        let answer = self.op.answer(&master, &params)?;
        debug_assert_eq!(answer.source_id(), self.op.source_id());
        Ok(json!({
            "source_id": answer.source_id(),
            "data": whole_numbers_as_integers(answer.data),
            "as_of": answer.as_of,
        }))
    }
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false
    })
}

fn symbol_schema() -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_SYMBOL_LEN,
        "description": "Ticker symbol, any case, e.g. 'AAPL' or 'btc'",
        // What a symbol looks like: the offline model takes the message's
        // word of this shape (and a model sees them as examples).
        "examples": ["AAPL", "BTC"]
    })
}

fn limit_schema(what: &str) -> Value {
    json!({
        "type": "integer",
        "minimum": 1,
        "maximum": MAX_LIMIT,
        "default": DEFAULT_LIMIT,
        "description": format!("How many {what} to return, newest first")
    })
}

fn names<'a>(names: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    names.collect()
}

fn required_str<'a>(params: &'a Value, field: &str) -> Result<&'a str, ToolError> {
    params[field]
        .as_str()
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| ToolError::invalid(format!("{field} is required")))
}

fn optional_name<T>(
    params: &Value,
    field: &str,
    parse: fn(&str) -> Option<T>,
    valid: fn() -> String,
) -> Result<Option<T>, ToolError> {
    match params[field].as_str() {
        None => Ok(None),
        Some(s) => parse(s).map(Some).ok_or_else(|| {
            ToolError::invalid(format!("unknown {field} '{s}'; valid: {}", valid()))
        }),
    }
}

fn limit(params: &Value) -> usize {
    params["limit"]
        .as_u64()
        .unwrap_or(DEFAULT_LIMIT)
        .clamp(1, MAX_LIMIT) as usize
}

/// `42.0` → `42`; other numbers as they are.
fn whole_numbers_as_integers(value: Value) -> Value {
    match value {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => json!(f as i64),
            _ => Value::Number(n),
        },
        Value::Array(items) => items.into_iter().map(whole_numbers_as_integers).collect(),
        Value::Object(map) => map
            .into_iter()
            .map(|(k, v)| (k, whole_numbers_as_integers(v)))
            .collect(),
        other => other,
    }
}

/// Seconds a brokerage answer is cached, declared by each tool (the
/// runtime's default for a read-only tool is 30 s): quotes move, so 5 s;
/// the account changes with every trade the user makes elsewhere, 10 s;
/// facts (fees, rules) 30 s.
fn cache_ttl(category: &str) -> u64 {
    match category {
        "market" => 5,
        "portfolio" => 10,
        _ => 30,
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::path::{Path, PathBuf};
    use std::time::{Duration, SystemTime};

    use super::*;
    use cadre::store::Store;
    use cadre::tools::CallerType;
    use cadre::tools::definition::Plan;
    use cadre::tools::validate::ParamValidator;

    const SAMPLE: &str = include_str!("../../../agents/data/brokerage.json");

    struct Fixture {
        _dir: tempfile::TempDir,
        data_dir: PathBuf,
        tools: Vec<ToolEntry>,
    }

    impl Fixture {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let data_dir = dir.path().join("data");
            std::fs::create_dir_all(&data_dir).unwrap();
            write(&data_dir.join(FILE_NAME), SAMPLE, SystemTime::now());
            let ctx = BuiltinContext {
                store: Store::open(&dir.path().join("store")).unwrap(),
                data_dir: data_dir.clone(),
                http_allowlist: Vec::new(),
            };
            let tools = tools(&ctx);
            Fixture {
                _dir: dir,
                data_dir,
                tools,
            }
        }

        fn file(&self) -> PathBuf {
            self.data_dir.join(FILE_NAME)
        }

        fn tool(&self, name: &str) -> &ToolEntry {
            self.tools
                .iter()
                .find(|(d, _)| d.name == name)
                .unwrap_or_else(|| panic!("no tool {name}"))
        }

        /// As the executor calls: parameters validated (defaults filled) first,
        /// not strict, so the schemas themselves must refuse extra fields.
        async fn call(&self, name: &str, params: Value) -> Result<Value, ToolError> {
            let (def, _) = self.tool(name);
            let params = ParamValidator::new(&def.parameters, false)
                .unwrap()
                .validate(params)
                .unwrap_or_else(|e| panic!("{name}: invalid params: {e:?}"));
            self.call_unvalidated(name, params).await
        }

        async fn call_unvalidated(&self, name: &str, params: Value) -> Result<Value, ToolError> {
            let ctx = ExecutionContext::new(CallerType::Direct, "test");
            self.tool(name).1.call(params, &ctx).await
        }
    }

    fn write(path: &Path, text: &str, modified: SystemTime) {
        std::fs::write(path, text).unwrap();
        File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(modified)
            .unwrap();
    }

    #[test]
    fn the_family_is_eight_free_tools_with_closed_schemas() {
        let fx = Fixture::new();
        let categories: Vec<(&str, &str)> = fx
            .tools
            .iter()
            .map(|(d, _)| (d.name.as_str(), d.category.as_str()))
            .collect();
        assert_eq!(
            categories,
            [
                ("get_account_summary", "portfolio"),
                ("get_positions", "portfolio"),
                ("get_positions_list", "portfolio"),
                ("get_activity", "portfolio"),
                ("get_transfers", "portfolio"),
                ("get_performance", "portfolio"),
                ("get_quotes", "market"),
                ("get_facts", "education"),
            ]
        );
        for (def, _) in &fx.tools {
            assert_eq!(def.required_plan, Plan::Free, "{}", def.name);
            // Each declares its cache: the runtime no longer reads a
            // category for one.
            let ttl = match def.category.as_str() {
                "market" => 5,
                "portfolio" => 10,
                _ => 30,
            };
            assert_eq!(def.cache.map(|c| c.ttl_seconds), Some(ttl), "{}", def.name);
            assert_eq!(
                def.parameters["additionalProperties"], false,
                "{}",
                def.name
            );
            ParamValidator::new(&def.parameters, false).unwrap();
        }
    }

    #[tokio::test]
    async fn each_tool_answers_with_its_source_id_data_and_as_of() {
        let fx = Fixture::new();
        let cases = [
            (
                "get_account_summary",
                json!({}),
                "tool:account_summary:v1",
                "total_value",
            ),
            (
                "get_positions",
                json!({"symbol": "VOO"}),
                "tool:positions:v1",
                "position",
            ),
            (
                "get_positions_list",
                json!({}),
                "tool:positions:v1",
                "positions",
            ),
            ("get_activity", json!({}), "tool:activity:v1", "entries"),
            ("get_transfers", json!({}), "tool:transfers:v1", "transfers"),
            (
                "get_performance",
                json!({"timeframe": "YTD"}),
                "tool:performance:v1",
                "return_pct",
            ),
            (
                "get_quotes",
                json!({"symbol": "NVDA"}),
                "tool:quotes:v1",
                "quote",
            ),
            (
                "get_facts",
                json!({"topic": "margin"}),
                "tool:facts:v1",
                "snippet",
            ),
        ];
        for (name, params, source_id, field) in cases {
            let out = fx.call(name, params).await.unwrap();
            assert_eq!(out["source_id"], source_id, "{name}");
            assert!(
                out["as_of"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("2026-01-15")),
                "{name}: {out}"
            );
            assert!(
                !out["data"][field].is_null(),
                "{name}: no data.{field} in {out}"
            );
            assert_eq!(out.as_object().unwrap().len(), 3, "{name}: {out}");
        }
    }

    #[tokio::test]
    async fn get_positions_returns_only_the_symbol_asked_for_in_any_case() {
        let fx = Fixture::new();
        let out = fx
            .call("get_positions", json!({"symbol": "msft"}))
            .await
            .unwrap();
        let p = &out["data"]["position"];
        assert_eq!(p["symbol"], "MSFT");
        assert_eq!(p["quantity"], json!(12));
        assert!(out["data"].get("positions").is_none());
    }

    #[tokio::test]
    async fn get_positions_of_an_unknown_symbol_is_an_error_listing_the_positions() {
        let fx = Fixture::new();
        let err = fx
            .call("get_positions", json!({"symbol": "XYZ"}))
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::InvalidInput { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "no position in 'XYZ'; positions: AAPL, MSFT, VOO, BND, BTC, SPAXX"
        );
    }

    #[tokio::test]
    async fn get_quotes_returns_only_the_symbol_asked_for_or_an_error() {
        let fx = Fixture::new();
        let out = fx
            .call("get_quotes", json!({"symbol": "btc"}))
            .await
            .unwrap();
        assert_eq!(out["data"]["quote"]["symbol"], "BTC");
        assert_eq!(out["data"]["quote"]["price"], json!(97250));
        let err = fx
            .call("get_quotes", json!({"symbol": "XYZ"}))
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::InvalidInput { .. }), "{err:?}");
        assert!(
            err.to_string()
                .starts_with("no quote for 'XYZ'; quotes: AAPL"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn get_positions_list_filters_by_asset_class() {
        let fx = Fixture::new();
        let out = fx
            .call("get_positions_list", json!({"asset_class": "crypto"}))
            .await
            .unwrap();
        assert_eq!(out["data"]["count"], 1);
        assert_eq!(out["data"]["positions"][0]["symbol"], "BTC");
    }

    #[tokio::test]
    async fn unknown_names_are_errors_listing_the_valid_ones() {
        let fx = Fixture::new();
        // The schema's enums stop these before the executor calls; a direct
        // call reaches the handler, which says the same.
        let cases = [
            (
                "get_positions_list",
                json!({"asset_class": "stocks"}),
                "unknown asset_class 'stocks'; valid: equity, etf, mutual_fund, bond, crypto, cash",
            ),
            (
                "get_performance",
                json!({"timeframe": "2Y"}),
                "unknown timeframe '2Y'; valid: 1W, 1M, 3M, YTD, 1Y, ALL",
            ),
            (
                "get_activity",
                json!({"type": "split"}),
                "unknown type 'split'; valid: buy, sell, dividend, interest, fee",
            ),
        ];
        for (name, params, message) in cases {
            let (def, _) = fx.tool(name);
            let field_errors = ParamValidator::new(&def.parameters, false)
                .unwrap()
                .validate(params.clone())
                .unwrap_err();
            assert_eq!(field_errors[0].code, "enum", "{name}");
            let err = fx.call_unvalidated(name, params).await.unwrap_err();
            assert!(matches!(err, ToolError::InvalidInput { .. }), "{err:?}");
            assert_eq!(err.to_string(), message);
        }
        let err = fx
            .call("get_facts", json!({"topic": "options"}))
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("topics: crypto, dividends, etf_basics, fees"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn schemas_refuse_extra_parameters() {
        let fx = Fixture::new();
        let (def, _) = fx.tool("get_account_summary");
        let errors = ParamValidator::new(&def.parameters, false)
            .unwrap()
            .validate(json!({"account": "Brokerage"}))
            .unwrap_err();
        assert_eq!(errors[0].code, "additionalProperties");
    }

    #[tokio::test]
    async fn limits_default_to_ten_and_cap_the_list() {
        let fx = Fixture::new();
        let out = fx.call("get_activity", json!({})).await.unwrap();
        assert_eq!(out["data"]["count"], 10);
        let out = fx
            .call("get_activity", json!({"limit": 2, "type": "buy"}))
            .await
            .unwrap();
        assert_eq!(out["data"]["count"], 2);
        let out = fx.call("get_transfers", json!({"limit": 1})).await.unwrap();
        assert_eq!(out["data"]["transfers"].as_array().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn an_edited_file_is_read_again_when_its_mtime_changes() {
        let fx = Fixture::new();
        let t0 = SystemTime::now() - Duration::from_secs(60);
        write(&fx.file(), SAMPLE, t0);
        let price = |out: Value| out["data"]["quote"]["price"].clone();
        let before = fx
            .call("get_quotes", json!({"symbol": "AAPL"}))
            .await
            .unwrap();
        assert_eq!(price(before), json!(193.12));

        let edited = SAMPLE.replacen("193.12", "201.50", 1);
        write(&fx.file(), &edited, t0 + Duration::from_secs(10));
        let after = fx
            .call("get_quotes", json!({"symbol": "AAPL"}))
            .await
            .unwrap();
        assert_eq!(price(after), json!(201.5));
        // And what is computed from it follows.
        let pos = fx
            .call("get_positions", json!({"symbol": "AAPL"}))
            .await
            .unwrap();
        assert_eq!(pos["data"]["position"]["market_value"], json!(8463));
    }

    #[tokio::test]
    async fn a_corrupt_file_is_a_failed_call_that_says_where() {
        let fx = Fixture::new();
        write(
            &fx.file(),
            "{ not json",
            SystemTime::now() + Duration::from_secs(5),
        );
        let err = fx.call("get_account_summary", json!({})).await.unwrap_err();
        assert!(matches!(err, ToolError::Failed { .. }), "{err:?}");
        let message = err.to_string();
        assert!(
            message.starts_with("brokerage data unavailable: brokerage.json is not valid")
                && message.contains("line 1 column 3"),
            "{message}"
        );
        assert!(
            !message.contains(&*fx.data_dir.to_string_lossy()),
            "{message}"
        );
    }

    #[tokio::test]
    async fn a_missing_file_is_a_failed_call() {
        let fx = Fixture::new();
        std::fs::remove_file(fx.file()).unwrap();
        let err = fx.call("get_transfers", json!({})).await.unwrap_err();
        assert!(matches!(err, ToolError::Failed { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "brokerage data unavailable: brokerage.json is missing"
        );
    }

    #[test]
    fn whole_numbers_become_integers_and_fractions_stay() {
        let v = whole_numbers_as_integers(json!({"a": [42.0, 0.15, -3.0], "b": {"c": 1e20}}));
        assert_eq!(v, json!({"a": [42, 0.15, -3], "b": {"c": 1e20}}));
    }
}
