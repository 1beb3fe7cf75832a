//! `antler memory list|search|flush`: MemoryService.ListFacts / SearchFacts / FlushUpdates (with
//! wait), and `antler memory import|export`: ImportMemory / ExportMemory.

use antler_proto::memory::memory_service_client::MemoryServiceClient;
use antler_proto::memory::{Fact, FlushUpdatesRequest, ListFactsRequest, SearchFactsRequest};

use super::{Conn, Page, print_json, short};
use crate::output::Style;

/// What `antler memory list|search` does.
#[derive(Debug)]
pub enum Action {
    /// ListFacts, one page.
    List(Page),
    /// SearchFacts for a query, at most `limit` results (0: the server's default).
    Search { query: String, limit: u32 },
    /// FlushUpdates of `thread`'s queued conversation (empty: all of the caller's), waiting at most `timeout`.
    Flush { thread: String, timeout: std::time::Duration },
}

/// Runs `antler memory list|search` for the facts of `agent`.
pub async fn run(conn: &Conn, agent: &str, action: Action) -> anyhow::Result<()> {
    let mut client = MemoryServiceClient::new(conn.channel().await?);
    let style = Style::stdout(conn.color);
    match action {
        Action::List(page) => {
            let request = ListFactsRequest { agent_name: agent.to_owned(), page: Some(page.request()), ..Default::default() };
            let reply = client.list_facts(conn.request(request)?).await?.into_inner();
            if conn.json {
                return print_json(&reply, "antler.memory.v1.ListFactsResponse");
            }
            if reply.facts.is_empty() {
                outln!("no facts")?;
            }
            for fact in &reply.facts {
                print_fact(style, fact, None)?;
            }
            super::next_page(style, reply.page.as_ref())?;
        }
        Action::Search { query, limit } => {
            let request = SearchFactsRequest { agent_name: agent.to_owned(), query, limit, ..Default::default() };
            let reply = client.search_facts(conn.request(request)?).await?.into_inner();
            if conn.json {
                return print_json(&reply, "antler.memory.v1.SearchFactsResponse");
            }
            if reply.results.is_empty() {
                outln!("no matching facts")?;
            }
            for scored in &reply.results {
                if let Some(fact) = &scored.fact {
                    print_fact(style, fact, Some(scored.score))?;
                }
            }
        }
        Action::Flush { thread, timeout } => {
            let request = FlushUpdatesRequest {
                thread_id: thread,
                agent_name: agent.to_owned(),
                wait: true,
                timeout: prost_types::Duration::try_from(timeout).ok(),
            };
            let reply = client.flush_updates(conn.request(request)?).await?.into_inner();
            if conn.json {
                return print_json(&reply, "antler.memory.v1.FlushUpdatesResponse");
            }
            if reply.flushed == 0 {
                outln!("nothing was queued")?;
            }
            let mut failed = Vec::new();
            for outcome in &reply.outcomes {
                let agent = if outcome.agent_name.is_empty() { String::new() } else { format!(" (agent {})", outcome.agent_name) };
                outln!(
                    "thread {}{agent}: {} added, {} invalidated, {} confirmed again, {} rejected, {} summary sections",
                    outcome.thread_id,
                    style.good(&outcome.facts_added.to_string()),
                    outcome.facts_invalidated,
                    outcome.facts_reinforced,
                    outcome.facts_rejected,
                    outcome.sections_updated
                )?;
                if !outcome.error.is_empty() {
                    outln!("    {}", style.bad(&outcome.error))?;
                    failed.push(outcome.thread_id.clone());
                }
            }
            if !reply.completed {
                outln!("{}", style.dim(&format!("{} still pending after {} s", reply.pending, timeout.as_secs())))?;
            }
            if !failed.is_empty() {
                anyhow::bail!("the extraction failed for thread {}; nothing was saved from it", failed.join(", "));
            }
        }
    }
    Ok(())
}

fn print_fact(style: Style, fact: &Fact, score: Option<f64>) -> std::io::Result<()> {
    let category = short(fact.category().as_str_name(), "FACT_CATEGORY_").to_ascii_lowercase();
    let score = score.map(|s| format!(" score {s:.3}")).unwrap_or_default();
    outln!("{}  {category} ({:.2}){score}  {}", style.dim(&fact.id), fact.confidence, fact.content)
}

/// What `antler memory import|export` does.
#[derive(Debug)]
pub enum Transfer {
    Import(std::path::PathBuf),
    Export(String),
}

/// `antler memory import|export`: one ImportMemory / ExportMemory call.
pub async fn transfer(conn: &Conn, agent: &str, action: Transfer) -> anyhow::Result<()> {
    use antler_proto::memory::memory_service_client::MemoryServiceClient;
    use antler_proto::memory::{ExportMemoryRequest, ImportMemoryRequest};
    let channel = conn.channel().await?;
    let mut client = MemoryServiceClient::new(channel).max_decoding_message_size(64 << 20).max_encoding_message_size(64 << 20);
    match action {
        Transfer::Import(path) => {
            let document = if path.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())?
            } else {
                std::fs::read_to_string(&path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?
            };
            let r = client.import_memory(conn.request(ImportMemoryRequest { agent_name: agent.to_owned(), document })?).await?.into_inner();
            outln!(
                "imported memory.json v{}: {} facts, {} skipped (already known or not active), {} summary sections, {} evicted by the cap",
                r.version,
                r.facts_imported,
                r.facts_skipped,
                r.sections_imported,
                r.evicted_fact_ids.len()
            )?;
        }
        Transfer::Export(version) => {
            let r = client.export_memory(conn.request(ExportMemoryRequest { agent_name: agent.to_owned(), version })?).await?.into_inner();
            outln!("{}", r.document)?;
        }
    }
    Ok(())
}
