//! Request extractors: what a handler receives is what `/openapi.json`
//! says it may send.
//!
//! body ──`axum::Json<Value>`──▶ 400 / 413 / 415 ──the documented schema──▶ 422 ──serde──▶ handler
//! query ──`axum::Query<T>`──▶ 422
//!
//! [`ApiJson<T>`] checks a JSON body against `T`'s own OpenAPI schema (the
//! one `#[utoipa::path(request_body = T)]` publishes) before serde sees it,
//! so the server refuses exactly what the document forbids: a value of the
//! wrong type (an array where the document says object: serde alone would
//! read `["assistant", null, null, null]` as a struct, in its sequence
//! form), an unknown field, a value outside an enum, a range or a length.
//! Each refusal is a 422 `VALIDATION_ERROR` naming the field, in JSON
//! Schema's own words, never a Rust type name. [`ApiJsonValue<S>`] does the
//! same for a body the handler keeps as JSON (a merge patch, where `null`
//! means "remove"). Malformed JSON stays a 400, a body over the cap a 413,
//! a wrong content type a 415 (the `From<JsonRejection>` below).
//!
//! [`ApiQuery<T>`] is axum's `Query` whose refusal (a value that does not
//! parse, a number too large for its field, an unknown or missing
//! parameter) is a 422 `VALIDATION_ERROR`, like a body's and like a range
//! the handler checks: one status for "this request does not fit the
//! document".
//!
//! JSON Schema counts `12.0` as an integer; serde's integer types do not.
//! Where the document says `integer`, an integral number written with a
//! fraction (`12.0` in a body, `12.0` or `12.` in a query) is read as the
//! integer it is. Elsewhere (free-form `params`, `metadata`) numbers are
//! left as they were sent.
//!
//! Decision: the schema check runs on every request (a compiled validator
//! per body type, built once). Bodies are at most 1 MiB and the schemas are
//! small; the cost is well under the JSON parse's.

use std::any::TypeId;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, LazyLock, Mutex};

use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::Uri;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use utoipa::openapi::path::ParameterIn;
use utoipa::{IntoParams, ToSchema};

use super::error::ApiError;
use crate::error_code::ErrorCode;

/// axum's refusals of a JSON body, in our error shape: 400 for malformed
/// JSON, 413 over the body limit, 415 without a JSON content type, 422 for
/// a well-formed body that does not fit.
impl From<axum::extract::rejection::JsonRejection> for ApiError {
    fn from(r: axum::extract::rejection::JsonRejection) -> Self {
        use axum::extract::rejection::JsonRejection;
        use axum::http::StatusCode;
        let code = match &r {
            JsonRejection::JsonDataError(_) => ErrorCode::ValidationError,
            JsonRejection::JsonSyntaxError(_) => ErrorCode::MalformedJson,
            _ => match r.status() {
                StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::PayloadTooLarge,
                StatusCode::UNSUPPORTED_MEDIA_TYPE => ErrorCode::UnsupportedMediaType,
                StatusCode::UNPROCESSABLE_ENTITY => ErrorCode::ValidationError,
                _ => ErrorCode::MalformedJson,
            },
        };
        ApiError::new(code, r.body_text())
    }
}

/// `pattern` of a string that holds something besides whitespace: one
/// character outside Rust's `char::is_whitespace` set, written out so the
/// document and `str::trim` agree on what "blank" is. utoipa takes a
/// `pattern` as a literal only: fields write it out, and a test checks each
/// copy in the document is this one.
pub const NOT_BLANK: &str =
    "[^\\t-\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]";

/// Longest error message sent for a refused body (the message may quote
/// field names the client sent).
const MAX_MESSAGE_CHARS: usize = 300;

/// A JSON body that fits `T`'s documented schema, deserialized.
pub struct ApiJson<T>(pub T);

/// A JSON body that fits `S`'s documented schema, kept as JSON.
pub struct ApiJsonValue<S>(pub Value, pub PhantomData<S>);

