//! Templates: how a node's params and prompt take values from the run.
//!
//! definition (load) ──parse──▶ [`Template`] / [`TemplateValue`] ──render(scope)──▶ JSON / text (scheduler)
//!
//! A placeholder is `{{ path }}`, where a path is one of:
//! - `input` or `input.<path>`: the run's (validated) input;
//! - `nodes.<id>.output` or `nodes.<id>.output.<path>`: a finished node's output;
//! - `item` or `item.<path>`, and `index`: the element (and its position)
//!   a map node is running for (map nodes only).
//!
//! `<path>` is dot-separated; a segment that is a number indexes an array
//! (`nodes.list.output.data.items.0.sku`). Decisions:
//! - a string that is exactly one placeholder keeps the JSON type of the
//!   value (`"{{nodes.a.output.count}}"` renders the number `3`, and
//!   `"{{nodes.a.output}}"` the whole object); a placeholder inside a longer
//!   string is stringified: strings as they are, everything else as compact
//!   JSON (`null` as `null`);
//! - there is no escape: `{{` always opens a placeholder, and one left
//!   unclosed is a load error;
//! - a path that is not in the data is an error when params and prompts are
//!   rendered (the node fails, naming the path): a silent empty string would
//!   send a tool wrong arguments. The workflow's `output` renders missing
//!   paths as `null` instead (it is a summary, and skipped nodes have none).
//!
//! Parsing happens once, when the definition loads; rendering is pure.

use serde_json::Value;

/// What a path starts from.
#[derive(Debug, Clone, PartialEq)]
pub enum Root {
    Input,
    /// A node's output, by node id.
    Node(String),
    Item,
    Index,
}

/// A parsed path such as `nodes.a.output.items.0`.
#[derive(Debug, Clone, PartialEq)]
pub struct PathExpr {
    pub root: Root,
    pub segments: Vec<String>,
    /// The path as written, for messages.
    pub text: String,
}

/// Why a template or path could not be parsed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TemplateError {
    #[error("'{{{{' at byte {at} is never closed with '}}}}'")]
    Unclosed { at: usize },
    #[error("empty placeholder '{{{{}}}}'")]
    Empty,
    #[error("'{path}' must start with input, nodes.<id>.output, item or index")]
    UnknownRoot { path: String },
    #[error("'{path}': a node's value is read as nodes.<id>.output[.<path>]")]
    NotOutput { path: String },
    #[error("'{path}' has an empty segment")]
    EmptySegment { path: String },
    #[error("'index' has no fields ('{path}')")]
    IndexField { path: String },
}

/// Why rendering failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RenderError {
    #[error("{{{{{path}}}}}: no such value in this run")]
    Missing { path: String },
}

impl PathExpr {
    /// Parses a bare path (`nodes.a.output.x`); `{{ }}` around it is accepted.
    pub fn parse(text: &str) -> Result<PathExpr, TemplateError> {
        let trimmed = text.trim();
        let trimmed = trimmed
            .strip_prefix("{{")
            .and_then(|t| t.strip_suffix("}}"))
            .map(str::trim)
            .unwrap_or(trimmed);
        if trimmed.is_empty() {
            return Err(TemplateError::Empty);
        }
        let parts: Vec<&str> = trimmed.split('.').collect();
        if parts.iter().any(|p| p.trim().is_empty()) {
            return Err(TemplateError::EmptySegment {
                path: trimmed.into(),
            });
        }
        let owned = |s: &[&str]| s.iter().map(|p| p.trim().to_string()).collect::<Vec<_>>();
        let (root, segments) = match parts[0] {
            "input" => (Root::Input, owned(&parts[1..])),
            "item" => (Root::Item, owned(&parts[1..])),
            "index" if parts.len() == 1 => (Root::Index, Vec::new()),
            "index" => {
                return Err(TemplateError::IndexField {
                    path: trimmed.into(),
                });
            }
            "nodes" => {
                if parts.len() < 3 || parts[2] != "output" {
                    return Err(TemplateError::NotOutput {
                        path: trimmed.into(),
                    });
                }
                (Root::Node(parts[1].to_string()), owned(&parts[3..]))
            }
            _ => {
                return Err(TemplateError::UnknownRoot {
                    path: trimmed.into(),
                });
            }
        };
        Ok(PathExpr {
            root,
            segments,
            text: trimmed.to_string(),
        })
    }

    /// The node this path reads, if it reads one.
    pub fn node(&self) -> Option<&str> {
        match &self.root {
            Root::Node(id) => Some(id),
            _ => None,
        }
    }

    /// Whether the path only makes sense inside a map node.
    pub fn needs_item(&self) -> bool {
        matches!(self.root, Root::Item | Root::Index)
    }

