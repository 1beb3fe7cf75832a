//! Thread ids, filesystem-safe user directory names and deterministic sandbox ids.

use sha2::{Digest, Sha256};

use crate::error::{Result, SandboxError};

/// Checks `thread_id` against `^[A-Za-z0-9_-]{1,64}$` (it becomes a directory name as it is).
pub fn check_thread_id(thread_id: &str) -> Result<()> {
    let ok = (1..=64).contains(&thread_id.len()) && thread_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(SandboxError::invalid("thread_id", format!("`{}` must match ^[A-Za-z0-9_-]{{1,64}}$", crate::error::echo(thread_id))))
    }
}

/// The directory name of a user's workspaces. User ids may contain `.` and `@` (see
/// `antler_kit::auth::valid_user_id`); those are replaced with `-` and a digest of the original id is
/// appended after a `.`, a character no untouched name contains, so two users never share a directory
/// (`a.b` → `a-b.<digest>`, while `a-b` stays `a-b`).
pub fn user_dir_name(user_id: &str) -> String {
    let safe = !user_id.is_empty() && user_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if safe {
        return user_id.to_owned();
    }
    let replaced: String = user_id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '-' }).collect();
    let digest = hex::encode(Sha256::digest(user_id.as_bytes()));
    format!("{replaced}.{}", &digest[..16])
}

/// The sandbox id of (user, thread): the first 128 bits of SHA-256("{user_id}:{thread_id}") in hex, so
/// every replica derives the same id. Thread ids cannot contain `:`, so the input is unambiguous.
pub fn sandbox_id(user_id: &str, thread_id: &str) -> String {
    let digest = Sha256::digest(format!("{user_id}:{thread_id}").as_bytes());
    hex::encode(&digest[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_ids_are_checked() {
        for ok in ["t", "thread-1", "A_b-9", &"x".repeat(64)] {
            assert!(check_thread_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", "../x", "a/b", "a b", "t:1", &"x".repeat(65), "é", "a\0"] {
            assert!(check_thread_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn user_dirs_are_safe_and_distinct() {
        assert_eq!(user_dir_name("alice"), "alice");
        assert_eq!(user_dir_name("a-b"), "a-b");
        let dotted = user_dir_name("a.b");
        assert!(dotted.starts_with("a-b.") && dotted != user_dir_name("a@b"), "{dotted}");
        for tricky in [".", "..", "a.b@c", "..."] {
            let name = user_dir_name(tricky);
            assert!(name != "." && name != ".." && !name.contains('/'), "{tricky} -> {name}");
        }
    }

    #[test]
    fn sandbox_ids_are_deterministic_and_per_user() {
        assert_eq!(sandbox_id("alice", "t1"), sandbox_id("alice", "t1"));
        assert_ne!(sandbox_id("alice", "t1"), sandbox_id("bob", "t1"));
        assert_eq!(sandbox_id("alice", "t1").len(), 32);
    }
}
