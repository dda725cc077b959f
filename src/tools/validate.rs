//! Parameter validation: raw model arguments in, validated parameters out.
//!
//! executor ──(raw arguments)──▶ ParamValidator ──▶ params with defaults | every field error
//!
//! Each tool's JSON Schema is compiled once (jsonschema, no remote `$ref`)
//! when the tool is registered. Validation reports every error found, not
//! just the first, as `{field, code, message}`; `field` is the parameter's
//! dotted path and `code` the schema keyword that failed. Defaults declared
//! on top-level properties are filled in before validation. At most
//! [`MAX_FIELD_ERRORS`] errors are kept, each message cut at
//! [`MAX_MESSAGE_BYTES`]: the messages quote the offending value, and they
//! are stored in the call's record.

use serde_json::Value;

use super::FieldError;
use super::outcome::{ArgumentsProblem, MAX_ARGUMENT_DEPTH, ParsedArguments};

pub struct ParamValidator {
    schema: Value,
    compiled: jsonschema::Validator,
}

#[derive(Debug, thiserror::Error)]
#[error("invalid parameter schema: {0}")]
pub struct SchemaError(pub String);

impl ParamValidator {
    /// `strict` also refuses parameters the schema does not declare (unless
    /// the schema says otherwise with its own `additionalProperties`).
    pub fn new(schema: &Value, strict: bool) -> Result<Self, SchemaError> {
        let mut checked = schema.clone();
        if strict
            && let Some(obj) = checked.as_object_mut()
            && !obj.contains_key("additionalProperties")
        {
            obj.insert("additionalProperties".into(), Value::Bool(false));
        }
        let compiled =
            jsonschema::validator_for(&checked).map_err(|e| SchemaError(e.to_string()))?;
        Ok(ParamValidator {
            schema: schema.clone(),
            compiled,
        })
    }

    /// Parses the model's raw argument string, then validates it.
    /// An empty string counts as `{}` (some models send it for no arguments).
    pub fn validate_raw(&self, raw: &str) -> Result<Value, Vec<FieldError>> {
        self.validate_parsed(&ParsedArguments::parse(raw))
    }

    /// Validates arguments parsed once where the model's reply arrived.
    pub fn validate_parsed(&self, args: &ParsedArguments) -> Result<Value, Vec<FieldError>> {
        match &args.problem {
            None => self.validate(args.value.clone()),
            Some(ArgumentsProblem::NotJson(e)) => Err(vec![FieldError {
                field: String::new(),
                code: "invalid_json".into(),
                message: format!("arguments are not valid JSON: {e}"),
            }]),
            Some(ArgumentsProblem::TooDeep) => Err(vec![FieldError {
                field: String::new(),
                code: "depth".into(),
                message: format!("arguments nest more than {MAX_ARGUMENT_DEPTH} levels deep"),
            }]),
        }
    }

    pub fn validate(&self, mut params: Value) -> Result<Value, Vec<FieldError>> {
        let Some(obj) = params.as_object_mut() else {
            return Err(vec![FieldError {
                field: String::new(),
                code: "type".into(),
                message: format!(
                    "arguments must be a JSON object, got {}",
                    json_type_name(&params)
                ),
            }]);
        };
        if let Some(props) = self.schema.get("properties").and_then(Value::as_object) {
            for (name, prop) in props {
                if let Some(default) = prop.get("default") {
                    obj.entry(name.clone()).or_insert_with(|| default.clone());
                }
            }
        }
        let errors: Vec<FieldError> = self
            .compiled
            .iter_errors(&params)
            .map(|e| {
                let mut field = pointer_to_dotted(e.instance_path().as_str());
                if let jsonschema::error::ValidationErrorKind::Required { property } = e.kind() {
                    let name = property.as_str().unwrap_or_default();
                    field = if field.is_empty() {
                        name.to_string()
                    } else {
                        format!("{field}.{name}")
                    };
                }
                FieldError {
                    field,
                    code: e.kind().keyword().to_string(),
                    message: clipped(e.to_string()),
                }
            })
            .take(MAX_FIELD_ERRORS)
            .collect();
        if errors.is_empty() {
            Ok(params)
        } else {
            Err(errors)
        }
    }
}

