//! Rebuilding a rustls configuration when its certificate and key files change.
//!
//! Polled like `antler.yaml` ([`crate::config::reload`]): one `stat` per file per interval, and only a new
//! size or modification time leads to reading the files, whose SHA-256 tells a real change from a touch.
//! Polling works the same on every filesystem, including Kubernetes Secret volumes, where the files are
//! swapped through a symlink and inotify events are unreliable. A change that cannot be used (a key that
//! does not match its certificate halfway through a rotation, a truncated file) is logged and the previous
//! configuration stays in force; the next change is tried again.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::TlsError;

/// Reloads counted by outcome (`applied`, `rejected`).
pub const RELOADS: &str = "antler_tls_reloads_total";

/// The cheap part of a file's identity, checked every interval.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    size: u64,
    modified: Option<SystemTime>,
}

fn stamps(files: &[PathBuf]) -> Vec<Option<Stamp>> {
    files.iter().map(|f| std::fs::metadata(f).ok().map(|m| Stamp { size: m.len(), modified: m.modified().ok() })).collect()
}

/// SHA-256 over every file's contents (None while one cannot be read).
fn digest(files: &[PathBuf]) -> Option<[u8; 32]> {
    let mut hasher = Sha256::new();
    for file in files {
        let bytes = std::fs::read(file).ok()?;
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(&bytes);
    }
    Some(hasher.finalize().into())
}

/// Builds the value from `files` once (an error here is a start-up error), then, when `interval` is not
/// zero and a tokio runtime is running, rebuilds it whenever the files change. The receiver always holds
/// the newest value that built. Polling stops at `shutdown`, or when every receiver is gone.
pub(crate) fn load_and_watch<T, F>(
    label: String,
    files: Vec<PathBuf>,
    interval: Duration,
    build: F,
    shutdown: Option<CancellationToken>,
) -> Result<watch::Receiver<Arc<T>>, TlsError>
where
    T: Send + Sync + 'static,
    F: Fn() -> Result<T, TlsError> + Send + 'static,
{
    // Fingerprint first: a file replaced while it is being loaded is then seen as changed on the first tick.
    let (first_stamps, first_digest) = (stamps(&files), digest(&files));
    let (tx, rx) = watch::channel(Arc::new(build()?));
    if interval.is_zero() {
        return Ok(rx);
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return Ok(rx) };
    let span = tracing::info_span!("tls_reload", files = %label);
    let task = poll(files, first_stamps, first_digest, interval, build, tx, shutdown.unwrap_or_default());
    runtime.spawn(tracing::Instrument::instrument(task, span));
    Ok(rx)
}

#[allow(clippy::too_many_arguments)]
async fn poll<T, F>(
    files: Vec<PathBuf>,
    mut last_stamps: Vec<Option<Stamp>>,
    mut last_digest: Option<[u8; 32]>,
    interval: Duration,
    build: F,
    tx: watch::Sender<Arc<T>>,
    shutdown: CancellationToken,
) where
    F: Fn() -> Result<T, TlsError>,
{
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tx.closed() => return,
            _ = ticker.tick() => {}
        }
        // A few small files: reading them on the runtime thread costs less than handing them to another.
        let now = stamps(&files);
        if now == last_stamps {
            continue;
        }
        last_stamps = now;
        let now = digest(&files);
        if now.is_none() || now == last_digest {
            // Missing (a swap in progress: the next tick sees the new file) or touched without a change.
            continue;
        }
        match build() {
            Ok(value) => {
                last_digest = now;
                tracing::info!("TLS certificates reloaded; new connections use them");
                metrics::counter!(RELOADS, "outcome" => "applied").increment(1);
                tx.send_replace(Arc::new(value));
            }
            Err(error) => {
                tracing::warn!(%error, "changed TLS files cannot be used; connections keep the previous certificates");
                metrics::counter!(RELOADS, "outcome" => "rejected").increment(1);
            }
        }
    }
}
