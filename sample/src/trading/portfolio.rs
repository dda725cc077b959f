//! Portfolio tools: `get_portfolio`, `get_trade_history` (pro), and the
//! account arithmetic the order tools share.
//!
//! handler ──▶ user's orders (store) + starting portfolio (data.rs) ──derive──▶ account
//!
//! Decisions:
//! - Nothing but orders is stored: an account is derived on every call from
//!   the sample's `starting_portfolio` (the same for every user) plus the
//!   user's filled paper orders, applied in fill order. Editing the sample's
//!   starting portfolio therefore changes every account, consistently.
//! - Average-cost accounting: a buy moves the average price, a sell realises
//!   (fill − average) × quantity and leaves the average unchanged.
//! - Positions are valued at the latest sample close; a position whose
//!   symbol has left the data is valued at cost and flagged.
//! - The trade history lists the user's fills only (the starting holdings
//!   have no trades), newest first.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde_json::{Value, json};

use super::data::StartingPortfolio;
use super::order_book::{self, Order, OrderState, OrderType, Side};
use super::{NO_CACHE, Op, Shared, envelope, opt_str, opt_u64, round, symbol_schema};
use cadre::tools::definition::Plan;
use cadre::tools::{SideEffects, ToolDefinition, ToolError};

const MAX_HISTORY: u64 = 100;
/// Quantities closer to zero than this are a closed position.
const DUST: f64 = 1e-9;

pub(super) fn definitions() -> Vec<(ToolDefinition, Op)> {
    vec![
        (
            ToolDefinition::new(
                "get_portfolio",
                "The user's paper portfolio: cash, positions valued at current prices, \
                 realized and unrealized P&L.",
                json!({"type": "object", "properties": {}, "additionalProperties": false}),
            )
            .with_side_effects(SideEffects::None)
            .with_category("portfolio")
            .with_tags(&["portfolio", "positions", "holdings", "balance", "pnl"])
            .with_plan(Plan::Pro)
            .per_minute(30)
            .with_cache_ttl(NO_CACHE),
            Op::GetPortfolio,
        ),
        (
            ToolDefinition::new(
                "get_trade_history",
                "The user's filled paper trades, newest first, with realized P&L of sells.",
                json!({
                    "type": "object",
                    "properties": {
                        "limit": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_HISTORY,
                            "default": 20,
                            "description": "Number of trades (max 100)"
                        },
                        "symbol": symbol_schema()
                    },
                    "additionalProperties": false
                }),
            )
            .with_side_effects(SideEffects::None)
            .with_category("portfolio")
            .with_tags(&["trades", "history", "fills", "pnl"])
            .with_plan(Plan::Pro)
            .per_minute(20)
            .with_cache_ttl(NO_CACHE),
            Op::GetTradeHistory,
        ),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Position {
    pub quantity: f64,
    pub avg_price: f64,
}

/// One filled order as the history shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Fill {
    pub order_id: String,
    pub symbol: String,
    pub side: Side,
    pub order_type: OrderType,
    pub quantity: f64,
    pub price: f64,
    /// Only sells realise P&L.
    pub realized_pnl: Option<f64>,
    pub filled_at: Timestamp,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Account {
    pub cash: f64,
    pub positions: BTreeMap<String, Position>,
    pub realized_pnl: f64,
    /// Oldest first.
    pub fills: Vec<Fill>,
}

impl Account {
    pub fn quantity(&self, symbol: &str) -> f64 {
        self.positions.get(symbol).map_or(0.0, |p| p.quantity)
    }
}

/// The starting portfolio with the filled orders applied in fill order.
pub fn derive(start: &StartingPortfolio, orders: &[Order]) -> Account {
    let mut account = Account {
        cash: start.cash,
        ..Account::default()
    };
    for p in &start.positions {
        let pos = account
            .positions
            .entry(p.symbol.clone())
            .or_insert(Position {
                quantity: 0.0,
                avg_price: 0.0,
            });
        let total = pos.quantity + p.quantity;
        pos.avg_price = (pos.quantity * pos.avg_price + p.quantity * p.avg_price) / total;
        pos.quantity = total;
    }
    let mut filled: Vec<(&Order, f64, Timestamp)> = orders
        .iter()
        .filter_map(|o| match o.state {
            OrderState::Filled {
                fill_price,
                filled_at,
            } => Some((o, fill_price, filled_at)),
            _ => None,
        })
        .collect();
    filled.sort_by(|a, b| (a.2, &a.0.id).cmp(&(b.2, &b.0.id)));
    for (order, price, filled_at) in filled {
        let q = order.quantity;
        let pos = account
            .positions
            .entry(order.symbol.clone())
            .or_insert(Position {
                quantity: 0.0,
                avg_price: price,
            });
        let realized_pnl = match order.side {
            Side::Buy => {
                let total = pos.quantity + q;
                if total > DUST {
                    pos.avg_price = (pos.quantity * pos.avg_price + q * price) / total;
                }
                pos.quantity = total;
                account.cash -= q * price;
                None
            }
            Side::Sell => {
                let pnl = (price - pos.avg_price) * q;
                pos.quantity -= q;
                account.cash += q * price;
                account.realized_pnl += pnl;
                Some(pnl)
            }
        };
        if pos.quantity.abs() < DUST {
            account.positions.remove(&order.symbol);
        }
        account.fills.push(Fill {
            order_id: order.id.clone(),
            symbol: order.symbol.clone(),
            side: order.side,
            order_type: order.order_type,
            quantity: q,
            price,
            realized_pnl,
            filled_at,
        });
    }
    account
}

/// What pending orders hold back: cash for limit buys, shares for sells.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reservations {
    pub cash: f64,
    pub shares: BTreeMap<String, f64>,
}

