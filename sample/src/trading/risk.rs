//! Risk calculators: `calculate_position_size`, `calculate_risk_reward`.
//!
//! executor ──params──▶ handler ──▶ pure functions here ──▶ result (no data, no state)
//!
//! Decisions:
//! - Parameter names follow the issue (`account_size`, `stop_price`,
//!   `target_price`), not the spec (`capital`, `stop_loss_price`,
//!   `take_profit_price`).
//! - `risk_percent` is a percentage: 2 means 2 % of the account (the spec's
//!   example used the fraction 0.02; the name says percent, and the schema
//!   bounds it to (0, 100]).
//! - The direction follows from the stop: below the entry is a long trade,
//!   above it a short one; entry = stop is refused (no risk to size by).
//!   For risk/reward the target must lie on the profit side of the entry.
//! - Position sizes are whole shares, rounded down so the risk never exceeds
//!   the budget; a size whose value exceeds the account is reported
//!   (`exceeds_account`) with the largest affordable size, not silently cut.
//! - No `source_id`: these are calculations, not data.

use serde_json::{Value, json};

use super::{NO_CACHE, Op, req_f64, round};
use cadre::tools::definition::Plan;
use cadre::tools::{SideEffects, ToolDefinition, ToolError};

fn price_schema(description: &str) -> Value {
    json!({"type": "number", "exclusiveMinimum": 0, "maximum": 1.0e9, "description": description})
}

pub(super) fn definitions() -> Vec<(ToolDefinition, Op)> {
    vec![
        (
            ToolDefinition::new(
                "calculate_position_size",
                "Number of shares to buy or sell so that hitting the stop loses \
                 risk_percent of the account.",
                json!({
                    "type": "object",
                    "properties": {
                        "account_size": {
                            "type": "number", "exclusiveMinimum": 0, "maximum": 1.0e12,
                            "description": "Account value in currency units"
                        },
                        "risk_percent": {
                            "type": "number", "exclusiveMinimum": 0, "maximum": 100,
                            "description": "Percent of the account risked, e.g. 2 for 2%"
                        },
                        "entry_price": price_schema("Planned entry price"),
                        "stop_price": price_schema("Stop-loss price")
                    },
                    "required": ["account_size", "risk_percent", "entry_price", "stop_price"],
                    "additionalProperties": false
                }),
            )
            .with_side_effects(SideEffects::None)
            .with_category("calculate")
            .with_tags(&["position size", "risk", "calculate", "stop loss"])
            .with_plan(Plan::Free)
            .per_minute(100)
            .with_cache_ttl(NO_CACHE),
            Op::CalculatePositionSize,
        ),
        (
            ToolDefinition::new(
                "calculate_risk_reward",
                "Risk/reward ratio of a trade from its entry, stop and target prices, \
                 with the win rate needed to break even.",
                json!({
                    "type": "object",
                    "properties": {
                        "entry_price": price_schema("Planned entry price"),
                        "stop_price": price_schema("Stop-loss price"),
                        "target_price": price_schema("Take-profit price")
                    },
                    "required": ["entry_price", "stop_price", "target_price"],
                    "additionalProperties": false
                }),
            )
            .with_side_effects(SideEffects::None)
            .with_category("calculate")
            .with_tags(&["risk reward", "ratio", "calculate", "target"])
            .with_plan(Plan::Free)
            .per_minute(100)
            .with_cache_ttl(NO_CACHE),
            Op::CalculateRiskReward,
        ),
    ]
}

/// Why a calculation has no answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RiskError {
    #[error("stop_price must differ from entry_price: there is no risk to size by")]
    StopAtEntry,
    #[error("{name} must be a positive number, got {value}")]
    NotPositive { name: &'static str, value: f64 },
    #[error("risk_percent must be in (0, 100], got {0}")]
    RiskPercent(f64),
    #[error(
        "for a {direction} trade (stop {stop_side} the entry) the target must be {target_side} the entry"
    )]
    TargetOnLossSide {
        direction: &'static str,
        stop_side: &'static str,
        target_side: &'static str,
    },
}

