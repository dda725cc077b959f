//! Paper-trading tools: `create_paper_order`, `cancel_paper_order`,
//! `get_pending_orders` (all pro).
//!
//! executor (after confirmation) ──▶ create_paper_order ──lock user──▶ orders in store
//!                                        │ sample price (data.rs), account (portfolio.rs),
//!                                        │ order types and storage (order_book.rs)
//!                                        ▼
//!                          put_doc(trading.orders, <user>/<order_id>, durable)
//!
//! Decisions:
//! - `create_paper_order` carries the post-processor `require_confirmation`:
//!   the executor asks the user before the handler runs; the handler itself
//!   places the order when called.
//! - Order types are `market` and `limit` (the issue), not the spec's
//!   `stop`/`stop_limit`. A market order fills at once at the sample's latest
//!   close. A limit order stays pending until cancelled, even when it is
//!   marketable: the sample has no price feed to trigger it.
//! - No margin, no short selling: a buy needs the cash (minus what pending
//!   limit buys reserve, quantity × limit price), a sell needs the shares
//!   (minus what pending sells reserve). Fractional quantities are allowed.
//! - Each order is its own document, written durably under the user's lock,
//!   so concurrent orders cannot both spend the same cash.
//! - Ids are `ord_` + a v7 UUID (time-ordered), so key order is order time.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::order_book::{Order, OrderState, OrderType, Side, WHAT, load_orders, order_key};
use super::portfolio::{self, Reservations};
use super::user_docs::{self, ORDERS, lock_user};
use super::{NO_CACHE, Op, Shared, envelope, opt_f64, req_f64, req_str, round, symbol_schema};
use cadre::tools::definition::{Plan, REQUIRE_CONFIRMATION};
use cadre::tools::{SideEffects, ToolDefinition, ToolError};

/// Largest quantity of one order.
const MAX_QUANTITY: f64 = 1_000_000.0;
/// Slack for float sums of cash and quantities.
const EPSILON: f64 = 1e-9;

fn order_id_schema() -> Value {
    json!({
        "type": "string",
        "pattern": "^ord_[0-9a-f]{32}$",
        "description": "Id of a paper order, e.g. from get_pending_orders"
    })
}

pub(super) fn definitions() -> Vec<(ToolDefinition, Op)> {
    vec![
        (
            ToolDefinition::new(
                "create_paper_order",
                "Place a paper-trading order (simulated, no real money; the user is asked to \
                 confirm). Market orders fill at once at the current price; limit orders \
                 stay pending.",
                json!({
                    "type": "object",
                    "properties": {
                        "symbol": symbol_schema(),
                        "side": {"type": "string", "enum": ["buy", "sell"]},
                        "quantity": {
                            "type": "number",
                            "exclusiveMinimum": 0,
                            "maximum": MAX_QUANTITY,
                            "description": "Number of shares (fractions allowed)"
                        },
                        "order_type": {"type": "string", "enum": ["market", "limit"]},
                        "limit_price": {
                            "type": "number",
                            "exclusiveMinimum": 0,
                            "maximum": 1.0e9,
                            "description": "Limit price; required for limit orders only"
                        }
                    },
                    "required": ["symbol", "side", "quantity", "order_type"],
                    "additionalProperties": false
                }),
            )
            .with_side_effects(SideEffects::AtMostOnce)
            .with_category("trading")
            .with_tags(&["order", "buy", "sell", "paper trading", "trade"])
            .with_plan(Plan::Pro)
            .per_minute(10)
            .with_cache_ttl(NO_CACHE)
            .with_post_processor(REQUIRE_CONFIRMATION),
            Op::CreatePaperOrder,
        ),
        (
            ToolDefinition::new(
                "cancel_paper_order",
                "Cancel a pending paper-trading order.",
                json!({
                    "type": "object",
                    "properties": {"order_id": order_id_schema()},
                    "required": ["order_id"],
                    "additionalProperties": false
                }),
            )
            .with_side_effects(SideEffects::Idempotent)
            .with_category("trading")
            .with_tags(&["order", "cancel", "paper trading"])
            .with_plan(Plan::Pro)
            .per_minute(20)
            .with_cache_ttl(NO_CACHE),
            Op::CancelPaperOrder,
        ),
        (
            ToolDefinition::new(
                "get_pending_orders",
                "The user's pending paper-trading orders, oldest first, with current prices.",
                json!({"type": "object", "properties": {}, "additionalProperties": false}),
            )
            .with_side_effects(SideEffects::None)
            .with_category("trading")
            .with_tags(&["orders", "pending", "open orders", "paper trading"])
            .with_plan(Plan::Pro)
            .per_minute(30)
            .with_cache_ttl(NO_CACHE),
            Op::GetPendingOrders,
        ),
    ]
}