impl Reservations {
    pub fn of(orders: &[Order]) -> Reservations {
        let mut r = Reservations::default();
        for o in orders.iter().filter(|o| o.state == OrderState::Pending) {
            match o.side {
                Side::Buy => r.cash += o.quantity * o.limit_price.unwrap_or(0.0),
                Side::Sell => *r.shares.entry(o.symbol.clone()).or_default() += o.quantity,
            }
        }
        r
    }

    pub fn shares(&self, symbol: &str) -> f64 {
        self.shares.get(symbol).copied().unwrap_or(0.0)
    }
}

pub(super) async fn get_portfolio(shared: &Shared, user: &str) -> Result<Value, ToolError> {
    let data = shared.data.get().await?;
    let orders = order_book::load_orders(&shared.store, user).await?;
    let account = derive(&data.starting_portfolio, &orders);
    let reserved = Reservations::of(&orders);
    let (mut value, mut unrealized) = (0.0, 0.0);
    let positions: Vec<Value> = account
        .positions
        .iter()
        .map(|(symbol, p)| {
            let cost = p.quantity * p.avg_price;
            match data.price(symbol) {
                Some(last) => {
                    let mv = p.quantity * last;
                    value += mv;
                    unrealized += mv - cost;
                    json!({
                        "symbol": symbol,
                        "quantity": round(p.quantity, 6),
                        "avg_price": round(p.avg_price, 4),
                        "last_price": last,
                        "cost_basis": round(cost, 2),
                        "market_value": round(mv, 2),
                        "unrealized_pnl": round(mv - cost, 2),
                        "unrealized_pnl_percent": round((last / p.avg_price - 1.0) * 100.0, 2),
                    })
                }
                None => {
                    value += cost;
                    json!({
                        "symbol": symbol,
                        "quantity": round(p.quantity, 6),
                        "avg_price": round(p.avg_price, 4),
                        "last_price": null,
                        "cost_basis": round(cost, 2),
                        "market_value": round(cost, 2),
                        "price_unavailable": true,
                    })
                }
            }
        })
        .collect();
    let pending = orders
        .iter()
        .filter(|o| o.state == OrderState::Pending)
        .count();
    Ok(envelope(
        "portfolio",
        json!({
            "currency": data.currency,
            "cash": round(account.cash, 2),
            "available_cash": round(account.cash - reserved.cash, 2),
            "positions": positions,
            "positions_value": round(value, 2),
            "equity": round(account.cash + value, 2),
            "realized_pnl": round(account.realized_pnl, 2),
            "unrealized_pnl": round(unrealized, 2),
            "filled_orders": account.fills.len(),
            "pending_orders": pending,
            "prices_as_of": data.as_of.to_string(),
            "basis": "sample starting portfolio plus your filled paper orders",
        }),
        Timestamp::now(),
    ))
}

pub(super) async fn get_trade_history(
    shared: &Shared,
    p: &Value,
    user: &str,
) -> Result<Value, ToolError> {
    let data = shared.data.get().await?;
    let limit = opt_u64(p, "limit")?.unwrap_or(20);
    if !(1..=MAX_HISTORY).contains(&limit) {
        return Err(ToolError::invalid(format!(
            "limit must be between 1 and {MAX_HISTORY}, got {limit}"
        )));
    }
    let orders = order_book::load_orders(&shared.store, user).await?;
    let account = derive(&data.starting_portfolio, &orders);
    let symbol = opt_str(p, "symbol")?.map(|s| s.trim().to_ascii_uppercase());
    if let Some(s) = &symbol
        && !account.fills.iter().any(|f| &f.symbol == s)
    {
        // Not traded: fine if the symbol exists, a mistake otherwise.
        data.symbol(s)?;
    }
    let trades: Vec<Value> = account
        .fills
        .iter()
        .rev()
        .filter(|f| symbol.as_ref().is_none_or(|s| &f.symbol == s))
        .take(limit as usize)
        .map(|f| {
            json!({
                "order_id": f.order_id,
                "symbol": f.symbol,
                "side": f.side,
                "order_type": f.order_type,
                "quantity": round(f.quantity, 6),
                "price": f.price,
                "value": round(f.quantity * f.price, 2),
                "realized_pnl": f.realized_pnl.map(|x| round(x, 2)),
                "filled_at": f.filled_at.to_string(),
            })
        })
        .collect();
    Ok(envelope(
        "trade_history",
        json!({
            "symbol": symbol,
            "count": trades.len(),
            "total_fills": account.fills.len(),
            "trades": trades,
        }),
        Timestamp::now(),
    ))
}

