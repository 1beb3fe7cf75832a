//! Per-file locks of one sandbox: WriteFile and EditFile hold the lock of their (normalised virtual) path
//! across read-modify-write, so concurrent edits of one file are applied one after the other and none is
//! lost. Commands running in the sandbox do not take these locks; they are the agent's own tools' order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::OwnedMutexGuard;

/// Entries are dropped once no caller holds or waits for them; the map is pruned when it grows past this.
const PRUNE_AT: usize = 256;

#[derive(Debug, Default)]
pub struct PathLocks {
    locks: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl PathLocks {
    /// Waits for the lock of `path` (a normalised virtual path). Held until the guard is dropped.
    pub async fn lock(&self, path: &str) -> OwnedMutexGuard<()> {
        let lock = {
            let mut map = self.locks.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if map.len() >= PRUNE_AT {
                map.retain(|_, weak| weak.strong_count() > 0);
            }
            match map.get(path).and_then(Weak::upgrade) {
                Some(lock) => lock,
                None => {
                    let lock = Arc::new(tokio::sync::Mutex::new(()));
                    map.insert(path.to_owned(), Arc::downgrade(&lock));
                    lock
                }
            }
        };
        lock.lock_owned().await
    }

    /// Forgets every lock (ResetSandbox). Holders keep their guards; new callers get fresh locks.
    pub fn clear(&self) {
        self.locks.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.locks.lock().map(|m| m.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_path_is_serialised_and_others_are_not() {
        let locks = Arc::new(PathLocks::default());
        let held = locks.lock("/a").await;
        let other = tokio::time::timeout(Duration::from_millis(100), locks.lock("/b")).await;
        assert!(other.is_ok(), "a different path must not wait");
        let same = tokio::time::timeout(Duration::from_millis(100), locks.lock("/a")).await;
        assert!(same.is_err(), "the same path must wait while the lock is held");
        drop(held);
        assert!(tokio::time::timeout(Duration::from_millis(100), locks.lock("/a")).await.is_ok());
    }

    #[tokio::test]
    async fn unused_entries_are_pruned() {
        let locks = PathLocks::default();
        for i in 0..(PRUNE_AT * 2) {
            drop(locks.lock(&format!("/f{i}")).await);
        }
        assert!(locks.len() <= PRUNE_AT + 1, "{}", locks.len());
    }
}
