//! The API's contract: an OpenAPI 3.1 document built from the handlers'
//! own `#[utoipa::path]` annotations, served at `GET /openapi.json`, and
//! Swagger UI over it at `/docs`.
//!
//! handler + #[utoipa::path] ──routes!──▶ OpenApiRouter ──split──▶ axum Router (serves)
//!                                                         └──────▶ OpenApi (this document)
//!
//! Each resource file's `routes()` registers its handlers with
//! `utoipa_axum::routes!`, which takes the path and method from the same
//! annotation that documents them: what is served and what is documented
//! come from one place. [`ApiDoc`] adds what is common to every operation
//! ([`CommonErrors`]): 401 (bearer key), 429 (the API's rate limit), and,
//! for operations with a JSON body, 400/413/415/422 from [`ApiJson`]'s
//! rejections. Every error response's body is [`ErrorBody`].
//!
//! Crates: utoipa 6 (`utoipa`, `utoipa-axum`, `utoipa-swagger-ui`), the
//! de-facto code-first OpenAPI generator for axum; 6.0 is the current major
//! (5.x is superseded) and still emits `openapi: 3.1.0` by default.
//! Swagger UI comes from `utoipa-swagger-ui` with its `vendored` feature:
//! its build script then unpacks the Swagger UI zip shipped inside the
//! `utoipa-swagger-ui-vendored` crate and never downloads (the download
//! branch is only taken without that feature).
//!
//! Decision: `/openapi.json` and `/docs` are public like `/healthz` (see
//! [`super::auth`]): they describe the API and expose no data, and a client
//! needs the contract before it has a key. They stay under the API's rate
//! limit, and are not themselves operations of the document.
//!
//! The document describes the server that serves it. A server without API
//! keys (open mode: every caller is the `default` tenant, as admin) serves
//! it without the bearer requirement ([`open_mode`]): there, no key is
//! needed and none is checked, and a client or a tester reading the
//! document must not expect a 401.
//!
//! Requests are held to the document by [`super::extract`]: a JSON body is
//! checked against the very schema published here before a handler sees
//! it. So the limits written into the request types (`minLength`, enums,
//! ranges, `additionalProperties: false`) are the server's limits, not a
//! description of them.
//!
//! Server-Sent Events: OpenAPI 3.1 has no keyword for the items of a
//! stream (3.2 adds `itemSchema`), so the `schema` of a
//! `text/event-stream` response describes one event, as 3.2 does for
//! `itemSchema` and as tools (schemathesis) read 3.1 documents: `{event,
//! data}`, one alternative per event name, `data` being JSON
//! (`contentMediaType`) that fits `contentSchema`. `event_stream!`
//! declares such a stream from its (event name, payload type) table.
//!
//! [`ApiJson`]: super::extract::ApiJson

use std::collections::BTreeMap;

use axum::Router;
use utoipa::openapi::example::ExampleBuilder;
use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{Content, Header, OpenApi as OpenApiDoc, Ref, RefOr, Response};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};
use utoipa_swagger_ui::SwaggerUi;

use super::error::{ErrorBody, ErrorDetail};
use crate::error_code::ErrorCode;

/// Where the document is served.
pub const SPEC_PATH: &str = "/openapi.json";
/// Where Swagger UI is served (and everything under it).
pub const DOCS_PATH: &str = "/docs";

/// Paths served without an API key: probes, the API's own description and
/// the console's static files ([`super::console`]) and the A2A agent cards
/// ([`super::a2a`]).
pub fn is_public(path: &str) -> bool {
    super::console::is_console(path)
        || super::a2a::is_card(path)
        || path == "/healthz"
        || path == "/readyz"
        || path == SPEC_PATH
        || path == DOCS_PATH
        || path.starts_with("/docs/")
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "cadre",
        description = "HTTP API of cadre, an actor-based multi-agent runtime for LLM tool calling. Every error body is `{\"error\": {\"code\", \"message\", \"details\"?}}`. With API keys configured, every operation but `/healthz` needs `Authorization: Bearer <key>`."
    ),
    security(("bearer" = [])),
    components(schemas(ErrorBody, ErrorDetail, ErrorCode)),
    tags(
        (name = "sessions", description = "Chat sessions and their turns"),
        (name = "assist", description = "Help for human operators"),
        (name = "tools", description = "The tool catalogue and direct calls"),
        (name = "calls", description = "Call records and counters"),
        (name = "confirmations", description = "Tool calls waiting for a human decision"),
        (name = "events", description = "Runtime events"),
        (name = "limits", description = "Concurrency, quotas and metrics"),
        (name = "tenants", description = "Tenant configuration and model providers"),
        (name = "keys", description = "API keys: create, list, revoke while the server runs"),
        (name = "workflows", description = "Multi-agent workflows and their runs"),
        (name = "schedules", description = "Agent turns and workflow runs on a clock, exactly once per slot"),
        (name = "webhooks", description = "Signed events when a background turn or a workflow run ends, and their delivery attempts"),
        (name = "memory", description = "Memory across sessions: a tenant's items by namespace and key, BM25 search, TTL"),
        (name = "health", description = "Liveness"),
    )
)]
pub struct ApiDoc;

