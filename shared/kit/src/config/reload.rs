//! Reloading `antler.yaml` when it changes.
//!
//! The file is polled: a change of size or modification time triggers a read, and a new content hash
//! triggers a parse. Polling works the same on every filesystem (including ConfigMap volumes, where the
//! file is swapped through a symlink and inotify events are unreliable) and costs one `stat` per
//! interval. An invalid new file is rejected with a log line and the previous configuration stays in
//! force; subscribers only ever see configurations that passed validation.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Config;

/// The cheap part of a file's identity, checked every interval; the content hash is only computed
/// when this changes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    size: u64,
    modified: Option<SystemTime>,
}

/// Extra validation a subscriber needs before a new configuration may be published (for example
/// parsing the service sections). Returns a message naming what is wrong.
pub type Validator = Arc<dyn Fn(&Config) -> Result<(), String> + Send + Sync>;

/// Starts polling `initial.path` every `interval` and returns a receiver that always holds the newest
/// valid configuration. Without a path, or with a zero interval, the receiver never changes. The task
/// stops when `shutdown` is cancelled.
pub fn spawn(initial: Arc<Config>, interval: Duration, validate: Validator, shutdown: CancellationToken) -> watch::Receiver<Arc<Config>> {
    let (tx, rx) = watch::channel(initial.clone());
    let Some(path) = initial.path.clone() else { return rx };
    if interval.is_zero() {
        return rx;
    }
    let span = tracing::info_span!("config_reload", path = %path.display());
    let hash = initial.source_sha256;
    tokio::spawn(tracing::Instrument::instrument(poll(path, hash, interval, validate, tx, shutdown), span));
    rx
}

async fn poll(
    path: PathBuf,
    mut last_hash: Option<[u8; 32]>,
    interval: Duration,
    validate: Validator,
    tx: watch::Sender<Arc<Config>>,
    shutdown: CancellationToken,
) {
    let mut last_stamp: Option<Stamp> = None;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let Ok(meta) = tokio::fs::metadata(&path).await else {
            // A file being replaced can be briefly absent; the next tick sees the new one.
            continue;
        };
        let stamp = Stamp { size: meta.len(), modified: meta.modified().ok() };
        if last_stamp.as_ref() == Some(&stamp) {
            continue;
        }
        last_stamp = Some(stamp);
        let Ok(bytes) = tokio::fs::read(&path).await else { continue };
        let hash: [u8; 32] = Sha256::digest(&bytes).into();
        if last_hash == Some(hash) {
            continue;
        }
        last_hash = Some(hash);
        match Config::load(Some(&path)).map_err(|e| e.to_string()).and_then(|c| validate(&c).map(|()| c)) {
            Ok(config) => {
                tracing::info!("configuration reloaded");
                metrics::counter!("antler_config_reloads_total", "outcome" => "applied").increment(1);
                tx.send_replace(Arc::new(config));
            }
            Err(error) => {
                tracing::warn!(%error, "configuration change rejected; the previous configuration stays in force");
                metrics::counter!("antler_config_reloads_total", "outcome" => "rejected").increment(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn wait_for(rx: &mut watch::Receiver<Arc<Config>>, pred: impl Fn(&Config) -> bool) -> bool {
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if pred(&rx.borrow_and_update()) {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
        .await
        .is_ok()
    }

    #[tokio::test]
    async fn a_valid_change_is_published_and_an_invalid_one_is_rejected() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("antler.yaml");
        std::fs::write(&path, "server:\n  shutdown_grace_secs: 5\n")?;
        let initial = Arc::new(Config::load(Some(&path))?);
        let shutdown = CancellationToken::new();
        let mut rx = spawn(initial, Duration::from_millis(20), Arc::new(|_| Ok(())), shutdown.clone());

        std::fs::write(&path, "server:\n  shutdown_grace_secs: 7\n")?;
        assert!(wait_for(&mut rx, |c| c.server.shutdown_grace_secs == 7).await, "valid change not delivered");

        // A typo: rejected, and the receiver keeps the last valid configuration.
        std::fs::write(&path, "server:\n  shutdown_grace_sec: 9\n")?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(rx.borrow().server.shutdown_grace_secs, 7);

        // A validator veto is a rejection too.
        std::fs::write(&path, "server:\n  shutdown_grace_secs: 11\n")?;
        assert!(wait_for(&mut rx, |c| c.server.shutdown_grace_secs == 11).await);
        shutdown.cancel();
        Ok(())
    }

    #[tokio::test]
    async fn a_validator_can_veto_a_change() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("antler.yaml");
        std::fs::write(&path, "server:\n  shutdown_grace_secs: 5\n")?;
        let initial = Arc::new(Config::load(Some(&path))?);
        let shutdown = CancellationToken::new();
        let veto: Validator = Arc::new(|c| if c.server.shutdown_grace_secs == 13 { Err("13 is unlucky".into()) } else { Ok(()) });
        let mut rx = spawn(initial, Duration::from_millis(20), veto, shutdown.clone());
        std::fs::write(&path, "server:\n  shutdown_grace_secs: 13\n")?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(rx.borrow().server.shutdown_grace_secs, 5);
        std::fs::write(&path, "server:\n  shutdown_grace_secs: 14\n")?;
        assert!(wait_for(&mut rx, |c| c.server.shutdown_grace_secs == 14).await);
        shutdown.cancel();
        Ok(())
    }
}
