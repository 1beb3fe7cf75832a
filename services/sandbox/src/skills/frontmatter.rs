//! `SKILL.md` frontmatter with DeerFlow's validation rules (reference §7).
//!
//! The file must start with a `---` line; the YAML up to the next `---` line is a mapping whose keys are
//! among [`ALLOWED_KEYS`]. `name` is required, hyphen-case (`[a-z0-9-]`, no leading, trailing or double
//! hyphen), at most [`MAX_NAME`] characters; `description` is required, at most [`MAX_DESCRIPTION`]
//! characters, without `<` or `>`; `allowed-tools`, when present, is a list of non-empty strings (absent
//! = no tool policy, empty list = no tools).

use serde_yaml_ng::Value;

/// Longest skill name, in characters.
pub const MAX_NAME: usize = 64;
/// Longest description, in characters.
pub const MAX_DESCRIPTION: usize = 1024;
/// The only keys a frontmatter may have.
pub const ALLOWED_KEYS: [&str; 10] = [
    "name",
    "description",
    "license",
    "allowed-tools",
    "required-secrets",
    "secrets-autonomous",
    "metadata",
    "compatibility",
    "version",
    "author",
];

/// The validated metadata of one skill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillMeta {
    /// Hyphen-case name; also its directory name.
    pub name: String,
    /// What the skill does and when to use it (shown to the model).
    pub description: String,
    /// `license`, if given.
    pub license: Option<String>,
    /// `allowed-tools`: None = no policy, Some(empty) = no tools.
    pub allowed_tools: Option<Vec<String>>,
}

/// Why a `SKILL.md` is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("SKILL.md: {0}")]
pub struct FrontmatterError(pub String);

fn bad(message: impl Into<String>) -> FrontmatterError {
    FrontmatterError(message.into())
}

/// Checks a skill name against the hyphen-case rule.
pub fn check_name(name: &str) -> Result<(), FrontmatterError> {
    if name.is_empty() {
        return Err(bad("name is empty"));
    }
    if name.chars().count() > MAX_NAME {
        return Err(bad(format!("name is {} characters; the limit is {MAX_NAME}", name.chars().count())));
    }
    if !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
        return Err(bad(format!("name {name:?} must be hyphen-case: lowercase letters, digits and '-'")));
    }
    if name.starts_with('-') || name.ends_with('-') || name.contains("--") {
        return Err(bad(format!("name {name:?} must not start or end with '-' or contain '--'")));
    }
    Ok(())
}

/// Parses and validates the frontmatter of a `SKILL.md`.
pub fn parse(text: &str) -> Result<SkillMeta, FrontmatterError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or("");
    if first.trim_end() != "---" {
        return Err(bad("does not start with a '---' frontmatter line"));
    }
    let mut yaml = String::new();
    let mut closed = false;
    for line in lines {
        if line.trim_end() == "---" {
            closed = true;
            break;
        }
        yaml.push_str(line);
    }
    if !closed {
        return Err(bad("the frontmatter has no closing '---' line"));
    }
    let value: Value = serde_yaml_ng::from_str(&yaml).map_err(|e| bad(format!("frontmatter is not valid YAML: {e}")))?;
    let Value::Mapping(map) = value else {
        return Err(bad("frontmatter must be a YAML mapping"));
    };
    for key in map.keys() {
        let Some(key) = key.as_str() else { return Err(bad("frontmatter keys must be strings")) };
        if !ALLOWED_KEYS.contains(&key) {
            return Err(bad(format!("unexpected key {key:?}; allowed: {}", ALLOWED_KEYS.join(", "))));
        }
    }
    let text_field = |key: &str| -> Result<Option<String>, FrontmatterError> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.trim().to_owned())),
            Some(_) => Err(bad(format!("{key} must be a string"))),
        }
    };
    let name = text_field("name")?.ok_or_else(|| bad("name is required"))?;
    check_name(&name)?;
    let description = text_field("description")?.ok_or_else(|| bad("description is required"))?;
    if description.is_empty() {
        return Err(bad("description is empty"));
    }
    if description.chars().count() > MAX_DESCRIPTION {
        return Err(bad(format!("description is {} characters; the limit is {MAX_DESCRIPTION}", description.chars().count())));
    }
    if description.contains(['<', '>']) {
        return Err(bad("description must not contain '<' or '>'"));
    }
    let license = text_field("license")?;
    let allowed_tools = match map.get("allowed-tools") {
        None | Some(Value::Null) => None,
        Some(Value::Sequence(items)) => {
            let mut tools = Vec::with_capacity(items.len());
            for item in items {
                match item.as_str().map(str::trim) {
                    Some(tool) if !tool.is_empty() => tools.push(tool.to_owned()),
                    _ => return Err(bad("allowed-tools must be a list of non-empty strings")),
                }
            }
            Some(tools)
        }
        Some(_) => return Err(bad("allowed-tools must be a list of non-empty strings")),
    };
    if let Some(v) = map.get("secrets-autonomous")
        && !v.is_bool()
    {
        return Err(bad("secrets-autonomous must be true or false"));
    }
    Ok(SkillMeta { name, description, license, allowed_tools })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(front: &str) -> String {
        format!("---\n{front}\n---\n# Body\n")
    }

    #[test]
    fn a_valid_frontmatter_parses() -> anyhow::Result<()> {
        let meta = parse(&doc("name: data-analysis\ndescription: Analyse CSV files.\nallowed-tools: [bash, read_file]"))?;
        assert_eq!(meta.name, "data-analysis");
        assert_eq!(meta.allowed_tools, Some(vec!["bash".to_owned(), "read_file".to_owned()]));
        assert_eq!(parse(&doc("name: a\ndescription: d"))?.allowed_tools, None);
        assert_eq!(parse(&doc("name: a\ndescription: d\nallowed-tools: []"))?.allowed_tools, Some(vec![]));
        Ok(())
    }

    #[test]
    fn deerflows_rules_are_enforced() {
        let long_name = "a".repeat(65);
        let long_desc = "d".repeat(1025);
        let cases = [
            ("name: Data\ndescription: d", "hyphen-case"),
            ("name: -a\ndescription: d", "must not start"),
            ("name: a--b\ndescription: d", "must not start"),
            (&format!("name: {long_name}\ndescription: d") as &str, "limit is 64"),
            (&format!("name: a\ndescription: {long_desc}"), "limit is 1024"),
            ("name: a\ndescription: use <b>", "'<' or '>'"),
            ("name: a\ndescription: d\nextra: 1", "unexpected key \"extra\""),
            ("description: d", "name is required"),
            ("name: a", "description is required"),
            ("name: a\ndescription: d\nallowed-tools: bash", "list of non-empty strings"),
            ("name: a\ndescription: d\nallowed-tools: ['']", "list of non-empty strings"),
        ];
        for (front, want) in cases {
            let err = parse(&doc(front)).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(want), "{front:?}: got {err:?}, want {want:?}");
        }
        assert!(parse("# no frontmatter\n").is_err());
        assert!(parse("---\nname: a\ndescription: d\n").is_err());
    }
}
