//! How `web_fetch` gets pages: the direct fetcher or a reader service. Apart from the builders in
//! `web/mod.rs`, so that the tool (`tools/web_fetch.rs`) and its builder do not import each other.

use std::sync::Arc;

use super::direct;
use super::providers::FetchProvider;
use super::ssrf;

/// How `web_fetch` gets pages.
#[derive(Debug)]
pub enum Fetcher {
    Direct(direct::DirectFetcher),
    /// A reader service; `policy` still judges the URL (and what its name resolves to) before the
    /// service is asked, since a self-hosted reader sits inside the network it could reach into.
    Reader {
        provider: Arc<dyn FetchProvider>,
        policy: Arc<ssrf::Policy>,
    },
}