impl<T, St> FromRequest<St> for ApiJson<T>
where
    T: ToSchema + DeserializeOwned + 'static,
    St: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &St) -> Result<Self, Self::Rejection> {
        let value = checked_body::<T, St>(req, state).await?;
        serde_json::from_value(value)
            .map(ApiJson)
            .map_err(|e| ApiError::validation(serde_message(&e)))
    }
}

impl<S, St> FromRequest<St> for ApiJsonValue<S>
where
    S: ToSchema + 'static,
    St: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &St) -> Result<Self, Self::Rejection> {
        let value = checked_body::<S, St>(req, state).await?;
        Ok(ApiJsonValue(value, PhantomData))
    }
}

async fn checked_body<S: ToSchema + 'static, St: Send + Sync>(
    req: Request,
    state: &St,
) -> Result<Value, ApiError> {
    let axum::Json(mut value) = axum::Json::<Value>::from_request(req, state).await?;
    check::<S>(&mut value)?;
    Ok(value)
}

/// Holds `value` to `S`'s schema: the first way it breaks it, as a 422.
/// Integral numbers where the schema says `integer` become integers.
pub fn check<S: ToSchema + 'static>(value: &mut Value) -> Result<(), ApiError> {
    let schema = schema::<S>();
    integers_as_integers(value, &schema.document, &schema.document, 0);
    let Some(error) = schema.validator.iter_errors(value).next() else {
        return Ok(());
    };
    let path = error.instance_path().to_string();
    let place = if path.is_empty() {
        "the body".to_string()
    } else {
        format!("`{}`", path.trim_start_matches('/').replace('/', "."))
    };
    let message = match error.kind() {
        jsonschema::error::ValidationErrorKind::Pattern { pattern } if pattern == NOT_BLANK => {
            format!("{place} must not be blank")
        }
        _ => error.masked_with(place.as_str()).to_string(),
    };
    Err(ApiError::validation(truncate(message)))
}

/// A body type's schema, as JSON and compiled.
struct BodySchema {
    document: Value,
    validator: jsonschema::Validator,
}

/// The schema of `S` (with the schemas it references), built once.
fn schema<S: ToSchema + 'static>() -> Arc<BodySchema> {
    static CACHE: LazyLock<Mutex<HashMap<TypeId, Arc<BodySchema>>>> =
        LazyLock::new(Default::default);
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    cache
        .entry(TypeId::of::<S>())
        .or_insert_with(|| {
            let document = standalone_schema::<S>();
            let validator = jsonschema::options()
                .with_draft(jsonschema::Draft::Draft202012)
                .build(&document)
                .unwrap_or_else(|e| panic!("the schema of {} compiles: {e}", S::name()));
            Arc::new(BodySchema {
                document,
                validator,
            })
        })
        .clone()
}

/// Deeper than any request schema nests (and than serde_json parses).
const MAX_SCHEMA_DEPTH: usize = 64;

/// Rewrites integral floats (`12.0`) into integers wherever `schema` says
/// `integer`, following `$ref`s (inside `root`), `oneOf`/`anyOf`/`allOf`,
/// properties and items.
fn integers_as_integers(value: &mut Value, schema: &Value, root: &Value, depth: usize) {
    if depth > MAX_SCHEMA_DEPTH {
        return;
    }
    if let Some(target) = schema["$ref"]
        .as_str()
        .and_then(|r| r.strip_prefix('#'))
        .and_then(|pointer| root.pointer(pointer))
    {
        integers_as_integers(value, target, root, depth + 1);
    }
    for keyword in ["oneOf", "anyOf", "allOf"] {
        for alternative in schema[keyword].as_array().into_iter().flatten() {
            integers_as_integers(value, alternative, root, depth + 1);
        }
    }
    let says_integer = match &schema["type"] {
        Value::String(t) => t == "integer",
        Value::Array(ts) => ts.iter().any(|t| t == "integer"),
        _ => false,
    };
    match value {
        Value::Number(n) if says_integer && n.is_f64() => {
            if let Some(integer) = n.as_f64().and_then(integral) {
                *value = integer;
            }
        }
        Value::Object(fields) => {
            for (name, field) in fields.iter_mut() {
                if let Some(property) = schema["properties"].get(name) {
                    integers_as_integers(field, property, root, depth + 1);
                } else if schema["additionalProperties"].is_object() {
                    // A map (`tool_quotas`): each value has the one schema.
                    integers_as_integers(field, &schema["additionalProperties"], root, depth + 1);
                }
            }
        }
        Value::Array(items) if schema["items"].is_object() => {
            for item in items {
                integers_as_integers(item, &schema["items"], root, depth + 1);
            }
        }
        _ => {}
    }
}

