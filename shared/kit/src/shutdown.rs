//! Process shutdown: the signal that starts it and the token every task watches.

use tokio_util::sync::CancellationToken;

/// Completes on the first SIGTERM or SIGINT (Ctrl-C).
pub async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!(signal = "SIGTERM", "shutdown requested"),
                    _ = int.recv() => tracing::info!(signal = "SIGINT", "shutdown requested"),
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// A token cancelled when the first shutdown signal arrives.
pub fn on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let trigger = token.clone();
    tokio::spawn(async move {
        signal().await;
        trigger.cancel();
    });
    token
}
