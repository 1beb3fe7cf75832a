//! A tool result as the API returns it: MCP content blocks mapped to typed proto blocks (base64 decoded),
//! with host paths of the thread's directories rewritten to the `/mnt/user-data/…` paths the agent and
//! the sandbox use.
//!
//! Blocks are read from their JSON wire form (`type`: text | image | audio | resource | resource_link),
//! which is the protocol's contract, rather than from rmcp's enums, which grow variants between versions.

use antler_proto::mcp::{
    AudioContent, EmbeddedResource, ImageContent, ResourceLink, TextContent, ToolContent, embedded_resource, tool_content,
};
use base64::Engine;
use serde_json::Value;

/// (host prefix, virtual prefix) pairs, longest host prefix first.
pub type Rewrites = [(String, String)];

/// Replaces host prefixes in `text`.
pub fn rewrite(text: &str, rewrites: &Rewrites) -> String {
    let mut out = text.to_owned();
    for (host, virt) in rewrites {
        if !host.is_empty() && out.contains(host.as_str()) {
            out = out.replace(host.as_str(), virt);
        }
    }
    out
}

/// Rewrites every string inside a structured result.
pub fn rewrite_json(value: &mut Value, rewrites: &Rewrites) {
    match value {
        Value::String(s) => *s = rewrite(s, rewrites),
        Value::Array(items) => items.iter_mut().for_each(|v| rewrite_json(v, rewrites)),
        Value::Object(map) => map.values_mut().for_each(|v| rewrite_json(v, rewrites)),
        _ => {}
    }
}

fn rewrite_uri(uri: &str, rewrites: &Rewrites) -> String {
    if let Some(path) = uri.strip_prefix("file://") {
        for (host, virt) in rewrites {
            if let Some(rest) = path.strip_prefix(host.as_str())
                && (rest.is_empty() || rest.starts_with('/'))
            {
                return format!("{virt}{rest}");
            }
        }
    }
    rewrite(uri, rewrites)
}

fn text_of(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or_default().to_owned()
}

fn decode(v: &Value, key: &str) -> Vec<u8> {
    let data = v.get(key).and_then(Value::as_str).unwrap_or_default();
    base64::engine::general_purpose::STANDARD.decode(data.trim()).unwrap_or_else(|_| data.as_bytes().to_vec())
}

/// Maps one block; an unknown block type becomes text describing it (nothing is dropped silently).
pub fn block(v: &Value, rewrites: &Rewrites) -> ToolContent {
    let content = match v.get("type").and_then(Value::as_str).unwrap_or_default() {
        "text" => tool_content::Content::Text(TextContent { text: rewrite(&text_of(v, "text"), rewrites) }),
        "image" => tool_content::Content::Image(ImageContent { data: decode(v, "data"), mime_type: text_of(v, "mimeType") }),
        "audio" => tool_content::Content::Audio(AudioContent { data: decode(v, "data"), mime_type: text_of(v, "mimeType") }),
        "resource" => {
            let r = v.get("resource").cloned().unwrap_or(Value::Null);
            let content = if r.get("blob").is_some() {
                embedded_resource::Content::Blob(decode(&r, "blob"))
            } else {
                embedded_resource::Content::Text(rewrite(&text_of(&r, "text"), rewrites))
            };
            tool_content::Content::Resource(EmbeddedResource {
                uri: rewrite_uri(&text_of(&r, "uri"), rewrites),
                mime_type: text_of(&r, "mimeType"),
                content: Some(content),
            })
        }
        "resource_link" => tool_content::Content::ResourceLink(ResourceLink {
            uri: rewrite_uri(&text_of(v, "uri"), rewrites),
            name: text_of(v, "name"),
            description: text_of(v, "description"),
            mime_type: text_of(v, "mimeType"),
        }),
        other => tool_content::Content::Text(TextContent { text: format!("[unsupported MCP content block of type `{other}`]") }),
    };
    ToolContent { content: Some(content) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rewrites() -> Vec<(String, String)> {
        vec![("/data/sandbox/users/u/threads/t/user-data".to_owned(), "/mnt/user-data".to_owned())]
    }

    #[test]
    fn host_paths_become_virtual_paths_in_text_and_file_links() {
        let text = block(&json!({"type": "text", "text": "wrote /data/sandbox/users/u/threads/t/user-data/outputs/a.csv"}), &rewrites());
        assert!(matches!(text.content, Some(tool_content::Content::Text(ref t)) if t.text == "wrote /mnt/user-data/outputs/a.csv"));
        let link = block(
            &json!({"type": "resource_link", "uri": "file:///data/sandbox/users/u/threads/t/user-data/outputs/a.csv", "name": "a"}),
            &rewrites(),
        );
        assert!(matches!(link.content, Some(tool_content::Content::ResourceLink(ref l)) if l.uri == "/mnt/user-data/outputs/a.csv"));
        let other = block(&json!({"type": "resource_link", "uri": "https://example.com/x", "name": "x"}), &rewrites());
        assert!(matches!(other.content, Some(tool_content::Content::ResourceLink(ref l)) if l.uri == "https://example.com/x"));
    }

    #[test]
    fn binary_blocks_are_decoded() {
        let image = block(&json!({"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"}), &[]);
        assert!(matches!(image.content, Some(tool_content::Content::Image(ref i)) if i.data == b"hello" && i.mime_type == "image/png"));
    }
}