/// `x` as a JSON integer, when it is one that fits an `i64` or a `u64`.
fn integral(x: f64) -> Option<Value> {
    const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;
    const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;
    if !x.is_finite() || x.fract() != 0.0 {
        None
    } else if (0.0..TWO_POW_64).contains(&x) {
        Some(Value::from(x as u64))
    } else if (-TWO_POW_63..0.0).contains(&x) {
        Some(Value::from(x as i64))
    } else {
        None
    }
}

/// `S`'s schema as one JSON Schema document: its `$ref`s
/// (`#/components/schemas/...`) resolve inside it.
pub fn standalone_schema<S: ToSchema>() -> Value {
    let mut referenced = Vec::new();
    S::schemas(&mut referenced);
    let components: Map<String, Value> = referenced
        .into_iter()
        .map(|(name, schema)| (name, json!(schema)))
        .collect();
    let mut schema = json!(S::schema());
    schema["components"] = json!({ "schemas": components });
    schema
}

/// serde's message without the Rust type it expected (`expected u32`,
/// `expected struct CreateBody`). Only reached where the schema is looser
/// than the type, which the schemas are written to avoid.
fn serde_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let text = text.split(", expected").next().unwrap_or_default();
    truncate(format!("the body does not fit its schema: {text}"))
}

fn truncate(message: String) -> String {
    match message.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((at, _)) => format!("{}…", &message[..at]),
        None => message,
    }
}

/// One page of a listing that filters nothing (sessions, confirmations):
/// `limit` and the opaque `cursor` of the previous page's `next`.
#[derive(serde::Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// 1 to 1,000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// The `next` of the previous page (opaque).
    #[param(max_length = 128, pattern = "^[!-~]*$")]
    pub cursor: Option<String>,
}

/// `Query<T>` whose refusal is a 422 `VALIDATION_ERROR`; a parameter the
/// document says is an integer may be written `12.0`.
pub struct ApiQuery<T>(pub T);

impl<T, St> FromRequestParts<St> for ApiQuery<T>
where
    T: DeserializeOwned + IntoParams,
    St: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &St) -> Result<Self, Self::Rejection> {
        let uri = integral_query::<T>(&parts.uri);
        Query::<T>::try_from_uri(uri.as_ref().unwrap_or(&parts.uri))
            .map(|Query(q)| ApiQuery(q))
            .map_err(|r| ApiError::validation(truncate(r.body_text())))
    }
}

/// `uri` with its integer parameters' `12.0` / `12.` written `12`, or
/// `None` when there is nothing to rewrite.
fn integral_query<T: IntoParams>(uri: &Uri) -> Option<Uri> {
    let query = uri.query()?;
    let integers: Vec<String> = T::into_params(|| Some(ParameterIn::Query))
        .into_iter()
        .filter(|p| {
            let schema = json!(p.schema);
            schema["type"] == "integer"
                || schema["type"]
                    .as_array()
                    .is_some_and(|ts| ts.iter().any(|t| t == "integer"))
        })
        .map(|p| p.name)
        .collect();
    let mut rewritten = false;
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
        .map(|(name, value)| {
            let value = match integral_text(&value) {
                Some(digits) if integers.iter().any(|i| *i == name) => {
                    rewritten = true;
                    digits.to_string()
                }
                _ => value.into_owned(),
            };
            (name.into_owned(), value)
        })
        .collect();
    if !rewritten {
        return None;
    }
    let query = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish();
    format!("{}?{query}", uri.path()).parse().ok()
}