/// The `ErrorCode` schema: every code of the table, each with its status
/// and meaning in the description.
impl PartialSchema for ErrorCode {
    fn schema() -> RefOr<Schema> {
        let mut description = String::from(
            "Stable, machine-readable error code. Every code, its HTTP status and meaning:\n\n| code | status | meaning |\n|---|---|---|\n",
        );
        for code in ErrorCode::ALL {
            description.push_str(&format!(
                "| `{}` | {} | {} |\n",
                code.as_str(),
                code.status().as_u16(),
                code.meaning().replace('|', "\\|")
            ));
        }
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(ErrorCode::ALL.iter().map(|c| c.as_str())))
            .description(Some(description))
            .into()
    }
}

impl ToSchema for ErrorCode {}

/// Declares the error responses of one operation, for its
/// `#[utoipa::path(responses(...))]`: a unit struct whose responses are
/// built from [`ErrorCode`] rows, grouped by status, each code with an
/// example body. A code may carry a note saying when this operation
/// answers it; otherwise its meaning from the table is shown.
///
/// ```text
/// error_responses!(GetSessionErrors: SessionNotFound, StorageUnavailable);
/// error_responses!(SendErrors: PayloadTooLarge = "the body is over 1 MiB", ...);
/// ```
macro_rules! error_responses {
    ($name:ident: $($code:ident $(= $note:literal)?),+ $(,)?) => {
        pub struct $name;

        impl utoipa::IntoResponses for $name {
            fn responses() -> std::collections::BTreeMap<
                String,
                utoipa::openapi::RefOr<utoipa::openapi::response::Response>,
            > {
                $crate::http::openapi::responses_for_codes(&[$((
                    $crate::error_code::ErrorCode::$code,
                    None::<&str> $(.or(Some($note)))?,
                )),+])
            }
        }
    };
}
pub(crate) use error_responses;

/// `impl From<Source> for View`: a response type the handler builds from a
/// value of the runtime, field by field (each through `Into`, so a field
/// may change its type on the way, e.g. an enum the document names). The
/// source is taken apart without `..`: a field it gains stops the build
/// here until the response says whether it shows it.
///
/// ```text
/// view_of!(PendingConfirmation => Pending { confirmation_id, tool_name, ... });
/// ```
macro_rules! view_of {
    ($source:ident => $view:ident { $($field:ident),+ $(,)? }) => {
        impl From<$source> for $view {
            fn from(source: $source) -> Self {
                let $source { $($field),+ } = source;
                $view { $($field: $field.into()),+ }
            }
        }
    };
}
pub(crate) use view_of;

/// The responses of a list of codes (see [`error_responses!`]).
pub fn responses_for_codes(
    codes: &[(ErrorCode, Option<&str>)],
) -> BTreeMap<String, RefOr<Response>> {
    let mut out: BTreeMap<String, RefOr<Response>> = BTreeMap::new();
    for &(code, note) in codes {
        let status = code.status().as_u16().to_string();
        let entry = out
            .entry(status)
            .or_insert_with(|| RefOr::T(error_response()));
        if let RefOr::T(response) = entry {
            add_code(response, code, note);
        }
    }
    out
}

/// An error response without codes yet; its body is [`ErrorBody`].
fn error_response() -> Response {
    let mut response = Response::new("");
    response.content.insert(
        "application/json".into(),
        RefOr::T(Content::new(Some(Ref::from_schema_name("ErrorBody")))),
    );
    response
}