    /// The value at this path, or `None` when it is not there.
    pub fn resolve(&self, scope: &Scope<'_>) -> Option<Value> {
        let start: &Value = match &self.root {
            Root::Input => scope.input,
            Root::Node(id) => scope.outputs.output(id)?,
            Root::Item => scope.item.map(|(v, _)| v)?,
            Root::Index => return scope.item.map(|(_, i)| Value::from(i)),
        };
        let mut at = start;
        for seg in &self.segments {
            at = match at {
                Value::Object(map) => map.get(seg)?,
                Value::Array(items) => items.get(seg.parse::<usize>().ok()?)?,
                _ => return None,
            };
        }
        Some(at.clone())
    }
}

/// Where node outputs come from when rendering.
pub trait Outputs {
    /// The output of a node that succeeded; `None` otherwise.
    fn output(&self, node: &str) -> Option<&Value>;
}

impl Outputs for std::collections::BTreeMap<String, Value> {
    fn output(&self, node: &str) -> Option<&Value> {
        self.get(node)
    }
}

/// The data a template is rendered against.
pub struct Scope<'a> {
    pub input: &'a Value,
    pub outputs: &'a dyn Outputs,
    /// For map nodes: the element and its index.
    pub item: Option<(&'a Value, usize)>,
}

/// What to do with a path that is not in the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    Error,
    Null,
}

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    Value(PathExpr),
}

/// A string with `{{ path }}` placeholders.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    parts: Vec<Part>,
}

impl Template {
    pub fn parse(text: &str) -> Result<Template, TemplateError> {
        let mut parts = Vec::new();
        let mut rest = text;
        let mut offset = 0;
        while let Some(open) = rest.find("{{") {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_string()));
            }
            let after = &rest[open + 2..];
            let close = after
                .find("}}")
                .ok_or(TemplateError::Unclosed { at: offset + open })?;
            parts.push(Part::Value(PathExpr::parse(&after[..close])?));
            let consumed = open + 2 + close + 2;
            offset += consumed;
            rest = &rest[consumed..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_string()));
        }
        Ok(Template { parts })
    }

    /// Whether the text had any placeholder.
    pub fn has_placeholders(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Value(_)))
    }

    /// Every path the template reads.
    pub fn paths(&self) -> impl Iterator<Item = &PathExpr> {
        self.parts.iter().filter_map(|p| match p {
            Part::Value(v) => Some(v),
            Part::Text(_) => None,
        })
    }

    /// Renders to JSON: exactly one placeholder keeps the value's type,
    /// anything else is a string.
    pub fn render(&self, scope: &Scope<'_>, missing: Missing) -> Result<Value, RenderError> {
        if let [Part::Value(path)] = self.parts.as_slice() {
            return lookup(path, scope, missing);
        }
        self.render_string(scope, missing).map(Value::String)
    }

    /// Renders to text, every value stringified.
    pub fn render_string(
        &self,
        scope: &Scope<'_>,
        missing: Missing,
    ) -> Result<String, RenderError> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Value(path) => out.push_str(&stringify(&lookup(path, scope, missing)?)),
            }
        }
        Ok(out)
    }
}

fn lookup(path: &PathExpr, scope: &Scope<'_>, missing: Missing) -> Result<Value, RenderError> {
    match (path.resolve(scope), missing) {
        (Some(v), _) => Ok(v),
        (None, Missing::Null) => Ok(Value::Null),
        (None, Missing::Error) => Err(RenderError::Missing {
            path: path.text.clone(),
        }),
    }
}

