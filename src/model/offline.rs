//! The offline provider: a deterministic intent router that serves when no
//! model endpoint is configured, so cadre runs with no key and no network.
//!
//! It is not a language model. Given the conversation it:
//! 1. after tool results: composes the answer from them (the calculator's
//!    `expression = result`, an echo's message, a pending confirmation with
//!    its id, or the tool's error); from a data tool's `data`, the fields
//!    the question names ("RSI" → `indicators.RSI.value`, "cash" → every
//!    `*cash*` field, "worth" → `value`) with what the record is about
//!    (its symbol or name) and the `source_id`, else a summary of every
//!    field; another agent's answer (`ask_<agent>`) relayed as
//!    "<agent> says: ...";
//! 2. after a user message, when tools are offered with `tool_choice = auto`:
//!    picks one tool by keywords (an arithmetic expression in the message
//!    picks a tool with an `expression` parameter; otherwise the tool whose
//!    name and description share the most words with the message, and
//!    whose parameters the message fills best) and fills the parameters it
//!    can: the expression, enum values the message names (`buy`, `RSI`),
//!    a code, numbers by the word next to them ("10 units" is the
//!    `quantity` described as "Number of units", else the message's
//!    numbers in order); a required enum the message does not name gets
//!    its default. A string whose `examples` are codes (capitals and
//!    digits: `BOLT`, `SKU42`), required or not, takes the first word of
//!    that shape that is not an everyday word (`I`, `OK`) and not one the
//!    tool uses for something else: its enum values, its name's words and
//!    the capitalised words of its descriptions (a tool that says "cash in
//!    USD" never takes USD for a code). A required string takes, by what
//!    its schema says:
//!    - `pattern`: the first word of the message that matches it (compiled
//!      as the executor's validation does, size and backtracking bounded;
//!      a pattern that does not compile is ignored);
//!    - `format` (email, uri/url, date `YYYY-MM-DD`, date-time, uuid): the
//!      first word of that shape;
//!    - `examples`: an example the message names, else a word of an
//!      example's shape (`TCK-88` for `TCK-5`);
//!    - named `id`, `*_id`, `*Id`, or described as an identifier or a
//!      number: the first id-like word (letters, digits, `-`, `_`, with a
//!      digit: `A1001`, `ORD-17`, a UUID);
//!    - otherwise (free text: `query`, `message`, `text` ...): a quoted
//!      string ("..." or '...'), else the message text.
//!
//!    A parameter whose schema names a shape the message does not hold is
//!    left out, never given the message text: the executor's validation
//!    then names it, and the answer says the tool failed and why.
//!
//!    After a handoff (`transfer_to_<agent>`'s result only), the agent now
//!    answering routes the question as if it had been asked first: with
//!    its own tools, and without offering the handoff back.
//! 3. with no tools offered: restates the facts the message carries (each
//!    JSON value in it, described like a tool result, under the label
//!    before it), so a tool-less agent, such as a workflow's analyst given
//!    the outputs of earlier nodes, still answers with their content;
//! 4. otherwise: says what it is and which tools it could use.
//!
//! Same input, same output: tool call ids derive from the message count.
//!
//! Decided (issue #30): it knows no domain. Every word it matches on comes
//! from the tool definitions it is given (names, descriptions, parameter
//! schemas) or is everyday English; the sample domain's tools teach it
//! their symbols through their schemas' `examples`, as any team's tools
//! can.
//!
//! What it cannot do: understand a sentence. It calls one tool per turn,
//! never chains calls (one result, then an answer), fills optional text
//! parameters only with a code, nested objects and arrays only from enum
//! values, and picks a tool by shared words, so a question that uses none
//! of a tool's words (and no value only that tool takes) gets no call.
//!
//! Usage: every reply reports zero tokens. No language model runs, so none
//! are spent; an estimate (characters / 4) would make budgets bind on calls
//! that cost nothing. Its calls still count as model calls.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value, json};

use crate::error_code::{CONFIRMATION_REQUIRED, tool_outcome_name};

use super::{
    ChatMessage, ChatModel, ChatRequest, ChatResponse, FinishReason, ModelError, Purpose, Role,
    ToolCall, ToolChoice, ToolSpec, Usage,
};

#[derive(Debug, Default)]
pub struct OfflineModel;

impl OfflineModel {
    pub fn new() -> Self {
        OfflineModel
    }
}

#[async_trait::async_trait]
impl ChatModel for OfflineModel {
    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        Ok(route(&request))
    }

    fn describe(&self) -> String {
        "offline intent router (no model endpoint configured)".into()
    }
}

fn text(content: String) -> ChatResponse {
    ChatResponse {
        content: Some(content),
        tool_calls: Vec::new(),
        usage: Some(Usage::default()),
        finish_reason: Some(FinishReason::Stop),
    }
}

/// The whole decision, pure. A turn with an answer schema gets its text
/// answer as a JSON object of that schema ([`fill_schema`]).
pub fn route(request: &ChatRequest) -> ChatResponse {
    let mut reply = route_text(request);
    if let Some(format) = &request.response_format
        && request.purpose == Purpose::Turn
        && reply.tool_calls.is_empty()
    {
        let text = reply.content.take().unwrap_or_default();
        reply.content = Some(typed_answer(request, &format.schema, &text).to_string());
    }
    reply
}

/// The answer of a turn whose reply must match `schema`: filled from the
/// JSON the turn's tools returned and the question, `text` (the answer it
/// would have written) for free-text fields.
fn typed_answer(request: &ChatRequest, schema: &Value, text: &str) -> Value {
    let last_user = request.messages.iter().rposition(|m| m.role == Role::User);
    let since_user = last_user.map(|i| &request.messages[i + 1..]).unwrap_or(&[]);
    let facts: Vec<Value> = since_user
        .iter()
        .filter(|m| m.role == Role::Tool)
        .filter_map(|m| serde_json::from_str(m.content.as_deref()?).ok())
        .collect();
    let question = last_user
        .and_then(|i| request.messages[i].content.as_deref())
        .unwrap_or_default();
    fill_schema(schema, "", &Facts::new(&facts, question, text), 0)
}

/// What a typed answer is filled from: every keyed scalar, array and
/// object of the turn's tool outputs (first found first), the source ids
/// they carry, the question and the text answer.
struct Facts<'a> {
    keyed: Vec<(String, &'a Value)>,
    sources: Vec<String>,
    strings: Vec<&'a str>,
    question: &'a str,
    text: &'a str,
}

impl<'a> Facts<'a> {
    fn new(outputs: &'a [Value], question: &'a str, text: &'a str) -> Self {
        let mut facts = Facts {
            keyed: Vec::new(),
            sources: Vec::new(),
            strings: Vec::new(),
            question,
            text,
        };
        for v in outputs {
            facts.walk(v, 0);
        }
        facts
    }

    fn walk(&mut self, v: &'a Value, depth: usize) {
        if depth > 6 {
            return;
        }
        match v {
            Value::Object(map) => {
                for (k, child) in map {
                    if k == "source_id"
                        && let Some(s) = child.as_str()
                        && !self.sources.iter().any(|x| x == s)
                    {
                        self.sources.push(s.to_string());
                    }
                    self.keyed.push((normal_key(k), child));
                    self.walk(child, depth + 1);
                }
            }
            Value::Array(items) => {
                for item in items.iter().take(50) {
                    self.walk(item, depth + 1);
                }
            }
            Value::String(s) => self.strings.push(s),
            _ => {}
        }
    }

    /// The first value under a key named like `name` that `fits`.
    fn named(&self, name: &str, fits: impl Fn(&Value) -> bool) -> Option<&'a Value> {
        let name = normal_key(name);
        self.keyed
            .iter()
            .find(|(k, v)| *k == name && fits(v))
            .map(|(_, v)| *v)
    }
}

