//! ML tools: `get_ml_signals` (pro), `get_ml_features` (premium).
//!
//! executor ──params──▶ handler ──▶ sample data (data.rs) ──▶ envelope
//!
//! Decisions:
//! - The prediction and its feature importances are the sample's (there is
//!   no model in cadre); the handlers add the latest close so the model can
//!   relate `target_price` to it.
//! - `get_ml_features` takes the spec's optional `prediction_id`; an id that
//!   is not the symbol's current prediction is refused, naming the current
//!   one, rather than silently answering for another prediction.

use serde_json::{Value, json};

use super::{Op, Shared, envelope, opt_str, req_str, symbol_schema};
use cadre::tools::definition::Plan;
use cadre::tools::{SideEffects, ToolDefinition, ToolError};

pub(super) fn definitions() -> Vec<(ToolDefinition, Op)> {
    vec![
        (
            ToolDefinition::new(
                "get_ml_signals",
                "The ML model's prediction for a symbol: direction (bullish, bearish, \
                 neutral), confidence, horizon, expected return and target price.",
                json!({
                    "type": "object",
                    "properties": {"symbol": symbol_schema()},
                    "required": ["symbol"],
                    "additionalProperties": false
                }),
            )
            .with_side_effects(SideEffects::None)
            .with_category("ml")
            .with_tags(&["ml", "prediction", "signal", "forecast"])
            .with_plan(Plan::Pro)
            .per_minute(30)
            .with_cache_ttl(60),
            Op::GetMlSignals,
        ),
        (
            ToolDefinition::new(
                "get_ml_features",
                "The main features behind the ML prediction of a symbol, with their \
                 values and importances.",
                json!({
                    "type": "object",
                    "properties": {
                        "symbol": symbol_schema(),
                        "prediction_id": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 64,
                            "description": "Id of a prediction from get_ml_signals (optional)"
                        }
                    },
                    "required": ["symbol"],
                    "additionalProperties": false
                }),
            )
            .with_side_effects(SideEffects::None)
            .with_category("ml")
            .with_tags(&["ml", "features", "explain", "importance"])
            .with_plan(Plan::Premium)
            .per_minute(20)
            .with_cache_ttl(60),
            Op::GetMlFeatures,
        ),
    ]
}

fn generated_at(v: &Value, fallback: impl ToString) -> String {
    v.get("generated_at")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| fallback.to_string())
}

pub(super) async fn get_ml_signals(shared: &Shared, p: &Value) -> Result<Value, ToolError> {
    let data = shared.data.get().await?;
    let (symbol, s) = data.symbol(req_str(p, "symbol")?)?;
    let signals = s.ml_signals.as_ref().ok_or_else(|| {
        ToolError::failed(format!("the sample data has no ML signals for {symbol}"))
    })?;
    Ok(envelope(
        "ml_signals",
        json!({"symbol": symbol, "last_close": s.last_price(), "signals": signals}),
        generated_at(signals, data.as_of),
    ))
}

pub(super) async fn get_ml_features(shared: &Shared, p: &Value) -> Result<Value, ToolError> {
    let data = shared.data.get().await?;
    let (symbol, s) = data.symbol(req_str(p, "symbol")?)?;
    let features = s.ml_features.as_ref().ok_or_else(|| {
        ToolError::failed(format!("the sample data has no ML features for {symbol}"))
    })?;
    let current = features.get("prediction_id").and_then(Value::as_str);
    if let Some(wanted) = opt_str(p, "prediction_id")?
        && Some(wanted) != current
    {
        return Err(ToolError::invalid(format!(
            "prediction '{wanted}' is not the current prediction for {symbol} (current: {}); \
             call get_ml_signals for the latest",
            current.unwrap_or("none")
        )));
    }
    let as_of = s
        .ml_signals
        .as_ref()
        .map(|sig| generated_at(sig, data.as_of))
        .unwrap_or_else(|| data.as_of.to_string());
    Ok(envelope(
        "ml_features",
        json!({"symbol": symbol, "features": features}),
        as_of,
    ))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{call, fixture};
    use super::*;

    #[tokio::test]
    async fn ml_signals_and_features_come_from_the_sample() {
        let fx = fixture().await;
        let out = call(&fx, "get_ml_signals", json!({"symbol": "MSFT"}), None)
            .await
            .unwrap();
        assert_eq!(out["source_id"], "tool:ml_signals:v1");
        let id = out["data"]["signals"]["prediction_id"].as_str().unwrap();
        assert!(out["data"]["last_close"].is_number());
        let out = call(
            &fx,
            "get_ml_features",
            json!({"symbol": "MSFT", "prediction_id": id}),
            None,
        )
        .await
        .unwrap();
        assert_eq!(out["source_id"], "tool:ml_features:v1");
        assert!(
            !out["data"]["features"]["features"]
                .as_array()
                .unwrap()
                .is_empty()
        );
    }

    #[tokio::test]
    async fn a_stale_prediction_id_is_refused() {
        let fx = fixture().await;
        let err = call(
            &fx,
            "get_ml_features",
            json!({"symbol": "MSFT", "prediction_id": "pred_old"}),
            None,
        )
        .await
        .unwrap_err();
        assert!(matches!(err, ToolError::InvalidInput { .. }));
        assert!(
            err.to_string().contains("current: pred_MSFT_20261030"),
            "{err}"
        );
        assert!(
            call(&fx, "get_ml_signals", json!({"symbol": "XYZ"}), None)
                .await
                .is_err()
        );
    }
}
