//! The OpenAPI document in the shapes client generators read (issue #32).
//!
//! handlers' annotations ──utoipa──▶ document ──[`for_generators`]──▶ /openapi.json
//!
//! utoipa writes a struct with a `#[serde(flatten)]`ed tagged enum (a
//! turn's record and its phase, a workflow event and its kind) and an
//! enum variant holding a struct (a tool call's report in the turn
//! events) as `allOf` of the two schemas. That is valid JSON Schema, but
//! `openapi-python-client` cannot take `allOf` over a `oneOf` ("Cannot
//! take allOf a non-object") nor inside a union, and drops the model,
//! then every operation that answers it. It also names an inline map
//! inside a union alternative twice ("duplicate models"). So, once, when
//! the router is built, the document is rewritten into equivalent
//! schemas:
//! - `allOf: [oneOf [A1, A2, ...], B]` becomes `oneOf [A1 ∪ B, A2 ∪ B, ...]`
//!   (each alternative with B's properties and required fields added);
//! - `allOf: [A, B]` of two objects becomes the one object `A ∪ B`;
//! - an inline map (`additionalProperties`, no `properties`) that is a
//!   property of a union alternative becomes a named component,
//!   `<Schema><Property>` (e.g. `EntryEnvSet`).
//!
//! The validator of request bodies ([`super::extract`]) reads the same
//! document; none of the rewritten schemas is a request body. The
//! generated-clients test (`tests/generated_clients.rs`) generates with
//! `openapi-python-client` and `openapi-typescript` and fails on any
//! warning.

use serde_json::{Map, Value};
use utoipa::openapi::OpenApi as OpenApiDoc;

