//! MCP content through cadre: a server's tool result as a tool output, and
//! back into content blocks when cadre serves that tool again.
//!
//! MCP server ──CallToolResult──▶ [`output`] ──▶ executor (output: Value) ──▶ model, API, records
//!                                                      │
//! MCP client ◀── content blocks ◀── [`blocks`] ◀───────┘  (cadre's `/mcp` or `cadre mcp`)
//!
//! The executor carries one JSON value per call, so the blocks are folded
//! into it: the `structuredContent` when given, else the text blocks joined
//! and parsed as JSON when they are JSON, else that text; a result with any
//! other block (image, audio, resource, link, or no block at all) is the
//! blocks themselves, as the JSON array MCP writes them in. The model reads
//! that array as text, as before; [`blocks`] reads it back, so a client of
//! cadre's MCP server gets the image as an image block and not as a JSON
//! string inside a text block. Only outputs of MCP tools are read back:
//! a builtin or HTTP tool that returns an array of `{type: ...}` objects
//! means its own data. A result with `structuredContent` keeps only that (the
//! protocol asks the server to repeat it as text; nothing else is kept).

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::Value;

/// The tool output of a successful MCP tool result.
pub fn output(result: CallToolResult) -> Value {
    if let Some(structured) = result.structured_content {
        return structured;
    }
    let text: Vec<&str> = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect();
    if text.len() == result.content.len() && !text.is_empty() {
        let joined = text.join("\n");
        return serde_json::from_str(&joined).unwrap_or(Value::String(joined));
    }
    serde_json::to_value(&result.content).unwrap_or(Value::Null)
}

/// The content blocks an MCP tool's output stands for, when [`output`] kept
/// them as blocks; `None` for any other output.
pub fn blocks(output: &Value) -> Option<Vec<ContentBlock>> {
    if !output.is_array() {
        return None;
    }
    serde_json::from_value(output.clone()).ok()
}

/// The text blocks of a result, in order.
pub fn texts(result: &CallToolResult) -> Vec<String> {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_image_result_comes_back_as_the_same_blocks() {
        let result = CallToolResult::success(vec![
            ContentBlock::text("a red dot"),
            ContentBlock::image("aGVsbG8=", "image/png"),
        ]);
        let out = output(result.clone());
        assert_eq!(out[1]["type"], "image", "{out}");
        assert_eq!(blocks(&out), Some(result.content));
    }

    #[test]
    fn text_and_structured_results_are_plain_outputs() {
        let text = CallToolResult::success(vec![ContentBlock::text("{\"n\": 1}")]);
        assert_eq!(output(text), json!({"n": 1}));
        let words = CallToolResult::success(vec![ContentBlock::text("a"), ContentBlock::text("b")]);
        assert_eq!(output(words), json!("a\nb"));
        let structured = CallToolResult::structured(json!({"area": 2.0}));
        assert_eq!(output(structured), json!({"area": 2.0}));
        assert_eq!(blocks(&json!({"type": "image"})), None);
        assert_eq!(blocks(&json!([1, 2])), None);
    }
}