fn order_json(o: &Order) -> Value {
    let mut v = serde_json::to_value(o).unwrap_or(Value::Null);
    if let Some(obj) = v.as_object_mut() {
        obj.insert("paper".into(), Value::Bool(true));
    }
    v
}

pub(super) async fn create_paper_order(
    shared: &Shared,
    p: &Value,
    user: &str,
) -> Result<Value, ToolError> {
    let data = shared.data.get().await?;
    let (symbol, s) = data.symbol(req_str(p, "symbol")?)?;
    let side = Side::parse(req_str(p, "side")?)?;
    let order_type = OrderType::parse(req_str(p, "order_type")?)?;
    let quantity = req_f64(p, "quantity")?;
    if !(quantity > 0.0 && quantity <= MAX_QUANTITY) {
        return Err(ToolError::invalid(format!(
            "quantity must be > 0 and ≤ {MAX_QUANTITY}, got {quantity}"
        )));
    }
    let limit_price = opt_f64(p, "limit_price")?;
    match (order_type, limit_price) {
        (OrderType::Limit, None) => {
            return Err(ToolError::invalid("a limit order needs limit_price"));
        }
        (OrderType::Market, Some(_)) => {
            return Err(ToolError::invalid(
                "limit_price applies to limit orders only; omit it for a market order",
            ));
        }
        (_, Some(lp)) if lp <= 0.0 => {
            return Err(ToolError::invalid(format!(
                "limit_price must be > 0, got {lp}"
            )));
        }
        _ => {}
    }
    let price = s
        .last_price()
        .ok_or_else(|| ToolError::failed(format!("the sample data has no price for {symbol}")))?;

    let _guard = lock_user(&shared.store, user).await;
    let orders = load_orders(&shared.store, user).await?;
    let account = portfolio::derive(&data.starting_portfolio, &orders);
    let reserved = Reservations::of(&orders);
    match side {
        Side::Buy => {
            let cost = quantity * limit_price.unwrap_or(price);
            let available = account.cash - reserved.cash;
            if cost > available + EPSILON {
                return Err(ToolError::invalid(format!(
                    "insufficient paper cash: buying {quantity} {symbol} at {:.2} costs {cost:.2}, \
                     available {available:.2} (cash {:.2}, {:.2} reserved by pending buy orders)",
                    limit_price.unwrap_or(price),
                    account.cash,
                    reserved.cash
                )));
            }
        }
        Side::Sell => {
            let held = account.quantity(symbol);
            let pending = reserved.shares(symbol);
            if quantity > held - pending + EPSILON {
                return Err(ToolError::invalid(format!(
                    "cannot sell {quantity} {symbol}: you hold {held} ({pending} reserved by \
                     pending sell orders); short selling is not supported"
                )));
            }
        }
    }
    let now = Timestamp::now();
    let order = Order {
        id: format!("ord_{}", uuid::Uuid::now_v7().simple()),
        symbol: symbol.to_string(),
        side,
        quantity,
        order_type,
        limit_price,
        created_at: now,
        state: match order_type {
            OrderType::Market => OrderState::Filled {
                fill_price: price,
                filled_at: now,
            },
            OrderType::Limit => OrderState::Pending,
        },
    };
    user_docs::save(
        &shared.store,
        ORDERS,
        &order_key(user, &order.id),
        &order,
        WHAT,
    )
    .await?;

    let signed = match side {
        Side::Buy => -1.0,
        Side::Sell => 1.0,
    };
    let (message, cash_after) = match order.state {
        OrderState::Filled { fill_price, .. } => (
            format!(
                "paper {} of {quantity} {symbol} filled at {fill_price:.2}",
                if side == Side::Buy { "buy" } else { "sell" }
            ),
            account.cash + signed * quantity * fill_price,
        ),
        _ => (
            format!(
                "paper limit order placed; it stays pending (current price {price:.2}) until \
                 cancelled"
            ),
            account.cash,
        ),
    };
    Ok(envelope(
        "orders",
        json!({
            "order": order_json(&order),
            "message": message,
            "cash_after": round(cash_after, 2),
        }),
        now,
    ))
}