/// `RSI`, `rsi_value`, `rsiValue` → `rsivalue`-style: lower case, no `_` or `-`.
fn normal_key(k: &str) -> String {
    k.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

/// A value of `schema` for the field `name`, from `facts` (see
/// [`typed_answer`]): a fact under the field's name when it has the
/// field's type; an enum value the outputs or the question name, else the
/// first; the source ids for a list of strings named like sources; the
/// text answer for another string; a number clamped into its bounds.
fn fill_schema(schema: &Value, name: &str, facts: &Facts<'_>, depth: usize) -> Value {
    if depth > 8 {
        return Value::Null;
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        let mentioned = |o: &Value| {
            let Some(s) = o.as_str() else {
                return false;
            };
            let s = s.to_lowercase();
            let said = |t: &str| {
                t.to_lowercase()
                    .split(|c: char| !c.is_alphanumeric())
                    .any(|w| w == s)
            };
            facts
                .named(name, |v| {
                    v.as_str().is_some_and(|v| v.eq_ignore_ascii_case(&s))
                })
                .is_some()
                || facts.strings.iter().any(|t| said(t))
                || said(facts.question)
        };
        return options
            .iter()
            .find(|o| mentioned(o))
            .or(options.first())
            .cloned()
            .unwrap_or(Value::Null);
    }
    if let Some(c) = schema.get("const") {
        return c.clone();
    }
    let kind = match schema.get("type") {
        Some(Value::String(t)) => t.as_str(),
        // `["string", "null"]`: the first that is not null.
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null"),
        // The root of an answer is an object, whatever else its schema says.
        _ if schema.get("properties").is_some() || depth == 0 => "object",
        _ => "string",
    };
    match kind {
        "object" => {
            let mut out = Map::new();
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (key, sub) in props {
                    out.insert(key.clone(), fill_schema(sub, key, facts, depth + 1));
                }
            }
            Value::Object(out)
        }
        "array" => {
            let items = schema.get("items").unwrap_or(&Value::Null);
            let of_strings = items.get("type").and_then(Value::as_str) == Some("string");
            let found = facts.named(name, Value::is_array).cloned();
            let mut list = match found {
                Some(v) => v,
                None if of_strings && normal_key(name).contains("source") => json!(facts.sources),
                None => json!([]),
            };
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
                && let Some(a) = list.as_array_mut()
            {
                while (a.len() as u64) < min {
                    a.push(fill_schema(items, name, facts, depth + 1));
                }
            }
            list
        }
        "number" | "integer" => {
            let integer = kind == "integer";
            let mut n = facts
                .named(name, Value::is_number)
                .and_then(Value::as_f64)
                .unwrap_or(0.0);
            if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
                n = n.max(min);
            }
            if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
                n = n.min(max);
            }
            if integer {
                json!(n.round() as i64)
            } else {
                number(n)
            }
        }
        "boolean" => facts
            .named(name, Value::is_boolean)
            .cloned()
            .unwrap_or(Value::Bool(false)),
        "null" => Value::Null,
        _ => match facts.named(name, |v| v.is_string() || v.is_number()) {
            Some(Value::String(s)) => Value::String(s.clone()),
            Some(v) => Value::String(v.to_string()),
            None => Value::String(facts.text.to_string()),
        },
    }
}

fn route_text(request: &ChatRequest) -> ChatResponse {
    match request.purpose {
        Purpose::Turn => {}
        Purpose::Summary => return text(extractive_summary(request)),
        Purpose::Suggestions => return text(suggestions(request)),
        Purpose::Improve => return text(improve(request)),
    }
    let last_user = request.messages.iter().rposition(|m| m.role == Role::User);
    let since_user = last_user.map(|i| &request.messages[i + 1..]).unwrap_or(&[]);
    let results: Vec<&ChatMessage> = since_user.iter().filter(|m| m.role == Role::Tool).collect();
    // Only handoffs so far (`transfer_to_<agent>`): the agent now answering
    // takes the question as if it had been asked first.
    let handed_over = !results.is_empty() && results.iter().all(|m| is_handoff(m));
    if !results.is_empty() && !handed_over {
        let question = last_user
            .and_then(|i| request.messages[i].content.as_deref())
            .unwrap_or_default();
        return text(compose_from_results(&results, question));
    }
    let Some(user) = last_user.map(|i| &request.messages[i]) else {
        return text("Hello. I am cadre's offline model.".into());
    };
    let question = user.content.clone().unwrap_or_default();
    // Just handed over: not straight back.
    let tools: Vec<ToolSpec> = request
        .tools
        .iter()
        .filter(|t| !(handed_over && t.name.starts_with("transfer_to_")))
        .cloned()
        .collect();
    if request.tool_choice == ToolChoice::Auto
        && let Some((tool, args)) = pick_tool(&question, &tools)
    {
        return ChatResponse {
            content: None,
            tool_calls: vec![ToolCall {
                id: format!("offline_call_{}", request.messages.len()),
                name: tool.name.clone(),
                arguments: args.to_string(),
            }],
            usage: Some(Usage::default()),
            finish_reason: Some(FinishReason::ToolCalls),
        };
    }
    let tools: Vec<&str> = request.tools.iter().map(|t| t.name.as_str()).collect();
    text(if tools.is_empty() {
        summarise(&question).unwrap_or_else(|| {
            "I am cadre's offline model and have no tools for this agent. Configure \
             CADRE_MODEL_BASE_URL (and CADRE_MODEL_API_KEY) to use a real model."
                .into()
        })
    } else {
        format!(
            "I am cadre's offline model: I answer through my tools ({}). I could not \
             match your message to one of them. Configure CADRE_MODEL_BASE_URL to use a real model.",
            tools.join(", ")
        )
    })
}

/// The facts of a message that carries JSON (e.g. a prompt templated with
/// tool outputs): its first line of text, then one line per JSON value,
/// labelled with the text before it on its line. `None` when the message
/// holds no JSON object or array.
fn summarise(message: &str) -> Option<String> {
    let mut facts = Vec::new();
    let mut text_lines = Vec::new();
    let mut line_start = 0;
    let mut i = 0;
    while i < message.len() {
        let rest = &message[i..];
        let Some(c) = rest.chars().next() else { break };
        if c == '\n' {
            let line = message[line_start..i].trim();
            if !line.is_empty() {
                text_lines.push(line.to_string());
            }
            line_start = i + 1;
        } else if c == '{' || c == '[' {
            let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
            if let Some(Ok(v)) = values.next()
                && (v.is_object() || v.is_array())
            {
                let label = message[line_start..i]
                    .trim()
                    .trim_end_matches([':', '=', '-'])
                    .trim();
                facts.push(describe_fact(label, &v));
                i += values.byte_offset();
                line_start = i;
                continue;
            }
        }
        i += c.len_utf8();
    }
    if facts.is_empty() {
        return None;
    }
    let mut out = String::new();
    if let Some(first) = text_lines.first() {
        out.push_str(first);
        out.push('\n');
    }
    for f in facts {
        out.push_str(&format!("- {f}\n"));
    }
    out.push_str(
        "(cadre's offline model restates the facts it was given; configure \
         CADRE_MODEL_BASE_URL for a written analysis.)",
    );
    Some(out)
}

/// One JSON value of a message as a line: a data tool's envelope as its
/// data and source id, anything else by its fields.
fn describe_fact(label: &str, v: &Value) -> String {
    let body = match (v.get("source_id").and_then(Value::as_str), v.get("data")) {
        (Some(source), Some(data)) => format!("{} [{source}]", describe_data(data)),
        _ => describe_data(v),
    };
    if label.is_empty() {
        body
    } else {
        format!("{label}: {body}")
    }
}

