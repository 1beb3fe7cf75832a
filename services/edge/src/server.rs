//! The listener: binds `edge.listen`, mounts the routes behind the gate and CORS, and serves until
//! shutdown.

use std::net::SocketAddr;
use std::sync::Arc;

use antler_kit::cli::{BoxError, ServiceContext};
use tracing::Instrument;

use crate::edge::Edge;
use crate::gate::gate;
use crate::langgraph::convert::Assistant;

/// The gRPC listener's rule for this one: no unauthenticated API beyond this machine unless a proxy
/// in front authenticates (`server.allow_insecure`).
fn check_bind(addr: SocketAddr, auth_enabled: bool, allow_insecure: bool) -> Result<(), String> {
    if !auth_enabled && !addr.ip().is_loopback() && !allow_insecure {
        return Err(format!(
            "refusing to serve the HTTP edge on {addr} without authentication (edge.listen)\nhint: enable server.auth, listen on a loopback address, or set server.allow_insecure: true if a proxy in front authenticates"
        ));
    }
    Ok(())
}

/// Serves the edge when `edge.listen` is set, until shutdown. Returns the address it listens on
/// (None when off). Like the gRPC listener, a non-loopback address needs authentication unless
/// `server.allow_insecure` is set.
pub async fn start(ctx: &ServiceContext) -> Result<Option<SocketAddr>, BoxError> {
    let (config, runs) = crate::config::load(&ctx.config)?;
    let Some(addr) = config.listen_addr()? else { return Ok(None) };
    check_bind(addr, ctx.auth.enabled(), ctx.config.server.allow_insecure)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr} (edge.listen): {e}\nhint: is another process using the port?"))?;
    let local = listener.local_addr()?;
    let since = prost_types::Timestamp::from(std::time::SystemTime::now());
    let edge = Arc::new(Edge::new(
        config,
        Assistant { kind: runs.agent, since },
        runs.context_keys,
        ctx.auth.clone(),
        ctx.clients.clone(),
        ctx.shutdown.child_token(),
    )?);
    let cors = edge.config.cors();
    let app = crate::langgraph::routes::router(edge.clone())
        // DeerFlow's gateway routes (`/api/*`, `/api/v1/auth/*`), behind the same gate.
        .merge(crate::gateway::router(edge.clone()))
        .layer(axum::middleware::from_fn_with_state(edge.clone(), gate));
    // Outside the gate: a browser's preflight carries no credentials and is answered here.
    let app = match cors {
        Some(cors) => app.layer(cors),
        None => app,
    };
    let shutdown = edge.shutdown.clone();
    // With the peer's address (ConnectInfo) in every request: the sign-in bounds count by it.
    tokio::spawn(
        async move {
            if let Err(error) = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
            {
                tracing::error!(%error, "the HTTP edge failed");
            }
        }
        .instrument(tracing::info_span!("edge", %local)),
    );
    tracing::info!(addr = %local, "serving the HTTP edge (LangGraph API)");
    Ok(Some(local))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unauthenticated_edge_stays_on_loopback_unless_allowed() {
        let public = SocketAddr::from(([0, 0, 0, 0], 2024));
        let local = SocketAddr::from(([127, 0, 0, 1], 2024));
        assert!(check_bind(public, false, false).is_err_and(|e| e.contains("edge.listen")));
        assert!(check_bind(public, true, false).is_ok());
        assert!(check_bind(public, false, true).is_ok());
        assert!(check_bind(local, false, false).is_ok());
    }
}
