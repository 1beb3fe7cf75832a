//! Helpers for callers of McpService (the lead agent's MCP tools): what a model sees of a tool, whether a
//! call is side-effecting, and a tool result as the text of a tool message.

use antler_proto::common::ToolSpec;
use antler_proto::mcp::{CallToolResponse, Tool, embedded_resource, tool_content};

/// The tool as a model sees it (name, description, JSON-schema parameters).
pub fn tool_spec(tool: &Tool) -> ToolSpec {
    ToolSpec { name: tool.name.clone(), description: tool.description.clone(), parameters: tool.input_schema.clone() }
}

/// True only when the server declares `readOnlyHint: true`; every other call must be treated as
/// side-effecting (journalled, never blindly repeated).
pub fn is_read_only(tool: &Tool) -> bool {
    tool.annotations.as_ref().and_then(|a| a.read_only_hint) == Some(true)
}

/// The result as the text of a tool message: text blocks as they are, other blocks as one-line notes
/// (binary data is not inlined).
pub fn result_text(response: &CallToolResponse) -> String {
    let mut parts: Vec<String> = Vec::new();
    for block in &response.content {
        match &block.content {
            Some(tool_content::Content::Text(t)) => parts.push(t.text.clone()),
            Some(tool_content::Content::Image(i)) => parts.push(format!("[image {} ({} bytes)]", i.mime_type, i.data.len())),
            Some(tool_content::Content::Audio(a)) => parts.push(format!("[audio {} ({} bytes)]", a.mime_type, a.data.len())),
            Some(tool_content::Content::Resource(r)) => match &r.content {
                Some(embedded_resource::Content::Text(text)) => parts.push(format!("[resource {}]\n{text}", r.uri)),
                Some(embedded_resource::Content::Blob(blob)) => parts.push(format!("[resource {} ({} bytes)]", r.uri, blob.len())),
                None => parts.push(format!("[resource {}]", r.uri)),
            },
            Some(tool_content::Content::ResourceLink(l)) => parts.push(format!("[resource link {} {}]", l.name, l.uri)),
            None => {}
        }
    }
    if parts.is_empty()
        && let Some(structured) = &response.structured_content
    {
        return format!("{structured:?}");
    }
    parts.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use antler_proto::mcp::{TextContent, ToolAnnotations, ToolContent};

    #[test]
    fn only_a_declared_read_only_hint_counts() {
        let mut tool = Tool { name: "fs_read".into(), ..Tool::default() };
        assert!(!is_read_only(&tool));
        tool.annotations = Some(ToolAnnotations { read_only_hint: Some(true), ..ToolAnnotations::default() });
        assert!(is_read_only(&tool));
    }

    #[test]
    fn text_blocks_are_joined() {
        let text = |t: &str| ToolContent { content: Some(tool_content::Content::Text(TextContent { text: t.into() })) };
        let response = CallToolResponse { content: vec![text("a"), text("b")], ..CallToolResponse::default() };
        assert_eq!(result_text(&response), "a\nb");
    }
}