/// Errors kept per validation: an array of thousands of bad items is
/// reported by its first ones.
pub const MAX_FIELD_ERRORS: usize = 32;
/// Bytes of one error's message: the schema crate quotes the offending
/// value whole, and a call's record keeps the messages (a 1 MiB argument
/// made a 2.2 MB record, issue #29).
pub const MAX_MESSAGE_BYTES: usize = 512;

fn clipped(mut message: String) -> String {
    if message.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str("… (cut)");
    }
    message
}

fn pointer_to_dotted(pointer: &str) -> String {
    pointer
        .trim_start_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect::<Vec<_>>()
        .join(".")
}

/// `a string`, `an object`...: a value's JSON type, for messages.
pub fn json_type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The field errors in one text, `field: message` each (the message
/// alone for the arguments as a whole), joined by `separator`.
pub fn describe_errors(errors: &[FieldError], separator: &str) -> String {
    errors
        .iter()
        .map(|e| {
            if e.field.is_empty() {
                e.message.clone()
            } else {
                format!("{}: {}", e.field, e.message)
            }
        })
        .collect::<Vec<_>>()
        .join(separator)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn validator() -> ParamValidator {
        ParamValidator::new(
            &json!({
                "type": "object",
                "properties": {
                    "expression": {"type": "string", "maxLength": 10},
                    "precision": {"type": "integer", "default": 2}
                },
                "required": ["expression"],
                "additionalProperties": false
            }),
            false,
        )
        .unwrap()
    }

    #[test]
    fn fills_defaults_and_accepts_valid_arguments() {
        let v = validator().validate_raw(r#"{"expression":"1+1"}"#).unwrap();
        assert_eq!(v, json!({"expression": "1+1", "precision": 2}));
    }

    #[test]
    fn reports_every_error_with_its_field() {
        let errs = validator()
            .validate_raw(r#"{"precision":"x","extra":1}"#)
            .unwrap_err();
        let mut codes: Vec<_> = errs
            .iter()
            .map(|e| (e.field.as_str(), e.code.as_str()))
            .collect();
        codes.sort();
        assert_eq!(
            codes,
            [
                ("", "additionalProperties"),
                ("expression", "required"),
                ("precision", "type")
            ]
        );
    }

    #[test]
    fn strict_mode_refuses_undeclared_parameters() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        let lax = ParamValidator::new(&schema, false).unwrap();
        assert!(lax.validate(json!({"a": "x", "b": 1})).is_ok());
        let strict = ParamValidator::new(&schema, true).unwrap();
        let errs = strict.validate(json!({"a": "x", "b": 1})).unwrap_err();
        assert_eq!(errs[0].code, "additionalProperties");
    }

    #[test]
    fn a_huge_bad_value_is_not_quoted_whole_and_errors_are_capped() {
        let v = ParamValidator::new(
            &json!({
                "type": "object",
                "properties": {
                    "s": {"type": "string", "maxLength": 4},
                    "a": {"type": "array", "items": {"type": "integer"}}
                }
            }),
            false,
        )
        .unwrap();
        let errs = v
            .validate(json!({"s": "\u{1}".repeat(100_000)}))
            .unwrap_err();
        assert_eq!(errs.len(), 1);
        assert!(
            errs[0].message.len() <= MAX_MESSAGE_BYTES + 16,
            "{}",
            errs[0].message.len()
        );
        assert!(errs[0].message.ends_with("(cut)"), "{}", errs[0].message);
        let errs = v.validate(json!({"a": vec!["x"; 1000]})).unwrap_err();
        assert_eq!(errs.len(), MAX_FIELD_ERRORS);
    }

    #[test]
    fn malformed_json_and_non_objects_are_field_errors() {
        let errs = validator().validate_raw("{not json").unwrap_err();
        assert_eq!(errs[0].code, "invalid_json");
        let errs = validator().validate_raw("[1,2]").unwrap_err();
        assert_eq!(errs[0].code, "type");
        assert!(errs[0].message.contains("an array"));
    }
}
