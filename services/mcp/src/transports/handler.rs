//! The client side of a session: who Antler says it is, and the notifications it listens to.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, ProtocolVersion};
use rmcp::service::{NotificationContext, RoleClient};

/// Answers server notifications; `tools_changed` is raised when the server says its tool list changed, so
/// the catalog is listed again on next use.
#[derive(Debug, Clone)]
pub struct Handler {
    info: ClientConfig,
    pub tools_changed: Arc<AtomicBool>,
}

impl Handler {
    pub fn new(protocol_version: ProtocolVersion) -> Self {
        let info = ClientConfig::new(ClientCapabilities::default(), Implementation::new("antler", env!("CARGO_PKG_VERSION")))
            .with_protocol_version(protocol_version);
        Self { info, tools_changed: Arc::new(AtomicBool::new(false)) }
    }
}

impl rmcp::ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }

    fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) -> impl Future<Output = ()> + Send + '_ {
        self.tools_changed.store(true, Ordering::Relaxed);
        std::future::ready(())
    }
}