/// Whether a tool message is a handoff's result.
fn is_handoff(m: &ChatMessage) -> bool {
    m.content
        .as_deref()
        .and_then(|c| serde_json::from_str::<Value>(c).ok())
        .is_some_and(|v| v.get("transferred_to").is_some())
}

fn compose_from_results(results: &[&ChatMessage], question: &str) -> String {
    let parts: Vec<String> = results
        .iter()
        .map(|m| {
            let name = m.name.clone().unwrap_or_else(|| "tool".into());
            let content = m.content.clone().unwrap_or_default();
            let Ok(v) = serde_json::from_str::<Value>(&content) else {
                return format!("{name} returned: {content}");
            };
            if let Some(err) = v.get("error").and_then(Value::as_str) {
                if v["error_type"].as_str().map(tool_outcome_name) == Some(CONFIRMATION_REQUIRED) {
                    let id = err
                        .rsplit_once("confirmation id ")
                        .map_or("{id}", |(_, id)| id.trim());
                    return format!(
                        "{err}. Nothing has run yet: approve it with POST \
                         /v1/confirmations/{id} and {{\"approve\": true}}, or discard it \
                         with false."
                    );
                }
                return format!("The {name} tool failed: {err}");
            }
            // Another agent's answer (`ask_<agent>`): relayed, said whose.
            if let (Some(answer), Some(agent)) = (
                v.get("answer").and_then(Value::as_str),
                v.get("agent").and_then(Value::as_str),
            ) {
                return format!("{agent} says: {answer}");
            }
            if let (Some(expr), Some(result)) = (
                v.get("expression").and_then(Value::as_str),
                v.get("formatted").and_then(Value::as_str),
            ) {
                return format!("{expr} = {result}");
            }
            if let Some(msg) = v.get("message").and_then(Value::as_str) {
                return msg.to_string();
            }
            if let Some(source) = v.get("source_id").and_then(Value::as_str) {
                if let Some(text) = v.get("text").and_then(Value::as_str) {
                    // A page: its title and first sentences, briefly.
                    let title = v
                        .get("title")
                        .and_then(Value::as_str)
                        .unwrap_or(name.as_str());
                    let brief: String = text.split_inclusive(". ").take(3).collect();
                    let brief: String = brief.chars().take(400).collect();
                    return format!("{title}: {} [{source}]", brief.trim());
                }
                let data = v.get("data").unwrap_or(&Value::Null);
                return match answer_fields(data, question) {
                    Some(answer) => format!("{answer} [{source}]"),
                    None => format!("{name}: {} [{source}]", describe_data(data)),
                };
            }
            format!("{name} returned: {content}")
        })
        .collect();
    parts.join("\n")
}

/// One scalar of a tool's data, with the keys that lead to it (an array
/// item is keyed by its symbol, name or id).
struct Leaf<'a> {
    path: Vec<String>,
    value: &'a Value,
}

/// Fields that name what a record is about, not what was asked.
const IDENTIFIERS: [&str; 5] = ["symbol", "name", "id", "title", "currency"];

/// Words of the question as field names spell them: lower case, plurals
/// singular, and the everyday word for a field ("worth" is a `value`).
/// Only everyday English: a domain's own words (a trade's "shares" for
/// its `quantity`) are not known here; a question that names no field
/// gets the whole record described, which states them all.
fn question_terms(question: &str) -> HashSet<String> {
    const SYNONYMS: [(&str, &str); 3] = [
        ("worth", "value"),
        ("own", "quantity"),
        ("hold", "quantity"),
    ];
    let mut terms: HashSet<String> = words(question).iter().map(|w| singular(w)).collect();
    for (word, field) in SYNONYMS {
        if terms.contains(word) {
            terms.insert(field.to_string());
        }
    }
    terms
}

fn singular(w: &str) -> String {
    match w.strip_suffix('s') {
        Some(stem) if stem.len() > 2 && !stem.ends_with('s') => stem.to_string(),
        _ => w.to_string(),
    }
}

fn key_terms(key: &str) -> HashSet<String> {
    words(key).iter().map(|w| singular(w)).collect()
}

/// The scalars of `data` (four levels deep at most); array items only when
/// the question names them (a symbol, a name), or all of them when the
/// question names the array itself ("my positions", the first five).
fn leaves<'a>(
    v: &'a Value,
    path: &mut Vec<String>,
    asked: &HashSet<String>,
    out: &mut Vec<Leaf<'a>>,
) {
    if path.len() > 4 {
        return;
    }
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                path.push(k.clone());
                leaves(child, path, asked, out);
                path.pop();
            }
        }
        Value::Array(items) => {
            let whole = path
                .last()
                .is_some_and(|k| !key_terms(k).is_disjoint(asked));
            for (i, item) in items.iter().enumerate().take(20) {
                let id = IDENTIFIERS
                    .iter()
                    .find_map(|f| item.get(*f).and_then(Value::as_str));
                let named = id.is_some_and(|id| asked.contains(&singular(&id.to_lowercase())));
                if named || (whole && i < 5) {
                    path.push(id.map_or_else(|| format!("#{}", i + 1), str::to_string));
                    leaves(item, path, asked, out);
                    path.pop();
                }
            }
        }
        Value::Null => {}
        scalar => out.push(Leaf {
            path: path.clone(),
            value: scalar,
        }),
    }
}

/// The answer a question asks for: the fields of the tool's data whose
/// names it uses (RSI, cash, price, quantity), with what they are about
/// (the record's symbol). `None` when it names none of them; the caller
/// then describes the data as a whole.
fn answer_fields(data: &Value, question: &str) -> Option<String> {
    let asked = question_terms(question);
    let mut all = Vec::new();
    leaves(data, &mut Vec::new(), &asked, &mut all);
    // A field's own name counts double; the keys above it count once. A
    // `value` field is named by its parent (`RSI.value` is the RSI).
    let score = |leaf: &Leaf| -> usize {
        let n = leaf.path.len();
        if n == 0 {
            return 0; // `data` is itself a scalar: nothing names it
        }
        let own = if leaf.path[n - 1] == "value" && n > 1 {
            n - 2
        } else {
            n - 1
        };
        let mut s = 0;
        for (i, key) in leaf.path.iter().enumerate() {
            let hits = key_terms(key).intersection(&asked).count();
            s += if i >= own { 2 * hits } else { hits };
        }
        s
    };
    let is_identifier = |leaf: &Leaf| {
        leaf.path
            .last()
            .is_some_and(|k| IDENTIFIERS.contains(&k.as_str()))
    };
    let scored: Vec<(usize, &Leaf)> = all
        .iter()
        .filter(|l| !is_identifier(l))
        .map(|l| (score(l), l))
        .collect();
    let best = scored.iter().map(|(s, _)| *s).max().filter(|s| *s >= 2)?;
    let facts: Vec<String> = scored
        .iter()
        .filter(|(s, _)| *s == best)
        .take(12)
        .map(|(_, leaf)| format!("{} {}", label(&leaf.path), scalar_text(leaf.value)))
        .collect();
    // What the record is about: its symbol (or name), when the data has one.
    let subject = ["symbol", "name"].iter().find_map(|f| {
        all.iter()
            .find(|l| l.path.len() <= 2 && l.path.last().is_some_and(|k| k == f))
            .map(|l| scalar_text(l.value))
    });
    Some(match subject {
        Some(s) if !facts.iter().any(|f| f.contains(&s)) => format!("{s}: {}", facts.join("; ")),
        _ => facts.join("; "),
    })
}

/// A leaf's name in an answer: its key, after the key that holds it when
/// that one says what it is (`RSI` for `indicators.RSI.value`, `BOLT
/// quantity` for an array item's).
fn label(path: &[String]) -> String {
    let human = |k: &str| k.replace('_', " ");
    match path {
        [.., parent, last] if last == "value" => human(parent),
        [.., parent, last]
            if parent.starts_with('#') || parent.chars().any(|c| c.is_ascii_uppercase()) =>
        {
            format!("{} {}", human(parent), human(last))
        }
        [.., last] => human(last),
        [] => String::new(),
    }
}

