//! `$VAR` / `${VAR}` / `${VAR:-default}` substitution in the string values of a parsed YAML tree.
//!
//! Substitution runs on the parsed tree rather than on the raw text so that an error can name the YAML
//! path of the value that referenced a missing variable, and so that a value containing YAML syntax
//! cannot change the document's structure. `$$` stands for a literal `$`.

use serde_yaml_ng::Value;

use super::ConfigError;

/// Replaces variable references in every string scalar below `value`. `path` is the YAML path of
/// `value` itself (empty for the document root). `lookup` resolves a variable name.
pub(crate) fn substitute(value: &mut Value, path: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
    match value {
        Value::String(text) => {
            if !text.contains('$') {
                return Ok(());
            }
            let whole_reference = is_single_reference(text);
            let expanded = expand(text, path, lookup)?;
            // `port: $PORT` should give a number, not the string "8080": a value that was exactly one
            // reference is re-read as a YAML scalar. Anything that would parse as a mapping or a
            // sequence stays a string, so a variable cannot inject structure.
            *value = if whole_reference {
                match serde_yaml_ng::from_str::<Value>(&expanded) {
                    Ok(parsed @ (Value::Bool(_) | Value::Number(_))) => parsed,
                    _ => Value::String(expanded),
                }
            } else {
                Value::String(expanded)
            };
            Ok(())
        }
        Value::Sequence(items) => {
            for (index, item) in items.iter_mut().enumerate() {
                substitute(item, &format!("{path}[{index}]"), lookup)?;
            }
            Ok(())
        }
        Value::Mapping(map) => {
            for (key, item) in map.iter_mut() {
                let key = key_name(key);
                let child = if path.is_empty() { key } else { format!("{path}.{key}") };
                substitute(item, &child, lookup)?;
            }
            Ok(())
        }
        Value::Tagged(tagged) => substitute(&mut tagged.value, path, lookup),
        Value::Null | Value::Bool(_) | Value::Number(_) => Ok(()),
    }
}

/// A printable name for a mapping key.
pub(crate) fn key_name(key: &Value) -> String {
    match key {
        Value::String(s) => s.clone(),
        other => serde_yaml_ng::to_string(other).map(|s| s.trim().to_owned()).unwrap_or_else(|_| "?".to_owned()),
    }
}

fn is_single_reference(text: &str) -> bool {
    let Some(rest) = text.strip_prefix('$') else { return false };
    if let Some(inner) = rest.strip_prefix('{') {
        return inner.find('}') == Some(inner.len() - 1);
    }
    !rest.is_empty() && rest.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn expand(text: &str, path: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, ConfigError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(braced) = after.strip_prefix('{') {
            let end = braced
                .find('}')
                .ok_or_else(|| ConfigError::BadReference { path: path.to_owned(), problem: "`${` has no closing `}`".to_owned() })?;
            let inner = &braced[..end];
            let (name, default) = match inner.split_once(":-") {
                Some((name, default)) => (name, Some(default)),
                None => (inner, None),
            };
            check_name(name, path)?;
            match (lookup(name), default) {
                (Some(found), _) => out.push_str(&found),
                (None, Some(default)) => out.push_str(default),
                (None, None) => return Err(missing(name, path)),
            }
            rest = &braced[end + 1..];
        } else {
            let len = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
            if len == 0 {
                // A lone `$` (as in a price or a regex) is kept as it is.
                out.push('$');
                rest = after;
                continue;
            }
            let name = &after[..len];
            check_name(name, path)?;
            out.push_str(&lookup(name).ok_or_else(|| missing(name, path))?);
            rest = &after[len..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn check_name(name: &str, path: &str) -> Result<(), ConfigError> {
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(ConfigError::BadReference { path: path.to_owned(), problem: format!("`{name}` is not a valid environment variable name") })
    }
}

fn missing(name: &str, path: &str) -> ConfigError {
    ConfigError::MissingEnv { var: name.to_owned(), path: path.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(yaml: &str, vars: &[(&str, &str)]) -> Result<Value, ConfigError> {
        let mut value: Value =
            serde_yaml_ng::from_str(yaml).map_err(|e| ConfigError::Parse { origin: "test".into(), message: e.to_string() })?;
        let lookup = |name: &str| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned());
        substitute(&mut value, "", &lookup)?;
        Ok(value)
    }

    #[test]
    fn plain_braced_and_default_forms_are_replaced() -> Result<(), ConfigError> {
        let v = run("a: $HOST:${PORT}\nb: ${NOPE:-fallback}\nc: cost $$5\nd: a $ b", &[("HOST", "h"), ("PORT", "80")])?;
        assert_eq!(v["a"], Value::String("h:80".into()));
        assert_eq!(v["b"], Value::String("fallback".into()));
        assert_eq!(v["c"], Value::String("cost $5".into()));
        assert_eq!(v["d"], Value::String("a $ b".into()));
        Ok(())
    }

    #[test]
    fn a_whole_reference_keeps_its_scalar_type_but_never_becomes_structure() -> Result<(), ConfigError> {
        let v = run("n: $N\nb: ${B}\ns: $S", &[("N", "8080"), ("B", "true"), ("S", "{a: 1}")])?;
        assert_eq!(v["n"].as_u64(), Some(8080));
        assert_eq!(v["b"].as_bool(), Some(true));
        assert_eq!(v["s"], Value::String("{a: 1}".into()));
        Ok(())
    }

    #[test]
    fn a_missing_variable_names_the_yaml_path() {
        let err = run("server:\n  auth:\n    api_keys:\n      - key: $ALICE_KEY\n", &[]).err();
        let text = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("ALICE_KEY"), "{text}");
        assert!(text.contains("server.auth.api_keys[0].key"), "{text}");
    }

    #[test]
    fn an_unclosed_brace_is_an_error() {
        assert!(matches!(run("a: ${OOPS", &[]), Err(ConfigError::BadReference { .. })));
    }
}