impl From<RiskError> for ToolError {
    fn from(e: RiskError) -> Self {
        ToolError::invalid(e.to_string())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Long,
    Short,
}

impl Direction {
    fn of(entry: f64, stop: f64) -> Result<Direction, RiskError> {
        if stop < entry {
            Ok(Direction::Long)
        } else if stop > entry {
            Ok(Direction::Short)
        } else {
            Err(RiskError::StopAtEntry)
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Direction::Long => "long",
            Direction::Short => "short",
        }
    }
}

fn positive(name: &'static str, value: f64) -> Result<f64, RiskError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(RiskError::NotPositive { name, value })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PositionSize {
    pub direction: Direction,
    pub risk_budget: f64,
    pub risk_per_share: f64,
    pub shares: u64,
    pub position_value: f64,
    pub actual_risk: f64,
    pub max_affordable_shares: u64,
}

pub fn position_size(
    account: f64,
    risk_percent: f64,
    entry: f64,
    stop: f64,
) -> Result<PositionSize, RiskError> {
    let account = positive("account_size", account)?;
    let entry = positive("entry_price", entry)?;
    let stop = positive("stop_price", stop)?;
    if !(risk_percent.is_finite() && risk_percent > 0.0 && risk_percent <= 100.0) {
        return Err(RiskError::RiskPercent(risk_percent));
    }
    let direction = Direction::of(entry, stop)?;
    let risk_budget = account * risk_percent / 100.0;
    let risk_per_share = (entry - stop).abs();
    // The epsilon keeps an exact quotient (e.g. 1000/5) from flooring one short.
    let shares = (risk_budget / risk_per_share + 1e-9).floor() as u64;
    Ok(PositionSize {
        direction,
        risk_budget,
        risk_per_share,
        shares,
        position_value: shares as f64 * entry,
        actual_risk: shares as f64 * risk_per_share,
        max_affordable_shares: (account / entry + 1e-9).floor() as u64,
    })
}

#[derive(Debug, Clone, PartialEq)]
pub struct RiskReward {
    pub direction: Direction,
    pub risk: f64,
    pub reward: f64,
    pub ratio: f64,
    pub breakeven_win_rate: f64,
}

pub fn risk_reward(entry: f64, stop: f64, target: f64) -> Result<RiskReward, RiskError> {
    let entry = positive("entry_price", entry)?;
    let stop = positive("stop_price", stop)?;
    let target = positive("target_price", target)?;
    let direction = Direction::of(entry, stop)?;
    let profitable = match direction {
        Direction::Long => target > entry,
        Direction::Short => target < entry,
    };
    if !profitable {
        return Err(match direction {
            Direction::Long => RiskError::TargetOnLossSide {
                direction: "long",
                stop_side: "below",
                target_side: "above",
            },
            Direction::Short => RiskError::TargetOnLossSide {
                direction: "short",
                stop_side: "above",
                target_side: "below",
            },
        });
    }
    let risk = (entry - stop).abs();
    let reward = (target - entry).abs();
    Ok(RiskReward {
        direction,
        risk,
        reward,
        ratio: reward / risk,
        breakeven_win_rate: risk / (risk + reward),
    })
}

pub(super) fn calculate_position_size(p: &Value) -> Result<Value, ToolError> {
    let account = req_f64(p, "account_size")?;
    let risk_percent = req_f64(p, "risk_percent")?;
    let entry = req_f64(p, "entry_price")?;
    let stop = req_f64(p, "stop_price")?;
    let s = position_size(account, risk_percent, entry, stop)?;
    Ok(json!({
        "direction": s.direction.as_str(),
        "shares": s.shares,
        "risk_budget": round(s.risk_budget, 2),
        "risk_per_share": round(s.risk_per_share, 4),
        "actual_risk": round(s.actual_risk, 2),
        "position_value": round(s.position_value, 2),
        "position_percent_of_account": round(s.position_value / account * 100.0, 2),
        "exceeds_account": s.shares > s.max_affordable_shares,
        "max_affordable_shares": s.max_affordable_shares,
    }))
}

pub(super) fn calculate_risk_reward(p: &Value) -> Result<Value, ToolError> {
    let entry = req_f64(p, "entry_price")?;
    let stop = req_f64(p, "stop_price")?;
    let target = req_f64(p, "target_price")?;
    let r = risk_reward(entry, stop, target)?;
    Ok(json!({
        "direction": r.direction.as_str(),
        "risk_per_share": round(r.risk, 4),
        "reward_per_share": round(r.reward, 4),
        "risk_percent": round(r.risk / entry * 100.0, 2),
        "reward_percent": round(r.reward / entry * 100.0, 2),
        "ratio": round(r.ratio, 2),
        "ratio_text": format!("1:{:.2}", r.ratio),
        "breakeven_win_rate": round(r.breakeven_win_rate, 4),
    }))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{call, fixture};
    use super::*;

    #[test]
    fn position_size_by_hand() {
        // 50 000 account, 2 % → 1 000 at risk; long 100 → 95 risks 5/share → 200 shares,
        // worth 20 000, risking exactly 1 000.
        let s = position_size(50_000.0, 2.0, 100.0, 95.0).unwrap();
        assert_eq!(s.direction, Direction::Long);
        assert_eq!(s.shares, 200);
        assert_eq!(s.position_value, 20_000.0);
        assert_eq!(s.actual_risk, 1_000.0);
        // Short 50 → 53: 3/share; 10 000 · 1 % = 100 → 33.33 → 33 shares (risk 99).
        let s = position_size(10_000.0, 1.0, 50.0, 53.0).unwrap();
        assert_eq!((s.direction, s.shares), (Direction::Short, 33));
        assert!((s.actual_risk - 99.0).abs() < 1e-9);
        // A tight stop can ask for more than the account buys: 10 000 · 2 % = 200,
        // 0.1/share → 2 000 shares of 100 = 200 000 > 10 000 → 100 affordable.
        let s = position_size(10_000.0, 2.0, 100.0, 99.9).unwrap();
        assert_eq!((s.shares, s.max_affordable_shares), (2000, 100));
    }

    #[test]
    fn risk_reward_by_hand() {
        // Long 100, stop 95 (risk 5), target 115 (reward 15): 1:3, break-even 5/20 = 25 %.
        let r = risk_reward(100.0, 95.0, 115.0).unwrap();
        assert_eq!((r.risk, r.reward, r.ratio), (5.0, 15.0, 3.0));
        assert_eq!(r.breakeven_win_rate, 0.25);
        // Short 50, stop 52 (risk 2), target 45 (reward 5): 1:2.5.
        let r = risk_reward(50.0, 52.0, 45.0).unwrap();
        assert_eq!((r.direction, r.ratio), (Direction::Short, 2.5));
    }

    #[test]
    fn impossible_trades_are_errors() {
        assert_eq!(
            position_size(1000.0, 1.0, 10.0, 10.0),
            Err(RiskError::StopAtEntry)
        );
        assert_eq!(
            position_size(1000.0, 0.0, 10.0, 9.0),
            Err(RiskError::RiskPercent(0.0))
        );
        assert!(matches!(
            position_size(-1.0, 1.0, 10.0, 9.0),
            Err(RiskError::NotPositive {
                name: "account_size",
                ..
            })
        ));
        let e = risk_reward(100.0, 95.0, 90.0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "for a long trade (stop below the entry) the target must be above the entry"
        );
    }

    #[tokio::test]
    async fn calculators_through_the_tools() {
        let fx = fixture().await;
        let out = call(
            &fx,
            "calculate_position_size",
            json!({"account_size": 50000, "risk_percent": 2, "entry_price": 100, "stop_price": 95}),
            None,
        )
        .await
        .unwrap();
        assert_eq!(out["shares"], 200);
        assert_eq!(out["exceeds_account"], false);
        let out = call(
            &fx,
            "calculate_risk_reward",
            json!({"entry_price": 100, "stop_price": 95, "target_price": 115}),
            None,
        )
        .await
        .unwrap();
        assert_eq!(out["ratio_text"], "1:3.00");
        // The schema refuses a zero risk percent before the handler runs.
        let err = call(
            &fx,
            "calculate_position_size",
            json!({"account_size": 50000, "risk_percent": 0, "entry_price": 100, "stop_price": 95}),
            None,
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("risk_percent"), "{err}");
        let err = call(
            &fx,
            "calculate_risk_reward",
            json!({"entry_price": 100, "stop_price": 100, "target_price": 115}),
            None,
        )
        .await
        .unwrap_err();
        assert!(matches!(err, ToolError::InvalidInput { .. }));
    }
}