#[cfg(test)]
mod tests {
    use super::super::data::StartingPosition;
    use super::super::tests::{call, fixture};
    use super::*;

    fn order(id: &str, side: Side, q: f64, price: Option<f64>, secs: i64) -> Order {
        let at = Timestamp::from_second(1_700_000_000 + secs).unwrap();
        Order {
            id: id.into(),
            symbol: "AAA".into(),
            side,
            quantity: q,
            order_type: if price.is_some() {
                OrderType::Market
            } else {
                OrderType::Limit
            },
            limit_price: price.is_none().then_some(1.0),
            created_at: at,
            state: match price {
                Some(fill_price) => OrderState::Filled {
                    fill_price,
                    filled_at: at,
                },
                None => OrderState::Pending,
            },
        }
    }

    #[test]
    fn average_cost_accounting_by_hand() {
        // Start: 1 000 cash, 10 AAA @ 10.
        // buy 10 @ 20: cash 1000−200 = 800, 20 @ (100+200)/20 = 15
        // sell 5 @ 30: cash 800+150 = 950, realised (30−15)·5 = 75, 15 @ 15
        // sell 15 @ 12: cash 950+180 = 1130, realised (12−15)·15 = −45, position closed
        // A pending order changes nothing.
        let start = StartingPortfolio {
            cash: 1000.0,
            positions: vec![StartingPosition {
                symbol: "AAA".into(),
                quantity: 10.0,
                avg_price: 10.0,
            }],
        };
        let orders = [
            // Out of order on purpose: fills apply by fill time.
            order("ord_3", Side::Sell, 15.0, Some(12.0), 3),
            order("ord_1", Side::Buy, 10.0, Some(20.0), 1),
            order("ord_2", Side::Sell, 5.0, Some(30.0), 2),
            order("ord_4", Side::Buy, 99.0, None, 4),
        ];
        // buy @1 then the sell of 15 @ 12 @3: 800 + 180
        let a = derive(&start, &orders[..2]);
        assert_eq!(a.cash, 980.0);
        let a = derive(&start, &[orders[1].clone()]);
        assert_eq!(
            a.positions["AAA"],
            Position {
                quantity: 20.0,
                avg_price: 15.0
            }
        );
        let a = derive(&start, &orders);
        assert_eq!(a.cash, 1130.0);
        assert_eq!(a.realized_pnl, 30.0);
        assert!(a.positions.is_empty());
        let pnl: Vec<_> = a.fills.iter().map(|f| f.realized_pnl).collect();
        assert_eq!(pnl, vec![None, Some(75.0), Some(-45.0)]);
        let r = Reservations::of(&orders);
        assert_eq!(r.cash, 99.0);
    }

    #[tokio::test]
    async fn a_new_user_sees_the_sample_portfolio() {
        let fx = fixture().await;
        let out = call(&fx, "get_portfolio", json!({}), Some("new"))
            .await
            .unwrap();
        assert_eq!(out["source_id"], "tool:portfolio:v1");
        let d = &out["data"];
        assert_eq!(d["cash"], 100000.0);
        let symbols: Vec<_> = d["positions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["symbol"].as_str().unwrap())
            .collect();
        assert_eq!(symbols, ["AAPL", "MSFT", "SPY"]);
        let equity = d["equity"].as_f64().unwrap();
        let parts = d["cash"].as_f64().unwrap() + d["positions_value"].as_f64().unwrap();
        assert!((equity - parts).abs() < 0.011);
        let history = call(&fx, "get_trade_history", json!({}), Some("new"))
            .await
            .unwrap();
        assert_eq!(history["source_id"], "tool:trade_history:v1");
        assert_eq!(history["data"]["count"], 0);
    }

    #[tokio::test]
    async fn trades_move_the_portfolio_of_their_user_only() {
        let fx = fixture().await;
        let sell =
            json!({"symbol": "AAPL", "side": "sell", "quantity": 20, "order_type": "market"});
        call(&fx, "create_paper_order", sell, Some("u1"))
            .await
            .unwrap();
        let mine = call(&fx, "get_portfolio", json!({}), Some("u1"))
            .await
            .unwrap();
        let theirs = call(&fx, "get_portfolio", json!({}), Some("u2"))
            .await
            .unwrap();
        let aapl = |v: &Value| v["data"]["positions"][0]["quantity"].as_f64().unwrap();
        assert_eq!((aapl(&mine), aapl(&theirs)), (30.0, 50.0));
        assert!(mine["data"]["realized_pnl"].as_f64().unwrap() != 0.0);
        let history = call(
            &fx,
            "get_trade_history",
            json!({"symbol": "aapl", "limit": 5}),
            Some("u1"),
        )
        .await
        .unwrap();
        assert_eq!(history["data"]["trades"][0]["side"], "sell");
        assert!(history["data"]["trades"][0]["realized_pnl"].is_number());
        let err = call(
            &fx,
            "get_trade_history",
            json!({"symbol": "XYZ"}),
            Some("u1"),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().starts_with("unknown symbol"));
    }
}
