//! Typed answers (issue #39): the JSON shape an agent promises, compiled
//! once and checked against each answer with the validator tool
//! parameters use ([`super::validate::ParamValidator`]).
//!
//! agent file `output_schema` ─┐
//!                             ├─▶ [`OutputSchema::new`] ──▶ turn settings ──▶ model request (`response_format`)
//! message `response_format` ──┘                                  answer ──▶ [`OutputSchema::check`] ──▶ `output` | field errors
//!
//! Decisions:
//! - the answer is a JSON object: a schema's root `type`, when given, is
//!   `object` (OpenAI's structured outputs require an object root), and
//!   the validator takes only objects and fills top-level defaults as it
//!   does for tool parameters;
//! - a schema is at most [`MAX_SCHEMA_BYTES`] of JSON and its name
//!   `^[A-Za-z0-9_-]{1,64}$` (OpenAI's rule), so any endpoint takes it;
//! - an answer is read as JSON after trimming whitespace and one Markdown
//!   code fence around it (models add them even when asked not to);
//!   nothing else is repaired;
//! - the validator is not strict: properties the schema does not declare
//!   pass unless the schema says `additionalProperties = false`.

use std::sync::Arc;

use serde_json::Value;

use super::FieldError;
use super::validate::ParamValidator;
use crate::model::ResponseFormat;

/// Most bytes of JSON an output schema may take.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;

/// A [`ResponseFormat`] with its validator.
pub struct OutputSchema {
    pub format: Arc<ResponseFormat>,
    /// Asked for by the turn's message (kept in the turn's record, so a
    /// resumed turn asks for it again) rather than by the agent file.
    pub from_message: bool,
    validator: ParamValidator,
}

impl std::fmt::Debug for OutputSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputSchema")
            .field("name", &self.format.name)
            .field("from_message", &self.from_message)
            .finish()
    }
}

impl OutputSchema {
    /// Checks and compiles `format`; the error says what is wrong.
    pub fn new(format: ResponseFormat, from_message: bool) -> Result<OutputSchema, String> {
        let name_ok = !format.name.is_empty()
            && format.name.len() <= 64
            && format
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !name_ok {
            return Err(format!(
                "the schema's name {:?} must be 1 to 64 letters, digits, '_' or '-'",
                crate::tools::outcome::cut_chars(&format.name, 80)
            ));
        }
        let Some(root) = format.schema.as_object() else {
            return Err("the schema must be a JSON object".into());
        };
        // No `type` at all is fine: the validator takes only objects.
        let object_root = match root.get("type") {
            None => true,
            Some(t) => t.as_str() == Some("object"),
        };
        if !object_root {
            return Err(
                "the schema's root must describe an object (`type = \"object\"`): the answer is a JSON object"
                    .into(),
            );
        }
        let bytes = serde_json::to_vec(&format.schema).map_or(0, |v| v.len());
        if bytes > MAX_SCHEMA_BYTES {
            return Err(format!(
                "the schema is {bytes} bytes of JSON, more than {MAX_SCHEMA_BYTES}"
            ));
        }
        let validator = ParamValidator::new(&format.schema, false).map_err(|e| e.to_string())?;
        Ok(OutputSchema {
            format: Arc::new(format),
            from_message,
            validator,
        })
    }

    /// The answer as JSON that matches the schema (top-level defaults
    /// filled), or every field error found.
    pub fn check(&self, answer: &str) -> Result<Value, Vec<FieldError>> {
        let text = unfenced(answer);
        let value: Value = serde_json::from_str(text).map_err(|e| {
            vec![FieldError {
                field: String::new(),
                code: "invalid_json".into(),
                message: format!("the answer is not a JSON value: {e}"),
            }]
        })?;
        self.validator.validate(value)
    }
}

/// `text` without surrounding whitespace and one Markdown code fence
/// (```` ```json ... ``` ````).
fn unfenced(text: &str) -> &str {
    let t = text.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return t;
    };
    let Some(body) = rest.strip_suffix("```") else {
        return t;
    };
    // The fence's info string (`json`) ends at the first line break.
    match body.find('\n') {
        Some(i) => body[i + 1..].trim(),
        None => body.trim(),
    }
}

/// The field errors as one line each (`field: message`), for a model's
/// second try and a turn's failure message.
pub fn describe(errors: &[FieldError]) -> String {
    super::validate::describe_errors(errors, "\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn signal() -> OutputSchema {
        OutputSchema::new(
            ResponseFormat {
                name: "signal".into(),
                description: None,
                schema: json!({
                    "type": "object",
                    "required": ["symbol", "action"],
                    "properties": {
                        "symbol": {"type": "string"},
                        "action": {"enum": ["buy", "sell", "hold"]},
                        "confidence": {"type": "number", "minimum": 0, "maximum": 1}
                    }
                }),
                strict: None,
            },
            false,
        )
        .unwrap()
    }

    #[test]
    fn a_valid_answer_is_parsed_even_inside_a_code_fence() {
        let s = signal();
        let v = s.check(r#"{"symbol":"AAPL","action":"hold"}"#).unwrap();
        assert_eq!(v["symbol"], "AAPL");
        let fenced = "```json\n{\"symbol\":\"MSFT\",\"action\":\"buy\"}\n```";
        assert_eq!(s.check(fenced).unwrap()["symbol"], "MSFT");
    }

    #[test]
    fn a_miss_names_every_field() {
        let s = signal();
        let errs = s.check(r#"{"action":"panic","confidence":3}"#).unwrap_err();
        let fields: Vec<&str> = errs.iter().map(|e| e.code.as_str()).collect();
        assert!(fields.contains(&"required"), "{errs:?}");
        assert!(fields.contains(&"enum"), "{errs:?}");
        assert!(fields.contains(&"maximum"), "{errs:?}");
        let prose = s.check("The signal is hold.").unwrap_err();
        assert_eq!(prose[0].code, "invalid_json");
    }

    #[test]
    fn bad_schemas_are_refused_with_a_reason() {
        let with = |name: &str, schema: Value| {
            OutputSchema::new(
                ResponseFormat {
                    name: name.into(),
                    description: None,
                    schema,
                    strict: None,
                },
                true,
            )
        };
        assert!(with("a b", json!({"type": "object"})).is_err());
        assert!(with("ok", json!({"type": "array"})).is_err());
        assert!(with("ok", json!("object")).is_err());
        assert!(
            with(
                "ok",
                json!({"type": "object", "properties": {"a": {"type": 7}}})
            )
            .is_err()
        );
        assert!(with("ok", json!({"properties": {}})).is_ok());
        assert!(with("ok", json!({"description": "anything"})).is_ok());
        assert!(with("ok", json!({"type": ["object", "null"]})).is_err());
    }
}
