//! `antler memory list|search`: MemoryService.ListFacts / SearchFacts. (`import|export` are in
//! `client.rs`.)

use antler_proto::memory::memory_service_client::MemoryServiceClient;
use antler_proto::memory::{Fact, ListFactsRequest, SearchFactsRequest};

use super::{Conn, Page, Style, print_json, short};

/// What `antler memory list|search` does.
#[derive(Debug)]
pub enum Action {
    /// ListFacts, one page.
    List(Page),
    /// SearchFacts for a query, at most `limit` results (0: the server's default).
    Search { query: String, limit: u32 },
}

/// Runs `antler memory list|search` for the facts of `agent`.
pub async fn run(conn: &Conn, agent: &str, action: Action) -> anyhow::Result<()> {
    let mut client = MemoryServiceClient::new(conn.channel().await?);
    let style = Style::stdout();
    match action {
        Action::List(page) => {
            let request = ListFactsRequest { agent_name: agent.to_owned(), page: Some(page.request()), ..Default::default() };
            let reply = client.list_facts(conn.request(request)?).await?.into_inner();
            if conn.json {
                return print_json(&reply, "antler.memory.v1.ListFactsResponse");
            }
            if reply.facts.is_empty() {
                println!("no facts");
            }
            for fact in &reply.facts {
                print_fact(style, fact, None);
            }
            super::next_page(style, reply.page.as_ref());
        }
        Action::Search { query, limit } => {
            let request = SearchFactsRequest { agent_name: agent.to_owned(), query, limit, ..Default::default() };
            let reply = client.search_facts(conn.request(request)?).await?.into_inner();
            if conn.json {
                return print_json(&reply, "antler.memory.v1.SearchFactsResponse");
            }
            if reply.results.is_empty() {
                println!("no matching facts");
            }
            for scored in &reply.results {
                if let Some(fact) = &scored.fact {
                    print_fact(style, fact, Some(scored.score));
                }
            }
        }
    }
    Ok(())
}

fn print_fact(style: Style, fact: &Fact, score: Option<f64>) {
    let category = short(fact.category().as_str_name(), "FACT_CATEGORY_").to_ascii_lowercase();
    let score = score.map(|s| format!(" score {s:.3}")).unwrap_or_default();
    println!("{}  {category} ({:.2}){score}  {}", style.dim(&fact.id), fact.confidence, fact.content);
}