/// Adds a code to a response: a line of its description and an example
/// body named after the code. A code already there is left as it is.
pub(crate) fn add_code(response: &mut Response, code: ErrorCode, note: Option<&str>) {
    let entry = response
        .content
        .entry("application/json".into())
        .or_insert_with(|| RefOr::T(Content::new(Some(Ref::from_schema_name("ErrorBody")))));
    let RefOr::T(content) = entry else {
        return;
    };
    if content.examples.contains_key(code.as_str()) {
        return;
    }
    let text = note.unwrap_or(code.meaning());
    let example = serde_json::json!({"error": {"code": code, "message": text.replace('`', "")}});
    content.examples.insert(
        code.as_str().into(),
        RefOr::T(ExampleBuilder::new().value(Some(example)).build()),
    );
    let line = format!("`{}`: {text}", code.as_str());
    response.description = if response.description.is_empty() {
        line
    } else {
        format!("{}; {line}", response.description)
    };
}

/// Adds the bearer scheme and the error responses every operation can give;
/// applied once the routers have added their paths.
pub struct CommonErrors;

fn add(op: &mut Operation, code: ErrorCode, note: &str) {
    let status = code.status().as_u16().to_string();
    let entry = op
        .responses
        .responses
        .entry(status)
        .or_insert_with(|| RefOr::T(error_response()));
    if let RefOr::T(response) = entry {
        add_code(response, code, Some(note));
    }
}

impl Modify for CommonErrors {
    fn modify(&self, openapi: &mut OpenApiDoc) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
        for (path, item) in openapi.paths.paths.iter_mut() {
            let ops = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.patch,
                &mut item.delete,
            ];
            for op in ops.into_iter().flatten() {
                if !is_public(path) {
                    add(
                        op,
                        ErrorCode::Unauthorized,
                        ErrorCode::Unauthorized.meaning(),
                    );
                }
                add(op, ErrorCode::RateLimited, ErrorCode::RateLimited.meaning());
                if let Some(RefOr::T(r)) = op.responses.responses.get_mut("429") {
                    r.headers.entry("Retry-After".into()).or_insert_with(|| {
                        RefOr::T(Header::new(ObjectBuilder::new().schema_type(Type::Integer)))
                    });
                }
                let has_query = op.parameters.iter().flatten().any(|p| match p {
                    RefOr::T(p) => {
                        matches!(p.parameter_in, utoipa::openapi::path::ParameterIn::Query)
                    }
                    RefOr::Ref(_) => false,
                });
                if has_query {
                    add(
                        op,
                        ErrorCode::ValidationError,
                        "a query parameter is missing, repeated, out of range or does not parse",
                    );
                }
                if op.request_body.is_some() {
                    add(op, ErrorCode::MalformedJson, "the body is not JSON");
                    add(op, ErrorCode::PayloadTooLarge, "the body is over 1 MiB");
                    add(
                        op,
                        ErrorCode::UnsupportedMediaType,
                        ErrorCode::UnsupportedMediaType.meaning(),
                    );
                    add(
                        op,
                        ErrorCode::ValidationError,
                        "a field is missing, unknown or of the wrong type",
                    );
                }
            }
        }
    }
}

/// The document of a server without API keys: no operation needs a key.
pub fn open_mode(doc: &mut OpenApiDoc) {
    doc.security = Some(Vec::new());
    // Open mode answers only loopback names (see `super::host`).
    for item in doc.paths.paths.values_mut() {
        let ops = [
            &mut item.get,
            &mut item.post,
            &mut item.put,
            &mut item.patch,
            &mut item.delete,
        ];
        for op in ops.into_iter().flatten() {
            add(
                op,
                ErrorCode::ForbiddenHost,
                ErrorCode::ForbiddenHost.meaning(),
            );
        }
    }
    doc.info.description = Some(format!(
        "{} This server runs without API keys (open mode): no `Authorization` is needed or checked, and every request is the `default` tenant with admin rights.",
        doc.info.description.as_deref().unwrap_or_default()
    ));
}