/// A scalar as the tool meant it: `100000.0` (a float that is whole) reads
/// `100000`.
fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

fn last_user_text(request: &ChatRequest) -> String {
    request
        .messages
        .iter()
        .rev()
        .find(|m| m.role == Role::User)
        .and_then(|m| m.content.clone())
        .unwrap_or_default()
}

fn first_sentence(s: &str, max: usize) -> String {
    let s = s.trim();
    let end = s
        .find(". ")
        .map(|i| i + 1)
        .or_else(|| s.find('\n'))
        .unwrap_or(s.len());
    s[..end].chars().take(max).collect()
}

/// Summary requests: the current summary plus the first sentence of each
/// new user and assistant message, the most recent kept when too long.
fn extractive_summary(request: &ChatRequest) -> String {
    let asked = last_user_text(request);
    let (current, new) = asked
        .split_once("\n\nNew messages to fold in:\n")
        .unwrap_or(("", asked.as_str()));
    let current = current.trim_start_matches("Current summary:\n").trim();
    let mut parts: Vec<String> = Vec::new();
    if !current.is_empty() && current != "(none yet)" {
        parts.push(current.to_string());
    }
    for line in new.lines() {
        for (prefix, who) in [
            ("user: ", "The user said"),
            ("assistant: ", "The assistant answered"),
        ] {
            if let Some(rest) = line.strip_prefix(prefix) {
                parts.push(format!("{who}: {}", first_sentence(rest, 160)));
            }
        }
    }
    let mut summary = parts.join(" ");
    const MAX: usize = 1200;
    if summary.chars().count() > MAX {
        let skip = summary.chars().count() - MAX;
        summary = format!("…{}", summary.chars().skip(skip).collect::<String>());
    }
    summary
}

/// Three reply suggestions for an operator, one per line.
fn suggestions(request: &ChatRequest) -> String {
    let asked = first_sentence(&last_user_text(request), 120);
    [
        format!("Thanks for your message! Let me look into \"{asked}\" for you."),
        "Could you tell me a bit more so I can help you best?".to_string(),
        "I'll check this with the team and get back to you shortly.".to_string(),
    ]
    .join("\n")
}

/// A reworded text: whitespace tidied, first letter capitalised, final
/// punctuation added.
fn improve(request: &ChatRequest) -> String {
    let text = last_user_text(request);
    let mut out = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if let Some(first) = out.chars().next() {
        out = first.to_uppercase().collect::<String>() + &out[first.len_utf8()..];
    }
    if !out.is_empty() && !out.ends_with(['.', '!', '?']) {
        out.push('.');
    }
    out
}

/// A readable line from a data tool's `data`: its scalar fields, and for
/// lists their length and the names of the first items.
fn describe_data(data: &Value) -> String {
    let scalar = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    };
    match data {
        Value::Object(map) => {
            // Scalars first, then those of nested objects (one level down).
            let nested = map.values().filter_map(Value::as_object).flatten();
            let mut parts: Vec<String> = map
                .iter()
                .chain(nested)
                .filter_map(|(k, v)| scalar(v).map(|s| format!("{} {s}", k.replace('_', " "))))
                .take(12)
                .collect();
            for (k, v) in map {
                if let Value::Array(items) = v {
                    let names: Vec<String> = items
                        .iter()
                        .filter_map(|i| {
                            ["symbol", "name", "title", "headline", "id"]
                                .iter()
                                .find_map(|f| i.get(*f).and_then(scalar))
                        })
                        .take(8)
                        .collect();
                    let mut s = format!("{} {}", items.len(), k.replace('_', " "));
                    if !names.is_empty() {
                        s.push_str(&format!(" ({})", names.join(", ")));
                    }
                    parts.push(s);
                }
            }
            parts.join("; ")
        }
        Value::Array(items) => format!("{} items", items.len()),
        other => scalar(other).unwrap_or_default(),
    }
}

const FUNCTIONS: [&str; 5] = ["sqrt", "abs", "min", "max", "round"];

/// The longest arithmetic expression in `s`, if it has an operator or a function.
pub fn extract_expression(s: &str) -> Option<String> {
    let chars: Vec<char> = s.chars().collect();
    let mut best: Option<String> = None;
    let mut i = 0;
    while i < chars.len() {
        let mut j = i;
        let mut span = String::new();
        while j < chars.len() {
            let c = chars[j];
            if c.is_ascii_digit() || "+-*/%^()., ×÷".contains(c) {
                span.push(c);
                j += 1;
            } else if let Some(f) = FUNCTIONS.iter().find(|f| {
                let w: String = chars[j..].iter().take(f.len()).collect();
                w.eq_ignore_ascii_case(f)
            }) {
                span.push_str(f);
                j += f.len();
            } else {
                break;
            }
        }
        let trimmed = span
            .trim()
            .trim_end_matches(|c: char| "+-*/%^.,×÷ ".contains(c))
            .trim_start_matches([',', '.', ' '])
            .to_string();
        let has_digit = trimmed.chars().any(|c| c.is_ascii_digit());
        let has_op = trimmed.chars().skip(1).any(|c| "+-*/%^×÷".contains(c))
            || FUNCTIONS.iter().any(|f| trimmed.contains(f));
        if has_digit && has_op && best.as_ref().is_none_or(|b| trimmed.len() > b.len()) {
            best = Some(trimmed);
        }
        i = j.max(i + 1);
    }
    best
}

const STOPWORDS: [&str; 16] = [
    "the", "a", "an", "is", "what", "of", "to", "me", "please", "for", "and", "my", "i", "you",
    "can", "it",
];

fn words(s: &str) -> HashSet<String> {
    s.split(|c: char| !c.is_alphanumeric() && c != '_')
        .flat_map(|w| w.split('_'))
        .map(str::to_lowercase)
        .filter(|w| w.len() > 1 && !STOPWORDS.contains(&w.as_str()))
        .collect()
}

fn pick_tool<'a>(question: &str, tools: &'a [ToolSpec]) -> Option<(&'a ToolSpec, Value)> {
    let expression = extract_expression(question);
    if let Some(expr) = &expression
        && let Some(tool) = tools.iter().find(|t| has_param(t, "expression"))
    {
        return Some((tool, json!({"expression": expr})));
    }
    let asked: HashSet<String> = words(question).iter().map(|w| singular(w)).collect();
    // Words of the tool's name count double; each required parameter the
    // message fills (a code, an enum value, a number) counts as much as a
    // name word, an optional one (a filter) half a description word; a tool
    // whose required parameters are all filled wins a tie, and of equals
    // the first offered.
    let (_, tool, args, score) = tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let name = key_terms(&t.name);
            let mut vocab = name.clone();
            vocab.extend(key_terms(&t.description));
            let matched =
                2 * asked.intersection(&name).count() + asked.intersection(&vocab).count();
            let filled = fill_arguments(t, question);
            // A tool is a candidate when the message uses its words or
            // names one of its specific values ("buy", "10 units").
            if matched + filled.specific == 0 {
                return (i, t, Value::Null, 0);
            }
            let score =
                2 * (matched + 2 * filled.named) + filled.optional + usize::from(filled.complete);
            (i, t, filled.args, score)
        })
        .max_by_key(|(i, _, _, score)| (*score, std::cmp::Reverse(*i)))?;
    if score == 0 {
        return None;
    }
    Some((tool, args))
}

fn has_param(tool: &ToolSpec, name: &str) -> bool {
    tool.parameters["properties"].get(name).is_some()
}