/// A value as it appears inside a longer string.
pub fn stringify(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A JSON tree (a node's `params`) whose strings may be templates; keys are
/// taken as written.
#[derive(Debug, Clone, PartialEq)]
pub enum TemplateValue {
    Literal(Value),
    Template(Template),
    Array(Vec<TemplateValue>),
    Object(Vec<(String, TemplateValue)>),
}

impl TemplateValue {
    pub fn parse(value: &Value) -> Result<TemplateValue, TemplateError> {
        Ok(match value {
            Value::String(s) => {
                let t = Template::parse(s)?;
                if t.has_placeholders() {
                    TemplateValue::Template(t)
                } else {
                    TemplateValue::Literal(value.clone())
                }
            }
            Value::Array(items) => TemplateValue::Array(
                items
                    .iter()
                    .map(TemplateValue::parse)
                    .collect::<Result<_, _>>()?,
            ),
            Value::Object(map) => TemplateValue::Object(
                map.iter()
                    .map(|(k, v)| Ok((k.clone(), TemplateValue::parse(v)?)))
                    .collect::<Result<_, TemplateError>>()?,
            ),
            other => TemplateValue::Literal(other.clone()),
        })
    }

    pub fn render(&self, scope: &Scope<'_>, missing: Missing) -> Result<Value, RenderError> {
        Ok(match self {
            TemplateValue::Literal(v) => v.clone(),
            TemplateValue::Template(t) => t.render(scope, missing)?,
            TemplateValue::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|i| i.render(scope, missing))
                    .collect::<Result<_, _>>()?,
            ),
            TemplateValue::Object(fields) => Value::Object(
                fields
                    .iter()
                    .map(|(k, v)| Ok((k.clone(), v.render(scope, missing)?)))
                    .collect::<Result<_, RenderError>>()?,
            ),
        })
    }

    /// Every path the tree reads.
    pub fn paths(&self) -> Vec<&PathExpr> {
        let mut out = Vec::new();
        self.collect(&mut out);
        out
    }

    fn collect<'a>(&'a self, out: &mut Vec<&'a PathExpr>) {
        match self {
            TemplateValue::Literal(_) => {}
            TemplateValue::Template(t) => out.extend(t.paths()),
            TemplateValue::Array(items) => items.iter().for_each(|i| i.collect(out)),
            TemplateValue::Object(fields) => fields.iter().for_each(|(_, v)| v.collect(out)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    fn outputs() -> BTreeMap<String, Value> {
        BTreeMap::from([(
            "a".to_string(),
            json!({"count": 3, "name": "Acme", "items": [{"sku": "BOLT"}, {"sku": "NUT8"}]}),
        )])
    }

    fn render(text: &str) -> Result<Value, RenderError> {
        let outputs = outputs();
        let input = json!({"sku": "BOLT", "n": 2});
        let scope = Scope {
            input: &input,
            outputs: &outputs,
            item: Some((&json!({"x": 1}), 4)),
        };
        Template::parse(text)
            .unwrap()
            .render(&scope, Missing::Error)
    }

    #[test]
    fn a_lone_placeholder_keeps_the_json_type() {
        assert_eq!(render("{{nodes.a.output.count}}").unwrap(), json!(3));
        assert_eq!(render("{{ input.n }}").unwrap(), json!(2));
        assert_eq!(
            render("{{nodes.a.output.items.1}}").unwrap(),
            json!({"sku": "NUT8"})
        );
        assert_eq!(render("{{index}}").unwrap(), json!(4));
        assert_eq!(render("{{item.x}}").unwrap(), json!(1));
    }

    #[test]
    fn placeholders_inside_text_are_stringified() {
        assert_eq!(
            render("{{input.sku}} has {{nodes.a.output.count}} items: {{nodes.a.output.items.0}}")
                .unwrap(),
            json!(r#"BOLT has 3 items: {"sku":"BOLT"}"#)
        );
        assert_eq!(render("plain").unwrap(), json!("plain"));
    }

    #[test]
    fn a_missing_path_is_an_error_naming_it_or_null_when_asked() {
        let err = render("x {{nodes.a.output.nope}}").unwrap_err();
        assert!(err.to_string().contains("nodes.a.output.nope"), "{err}");
        assert!(render("{{nodes.b.output}}").is_err());
        let t = Template::parse("{{nodes.b.output}}").unwrap();
        let scope = Scope {
            input: &Value::Null,
            outputs: &BTreeMap::<String, Value>::new(),
            item: None,
        };
        assert_eq!(t.render(&scope, Missing::Null).unwrap(), Value::Null);
    }

    #[test]
    fn bad_templates_are_refused_at_parse() {
        assert!(matches!(
            Template::parse("a {{input.x"),
            Err(TemplateError::Unclosed { at: 2 })
        ));
        assert!(matches!(
            Template::parse("{{output.x}}"),
            Err(TemplateError::UnknownRoot { .. })
        ));
        assert!(matches!(
            Template::parse("{{nodes.a.result}}"),
            Err(TemplateError::NotOutput { .. })
        ));
        assert!(matches!(
            Template::parse("{{ }}"),
            Err(TemplateError::Empty)
        ));
        assert!(matches!(
            Template::parse("{{input..x}}"),
            Err(TemplateError::EmptySegment { .. })
        ));
    }

    #[test]
    fn params_trees_render_every_string_and_list_their_paths() {
        let tv = TemplateValue::parse(&json!({
            "sku": "{{input.sku}}",
            "n": "{{nodes.a.output.count}}",
            "fixed": [1, "two", {"deep": "{{nodes.a.output.name}}!"}]
        }))
        .unwrap();
        let nodes: Vec<_> = tv.paths().iter().filter_map(|p| p.node()).collect();
        assert_eq!(nodes, ["a", "a"]);
        let outputs = outputs();
        let input = json!({"sku": "BOLT"});
        let scope = Scope {
            input: &input,
            outputs: &outputs,
            item: None,
        };
        assert_eq!(
            tv.render(&scope, Missing::Error).unwrap(),
            json!({"sku": "BOLT", "n": 3, "fixed": [1, "two", {"deep": "Acme!"}]})
        );
    }
}
