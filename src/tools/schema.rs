//! Parameter declarations → one JSON Schema.
//!
//! tool file `parameters:` ──(list form | JSON Schema object)──▶ JSON Schema ──▶ validator, OpenAI export
//!
//! The list form is the ToolEngine's: `[{name, type, required, default,
//! description, validation {pattern, min_length, max_length, enum, min, max,
//! items, min_items, max_items, properties, required}}]`. Each entry becomes
//! a property; `validation` keys map to their JSON Schema keywords
//! (`min_length` → `minLength`, `min` → `minimum`, ...). In `items` and
//! `properties` a bare type name (`string`) stands for `{"type": "string"}`;
//! a map is taken as a schema. A JSON Schema object is used as it is.

use serde::Deserialize;
use serde_json::{Map, Value, json};

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Parameters {
    List(Vec<ParamSpec>),
    Schema(Map<String, Value>),
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters::List(Vec::new())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamSpec {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: ParamType,
    #[serde(default)]
    pub required: bool,
    #[serde(default)]
    pub default: Option<Value>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub validation: Option<ValidationSpec>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParamType {
    String,
    Number,
    Integer,
    Boolean,
    Array,
    Object,
}

impl ParamType {
    fn as_str(self) -> &'static str {
        match self {
            ParamType::String => "string",
            ParamType::Number => "number",
            ParamType::Integer => "integer",
            ParamType::Boolean => "boolean",
            ParamType::Array => "array",
            ParamType::Object => "object",
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidationSpec {
    pub pattern: Option<String>,
    pub min_length: Option<u64>,
    pub max_length: Option<u64>,
    #[serde(rename = "enum")]
    pub one_of: Option<Vec<Value>>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub items: Option<Value>,
    pub min_items: Option<u64>,
    pub max_items: Option<u64>,
    pub properties: Option<Map<String, Value>>,
    pub required: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SchemaSpecError {
    #[error("parameter '{name}' is declared twice")]
    DuplicateParameter { name: String },
    #[error("parameter '{name}': validation '{key}' does not apply to type {kind}")]
    NotApplicable {
        name: String,
        key: &'static str,
        kind: &'static str,
    },
    #[error("the parameters schema must have \"type\": \"object\"")]
    NotAnObject,
}

/// Compiles either form to an object schema.
pub fn to_json_schema(params: &Parameters) -> Result<Value, SchemaSpecError> {
    match params {
        Parameters::Schema(map) => {
            let schema = Value::Object(map.clone());
            match schema.get("type") {
                Some(t) if t == "object" => Ok(schema),
                None if schema.get("properties").is_some() => {
                    let mut s = map.clone();
                    s.insert("type".into(), json!("object"));
                    Ok(Value::Object(s))
                }
                _ => Err(SchemaSpecError::NotAnObject),
            }
        }
        Parameters::List(list) => {
            let mut properties = Map::new();
            let mut required = Vec::new();
            for p in list {
                if properties.contains_key(&p.name) {
                    return Err(SchemaSpecError::DuplicateParameter {
                        name: p.name.clone(),
                    });
                }
                properties.insert(p.name.clone(), param_schema(p)?);
                if p.required {
                    required.push(json!(p.name));
                }
            }
            let mut schema = json!({"type": "object", "properties": properties});
            if !required.is_empty() {
                schema["required"] = Value::Array(required);
            }
            Ok(schema)
        }
    }
}

fn param_schema(p: &ParamSpec) -> Result<Value, SchemaSpecError> {
    let kind = p.kind.as_str();
    let mut s = Map::new();
    s.insert("type".into(), json!(kind));
    if let Some(d) = &p.description {
        s.insert("description".into(), json!(d));
    }
    if let Some(d) = &p.default {
        s.insert("default".into(), d.clone());
    }
    let Some(v) = &p.validation else {
        return Ok(Value::Object(s));
    };
    let check = |key: &'static str, ok: bool| {
        if ok {
            Ok(())
        } else {
            Err(SchemaSpecError::NotApplicable {
                name: p.name.clone(),
                key,
                kind,
            })
        }
    };
    let is = |t: ParamType| p.kind == t;
    let numeric = is(ParamType::Number) || is(ParamType::Integer);
    if let Some(x) = &v.pattern {
        check("pattern", is(ParamType::String))?;
        s.insert("pattern".into(), json!(x));
    }
    if let Some(x) = v.min_length {
        check("min_length", is(ParamType::String))?;
        s.insert("minLength".into(), json!(x));
    }
    if let Some(x) = v.max_length {
        check("max_length", is(ParamType::String))?;
        s.insert("maxLength".into(), json!(x));
    }
    if let Some(x) = &v.one_of {
        s.insert("enum".into(), json!(x));
    }
    if let Some(x) = v.min {
        check("min", numeric)?;
        s.insert("minimum".into(), number(x));
    }
    if let Some(x) = v.max {
        check("max", numeric)?;
        s.insert("maximum".into(), number(x));
    }
    if let Some(x) = &v.items {
        check("items", is(ParamType::Array))?;
        s.insert("items".into(), type_or_schema(x));
    }
    if let Some(x) = v.min_items {
        check("min_items", is(ParamType::Array))?;
        s.insert("minItems".into(), json!(x));
    }
    if let Some(x) = v.max_items {
        check("max_items", is(ParamType::Array))?;
        s.insert("maxItems".into(), json!(x));
    }
    if let Some(props) = &v.properties {
        check("properties", is(ParamType::Object))?;
        let props: Map<String, Value> = props
            .iter()
            .map(|(k, v)| (k.clone(), type_or_schema(v)))
            .collect();
        s.insert("properties".into(), Value::Object(props));
    }
    if let Some(req) = &v.required {
        check("required", is(ParamType::Object))?;
        s.insert("required".into(), json!(req));
    }
    Ok(Value::Object(s))
}

/// Whole numbers stay integers so `maximum: 300` reads as written.
fn number(x: f64) -> Value {
    if x.fract() == 0.0 && x.abs() < 9.0e15 {
        json!(x as i64)
    } else {
        json!(x)
    }
}

fn type_or_schema(v: &Value) -> Value {
    match v {
        Value::String(t) if t == "any" => json!({}),
        Value::String(t) => json!({ "type": t }),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(yaml: &str) -> Parameters {
        yaml_serde::from_str(yaml).unwrap()
    }

    #[test]
    fn the_list_form_compiles_every_validation_key() {
        let p = list(
            r#"
- name: url
  type: string
  required: true
  validation: { pattern: "^https?://", min_length: 8, max_length: 2048 }
- name: method
  type: string
  default: GET
  validation: { enum: [GET, POST] }
- name: timeout
  type: number
  default: 30
  validation: { min: 1, max: 300 }
- name: tags
  type: array
  validation: { items: string, min_items: 1, max_items: 3 }
- name: body
  type: object
  validation: { properties: { a: integer, b: { type: string } }, required: [a] }
"#,
        );
        let s = to_json_schema(&p).unwrap();
        assert_eq!(s["required"], json!(["url"]));
        let props = &s["properties"];
        assert_eq!(
            props["url"],
            json!({"type": "string", "pattern": "^https?://", "minLength": 8, "maxLength": 2048})
        );
        assert_eq!(props["method"]["enum"], json!(["GET", "POST"]));
        assert_eq!(props["method"]["default"], "GET");
        assert_eq!(props["timeout"]["minimum"], 1);
        assert_eq!(props["timeout"]["maximum"], 300);
        assert_eq!(props["tags"]["items"], json!({"type": "string"}));
        assert_eq!(
            (
                props["tags"]["minItems"].clone(),
                props["tags"]["maxItems"].clone()
            ),
            (json!(1), json!(3))
        );
        assert_eq!(props["body"]["properties"]["a"], json!({"type": "integer"}));
        assert_eq!(props["body"]["required"], json!(["a"]));
    }

    #[test]
    fn a_json_schema_object_is_taken_as_is() {
        let p: Parameters = serde_json::from_value(json!({
            "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]
        }))
        .unwrap();
        assert_eq!(to_json_schema(&p).unwrap()["required"], json!(["q"]));
        let bad: Parameters = serde_json::from_value(json!({"type": "string"})).unwrap();
        assert_eq!(to_json_schema(&bad), Err(SchemaSpecError::NotAnObject));
    }

    #[test]
    fn misplaced_validation_and_duplicates_are_refused() {
        let p = list("- {name: n, type: integer, validation: {pattern: x}}");
        assert!(matches!(
            to_json_schema(&p),
            Err(SchemaSpecError::NotApplicable { key: "pattern", .. })
        ));
        let p = list("- {name: n, type: string}\n- {name: n, type: string}");
        assert!(matches!(
            to_json_schema(&p),
            Err(SchemaSpecError::DuplicateParameter { .. })
        ));
    }
}