/// The schema of one event of a Server-Sent Events stream (see the module
/// doc): one alternative per `(event name, payload schema name)`.
pub fn sse_events(events: &[(&str, std::borrow::Cow<'static, str>)]) -> RefOr<Schema> {
    let mut one_of = OneOfBuilder::new();
    for (name, payload) in events {
        let event = ObjectBuilder::new()
            .property(
                "event",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some([*name])),
            )
            .required("event")
            .property(
                "data",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .content_media_type("application/json")
                    .content_schema(Some(Ref::from_schema_name(payload.as_ref()))),
            )
            .required("data");
        one_of = one_of.item(event);
    }
    one_of
        .description(Some(
            "One event of the stream: `event` names it, `data` is its JSON payload.",
        ))
        .into()
}

/// Declares a type standing for a Server-Sent Events stream, as its table
/// of event names and payload types; use it as the `text/event-stream`
/// body of a `#[utoipa::path]` response.
macro_rules! event_stream {
    ($(#[$doc:meta])* $name:ident { $($event:literal => $data:ty),* $(,)? }) => {
        $(#[$doc])*
        pub struct $name;

        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                $crate::http::openapi::sse_events(&[
                    $(($event, <$data as utoipa::ToSchema>::name())),*
                ])
            }
        }

        impl utoipa::ToSchema for $name {
            fn schemas(
                schemas: &mut Vec<(
                    String,
                    utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
                )>,
            ) {
                $(
                    schemas.push((
                        <$data as utoipa::ToSchema>::name().into(),
                        <$data as utoipa::PartialSchema>::schema(),
                    ));
                    <$data as utoipa::ToSchema>::schemas(schemas);
                )*
            }
        }
    };
}
pub(crate) use event_stream;

/// `lagged`: the subscriber fell behind and missed this many events; the
/// stream goes on.
#[derive(serde::Serialize, ToSchema)]
pub struct Lagged {
    missed: u64,
}

impl Lagged {
    /// The `lagged` event of a subscriber that missed `missed` events.
    pub fn event(missed: u64) -> axum::response::sse::Event {
        axum::response::sse::Event::default()
            .event("lagged")
            .data(serde_json::to_string(&Lagged { missed }).unwrap_or_default())
    }
}

/// `GET /openapi.json` and Swagger UI under `/docs`, over `doc` in the
/// shapes client generators read ([`super::client_shapes`]).
pub fn routes<S: Clone + Send + Sync + 'static>(doc: OpenApiDoc) -> Router<S> {
    SwaggerUi::new(DOCS_PATH)
        .external_url_unchecked(SPEC_PATH, super::client_shapes::for_generators(&doc))
        .into()
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    /// Schemas left as a bare `{"type": "object"}` on purpose, by their
    /// place in the document, with the reason.
    const UNTYPED_ON_PURPOSE: [(&str, &str); 0] = [];

    /// Where `value` (a part of the document at `at`) holds an object
    /// schema that names neither its fields (`properties`) nor its values
    /// (`additionalProperties`): a generated client can only call it
    /// "any object". Examples are values, not schemas, and are skipped.
    fn untyped_objects(value: &Value, at: &str, found: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                let is_object = match map.get("type") {
                    Some(Value::String(t)) => t == "object",
                    Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
                    _ => false,
                };
                let described = [
                    "properties",
                    "additionalProperties",
                    "patternProperties",
                    "$ref",
                    "oneOf",
                    "anyOf",
                    "allOf",
                ]
                .iter()
                .any(|k| map.contains_key(*k));
                if is_object && !described {
                    found.push(at.to_string());
                }
                for (key, inner) in map {
                    if key == "example" || key == "examples" {
                        continue;
                    }
                    let key = key.replace('~', "~0").replace('/', "~1");
                    untyped_objects(inner, &format!("{at}/{key}"), found);
                }
            }
            Value::Array(items) => {
                for (i, inner) in items.iter().enumerate() {
                    untyped_objects(inner, &format!("{at}/{i}"), found);
                }
            }
            _ => {}
        }
    }

    fn document() -> Value {
        let (_, doc) = crate::http::routes();
        serde_json::to_value(doc).expect("the document serializes")
    }

    #[test]
    fn every_object_in_the_document_declares_its_fields() {
        let doc = document();
        let mut found = Vec::new();
        untyped_objects(&doc["paths"], "#/paths", &mut found);
        untyped_objects(&doc["components"], "#/components", &mut found);
        found.retain(|at| !UNTYPED_ON_PURPOSE.iter().any(|(p, _)| p == at));
        assert!(
            found.is_empty(),
            "{} objects without declared fields:\n{}",
            found.len(),
            found.join("\n")
        );
    }

    #[test]
    fn a_lagged_event_says_how_many_were_missed() {
        let data = serde_json::to_string(&super::Lagged { missed: 3 }).unwrap();
        assert_eq!(data, r#"{"missed":3}"#);
    }

    #[test]
    fn the_walk_finds_an_untyped_object() {
        let mut doc = document();
        doc["components"]["schemas"]["Probe"] = serde_json::json!({
            "type": "object",
            "properties": {"inner": {"type": ["object", "null"]}}
        });
        let mut found = Vec::new();
        untyped_objects(&doc["components"], "#/components", &mut found);
        assert!(
            found.contains(&"#/components/schemas/Probe/properties/inner".to_string()),
            "{found:?}"
        );
    }
}
