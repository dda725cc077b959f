//! The `when` language: a node runs only when its condition holds over the
//! outputs before it; a false condition marks the node skipped.
//!
//! definition (load) ──parse──▶ [`Condition`] ──eval(scope)──▶ bool (scheduler)
//!
//! Small on purpose:
//! ```text
//! expr    := or
//! or      := and ( "||" and )*
//! and     := unary ( "&&" unary )*
//! unary   := "!" unary | compare
//! compare := operand ( ("==" | "!=" | "<" | "<=" | ">" | ">=") operand )?
//! operand := number | 'text' | "text" | true | false | null | path | "(" expr ")"
//! path    := input[.p] | nodes.<id>.output[.p] | item[.p] | index   (as in templates)
//! ```
//! e.g. `nodes.scan.output.count > 0 && input.mode != 'dry'`.
//!
//! Decisions:
//! - a path that is not in the data is `null` (not an error): `when` is how
//!   a workflow asks "is it there?", e.g. `nodes.a.output.next != null`;
//! - `==` / `!=` compare JSON values (numbers by value: `1 == 1.0`);
//!   `<`, `<=`, `>`, `>=` compare two numbers or two strings and are false
//!   for anything else (a missing count is not `> 0`);
//! - a lone operand, and the operands of `!`, `&&`, `||`, are taken by
//!   truthiness: `null`, `false`, `0`, `""`, `[]` and `{}` are false;
//! - no arithmetic, no functions: a condition that needs them belongs in a
//!   tool;
//! - at most [`MAX_TOKENS`] tokens: parsing, evaluating and dropping a
//!   condition recurse over its tree, whose depth the token count bounds, so
//!   a workflow file cannot overflow the stack of the server that loads it
//!   (found by the `workflow_def` fuzz target: 500 nested parentheses).

use serde_json::Value;

use super::template::{PathExpr, Scope, TemplateError};

/// Why a condition could not be parsed; `at` is a byte offset.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConditionError {
    #[error("at byte {at}: {message}")]
    Syntax { at: usize, message: String },
    #[error("at byte {at}: {source}")]
    Path {
        at: usize,
        #[source]
        source: TemplateError,
    },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Lit(Value),
    Path(PathExpr),
    Not(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Cmp(CmpOp, Box<Expr>, Box<Expr>),
}

/// A parsed `when`.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    source: String,
    expr: Expr,
}

/// The longest condition, in tokens (see the module doc).
pub const MAX_TOKENS: usize = 256;

impl Condition {
    pub fn parse(text: &str) -> Result<Condition, ConditionError> {
        let tokens = tokenize(text)?;
        if let Some((_, at)) = tokens.get(MAX_TOKENS) {
            return Err(ConditionError::Syntax {
                at: *at,
                message: format!("a condition may hold at most {MAX_TOKENS} tokens"),
            });
        }
        let mut p = Parser {
            tokens,
            pos: 0,
            end: text.len(),
        };
        let expr = p.or()?;
        if let Some((tok, at)) = p.tokens.get(p.pos) {
            return Err(ConditionError::Syntax {
                at: *at,
                message: format!("unexpected {}", tok.describe()),
            });
        }
        Ok(Condition {
            source: text.trim().to_string(),
            expr,
        })
    }