pub(super) async fn cancel_paper_order(
    shared: &Shared,
    p: &Value,
    user: &str,
) -> Result<Value, ToolError> {
    let id = req_str(p, "order_id")?.trim();
    if !id.starts_with("ord_") || id.contains('/') {
        return Err(ToolError::invalid(format!(
            "'{id}' is not a paper order id (they look like ord_…)"
        )));
    }
    let key = order_key(user, id);
    let _guard = lock_user(&shared.store, user).await;
    let Some(mut order) = user_docs::load_one::<Order>(&shared.store, ORDERS, &key, WHAT).await?
    else {
        return Err(ToolError::invalid(format!(
            "no paper order '{id}' on your account; get_pending_orders lists the open ones"
        )));
    };
    match order.state {
        OrderState::Pending => {}
        OrderState::Filled { fill_price, .. } => {
            return Err(ToolError::invalid(format!(
                "order {id} is already filled (at {fill_price:.2}); only pending orders can be \
                 cancelled"
            )));
        }
        OrderState::Cancelled { .. } => {
            return Err(ToolError::invalid(format!(
                "order {id} is already cancelled"
            )));
        }
    }
    let now = Timestamp::now();
    order.state = OrderState::Cancelled { cancelled_at: now };
    user_docs::save(&shared.store, ORDERS, &key, &order, WHAT).await?;
    Ok(envelope(
        "orders",
        json!({"order": order_json(&order), "message": format!("order {id} cancelled")}),
        now,
    ))
}