/// Fills parameters from the message: an enum value the message names, a
/// code for a string whose examples are codes, a number for a numeric
/// parameter (the one next to a word of the parameter's name or
/// description: "10 units" is a `quantity` of "Number of units"), a word matching a string's `pattern`,
/// `format` or `examples`, an id-like word for an identifier, a path for a
/// `path`, a URL for a `url`; other required strings get a quoted string,
/// else the message with the tool's name stripped ("echo hello" ->
/// "hello"). A required enum the message does
/// not name takes its default, else the value its description quotes
/// ("only '1d' and '1w'"), else its first. What is missing, the executor's
/// validation reports.
fn fill_arguments(tool: &ToolSpec, question: &str) -> Filled {
    let mut args = Map::new();
    let required: Vec<&str> = tool.parameters["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(props) = tool.parameters["properties"].as_object() else {
        return Filled {
            args: Value::Object(args),
            named: 0,
            optional: 0,
            specific: 0,
            complete: required.is_empty(),
        };
    };
    let asked: HashSet<String> = question
        .split(|c: char| !c.is_alphanumeric() && c != '_')
        .map(str::to_lowercase)
        .collect();
    let not_codes = not_codes(tool, props);
    let mut numbers = assign_numbers(props, &required, question);
    let mut named = 0;
    let mut optional = 0;
    let mut specific = 0;
    let mut complete = true;
    for (name, schema) in props {
        let is_required = required.contains(&name.as_str());
        let hints = Hints {
            question,
            asked: &asked,
            tool: &tool.name,
            not_codes: &not_codes,
        };
        let value = match numbers.remove(name) {
            Some((n, by_context)) => Some((n, Source::of(by_context))),
            None => fill_one(name, schema, &hints, is_required),
        };
        match value {
            Some((v, source)) => {
                let by_message = usize::from(source != Source::Default);
                if is_required {
                    named += by_message;
                } else {
                    optional += by_message;
                }
                specific += usize::from(source == Source::Specific);
                args.insert(name.clone(), v);
            }
            None if is_required => complete = false,
            None => {}
        }
    }
    Filled {
        args: Value::Object(args),
        named,
        optional,
        specific,
        complete,
    }
}

struct Filled {
    args: Value,
    /// Required parameters the message filled (a default does not count).
    named: usize,
    /// Optional parameters the message filled.
    optional: usize,
    /// Of those, the ones filled by a value only this tool's schema knows:
    /// an enum value, a number next to a word of its parameter.
    specific: usize,
    /// Whether every required parameter was filled.
    complete: bool,
}

/// Where a parameter's value came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    /// An enum value or a number by its word.
    Specific,
    /// Taken from the message, but any tool could have taken it (a code,
    /// the message text, a number left over).
    Message,
    /// Not in the message: the schema's default or first value.
    Default,
}

impl Source {
    fn of(specific: bool) -> Self {
        if specific {
            Source::Specific
        } else {
            Source::Message
        }
    }
}

/// The numbers of the message given to the numeric parameters: first each
/// number next to a word of a parameter's name or description, then the
/// numbers left to the required parameters left, in order. Each value
/// says whether it was found by its word.
fn assign_numbers(
    props: &Map<String, Value>,
    required: &[&str],
    question: &str,
) -> HashMap<String, (Value, bool)> {
    let tokens: Vec<&str> = question.split_whitespace().collect();
    let clean = |t: &str| {
        t.trim_matches(|c: char| !c.is_alphanumeric())
            .to_lowercase()
    };
    // (value, the words either side of it)
    let mut found: Vec<Option<(f64, HashSet<String>)>> = tokens
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let n: f64 = t
                .trim_start_matches('$')
                .trim_end_matches(['%', '?', '.', ',', '!'])
                .replace(',', "")
                .parse()
                .ok()?;
            let near: HashSet<String> = [i.checked_sub(1), Some(i + 1)]
                .into_iter()
                .flatten()
                .filter_map(|j| tokens.get(j))
                .map(|w| singular(&clean(w)))
                .collect();
            Some(Some((n, near)))
        })
        .collect();
    let numeric: Vec<(&String, &Value)> = props
        .iter()
        .filter(|(_, s)| s["type"] == "number" || s["type"] == "integer")
        .collect();
    let fits = |schema: &Value, n: f64| schema["type"] == "number" || n.fract() == 0.0;
    let mut out = HashMap::new();
    for (name, schema) in &numeric {
        let mut vocab = key_terms(name);
        vocab.extend(key_terms(
            schema["description"].as_str().unwrap_or_default(),
        ));
        let hit = found.iter().position(|f| {
            f.as_ref()
                .is_some_and(|(n, near)| fits(schema, *n) && !near.is_disjoint(&vocab))
        });
        if let Some(i) = hit
            && let Some((n, _)) = found[i].take()
        {
            out.insert((*name).clone(), (number(n), true));
        }
    }
    for (name, schema) in numeric {
        if out.contains_key(name) || !required.contains(&name.as_str()) {
            continue;
        }
        let next = found
            .iter()
            .position(|f| f.as_ref().is_some_and(|(n, _)| fits(schema, *n)));
        if let Some(i) = next
            && let Some((n, _)) = found[i].take()
        {
            out.insert(name.clone(), (number(n), false));
        }
    }
    out
}

fn number(n: f64) -> Value {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        json!(n as i64)
    } else {
        json!(n)
    }
}

struct Hints<'a> {
    question: &'a str,
    asked: &'a HashSet<String>,
    tool: &'a str,
    not_codes: &'a HashSet<String>,
}

/// One parameter's value, and where it came from.
fn fill_one(name: &str, schema: &Value, hints: &Hints, required: bool) -> Option<(Value, Source)> {
    let Hints {
        question,
        asked,
        tool,
        not_codes,
    } = *hints;
    let named = |options: &Vec<Value>| -> Vec<Value> {
        options
            .iter()
            .filter(|o| {
                o.as_str()
                    .is_some_and(|s| asked.contains(&s.to_lowercase()))
            })
            .cloned()
            .collect()
    };
    if let Some(options) = schema["enum"].as_array() {
        if let Some(v) = named(options).into_iter().next() {
            return Some((v, Source::Specific));
        }
        if !required {
            return None;
        }
        let description = schema["description"].as_str().unwrap_or_default();
        let quoted = options.iter().find(|o| {
            o.as_str()
                .is_some_and(|s| description.contains(&format!("'{s}'")))
        });
        let default = Some(&schema["default"]).filter(|d| options.contains(d));
        return default
            .or(quoted)
            .or(options.first())
            .map(|v| (v.clone(), Source::Default));
    }
    if let Some(options) = schema["items"]["enum"].as_array() {
        let chosen = named(options);
        return (!chosen.is_empty()).then_some((Value::Array(chosen), Source::Specific));
    }
    if schema["type"] != "string" {
        return None;
    }
    if let Some(longest) = code_examples(schema) {
        return code(question, longest, not_codes).map(|t| (Value::String(t), Source::Message));
    }
    let lower = name.to_lowercase();
    if !required {
        return None;
    }
    // What the schema says the value looks like, most specific first. A
    // parameter that says (a pattern, a format, an identifier) and finds
    // nothing of that shape is left out: the executor's validation then
    // names it, where the message text would only be a wrong value.
    let tokens = tokens(question);
    if let Some(pattern) = schema["pattern"].as_str()
        && let Some(matches) = pattern_matcher(pattern)
    {
        let quoted = quoted(question);
        return tokens
            .iter()
            .copied()
            .chain(quoted.iter().map(String::as_str))
            .chain([question.trim()])
            .find(|t| matches(t))
            .map(|t| (Value::String(t.to_string()), Source::Specific));
    }
    if let Some(shape) = schema["format"].as_str().and_then(Format::parse) {
        return tokens
            .iter()
            .find(|t| shape.fits(t))
            .map(|t| (Value::String((*t).to_string()), Source::Specific));
    }
    if let Some(found) = by_examples(schema, &tokens) {
        return Some((Value::String(found), Source::Specific));
    }
    if is_identifier(name, schema["description"].as_str().unwrap_or_default()) {
        return tokens
            .iter()
            .find(|t| id_like(t))
            .map(|t| (Value::String((*t).to_string()), Source::Message));
    }
    let value = if lower == "path" {
        let path = question
            .split_whitespace()
            .find(|w| w.starts_with('/'))
            .unwrap_or("/");
        Some(path.trim_end_matches(['?', '.', ',']).to_string())
    } else if lower == "topic" {
        question
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .rfind(|w| w.len() > 2 && !STOPWORDS.contains(&w.to_lowercase().as_str()))
            .map(str::to_lowercase)
    } else if lower == "url" {
        question
            .split_whitespace()
            .find(|w| w.starts_with("http://") || w.starts_with("https://"))
            .map(|w| w.trim_end_matches(['?', ',']).to_string())
    } else if let Some(first) = quoted(question).into_iter().next() {
        // A quoted string is what the user means the text to be.
        Some(first)
    } else {
        // The last resort, free text or not: the message, less the tool's
        // name ("echo hello" -> "hello").
        Some(strip_leading_word(question, tool))
    };
    // A path not in the message is the site's root, a default.
    let source = if lower != "path" || question.contains('/') {
        Source::Message
    } else {
        Source::Default
    };
    value.map(|v| (Value::String(v), source))
}

