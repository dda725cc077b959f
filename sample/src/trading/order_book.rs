//! The paper order book: what an order is and where the user's orders are
//! stored. Both the order tools (`orders.rs`, which place and cancel) and
//! the account (`portfolio.rs`, which derives cash and positions from the
//! orders) read it, so it sits below both of them.
//!
//! orders.rs ──▶ order_book ◀── portfolio.rs
//!                  │ user_docs (redb docs under `trading.orders`)

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::user_docs::{self, ORDERS, user_key};
use cadre::store::Store;
use cadre::tools::ToolError;

pub(super) const WHAT: &str = "paper orders";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    Buy,
    Sell,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OrderType {
    Market,
    Limit,
}

/// Where an order is in its life; the fields each state needs travel with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum OrderState {
    Pending,
    Filled {
        fill_price: f64,
        filled_at: Timestamp,
    },
    Cancelled {
        cancelled_at: Timestamp,
    },
}

/// One paper order as stored in `trading.orders`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Order {
    pub id: String,
    pub symbol: String,
    pub side: Side,
    pub quantity: f64,
    pub order_type: OrderType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_price: Option<f64>,
    pub created_at: Timestamp,
    #[serde(flatten)]
    pub state: OrderState,
}

impl Side {
    pub(super) fn parse(raw: &str) -> Result<Side, ToolError> {
        match raw {
            "buy" => Ok(Side::Buy),
            "sell" => Ok(Side::Sell),
            other => Err(ToolError::invalid(format!(
                "side must be 'buy' or 'sell', got '{other}'"
            ))),
        }
    }
}

impl OrderType {
    pub(super) fn parse(raw: &str) -> Result<OrderType, ToolError> {
        match raw {
            "market" => Ok(OrderType::Market),
            "limit" => Ok(OrderType::Limit),
            other => Err(ToolError::invalid(format!(
                "order_type must be 'market' or 'limit', got '{other}'"
            ))),
        }
    }
}

pub(super) fn order_key(user: &str, order_id: &str) -> String {
    format!("{}/{order_id}", user_key(user))
}

/// Every order of the user, oldest first (ids are time-ordered).
pub(super) async fn load_orders(store: &Store, user: &str) -> Result<Vec<Order>, ToolError> {
    let prefix = format!("{}/", user_key(user));
    user_docs::load_all(store, ORDERS, &prefix, WHAT).await
}