pub(super) async fn get_pending_orders(shared: &Shared, user: &str) -> Result<Value, ToolError> {
    let data = shared.data.get().await?;
    let orders = load_orders(&shared.store, user).await?;
    let pending: Vec<Value> = orders
        .iter()
        .filter(|o| o.state == OrderState::Pending)
        .map(|o| {
            let mut v = order_json(o);
            v["current_price"] = json!(data.price(&o.symbol));
            v
        })
        .collect();
    Ok(envelope(
        "orders",
        json!({"count": pending.len(), "orders": pending}),
        Timestamp::now(),
    ))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{call, fixture, reopen};
    use super::*;

    async fn buy(fx: &super::super::tests::Fixture, user: &str, extra: Value) -> Value {
        let mut p =
            json!({"symbol": "NVDA", "side": "buy", "quantity": 10, "order_type": "market"});
        for (k, v) in extra.as_object().unwrap() {
            p[k] = v.clone();
        }
        call(fx, "create_paper_order", p, Some(user)).await.unwrap()
    }

    #[tokio::test]
    async fn market_orders_fill_at_the_sample_price_and_limit_orders_wait() {
        let fx = fixture().await;
        let price = call(&fx, "get_price", json!({"symbol": "NVDA"}), None)
            .await
            .unwrap()["data"]["price"]
            .as_f64()
            .unwrap();
        let out = buy(&fx, "u1", json!({})).await;
        assert_eq!(out["source_id"], "tool:orders:v1");
        let order = &out["data"]["order"];
        assert_eq!(order["status"], "filled");
        assert_eq!(order["fill_price"].as_f64(), Some(price));
        assert!(order["id"].as_str().unwrap().starts_with("ord_"));
        assert_eq!(
            out["data"]["cash_after"].as_f64().unwrap(),
            round(100_000.0 - 10.0 * price, 2)
        );
        let out = buy(
            &fx,
            "u1",
            json!({"order_type": "limit", "limit_price": 1.5}),
        )
        .await;
        assert_eq!(out["data"]["order"]["status"], "pending");
        let pending = call(&fx, "get_pending_orders", json!({}), Some("u1"))
            .await
            .unwrap();
        assert_eq!(pending["data"]["count"], 1);
        assert_eq!(
            pending["data"]["orders"][0]["current_price"].as_f64(),
            Some(price)
        );
    }

    #[tokio::test]
    async fn orders_that_cannot_be_placed_are_refused_with_the_reason() {
        let fx = fixture().await;
        let err = call(
            &fx,
            "create_paper_order",
            json!({"symbol": "NVDA", "side": "buy", "quantity": 100000, "order_type": "market"}),
            Some("u1"),
        )
        .await
        .unwrap_err();
        assert!(
            err.to_string().starts_with("insufficient paper cash"),
            "{err}"
        );
        let err = call(
            &fx,
            "create_paper_order",
            json!({"symbol": "TSLA", "side": "sell", "quantity": 1, "order_type": "market"}),
            Some("u1"),
        )
        .await
        .unwrap_err();
        assert!(
            err.to_string().contains("short selling is not supported"),
            "{err}"
        );
        let err = call(
            &fx,
            "create_paper_order",
            json!({"symbol": "AAPL", "side": "buy", "quantity": 1, "order_type": "limit"}),
            Some("u1"),
        )
        .await
        .unwrap_err();
        assert_eq!(err.to_string(), "a limit order needs limit_price");
        let err = call(
            &fx,
            "create_paper_order",
            json!({"symbol": "AAPL", "side": "buy", "quantity": 0, "order_type": "market"}),
            Some("u1"),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("quantity"), "{err}");
        let err = call(
            &fx,
            "create_paper_order",
            json!({"symbol": "XYZ", "side": "buy", "quantity": 1, "order_type": "market"}),
            Some("u1"),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().starts_with("unknown symbol 'XYZ'"));
    }

    #[tokio::test]
    async fn pending_sells_reserve_the_shares() {
        let fx = fixture().await;
        // The sample portfolio holds 50 AAPL.
        let sell = |q: u32| json!({"symbol": "AAPL", "side": "sell", "quantity": q, "order_type": "limit", "limit_price": 999});
        call(&fx, "create_paper_order", sell(40), Some("u1"))
            .await
            .unwrap();
        let err = call(&fx, "create_paper_order", sell(20), Some("u1"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("40 reserved"), "{err}");
        call(&fx, "create_paper_order", sell(10), Some("u1"))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn cancel_only_touches_the_callers_pending_orders() {
        let fx = fixture().await;
        let out = buy(&fx, "u1", json!({"order_type": "limit", "limit_price": 50})).await;
        let id = out["data"]["order"]["id"].as_str().unwrap().to_string();
        // Another user cannot see or cancel it.
        let err = call(
            &fx,
            "cancel_paper_order",
            json!({"order_id": id}),
            Some("u2"),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().starts_with("no paper order"), "{err}");
        let out = call(
            &fx,
            "cancel_paper_order",
            json!({"order_id": id}),
            Some("u1"),
        )
        .await
        .unwrap();
        assert_eq!(out["data"]["order"]["status"], "cancelled");
        let err = call(
            &fx,
            "cancel_paper_order",
            json!({"order_id": id}),
            Some("u1"),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("already cancelled"));
        let filled = buy(&fx, "u1", json!({})).await;
        let fid = filled["data"]["order"]["id"].as_str().unwrap();
        let err = call(
            &fx,
            "cancel_paper_order",
            json!({"order_id": fid}),
            Some("u1"),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("already filled"));
        let pending = call(&fx, "get_pending_orders", json!({}), Some("u1"))
            .await
            .unwrap();
        assert_eq!(pending["data"]["count"], 0);
    }

    #[tokio::test]
    async fn orders_survive_a_store_reopen() {
        let fx = fixture().await;
        let out = buy(&fx, "u1", json!({"order_type": "limit", "limit_price": 50})).await;
        let id = out["data"]["order"]["id"].clone();
        buy(&fx, "u1", json!({})).await;
        let fx = reopen(fx).await;
        let pending = call(&fx, "get_pending_orders", json!({}), Some("u1"))
            .await
            .unwrap();
        assert_eq!(pending["data"]["orders"][0]["id"], id);
        let history = call(&fx, "get_trade_history", json!({}), Some("u1"))
            .await
            .unwrap();
        assert_eq!(history["data"]["count"], 1);
    }

    #[tokio::test]
    async fn concurrent_orders_cannot_spend_the_same_cash() {
        let fx = fixture().await;
        // 100 000 cash; NVDA around 160: each order of 250 costs ~40 000, so at most
        // two of five concurrent buys fit.
        let price = call(&fx, "get_price", json!({"symbol": "NVDA"}), None)
            .await
            .unwrap()["data"]["price"]
            .as_f64()
            .unwrap();
        let qty = (40_000.0 / price).floor();
        let calls = (0..5).map(|_| {
            call(
                &fx,
                "create_paper_order",
                json!({"symbol": "NVDA", "side": "buy", "quantity": qty, "order_type": "market"}),
                Some("u1"),
            )
        });
        let results = futures::future::join_all(calls).await;
        let ok = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 2, "{results:?}");
        let portfolio = call(&fx, "get_portfolio", json!({}), Some("u1"))
            .await
            .unwrap();
        assert!(portfolio["data"]["cash"].as_f64().unwrap() >= 0.0);
    }
}