/// The words of a message as values: split at whitespace, the punctuation
/// around them removed ("A1001?" is `A1001`, "(ORD-17)," is `ORD-17`).
fn tokens(question: &str) -> Vec<&str> {
    question
        .split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| "\"'`“”‘’()[]{}<>,;!?".contains(c))
                .trim_end_matches(['.', ':'])
        })
        .filter(|w| !w.is_empty())
        .collect()
}

/// The quoted strings of a message, in order: "…", “…”, and '…' when the
/// quotes stand at word boundaries (the apostrophe of "what's" is not one).
fn quoted(question: &str) -> Vec<String> {
    let chars: Vec<char> = question.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let close = match chars[i] {
            '"' => Some('"'),
            '“' => Some('”'),
            '\'' if i == 0 || !chars[i - 1].is_alphanumeric() => Some('\''),
            _ => None,
        };
        let Some(close) = close else {
            i += 1;
            continue;
        };
        let end = (i + 1..chars.len()).find(|&j| {
            chars[j] == close
                && (close != '\'' || chars.get(j + 1).is_none_or(|c| !c.is_alphanumeric()))
        });
        match end {
            Some(j) => {
                let inner: String = chars[i + 1..j].iter().collect();
                if !inner.trim().is_empty() {
                    out.push(inner.trim().to_string());
                }
                i = j + 1;
            }
            None => i += 1,
        }
    }
    out
}

/// A schema's `pattern` as a test of a token, compiled as the executor's
/// validation compiles it (ECMA-style, unanchored) with a bound on its
/// size and backtracking; `None` when it does not compile (then it guides
/// nothing).
fn pattern_matcher(pattern: &str) -> Option<impl Fn(&str) -> bool> {
    let validator = jsonschema::options()
        .with_pattern_options(
            jsonschema::PatternOptions::fancy_regex()
                .size_limit(1 << 20)
                .backtrack_limit(100_000),
        )
        .build(&json!({"type": "string", "pattern": pattern}))
        .ok()?;
    Some(move |token: &str| validator.is_valid(&json!(token)))
}

/// The string formats whose shape the offline model knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Email,
    Uri,
    Date,
    DateTime,
    Uuid,
}

impl Format {
    fn parse(format: &str) -> Option<Format> {
        Some(match format {
            "email" | "idn-email" => Format::Email,
            "uri" | "url" | "iri" | "uri-reference" | "iri-reference" => Format::Uri,
            "date" => Format::Date,
            "date-time" => Format::DateTime,
            "uuid" => Format::Uuid,
            _ => return None,
        })
    }

    fn fits(self, t: &str) -> bool {
        let date = |d: &str| {
            let b = d.as_bytes();
            b.len() == 10
                && b.iter().enumerate().all(|(i, c)| {
                    if i == 4 || i == 7 {
                        *c == b'-'
                    } else {
                        c.is_ascii_digit()
                    }
                })
        };
        match self {
            Format::Email => t.split_once('@').is_some_and(|(user, host)| {
                !user.is_empty() && host.contains('.') && !host.contains('@')
            }),
            Format::Uri => t.split_once("://").is_some_and(|(scheme, rest)| {
                !rest.is_empty()
                    && scheme
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
            }),
            Format::Date => date(t),
            Format::DateTime => t.get(..10).is_some_and(date) && t[10..].starts_with(['T', 't']),
            Format::Uuid => {
                let groups: Vec<&str> = t.split('-').collect();
                groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
                    && groups
                        .iter()
                        .all(|g| g.chars().all(|c| c.is_ascii_hexdigit()))
            }
        }
    }
}