    /// The condition as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Every path the condition reads.
    pub fn paths(&self) -> Vec<&PathExpr> {
        fn walk<'a>(e: &'a Expr, out: &mut Vec<&'a PathExpr>) {
            match e {
                Expr::Lit(_) => {}
                Expr::Path(p) => out.push(p),
                Expr::Not(a) => walk(a, out),
                Expr::And(a, b) | Expr::Or(a, b) | Expr::Cmp(_, a, b) => {
                    walk(a, out);
                    walk(b, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.expr, &mut out);
        out
    }

    pub fn eval(&self, scope: &Scope<'_>) -> bool {
        truthy(&value(&self.expr, scope))
    }
}

fn value(e: &Expr, scope: &Scope<'_>) -> Value {
    match e {
        Expr::Lit(v) => v.clone(),
        Expr::Path(p) => p.resolve(scope).unwrap_or(Value::Null),
        Expr::Not(a) => Value::Bool(!truthy(&value(a, scope))),
        Expr::And(a, b) => Value::Bool(truthy(&value(a, scope)) && truthy(&value(b, scope))),
        Expr::Or(a, b) => Value::Bool(truthy(&value(a, scope)) || truthy(&value(b, scope))),
        Expr::Cmp(op, a, b) => Value::Bool(compare(*op, &value(a, scope), &value(b, scope))),
    }
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

fn equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn compare(op: CmpOp, a: &Value, b: &Value) -> bool {
    use std::cmp::Ordering;
    let ordering = match (a, b) {
        (Value::Number(x), Value::Number(y)) => x
            .as_f64()
            .zip(y.as_f64())
            .and_then(|(x, y)| x.partial_cmp(&y)),
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        _ => None,
    };
    match op {
        CmpOp::Eq => equal(a, b),
        CmpOp::Ne => !equal(a, b),
        CmpOp::Lt => ordering == Some(Ordering::Less),
        CmpOp::Le => matches!(ordering, Some(Ordering::Less | Ordering::Equal)),
        CmpOp::Gt => ordering == Some(Ordering::Greater),
        CmpOp::Ge => matches!(ordering, Some(Ordering::Greater | Ordering::Equal)),
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Lit(Value),
    Path(PathExpr),
    Op(CmpOp),
    And,
    Or,
    Not,
    Open,
    Close,
}

impl Token {
    fn describe(&self) -> String {
        match self {
            Token::Lit(v) => format!("value {v}"),
            Token::Path(p) => format!("path '{}'", p.text),
            Token::Op(op) => format!("operator {op:?}"),
            Token::And => "'&&'".into(),
            Token::Or => "'||'".into(),
            Token::Not => "'!'".into(),
            Token::Open => "'('".into(),
            Token::Close => "')'".into(),
        }
    }
}

fn tokenize(text: &str) -> Result<Vec<(Token, usize)>, ConditionError> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let syntax = |at: usize, message: &str| ConditionError::Syntax {
        at,
        message: message.into(),
    };
    while i < bytes.len() {
        let c = bytes[i];
        let two = text.get(i..i + 2).unwrap_or("");
        let start = i;
        let token = match c {
            b' ' | b'\t' | b'\n' | b'\r' => {
                i += 1;
                continue;
            }
            b'(' => {
                i += 1;
                Token::Open
            }
            b')' => {
                i += 1;
                Token::Close
            }
            _ if two == "&&" => {
                i += 2;
                Token::And
            }
            _ if two == "||" => {
                i += 2;
                Token::Or
            }
            _ if two == "==" => {
                i += 2;
                Token::Op(CmpOp::Eq)
            }
            _ if two == "!=" => {
                i += 2;
                Token::Op(CmpOp::Ne)
            }
            _ if two == "<=" => {
                i += 2;
                Token::Op(CmpOp::Le)
            }
            _ if two == ">=" => {
                i += 2;
                Token::Op(CmpOp::Ge)
            }
            b'<' => {
                i += 1;
                Token::Op(CmpOp::Lt)
            }
            b'>' => {
                i += 1;
                Token::Op(CmpOp::Gt)
            }
            b'!' => {
                i += 1;
                Token::Not
            }
            b'\'' | b'"' => {
                let (s, next) =
                    string_literal(text, i).ok_or_else(|| syntax(i, "unclosed string"))?;
                i = next;
                Token::Lit(Value::String(s))
            }
            b'0'..=b'9' | b'-' => {
                let mut j = i + 1;
                while j < bytes.len() && (bytes[j].is_ascii_digit() || bytes[j] == b'.') {
                    j += 1;
                }
                let n: f64 = text[i..j]
                    .parse()
                    .map_err(|_| syntax(i, &format!("'{}' is not a number", &text[i..j])))?;
                i = j;
                let value = if n.fract() == 0.0 && n.abs() < 9.0e15 {
                    Value::from(n as i64)
                } else {
                    serde_json::Number::from_f64(n)
                        .map(Value::Number)
                        .ok_or_else(|| syntax(start, "not a finite number"))?
                };
                Token::Lit(value)
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let mut j = i + 1;
                while j < bytes.len()
                    && (bytes[j].is_ascii_alphanumeric() || matches!(bytes[j], b'_' | b'.' | b'-'))
                {
                    j += 1;
                }
                let word = &text[i..j];
                i = j;
                match word {
                    "true" => Token::Lit(Value::Bool(true)),
                    "false" => Token::Lit(Value::Bool(false)),
                    "null" => Token::Lit(Value::Null),
                    _ => Token::Path(
                        PathExpr::parse(word)
                            .map_err(|source| ConditionError::Path { at: start, source })?,
                    ),
                }
            }
            _ => {
                let ch = text[i..].chars().next().unwrap_or('?');
                return Err(syntax(i, &format!("unexpected character '{ch}'")));
            }
        };
        out.push((token, start));
    }
    Ok(out)
}

/// A quoted string starting at `start`; returns it and the byte after it.
fn string_literal(text: &str, start: usize) -> Option<(String, usize)> {
    let mut chars = text[start..].char_indices();
    let (_, quote) = chars.next()?;
    let mut out = String::new();
    let mut escaped = false;
    for (off, c) in chars {
        match c {
            _ if escaped => {
                out.push(c);
                escaped = false;
            }
            '\\' => escaped = true,
            c if c == quote => return Some((out, start + off + c.len_utf8())),
            c => out.push(c),
        }
    }
    None
}

struct Parser {
    tokens: Vec<(Token, usize)>,
    pos: usize,
    end: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos).map(|(t, _)| t)
    }

    fn at(&self) -> usize {
        self.tokens.get(self.pos).map_or(self.end, |(_, at)| *at)
    }

    fn or(&mut self) -> Result<Expr, ConditionError> {
        let mut left = self.and()?;
        while self.peek() == Some(&Token::Or) {
            self.pos += 1;
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, ConditionError> {
        let mut left = self.unary()?;
        while self.peek() == Some(&Token::And) {
            self.pos += 1;
            left = Expr::And(Box::new(left), Box::new(self.unary()?));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, ConditionError> {
        if self.peek() == Some(&Token::Not) {
            self.pos += 1;
            return Ok(Expr::Not(Box::new(self.unary()?)));
        }
        let left = self.operand()?;
        if let Some(Token::Op(op)) = self.peek() {
            let op = *op;
            self.pos += 1;
            let right = self.operand()?;
            return Ok(Expr::Cmp(op, Box::new(left), Box::new(right)));
        }
        Ok(left)
    }

    fn operand(&mut self) -> Result<Expr, ConditionError> {
        let at = self.at();
        let Some((token, _)) = self.tokens.get(self.pos).cloned() else {
            return Err(ConditionError::Syntax {
                at,
                message: "the condition ends where a value was expected".into(),
            });
        };
        self.pos += 1;
        match token {
            Token::Lit(v) => Ok(Expr::Lit(v)),
            Token::Path(p) => Ok(Expr::Path(p)),
            Token::Open => {
                let inner = self.or()?;
                if self.peek() != Some(&Token::Close) {
                    return Err(ConditionError::Syntax {
                        at: self.at(),
                        message: "expected ')'".into(),
                    });
                }
                self.pos += 1;
                Ok(inner)
            }
            other => Err(ConditionError::Syntax {
                at,
                message: format!("expected a value, found {}", other.describe()),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    fn eval(text: &str) -> bool {
        let outputs = BTreeMap::from([
            (
                "scan".to_string(),
                json!({"count": 3, "name": "x", "items": [], "ok": true}),
            ),
            ("empty".to_string(), json!({"count": 0})),
        ]);
        let input = json!({"mode": "live", "limit": 2.5});
        let scope = Scope {
            input: &input,
            outputs: &outputs,
            item: None,
        };
        Condition::parse(text).unwrap().eval(&scope)
    }

    #[test]
    fn comparisons_and_logic() {
        assert!(eval("nodes.scan.output.count > 0"));
        assert!(!eval("nodes.empty.output.count > 0"));
        assert!(eval(
            "nodes.empty.output.count == 0 && input.mode == 'live'"
        ));
        assert!(eval("nodes.scan.output.count >= 3 || false"));
        assert!(eval("!(nodes.scan.output.count < 3)"));
        assert!(eval("input.limit <= 2.5 && input.limit != 2"));
        assert!(eval("nodes.scan.output.name == \"x\""));
        assert!(eval("3 == 3.0"));
        assert!(eval("input.mode > 'abc'"));
    }

    #[test]
    fn truthiness_of_lone_values() {
        assert!(eval("nodes.scan.output.ok"));
        assert!(!eval("nodes.scan.output.items"));
        assert!(!eval("!nodes.scan.output.count"));
        assert!(!eval("null"));
    }

    #[test]
    fn a_missing_path_is_null_and_never_ordered() {
        assert!(!eval("nodes.scan.output.nope > 0"));
        assert!(!eval("nodes.scan.output.nope < 0"));
        assert!(eval("nodes.scan.output.nope == null"));
        assert!(!eval("nodes.other.output != null"));
        assert!(
            !eval("nodes.scan.output.name > 1"),
            "mixed kinds are not ordered"
        );
    }

    #[test]
    fn syntax_errors_say_where() {
        let err = Condition::parse("nodes.a.output.count >").unwrap_err();
        assert!(
            matches!(err, ConditionError::Syntax { at: 22, .. }),
            "{err}"
        );
        let err = Condition::parse("(input.x").unwrap_err();
        assert!(err.to_string().contains("expected ')'"), "{err}");
        let err = Condition::parse("input.x = 1").unwrap_err();
        assert!(
            err.to_string().contains("unexpected character '='"),
            "{err}"
        );
        let err = Condition::parse("count > 1").unwrap_err();
        assert!(matches!(err, ConditionError::Path { at: 0, .. }), "{err}");
        assert!(Condition::parse("'open").is_err());
        assert!(Condition::parse("1 2").is_err());
    }

    #[test]
    fn lists_the_paths_it_reads() {
        let c = Condition::parse("nodes.a.output.n > 1 && (input.x || nodes.b.output)").unwrap();
        let nodes: Vec<_> = c.paths().iter().filter_map(|p| p.node()).collect();
        assert_eq!(nodes, ["a", "b"]);
    }

    #[test]
    fn a_condition_deep_enough_to_overflow_the_stack_is_refused() {
        let parens = format!("{}input.a{}", "(".repeat(500), ")".repeat(500));
        let nots = format!("{}input.a", "!".repeat(2000));
        let chain = vec!["input.a"; 2000].join(" && ");
        for text in [parens, nots, chain] {
            let err = Condition::parse(&text).unwrap_err().to_string();
            assert!(err.contains("at most 256 tokens"), "{err}");
        }
        let deep_but_short = format!("{}input.a{}", "(".repeat(100), ")".repeat(100));
        assert!(Condition::parse(&deep_but_short).is_ok());
    }
}