/// The document served: `doc` as JSON, rewritten as the module doc says.
/// (As JSON: utoipa's types do not read back every schema they write.)
pub fn for_generators(doc: &OpenApiDoc) -> Value {
    let mut value = serde_json::to_value(doc).unwrap_or_default();
    let schemas = value["components"]["schemas"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    merge_all_of(&mut value, &schemas);
    name_inline_maps(&mut value);
    value
}

/// The schema `schema` names, if it is a `$ref` to a component.
fn resolve<'a>(schema: &'a Value, schemas: &'a Map<String, Value>) -> &'a Value {
    schema["$ref"]
        .as_str()
        .and_then(|r| r.strip_prefix("#/components/schemas/"))
        .and_then(|name| schemas.get(name))
        .unwrap_or(schema)
}

fn is_object(schema: &Value) -> bool {
    schema["type"] == "object" && schema.get("oneOf").is_none() && schema.get("allOf").is_none()
}

/// `a` with `b`'s properties and required fields.
fn union(a: &Value, b: &Value) -> Value {
    let mut out = a.clone();
    out["type"] = "object".into();
    // (`out` is an object: `a` is an object schema.)
    let properties = out
        .as_object_mut()
        .expect("an object schema")
        .entry("properties")
        .or_insert_with(|| Value::Object(Map::new()));
    if let (Some(to), Some(from)) = (properties.as_object_mut(), b["properties"].as_object()) {
        for (k, v) in from {
            to.insert(k.clone(), v.clone());
        }
    }
    let mut required: Vec<Value> = out["required"].as_array().cloned().unwrap_or_default();
    for r in b["required"].as_array().into_iter().flatten() {
        if !required.contains(r) {
            required.push(r.clone());
        }
    }
    out["required"] = Value::Array(required);
    out
}

fn merge_all_of(value: &mut Value, schemas: &Map<String, Value>) {
    match value {
        Value::Object(map) => {
            for v in map.values_mut() {
                merge_all_of(v, schemas);
            }
            let Some(Value::Array(parts)) = map.get("allOf") else {
                return;
            };
            let [a, b] = parts.as_slice() else { return };
            let (a, b) = (resolve(a, schemas), resolve(b, schemas));
            let merged = match (a.get("oneOf"), is_object(a), is_object(b)) {
                (Some(Value::Array(alternatives)), _, true)
                    if alternatives
                        .iter()
                        .all(|alt| is_object(resolve(alt, schemas))) =>
                {
                    let alternatives: Vec<Value> = alternatives
                        .iter()
                        .map(|alt| union(resolve(alt, schemas), b))
                        .collect();
                    let mut out = Map::new();
                    out.insert("oneOf".into(), Value::Array(alternatives));
                    out
                }
                (None, true, true) => union(a, b).as_object().cloned().unwrap_or_default(),
                _ => return,
            };
            map.remove("allOf");
            for (k, v) in merged {
                // The outer description stays (it is the field's).
                if k == "description" && map.contains_key("description") {
                    continue;
                }
                map.insert(k, v);
            }
        }
        Value::Array(items) => {
            for v in items {
                merge_all_of(v, schemas);
            }
        }
        _ => {}
    }
}

fn camel(name: &str) -> String {
    name.split(['_', '-'])
        .map(|p| {
            let mut c = p.chars();
            c.next()
                .map(|f| f.to_uppercase().chain(c).collect::<String>())
                .unwrap_or_default()
        })
        .collect()
}

fn is_inline_map(schema: &Value) -> bool {
    (schema["type"] == "object" || is_nullable_object(schema))
        && schema.get("additionalProperties").is_some()
        && schema.get("properties").is_none()
}

/// `type: ["object", "null"]` (an optional map, e.g. a turn's `output`).
fn is_nullable_object(schema: &Value) -> bool {
    schema["type"] == serde_json::json!(["object", "null"])
}

fn name_inline_maps(doc: &mut Value) {
    let Some(schemas) = doc["components"]["schemas"].as_object_mut() else {
        return;
    };
    let mut named = Vec::new();
    for (name, schema) in schemas.iter_mut() {
        // `get_mut`: indexing a map mutably would insert what is missing.
        let alternatives = schema.get_mut("oneOf").and_then(Value::as_array_mut);
        for alternative in alternatives.into_iter().flatten() {
            let properties = alternative
                .get_mut("properties")
                .and_then(Value::as_object_mut);
            for (field, property) in properties.into_iter().flatten() {
                if is_inline_map(property) {
                    let component = format!("{name}{}", camel(field));
                    let nullable = is_nullable_object(property);
                    let mut map = property.take();
                    let reference =
                        serde_json::json!({ "$ref": format!("#/components/schemas/{component}") });
                    // A nullable map stays nullable: the named map or null.
                    *property = if nullable {
                        map["type"] = "object".into();
                        let description = map.get("description").cloned();
                        let mut either =
                            serde_json::json!({"oneOf": [reference, {"type": "null"}]});
                        if let Some(d) = description {
                            either["description"] = d;
                        }
                        either
                    } else {
                        reference
                    };
                    named.push((component.clone(), map));
                }
            }
        }
    }
    for (component, schema) in named {
        schemas.insert(component, schema);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn all_of_over_a_one_of_becomes_a_one_of_of_unions() {
        let mut doc = json!({"components": {"schemas": {
            "Phase": {"oneOf": [
                {"type": "object", "required": ["phase"], "properties": {"phase": {"enum": ["idle"]}}},
                {"type": "object", "required": ["phase", "calls"], "properties": {"phase": {"enum": ["tools"]}, "calls": {"type": "array"}}}
            ]},
            "Record": {"allOf": [{"$ref": "#/components/schemas/Phase"},
                {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}]}
        }}});
        let schemas = doc["components"]["schemas"].as_object().cloned().unwrap();
        merge_all_of(&mut doc, &schemas);
        let record = &doc["components"]["schemas"]["Record"];
        assert!(record.get("allOf").is_none());
        let alternatives = record["oneOf"].as_array().unwrap();
        assert_eq!(alternatives.len(), 2);
        assert_eq!(alternatives[1]["required"], json!(["phase", "calls", "id"]));
        assert_eq!(alternatives[0]["properties"]["id"]["type"], "string");
    }

    #[test]
    fn an_inline_map_in_a_union_becomes_a_named_component() {
        let mut doc = json!({"components": {"schemas": {
            "Entry": {"oneOf": [{"type": "object", "properties": {
                "env_set": {"type": "object", "additionalProperties": {"type": "string"}}}}]}
        }}});
        name_inline_maps(&mut doc);
        let schemas = &doc["components"]["schemas"];
        assert_eq!(
            schemas["Entry"]["oneOf"][0]["properties"]["env_set"]["$ref"],
            "#/components/schemas/EntryEnvSet"
        );
        assert_eq!(
            schemas["EntryEnvSet"]["additionalProperties"]["type"],
            "string"
        );
    }

    #[test]
    fn a_nullable_inline_map_in_a_union_stays_nullable() {
        let mut doc = json!({"components": {"schemas": {
            "Reply": {"oneOf": [{"type": "object", "properties": {
                "output": {"type": ["object", "null"], "additionalProperties": {}, "description": "d"}}}]}
        }}});
        name_inline_maps(&mut doc);
        let schemas = &doc["components"]["schemas"];
        let output = &schemas["Reply"]["oneOf"][0]["properties"]["output"];
        assert_eq!(
            output["oneOf"][0]["$ref"],
            "#/components/schemas/ReplyOutput"
        );
        assert_eq!(output["oneOf"][1]["type"], "null");
        assert_eq!(output["description"], "d");
        assert_eq!(schemas["ReplyOutput"]["type"], "object");
    }

    #[test]
    fn the_served_document_has_no_all_of_left() {
        let (_, doc) = crate::http::routes();
        assert!(serde_json::to_string(&doc).unwrap().contains("\"allOf\""));
        let served = for_generators(&doc).to_string();
        assert!(!served.contains("\"allOf\""), "an allOf is left");
    }
}