/// A value the schema's `examples` point at: one of them the message names
/// (as the example spells it), else the first word of an example's shape
/// ("A1001" for the example "B2002", "ORD-17" for "ORD-5").
fn by_examples(schema: &Value, tokens: &[&str]) -> Option<String> {
    let examples: Vec<&str> = schema["examples"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(schema.get("example"))
        .filter_map(Value::as_str)
        .collect();
    if examples.is_empty() {
        return None;
    }
    let exact = tokens.iter().find_map(|t| {
        examples
            .iter()
            .find(|e| e.eq_ignore_ascii_case(t))
            .map(|e| (*e).to_string())
    });
    let shapes: Vec<String> = examples.iter().map(|e| shape(e)).collect();
    exact.or_else(|| {
        tokens
            .iter()
            .find(|t| shapes.contains(&shape(t)))
            .map(|t| (*t).to_string())
    })
}

/// A word's shape: runs of capitals, small letters and digits, each as
/// one class (`A1001` → `A9`, `ord-17` → `a-9`); other characters as they are.
fn shape(token: &str) -> String {
    let mut out = String::new();
    for c in token.chars() {
        let class = if c.is_ascii_uppercase() {
            'A'
        } else if c.is_ascii_lowercase() {
            'a'
        } else if c.is_ascii_digit() {
            '9'
        } else {
            c
        };
        if !out.ends_with(class) || !"Aa9".contains(class) {
            out.push(class);
        }
    }
    out
}

/// Whether a string parameter holds an identifier: named `id`, `*_id` or
/// `*Id`, or (when its name is not one of free text) described as an
/// identifier or a number ("The order number").
fn is_identifier(name: &str, description: &str) -> bool {
    let lower = name.to_lowercase();
    if lower == "id" || lower.ends_with("_id") || lower.ends_with("-id") || name.ends_with("Id") {
        return true;
    }
    !FREE_TEXT.contains(&lower.as_str())
        && description
            .to_lowercase()
            .split(|c: char| !c.is_alphanumeric())
            .any(|w| matches!(w, "id" | "identifier" | "number" | "reference"))
}

/// Names of parameters that hold free text: they take a quoted string, else
/// the message itself.
const FREE_TEXT: [&str; 12] = [
    "query", "q", "message", "text", "question", "prompt", "content", "input", "body", "search",
    "note", "comment",
];

/// An identifier: letters, digits, `-` and `_`, with at least one digit
/// (`A1001`, `ORD-17`, `1001`, a UUID); one character is not enough.
fn id_like(t: &str) -> bool {
    t.chars().count() > 1
        && t.chars().any(|c| c.is_ascii_digit())
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// A code: capitals and digits, at least one capital (`BOLT`, `SKU42`).
fn is_code(w: &str) -> bool {
    w.chars().any(|c| c.is_ascii_uppercase())
        && w.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

/// When a string's `examples` are all codes: the longest one's length.
fn code_examples(schema: &Value) -> Option<usize> {
    let examples = schema["examples"].as_array()?;
    let lengths: Option<Vec<usize>> = examples
        .iter()
        .map(|e| e.as_str().filter(|e| is_code(e)).map(str::len))
        .collect();
    lengths?.into_iter().max()
}

/// Words a tool uses for something other than a code: its enum values
/// (e.g. indicator names), the words of its name (ML in a `get_ml_…`) and
/// the capitalised words of its descriptions (USD in "cash in USD"), its
/// codes' own examples excepted.
fn not_codes(tool: &ToolSpec, props: &Map<String, Value>) -> HashSet<String> {
    let enums = props.values().flat_map(|s| {
        let direct = s["enum"].as_array().into_iter().flatten();
        let items = s["items"]["enum"].as_array().into_iter().flatten();
        direct.chain(items)
    });
    let mut not: HashSet<String> = enums
        .filter_map(|v| v.as_str().map(str::to_uppercase))
        .collect();
    not.extend(words(&tool.name).iter().map(|w| w.to_uppercase()));
    let descriptions = std::iter::once(tool.description.as_str())
        .chain(props.values().filter_map(|s| s["description"].as_str()));
    for text in descriptions {
        not.extend(
            text.split(|c: char| !c.is_ascii_alphanumeric())
                .filter(|w| is_code(w))
                .map(str::to_string),
        );
    }
    for schema in props.values() {
        for example in schema["examples"].as_array().into_iter().flatten() {
            if let Some(e) = example.as_str() {
                not.remove(e);
            }
        }
    }
    not
}

/// The first code of the message, at most two characters longer than the
/// longest example, that is not an everyday word and not one the tool
/// uses for something else.
fn code(question: &str, longest: usize, not_codes: &HashSet<String>) -> Option<String> {
    const EVERYDAY: [&str; 5] = ["I", "A", "OK", "AND", "OR"];
    question
        .split(|c: char| !c.is_ascii_alphanumeric())
        .find(|w| {
            (1..=longest + 2).contains(&w.len())
                && is_code(w)
                && !EVERYDAY.contains(w)
                && !not_codes.contains(*w)
        })
        .map(str::to_string)
}

fn strip_leading_word(question: &str, word: &str) -> String {
    let q = question.trim();
    match q.get(..word.len()) {
        Some(head) if head.eq_ignore_ascii_case(word) => q[word.len()..]
            .trim_start_matches([':', ',', ' '])
            .to_string(),
        _ => q.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ToolChoice;

    fn tools() -> Vec<ToolSpec> {
        vec![
            crate::tools::builtin::echo::definition().spec(),
            crate::tools::builtin::calculator::definition().spec(),
        ]
    }

    fn ask(q: &str) -> ChatResponse {
        route(&ChatRequest {
            model: String::new(),
            messages: vec![ChatMessage::system("s"), ChatMessage::user(q)],
            tools: tools().into(),
            tool_choice: ToolChoice::Auto,
            temperature: None,
            max_tokens: None,
            purpose: Purpose::Turn,
            response_format: None,
        })
    }

    #[test]
    fn a_typed_answer_is_an_object_even_when_its_schema_names_no_type() {
        // A schema of unknown keywords only (contract fuzzing sends these):
        // any object matches it, a string does not.
        let facts = Facts::new(&[], "q", "the answer");
        let schema = json!({"": {"x": [null]}, "__main__": ["a"]});
        assert_eq!(fill_schema(&schema, "", &facts, 0), json!({}));
        assert_eq!(
            fill_schema(&json!({}), "field", &facts, 1),
            json!("the answer")
        );
    }

    #[test]
    fn extracts_the_arithmetic_from_a_question() {
        assert_eq!(extract_expression("What is 6*7?").as_deref(), Some("6*7"));
        assert_eq!(
            extract_expression("What is (2+3)*4?").as_deref(),
            Some("(2+3)*4")
        );
        assert_eq!(
            extract_expression("compute sqrt(16) + 1 please").as_deref(),
            Some("sqrt(16) + 1")
        );
        assert_eq!(extract_expression("I have 3 cats"), None);
        assert_eq!(
            extract_expression("the year 2024-2025").as_deref(),
            Some("2024-2025")
        );
    }

    #[test]
    fn arithmetic_goes_to_the_calculator_and_text_to_echo() {
        let r = ask("What is 6*7?");
        assert_eq!(r.tool_calls[0].name, "calculator");
        assert_eq!(r.tool_calls[0].arguments, r#"{"expression":"6*7"}"#);
        let r = ask("echo hello world");
        assert_eq!(r.tool_calls[0].name, "echo");
        assert_eq!(r.tool_calls[0].arguments, r#"{"message":"hello world"}"#);
        let r = ask("tell me a story");
        assert!(r.tool_calls.is_empty());
        assert!(r.content.unwrap().contains("offline"));
    }

    #[test]
    fn with_no_tools_it_restates_the_facts_of_the_message() {
        let r = route(&ChatRequest {
            model: String::new(),
            messages: vec![ChatMessage::user(
                "Write a brief on BOLT.\nPrice: {\"source_id\":\"tool:price:v1\",\"data\":{\"symbol\":\"BOLT\",\"price\":189.5},\"as_of\":\"2024-01-02\"}\nNews: [{\"title\":\"Up\"}]",
            )],
            tools: Vec::new().into(),
            tool_choice: ToolChoice::Auto,
            temperature: None,
            max_tokens: None,
            purpose: Purpose::Turn,
            response_format: None,
        });
        let answer = r.content.unwrap();
        assert!(answer.starts_with("Write a brief on BOLT.\n"), "{answer}");
        assert!(
            answer.contains("- Price: price 189.5; symbol BOLT [tool:price:v1]"),
            "{answer}"
        );
        assert!(answer.contains("- News: 1 items"), "{answer}");
        let plain = route(&ChatRequest {
            model: String::new(),
            messages: vec![ChatMessage::user("hello")],
            tools: Vec::new().into(),
            tool_choice: ToolChoice::Auto,
            temperature: None,
            max_tokens: None,
            purpose: Purpose::Turn,
            response_format: None,
        });
        assert!(plain.content.unwrap().contains("no tools for this agent"));
    }

    fn spec(name: &str, description: &str, parameters: Value) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            parameters,
        }
    }

    /// Two tools of a warehouse: the order wins on its values, the
    /// calculator of units loses although it shares a word.
    fn warehouse() -> Vec<ToolSpec> {
        let sku = json!({"type": "string", "examples": ["BOLT", "NUT8"],
                         "description": "Stock keeping unit, e.g. BOLT (not SKU)"});
        vec![
            spec(
                "calculate_reorder_size",
                "Number of units to reorder so that stock covers the lead time.",
                json!({"type": "object", "required": ["daily_demand", "lead_days"],
                       "properties": {"daily_demand": {"type": "number"},
                                      "lead_days": {"type": "number"}}}),
            ),
            spec(
                "create_purchase_order",
                "Place a purchase order with the supplier.",
                json!({"type": "object", "required": ["sku", "action", "quantity", "shipping"],
                       "properties": {"sku": sku,
                                      "action": {"type": "string", "enum": ["order", "return"]},
                                      "quantity": {"type": "number",
                                                   "description": "Number of units"},
                                      "shipping": {"type": "string",
                                                   "enum": ["ground", "air"]},
                                      "max_price": {"type": "number"}}}),
            ),
        ]
    }

    #[test]
    fn an_order_is_filled_from_the_question_and_beats_a_calculator_of_units() {
        let tools = warehouse();
        let (tool, args) = pick_tool("Order 10 units of SCREW", &tools).unwrap();
        assert_eq!(tool.name, "create_purchase_order");
        assert_eq!(
            args,
            json!({"sku": "SCREW", "action": "order", "quantity": 10, "shipping": "ground"})
        );
        // A capitalised word of the tool's own descriptions is not a code.
        let (_, args) = pick_tool("Order 10 units of SKU", &tools).unwrap();
        assert_eq!(args.get("sku"), None, "{args}");
    }

    #[test]
    fn a_data_answer_states_the_fields_the_question_names() {
        let data = json!({"name": "north", "bins_used": 320, "last_count": 506.24,
                          "metrics": {"FILL": {"period": 14, "value": 47.9063}}});
        assert_eq!(
            answer_fields(&data, "Show the FILL for north").as_deref(),
            Some("north: FILL 47.9063")
        );
        let data = json!({"cash": 100000.0, "equity": 140323.0, "stock": [
            {"name": "BOLT", "quantity": 50}, {"name": "NUT8", "quantity": 20}]});
        assert_eq!(
            answer_fields(&data, "How much cash do I have?").as_deref(),
            Some("cash 100000")
        );
        assert_eq!(
            answer_fields(&data, "How many NUT8 do I hold?").as_deref(),
            Some("NUT8 quantity 20")
        );
        // A domain's word for a field is not known: the caller describes
        // the whole record.
        assert_eq!(answer_fields(&data, "How many NUT8 units are left?"), None);
        assert_eq!(answer_fields(&data, "Tell me everything"), None);
        assert_eq!(answer_fields(&json!(42), "What is the value?"), None);
        // Naming only the list: no field is asked for; the caller lists it.
        assert_eq!(answer_fields(&data, "Show my stock"), None);
    }

    fn one_tool(name: &str, description: &str, properties: Value, required: &[&str]) -> ToolSpec {
        spec(
            name,
            description,
            json!({"type": "object", "properties": properties, "required": required}),
        )
    }

    /// The arguments the offline model sends to `tool` for `q`.
    fn filled(tool: &ToolSpec, q: &str) -> Value {
        fill_arguments(tool, q).args
    }

    #[test]
    fn an_id_parameter_gets_the_id_like_token_not_the_message() {
        let tool = one_tool(
            "lookup_order",
            "Look up an order",
            json!({"order_id": {"type": "string"}}),
            &["order_id"],
        );
        assert_eq!(
            filled(&tool, "Where is my order A1001?"),
            json!({"order_id": "A1001"})
        );
        assert_eq!(
            filled(&tool, "status of (ORD-17), please"),
            json!({"order_id": "ORD-17"})
        );
        assert_eq!(
            filled(&tool, "find 0190f1a2-7b3c-7def-8a9b-0123456789ab now"),
            json!({"order_id": "0190f1a2-7b3c-7def-8a9b-0123456789ab"})
        );
        // Described, not named: "the parcel number".
        let by_description = one_tool(
            "track",
            "Track a parcel",
            json!({"parcel": {"type": "string", "description": "The parcel number"}}),
            &["parcel"],
        );
        assert_eq!(
            filled(&by_description, "track parcel 77123 please"),
            json!({"parcel": "77123"})
        );
        // Nothing id-like: left out (the executor names it), never the message.
        assert_eq!(filled(&tool, "Where is my order?"), json!({}));
        let offered = [tool];
        let (picked, args) = pick_tool("Where is my order A1001?", &offered).unwrap();
        assert_eq!(picked.name, "lookup_order");
        assert_eq!(args, json!({"order_id": "A1001"}));
    }

    #[test]
    fn a_pattern_takes_the_first_token_that_matches_it() {
        let tool = one_tool(
            "cancel_order",
            "Cancel an order",
            json!({"ref": {"type": "string", "pattern": "^ord_[0-9a-f]{4}$"}}),
            &["ref"],
        );
        assert_eq!(
            filled(&tool, "cancel ord_zzzz no, ord_beef please"),
            json!({"ref": "ord_beef"})
        );
        assert_eq!(filled(&tool, "cancel my last order"), json!({}));
        // A pattern that does not compile guides nothing: the other rules fill.
        let broken = one_tool(
            "cancel_order",
            "Cancel an order",
            json!({"order_id": {"type": "string", "pattern": "(unclosed"}}),
            &["order_id"],
        );
        assert_eq!(
            filled(&broken, "cancel B-2002 now"),
            json!({"order_id": "B-2002"})
        );
    }

    #[test]
    fn a_format_takes_a_token_of_its_shape() {
        let tool = one_tool(
            "book",
            "Book a visit",
            json!({"email": {"type": "string", "format": "email"},
                   "day": {"type": "string", "format": "date"},
                   "site": {"type": "string", "format": "uri"},
                   "ref": {"type": "string", "format": "uuid"}}),
            &["email", "day", "site", "ref"],
        );
        assert_eq!(
            filled(
                &tool,
                "Book 2025-03-14 for ann@example.org at https://example.org/x, \
                 ref 0190F1A2-7B3C-7DEF-8A9B-0123456789AB."
            ),
            json!({"email": "ann@example.org", "day": "2025-03-14",
                   "site": "https://example.org/x",
                   "ref": "0190F1A2-7B3C-7DEF-8A9B-0123456789AB"})
        );
        assert_eq!(filled(&tool, "Book a visit"), json!({}));
    }

    #[test]
    fn examples_pick_the_token_of_their_shape() {
        let tool = one_tool(
            "get_ticket",
            "Show a support ticket",
            json!({"ticket": {"type": "string", "examples": ["TCK-5", "TCK-1234"]}}),
            &["ticket"],
        );
        assert_eq!(
            filled(&tool, "show me ticket TCK-88 from 2024"),
            json!({"ticket": "TCK-88"})
        );
        let named = one_tool(
            "set_plan",
            "Change the plan",
            json!({"plan": {"type": "string", "examples": ["starter", "team"]}}),
            &["plan"],
        );
        assert_eq!(
            filled(&named, "move us to the Team plan"),
            json!({"plan": "team"})
        );
    }

    #[test]
    fn a_quoted_string_fills_a_text_parameter_else_the_message_does() {
        let tool = one_tool(
            "search_docs",
            "Search the documentation",
            json!({"query": {"type": "string"}}),
            &["query"],
        );
        assert_eq!(
            filled(&tool, "search the docs for \"rate limit\" please"),
            json!({"query": "rate limit"})
        );
        assert_eq!(
            filled(&tool, "what's the docs' word for 'hot reload'?"),
            json!({"query": "hot reload"})
        );
        assert_eq!(
            filled(&tool, "what's new in the docs"),
            json!({"query": "what's new in the docs"})
        );
    }

    #[test]
    fn numbers_fill_numeric_parameters_from_the_message() {
        let tool = one_tool(
            "refund",
            "Refund part of an order",
            json!({"order_id": {"type": "string"}, "amount": {"type": "number"},
                   "count": {"type": "integer"}}),
            &["order_id", "amount", "count"],
        );
        assert_eq!(
            filled(&tool, "refund 12.5 on A1001 for 3 items"),
            json!({"order_id": "A1001", "amount": 12.5, "count": 3})
        );
    }

    #[test]
    fn answers_from_tool_results() {
        let call = ToolCall {
            id: "c1".into(),
            name: "calculator".into(),
            arguments: "{}".into(),
        };
        let r = route(&ChatRequest {
            model: String::new(),
            messages: vec![
                ChatMessage::user("What is 6*7?"),
                ChatMessage::assistant_tool_calls(None, vec![call.clone()]),
                ChatMessage::tool_result(
                    &call,
                    r#"{"expression":"6*7","result":42.0,"formatted":"42"}"#,
                ),
            ],
            tools: tools().into(),
            tool_choice: ToolChoice::Auto,
            temperature: None,
            max_tokens: None,
            purpose: Purpose::Turn,
            response_format: None,
        });
        assert_eq!(r.content.as_deref(), Some("6*7 = 42"));
    }
}
