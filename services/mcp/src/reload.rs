//! Following changes: the extensions file is polled (size + mtime, then SHA-256, like the kit's config
//! watcher, because ConfigMap volumes swap files through symlinks), and a new antler.yaml from the kit
//! re-reads the `mcp` section (inline servers, the file's path). Either way [`Hub::reload`] applies the
//! difference: unchanged servers keep their sessions.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use antler_kit::Config;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::service::Hub;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    size: u64,
    modified: Option<SystemTime>,
}

/// Polls the extensions file every `mcp.reload_interval_ms` (0: never).
pub fn spawn_watcher(hub: Arc<Hub>, shutdown: CancellationToken) {
    let interval = hub.config().reload_interval_ms;
    if interval == 0 {
        return;
    }
    let span = tracing::info_span!("mcp_extensions_watch");
    tokio::spawn(tracing::Instrument::instrument(poll(hub, Duration::from_millis(interval), shutdown), span));
}

async fn poll(hub: Arc<Hub>, interval: Duration, shutdown: CancellationToken) {
    let mut last: Option<(std::path::PathBuf, Stamp, [u8; 32])> = None;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let Some(path) = hub.watched_file() else { continue };
        // A file being replaced can be briefly absent; a deleted file keeps the last good config (DeerFlow).
        let Ok(meta) = tokio::fs::metadata(&path).await else { continue };
        let stamp = Stamp { size: meta.len(), modified: meta.modified().ok() };
        if let Some((p, s, _)) = &last
            && *p == path
            && *s == stamp
        {
            continue;
        }
        let Ok(bytes) = tokio::fs::read(&path).await else { continue };
        let hash: [u8; 32] = Sha256::digest(&bytes).into();
        let first = last.is_none();
        let same_content = last.as_ref().is_some_and(|(p, _, h)| *p == path && *h == hash);
        last = Some((path.clone(), stamp, hash));
        if first || same_content {
            continue;
        }
        match hub.reload(None, false).await {
            Ok(report) if report.changed => tracing::info!(file = %path.display(), "extensions config changed; reloaded"),
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "extensions config change rejected"),
        }
    }
}

/// Re-reads the `mcp` section whenever the kit publishes a new antler.yaml.
pub async fn follow_config(hub: Arc<Hub>, mut updates: watch::Receiver<Arc<Config>>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = updates.changed() => if changed.is_err() { return },
        }
        let config = updates.borrow_and_update().clone();
        match crate::config::load(&config) {
            Ok(mcp) => {
                if let Err(error) = hub.reload(Some(mcp), false).await {
                    tracing::warn!(%error, "mcp section changed but the servers could not be reloaded");
                }
            }
            Err(error) => tracing::warn!(%error, "mcp section change rejected"),
        }
    }
}