/// The digits of `-?\d+\.0*` (an integer written with a zero fraction).
fn integral_text(text: &str) -> Option<&str> {
    let (whole, fraction) = text.split_once('.')?;
    let digits = whole.strip_prefix('-').unwrap_or(whole);
    let integral = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && fraction.bytes().all(|b| b == b'0');
    integral.then_some(whole)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, ToSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        #[schema(
            min_length = 1,
            pattern = "[^\\t-\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
        )]
        name: String,
        count: Option<u8>,
    }

    fn refused(mut value: Value) -> String {
        check::<Body>(&mut value).expect_err("refused").message
    }

    fn accepted(mut value: Value) -> Value {
        check::<Body>(&mut value).expect("accepted");
        value
    }

    #[test]
    fn a_body_is_held_to_its_schema_in_json_terms() {
        accepted(json!({"name": "a", "count": 3}));
        for (value, says) in [
            (json!(["a", 3]), "the body"),
            (json!({"name": "a", "other": 1}), "other"),
            (json!({"count": 1}), "name"),
            (json!({"name": 5}), "`name`"),
        ] {
            let message = refused(value.clone());
            assert!(message.contains(says), "{value}: {message}");
            assert!(
                !message.contains("Body") && !message.contains("u8"),
                "{message}"
            );
        }
    }

    #[test]
    fn blank_means_what_trim_means() {
        for blank in ["", " ", "\t\n\r", "\u{85}", "\u{a0}\u{3000}", "\u{2028}"] {
            assert!(blank.trim().is_empty());
            let message = refused(json!({ "name": blank }));
            assert!(message.contains("`name`"), "{blank:?}: {message}");
        }
        for filled in ["a", " a ", "\u{feff}", "\u{200b}"] {
            assert!(!filled.trim().is_empty());
            accepted(json!({ "name": filled }));
        }
        assert_eq!(refused(json!({"name": "  "})), "`name` must not be blank");
    }

    #[test]
    fn integral_numbers_are_integers_where_the_schema_says_integer() {
        let value = accepted(json!({"name": "a", "count": 12.0}));
        assert_eq!(value["count"], json!(12));
        assert!(value["count"].is_u64());
        let body: Body = serde_json::from_value(value).unwrap();
        assert_eq!(body.count, Some(12));
        refused(json!({"name": "a", "count": 12.5}));
        assert_eq!(integral(-3.0), Some(json!(-3)));
        assert_eq!(integral(18_446_744_073_709_551_616.0), None);
        assert_eq!(integral(f64::NAN), None);
    }

    #[derive(serde::Deserialize, IntoParams)]
    #[into_params(parameter_in = Query)]
    #[allow(dead_code)]
    struct Params {
        limit: Option<u32>,
        tool: Option<String>,
    }

    #[test]
    fn integer_query_parameters_may_carry_a_zero_fraction() {
        let rewrite = |q: &str| {
            integral_query::<Params>(&format!("/x?{q}").parse().unwrap()).map(|u| u.to_string())
        };
        assert_eq!(rewrite("limit=12.0"), Some("/x?limit=12".into()));
        assert_eq!(
            rewrite("limit=12.&tool=7.0"),
            Some("/x?limit=12&tool=7.0".into())
        );
        assert_eq!(rewrite("limit=12"), None);
        assert_eq!(rewrite("limit=1e3"), None);
        assert_eq!(rewrite("limit=1.5"), None);
        assert_eq!(rewrite("tool=7.0"), None);
    }

    #[test]
    fn serde_messages_lose_the_rust_type() {
        let e = serde_json::from_value::<u32>(json!("x")).unwrap_err();
        let message = serde_message(&e);
        assert!(!message.contains("u32"), "{message}");
    }
}
