//! The memory RPCs on `antler-memory` alone (SQLite and PostgreSQL): facts and their versions, paging,
//! search, summaries through import, injection budgets, the queue bound, bad input, and that another
//! user's memory looks exactly like none.

use antler_integration_tests::db::{BACKENDS, Backend, TestDb};
use antler_integration_tests::memory::*;
use antler_integration_tests::metrics::{metrics_url, scrape, with_metrics};
use antler_integration_tests::runs::authed;
use antler_integration_tests::{Launch, start};
use antler_proto::common::{PageRequest, Role};
use antler_proto::memory::*;
use sea_orm::ConnectionTrait;
use tonic::Code;

fn tiktoken(text: &str) -> usize {
    tiktoken_rs::cl100k_base_singleton().encode_ordinary(text).len()
}

#[tokio::test]
async fn facts_are_versioned_listed_searched_and_deleted() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_memory(&db, "")?;
        let mut memory = client(&server).await?;

        let empty = memory.get_memory(authed(GetMemoryRequest::default(), ALICE)).await?.into_inner().memory.unwrap_or_default();
        assert_eq!((empty.revision, empty.active_fact_count), (0, 0), "{backend:?}: no memory is not an error");

        let berlin = add_fact(&mut memory, ALICE, add("Lives in Berlin", FactCategory::Context, 0.9)).await?;
        assert!(berlin.id.starts_with("fact_") && berlin.id.len() == 37, "{}", berlin.id);
        assert_eq!(berlin.source.as_ref().map(|s| s.kind()), Some(FactSourceKind::Manual));
        let again = memory.add_fact(authed(add("  lives in   BERLIN ", FactCategory::Context, 0.8), ALICE)).await?.into_inner();
        assert!(again.deduplicated && again.fact.as_ref().map(|f| f.id.as_str()) == Some(berlin.id.as_str()), "{backend:?}: {again:?}");
        for (i, text) in ["Prefers Rust for services", "Works at Acme on billing", "Has two cats", "Runs marathons"].iter().enumerate() {
            let category = if i == 0 { FactCategory::Preference } else { FactCategory::Context };
            add_fact(&mut memory, ALICE, add(text, category, 0.8)).await?;
        }

        // Paging: newest first, stable tokens, every fact once.
        let mut seen = Vec::new();
        let mut token = String::new();
        loop {
            let page = PageRequest { page_size: 2, page_token: token.clone() };
            let r = memory.list_facts(authed(ListFactsRequest { page: Some(page), ..Default::default() }, ALICE)).await?.into_inner();
            assert!(r.facts.len() <= 2);
            seen.extend(r.facts.into_iter().map(|f| f.content));
            token = r.page.map(|p| p.next_page_token).unwrap_or_default();
            if token.is_empty() {
                break;
            }
        }
        assert_eq!(
            seen,
            ["Runs marathons", "Has two cats", "Works at Acme on billing", "Prefers Rust for services", "Lives in Berlin"],
            "{backend:?}"
        );
        let only = memory
            .list_facts(authed(ListFactsRequest { categories: vec![FactCategory::Preference as i32], ..Default::default() }, ALICE))
            .await?
            .into_inner();
        assert_eq!(only.facts.len(), 1);
        // A token is bound to its filters.
        let first = memory
            .list_facts(authed(
                ListFactsRequest { page: Some(PageRequest { page_size: 1, page_token: String::new() }), ..Default::default() },
                ALICE,
            ))
            .await?
            .into_inner();
        let token = first.page.map(|p| p.next_page_token).unwrap_or_default();
        let status = memory
            .list_facts(authed(
                ListFactsRequest {
                    page: Some(PageRequest { page_size: 1, page_token: token }),
                    include_invalidated: true,
                    ..Default::default()
                },
                ALICE,
            ))
            .await
            .err()
            .ok_or_else(|| anyhow::anyhow!("a token was accepted with other filters"))?;
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().starts_with("page.page_token"), "{}", status.message());

        // Search ranks by full-text relevance.
        let found = memory
            .search_facts(authed(SearchFactsRequest { query: "which city does she live in? berlin".into(), ..Default::default() }, ALICE))
            .await?
            .into_inner();
        assert_eq!(found.results.first().and_then(|r| r.fact.as_ref()).map(|f| f.content.as_str()), Some("Lives in Berlin"), "{backend:?}");
        assert!(found.results.iter().all(|r| r.score > 0.0));

        // Update: a new version, the old one invalidated and pointing at it.
        let updated = memory
            .update_fact(authed(
                UpdateFactRequest {
                    fact_id: berlin.id.clone(),
                    content: Some("Lives in Lisbon".into()),
                    reason: "moved".into(),
                    ..Default::default()
                },
                ALICE,
            ))
            .await?
            .into_inner();
        let (new, old) = (updated.fact.unwrap_or_default(), updated.previous.unwrap_or_default());
        assert_eq!((new.supersedes.as_str(), old.superseded_by.as_str()), (berlin.id.as_str(), new.id.as_str()));
        assert_eq!(old.invalidation_reason, "superseded: moved");
        assert!(old.invalidated_at.is_some() && new.invalidated_at.is_none());
        let found =
            memory.search_facts(authed(SearchFactsRequest { query: "Berlin".into(), ..Default::default() }, ALICE)).await?.into_inner();
        assert!(found.results.is_empty(), "{backend:?}: an invalidated fact is not searchable: {found:?}");
        let status = memory
            .update_fact(authed(UpdateFactRequest { fact_id: berlin.id.clone(), confidence: Some(0.5), ..Default::default() }, ALICE))
            .await
            .err()
            .ok_or_else(|| anyhow::anyhow!("an invalidated version was updated"))?;
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert!(status.message().contains(&new.id), "{}", status.message());

        // Delete invalidates (idempotently); purge removes the whole chain.
        let deleted = memory
            .delete_fact(authed(DeleteFactRequest { fact_id: new.id.clone(), reason: "wrong".into(), ..Default::default() }, ALICE))
            .await?
            .into_inner();
        assert_eq!(deleted.fact.as_ref().map(|f| f.invalidation_reason.as_str()), Some("deleted: wrong"));
        let twice =
            memory.delete_fact(authed(DeleteFactRequest { fact_id: new.id.clone(), ..Default::default() }, ALICE)).await?.into_inner();
        assert_eq!(twice.fact.and_then(|f| f.invalidated_at), deleted.fact.and_then(|f| f.invalidated_at));
        let all =
            memory.list_facts(authed(ListFactsRequest { include_invalidated: true, ..Default::default() }, ALICE)).await?.into_inner();
        assert_eq!(all.facts.len(), 6);
        let purged = memory
            .delete_fact(authed(DeleteFactRequest { fact_id: new.id.clone(), purge: true, ..Default::default() }, ALICE))
            .await?
            .into_inner();
        assert_eq!(purged.purged_versions, 2, "{backend:?}: the new version and the one it replaced");
        let all =
            memory.list_facts(authed(ListFactsRequest { include_invalidated: true, ..Default::default() }, ALICE)).await?.into_inner();
        assert_eq!(all.facts.len(), 4);
        let status = memory.delete_fact(authed(DeleteFactRequest { fact_id: berlin.id.clone(), ..Default::default() }, ALICE)).await.err();
        assert_eq!(status.map(|s| s.code()), Some(Code::NotFound));

        let overview = memory.get_memory(authed(GetMemoryRequest::default(), ALICE)).await?.into_inner().memory.unwrap_or_default();
        assert_eq!((overview.active_fact_count, overview.invalidated_fact_count), (4, 0));
        assert!(overview.revision > 0 && overview.updated_at.is_some());

        // Agent scopes are separate buckets.
        let mut scoped = add("Writes the weekly report", FactCategory::Behavior, 0.9);
        scoped.agent_name = "reporter".into();
        add_fact(&mut memory, ALICE, scoped).await?;
        let reporter =
            memory.list_facts(authed(ListFactsRequest { agent_name: "reporter".into(), ..Default::default() }, ALICE)).await?.into_inner();
        assert_eq!(reporter.facts.len(), 1);
        assert_eq!(active_facts(&mut memory, ALICE).await?.len(), 4);
    }
    Ok(())
}

#[tokio::test]
async fn the_cap_evicts_the_lowest_confidence_and_keeps_corrections() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_memory(&db, "  max_facts: 10\n")?;
    let mut memory = client(&server).await?;
    let mut correction = add("Uses PostgreSQL 16, not MySQL", FactCategory::Correction, 0.5);
    correction.source_error = "assumed MySQL".into();
    let correction = add_fact(&mut memory, ALICE, correction).await?;
    for i in 0..9 {
        add_fact(&mut memory, ALICE, add(&format!("Fact number {i}"), FactCategory::Context, 0.6 + f64::from(i) * 0.01)).await?;
    }
    let r = memory.add_fact(authed(add("The newest fact", FactCategory::Context, 0.95), ALICE)).await?.into_inner();
    assert_eq!(r.evicted_fact_ids.len(), 1);
    let live = active_facts(&mut memory, ALICE).await?;
    assert_eq!(live.len(), 10);
    assert!(live.iter().any(|f| f.id == correction.id), "corrections are protected from eviction");
    assert!(!live.iter().any(|f| f.content == "Fact number 0"), "the lowest confidence goes first");
    Ok(())
}

#[tokio::test]
async fn bad_input_is_invalid_argument_naming_the_field_and_limit() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_memory(&db, "")?;
    let mut memory = client(&server).await?;
    let huge = "x".repeat(1024 * 1024);
    let cases: Vec<(AddFactRequest, &str, &str)> = vec![
        (add("", FactCategory::Context, 0.9), "content", "required"),
        (add("   ", FactCategory::Context, 0.9), "content", "required"),
        (add(&huge, FactCategory::Context, 0.9), "content", "4000"),
        (add("Likes tea", FactCategory::Context, 2.0), "confidence", "0.0 to 1.0"),
        (AddFactRequest { content: "Likes tea".into(), category: 99, ..Default::default() }, "category", "not a FactCategory"),
        (AddFactRequest { content: "Likes tea".into(), category_label: "drinks".into(), ..Default::default() }, "category_label", "OTHER"),
        (AddFactRequest { content: "Likes tea".into(), agent_name: "Bad Name".into(), ..Default::default() }, "agent_name", "[a-z0-9-]"),
    ];
    for (request, field, limit) in cases {
        let status = memory.add_fact(authed(request, ALICE)).await.err().ok_or_else(|| anyhow::anyhow!("{field}: accepted"))?;
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert!(status.message().starts_with(field) && status.message().contains(limit), "{field}: {}", status.message());
    }
    let status = memory.search_facts(authed(SearchFactsRequest { query: String::new(), ..Default::default() }, ALICE)).await.err();
    assert!(status.is_some_and(|s| s.code() == Code::InvalidArgument && s.message().starts_with("query")));
    let status = memory.search_facts(authed(SearchFactsRequest { query: "x".into(), limit: 101, ..Default::default() }, ALICE)).await.err();
    assert!(status.is_some_and(|s| s.code() == Code::InvalidArgument && s.message().contains("100")));
    let status = memory.render_injection(authed(RenderInjectionRequest { max_tokens: 50, ..Default::default() }, ALICE)).await.err();
    assert!(status.is_some_and(|s| s.code() == Code::InvalidArgument
        && s.message().starts_with("max_tokens")
        && s.message().contains("100 to 8000")));
    let status = memory.update_fact(authed(UpdateFactRequest { fact_id: "fact_x".into(), ..Default::default() }, ALICE)).await.err();
    assert!(status.is_some_and(|s| s.code() == Code::InvalidArgument), "nothing to change");
    let status = memory
        .queue_update(authed(
            QueueUpdateRequest { thread_id: "../t".into(), messages: conversation("hi there"), ..Default::default() },
            ALICE,
        ))
        .await
        .err();
    assert!(status.is_some_and(|s| s.code() == Code::InvalidArgument && s.message().starts_with("thread_id")));
    let status = memory.queue_update(authed(QueueUpdateRequest { thread_id: "t1".into(), ..Default::default() }, ALICE)).await.err();
    assert!(status.is_some_and(|s| s.code() == Code::InvalidArgument && s.message().starts_with("messages")));
    let timeout = Some(prost_types::Duration { seconds: 301, nanos: 0 });
    let status = memory.flush_updates(authed(FlushUpdatesRequest { wait: true, timeout, ..Default::default() }, ALICE)).await.err();
    assert!(status.is_some_and(|s| s.code() == Code::InvalidArgument && s.message().starts_with("timeout")));
    let status = memory.get_memory(tonic::Request::new(GetMemoryRequest::default())).await.err();
    assert_eq!(status.map(|s| s.code()), Some(Code::Unauthenticated));
    Ok(())
}

#[tokio::test]
async fn the_queue_is_bounded_and_replaces_the_waiting_update() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_memory(&db, "  queue_max_depth: 3\n  debounce_seconds: 300\n")?;
    let mut memory = client(&server).await?;
    let first = queue(&mut memory, ALICE, "t-1", conversation("I like green tea"), false).await?;
    assert_eq!((first.queue_depth, first.replaced_pending), (1, false));
    let replaced = queue(&mut memory, ALICE, "t-1", conversation("I like green tea and oolong"), false).await?;
    assert!(replaced.replaced_pending, "a newer update for the same thread replaces the waiting one");
    assert_eq!(replaced.queue_depth, 1);
    queue(&mut memory, ALICE, "t-2", conversation("I work nights"), false).await?;
    queue(&mut memory, BOB, "t-3", conversation("I live in Oslo"), false).await?;
    let status = memory
        .queue_update(authed(
            QueueUpdateRequest { thread_id: "t-4".into(), messages: conversation("I am a nurse"), ..Default::default() },
            ALICE,
        ))
        .await
        .err()
        .ok_or_else(|| anyhow::anyhow!("the fourth update was accepted by a queue of 3"))?;
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("memory.queue_max_depth = 3"), "{}", status.message());
    // Replacing still works when the queue is full: it does not add an item.
    assert!(queue(&mut memory, ALICE, "t-2", conversation("I work nights as a nurse"), false).await?.replaced_pending);
    Ok(())
}

/// QueueUpdate commits the updates that arrive together in one transaction (group commit), and each
/// keeps the outcome it would have had alone: new threads beyond the bound are refused one by one,
/// replacements are always accepted, the depths the accepted ones report count up to the bound.
#[tokio::test]
async fn concurrent_queue_updates_are_committed_together_each_with_its_own_outcome() -> anyhow::Result<()> {
    const BOUND: u32 = 10;
    const NEW: usize = 32;
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let yaml = config(&db, &format!("  queue_max_depth: {BOUND}\n  debounce_seconds: 300\n"), "");
        let server = start("antler-memory", Launch::default().config(with_metrics(&yaml, "[1, 2, 4, 8, 16, 32, 64, 128]")))?;
        let url = metrics_url(&server)?;
        let mut channels = Vec::new();
        for _ in 0..4 {
            channels.push(client(&server).await?);
        }
        queue(&mut channels[0], ALICE, "waiting-a", conversation("I like green tea"), false).await?;
        queue(&mut channels[0], BOB, "waiting-b", conversation("I live in Oslo"), false).await?;

        // All at once: NEW updates of new threads and a replacement of each waiting one.
        let mut calls = Vec::new();
        for i in 0..NEW + 2 {
            let mut memory = channels[i % channels.len()].clone();
            let (key, thread, text) = match i {
                0 => (ALICE, "waiting-a".to_owned(), "I like green tea and oolong".to_owned()),
                1 => (BOB, "waiting-b".to_owned(), "I live in Oslo and work in Bergen".to_owned()),
                _ => (if i % 2 == 0 { ALICE } else { BOB }, format!("new-{i}"), format!("Detail number {i} about my week")),
            };
            calls.push(tokio::spawn(async move { (thread.clone(), queue(&mut memory, key, &thread, conversation(&text), false).await) }));
        }
        let (mut depths, mut refused) = (Vec::new(), 0);
        for call in calls {
            let (thread, outcome) = call.await?;
            match outcome {
                Ok(r) if thread.starts_with("waiting-") => {
                    assert!(r.replaced_pending, "{backend:?} {thread}: {r:?}");
                    assert!((2..=BOUND).contains(&r.queue_depth) && (1..=r.queue_depth).contains(&r.queue_position), "{r:?}");
                }
                Ok(r) => {
                    assert!(!r.replaced_pending, "{r:?}");
                    assert!((1..=r.queue_depth).contains(&r.queue_position), "{r:?}");
                    depths.push(r.queue_depth);
                }
                Err(error) => {
                    let status = error.downcast::<tonic::Status>()?;
                    assert_eq!(status.code(), Code::ResourceExhausted, "{backend:?} {thread}: {status:?}");
                    assert!(status.message().contains("memory.queue_max_depth = 10"), "{}", status.message());
                    refused += 1;
                }
            }
        }
        depths.sort_unstable();
        assert_eq!(depths, (3..=BOUND).collect::<Vec<_>>(), "{backend:?}: the accepted new threads fill the queue one by one");
        assert_eq!(refused, NEW - (BOUND as usize - 2), "{backend:?}: the rest are refused, each alone");

        // What is stored: exactly the bound, the replacements' newer texts, nothing of a refused one.
        let conn = db.connect().await?;
        let rows = conn
            .query_all_raw(sea_orm::Statement::from_string(
                conn.get_database_backend(),
                "SELECT thread_id, conversation FROM memory_updates WHERE status = 'pending' ORDER BY thread_id",
            ))
            .await?;
        assert_eq!(rows.len(), BOUND as usize, "{backend:?}");
        let mut threads = Vec::new();
        for row in &rows {
            let (thread, conversation): (String, String) = (row.try_get("", "thread_id")?, row.try_get("", "conversation")?);
            if thread == "waiting-a" {
                assert!(conversation.contains("oolong"), "{conversation}");
            }
            if thread == "waiting-b" {
                assert!(conversation.contains("Bergen"), "{conversation}");
            }
            threads.push(thread);
        }
        assert!(threads.contains(&"waiting-a".to_owned()) && threads.contains(&"waiting-b".to_owned()), "{threads:?}");

        // Fewer transactions than updates: some were committed together.
        let scrape = scrape(&url).await?;
        let batches = scrape.value("antler_memory_queue_batch_size_count", &[]);
        let updates = scrape.value("antler_memory_queue_batch_size_sum", &[]);
        assert_eq!(updates, (NEW + 4) as f64, "{backend:?}: every update went through the batcher");
        assert!(batches < updates, "{backend:?}: {batches} batches for {updates} updates");
    }
    Ok(())
}

/// A cold RenderInjection reads a scope in one statement whose facts come back as one JSON array: the
/// facts, sections and revisions it reads are exactly what the row-by-row queries read, on both
/// backends — floats that 15 digits do not round-trip, quotes, newlines, non-ASCII text, NULLs.
#[tokio::test]
async fn the_one_statement_render_snapshot_reads_exactly_what_the_row_queries_read() -> anyhow::Result<()> {
    use antler_memory::facts::{self, Scope};
    use antler_memory::render::RenderFact;
    use antler_memory::render_cache::{Loaded, Snapshot};
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_memory(&db, "")?;
        let mut memory = client(&server).await?;
        let document = r#"{"version": "1.0", "user": {"workContext": {"summary": "Writes \"quoted\" text\nover two lines, naïvely"}},
            "history": {"recentMonths": {"summary": "Moved to Zürich ✈"}}, "facts": []}"#;
        memory.import_memory(authed(ImportMemoryRequest { document: document.into(), ..Default::default() }, ALICE)).await?;
        let awkward = [0.7 + 0.29, 0.1 + 0.2, 1.0 / 3.0, 0.95, 1.0, 0.0];
        for (i, confidence) in awkward.into_iter().enumerate() {
            let content = format!("Fact {i}: \"quotes\", back\\slash, tab\there, 日本語, emoji 🦀");
            add_fact(&mut memory, ALICE, add(&content, FactCategory::Knowledge, confidence)).await?;
        }
        let mut labelled = add("Collects vinyl records", FactCategory::Other, 0.8);
        labelled.category_label = "hobby".into();
        add_fact(&mut memory, ALICE, labelled).await?;
        let mut correction = add("The office is in Basel", FactCategory::Correction, 0.9);
        correction.source_error = "said Bern".into();
        add_fact(&mut memory, ALICE, correction).await?;
        let gone = add_fact(&mut memory, ALICE, add("Lives in Geneva", FactCategory::Context, 0.9)).await?;
        memory.delete_fact(authed(DeleteFactRequest { fact_id: gone.id, ..Default::default() }, ALICE)).await?;
        let mut other_agent = add("Prefers tabs", FactCategory::Preference, 0.9);
        other_agent.agent_name = "coder".into();
        add_fact(&mut memory, ALICE, other_agent).await?;

        let conn = db.connect().await?;
        for (user, agent, live) in [("alice", "", 8), ("alice", "coder", 1), ("nobody", "", 0)] {
            let scope = Scope::new(user, agent);
            let snapshot = Snapshot::load(&conn, &scope).await?;
            let mut expected: Vec<RenderFact> = facts::live(&conn, &scope).await?.iter().map(RenderFact::from).collect();
            let mut got = snapshot.live.clone();
            expected.sort_by_key(|f| f.doc);
            got.sort_by_key(|f| f.doc);
            assert_eq!(got.len(), live, "{backend:?} {user}/{agent}");
            assert_eq!(got, expected, "{backend:?} {user}/{agent}: every column a render reads of every live fact");
            assert_eq!(snapshot.profile, antler_memory::profile::load(&conn, user).await?, "{backend:?} {user}");
            assert_eq!(snapshot.revisions, facts::revisions(&conn, &scope).await?, "{backend:?} {user}/{agent}");
        }
        let alice = Snapshot::load(&conn, &Scope::new("alice", "")).await?;
        // A kept snapshot at the current revisions costs the same statement without the rows.
        let unchanged = Snapshot::load_if_changed(&conn, &Scope::new("alice", ""), Some(alice.revisions)).await?;
        assert!(matches!(unchanged, Loaded::Unchanged), "{backend:?}: {unchanged:?}");
        let stale = (alice.revisions.0, alice.revisions.1 - 1);
        let fresh = Snapshot::load_if_changed(&conn, &Scope::new("alice", ""), Some(stale)).await?;
        assert!(matches!(&fresh, Loaded::Fresh(s) if s.live.len() == 8 && s.revisions == alice.revisions), "{backend:?}: {fresh:?}");
        for confidence in awkward {
            assert!(
                alice.live.iter().any(|f| f.confidence.to_bits() == confidence.to_bits()),
                "{backend:?}: {confidence:?} read back exactly"
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn another_users_memory_looks_like_none_on_every_rpc() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_memory(&db, "  debounce_seconds: 300\n")?;
    let mut memory = client(&server).await?;
    let fact = add_fact(&mut memory, ALICE, add("Alice's secret project is Falcon", FactCategory::Goal, 0.95)).await?;
    let document = r#"{"version": "1.0", "user": {"workContext": {"summary": "Alice works on Falcon"}}, "facts": []}"#;
    memory.import_memory(authed(ImportMemoryRequest { document: document.into(), ..Default::default() }, ALICE)).await?;
    queue(&mut memory, ALICE, "t-alice", conversation("Falcon ships in May"), false).await?;

    let bob_memory = memory.get_memory(authed(GetMemoryRequest::default(), BOB)).await?.into_inner().memory.unwrap_or_default();
    assert_eq!((bob_memory.revision, bob_memory.active_fact_count), (0, 0));
    assert!(bob_memory.profile.and_then(|p| p.work_context).map(|s| s.summary).unwrap_or_default().is_empty());
    assert!(
        memory
            .list_facts(authed(ListFactsRequest { include_invalidated: true, ..Default::default() }, BOB))
            .await?
            .into_inner()
            .facts
            .is_empty()
    );
    assert!(
        memory
            .search_facts(authed(SearchFactsRequest { query: "Falcon".into(), ..Default::default() }, BOB))
            .await?
            .into_inner()
            .results
            .is_empty()
    );
    let missing = memory
        .update_fact(authed(UpdateFactRequest { fact_id: fact.id.clone(), confidence: Some(0.1), ..Default::default() }, BOB))
        .await
        .err();
    let nonexistent = memory
        .update_fact(authed(
            UpdateFactRequest { fact_id: "fact_00000000000000000000000000000000".into(), confidence: Some(0.1), ..Default::default() },
            BOB,
        ))
        .await
        .err();
    assert_eq!(missing.as_ref().map(|s| s.code()), Some(Code::NotFound));
    assert_eq!(
        missing.map(|s| s.message().replace(&fact.id, "ID")),
        nonexistent.map(|s| s.message().replace("fact_00000000000000000000000000000000", "ID")),
        "the same answer as for a fact that does not exist"
    );
    let status =
        memory.delete_fact(authed(DeleteFactRequest { fact_id: fact.id.clone(), purge: true, ..Default::default() }, BOB)).await.err();
    assert_eq!(status.map(|s| s.code()), Some(Code::NotFound));
    let rendered = memory.render_injection(authed(RenderInjectionRequest::default(), BOB)).await?.into_inner();
    assert!(rendered.text.is_empty() && rendered.included_fact_ids.is_empty() && rendered.revision == 0);
    let flushed = memory.flush_updates(authed(FlushUpdatesRequest::default(), BOB)).await?.into_inner();
    assert_eq!((flushed.flushed, flushed.pending), (0, 0), "bob cannot flush alice's update");
    let exported = memory.export_memory(authed(ExportMemoryRequest::default(), BOB)).await?.into_inner();
    assert_eq!(exported.fact_count, 0);
    assert!(!exported.document.contains("Falcon"));
    // Bob adding the same text gets his own fact, not a deduplicated hit on alice's.
    let bobs = memory.add_fact(authed(add("Alice's secret project is Falcon", FactCategory::Goal, 0.95), BOB)).await?.into_inner();
    assert!(!bobs.deduplicated && bobs.fact.map(|f| f.id) != Some(fact.id.clone()));
    // And alice's memory is untouched.
    assert_eq!(active_facts(&mut memory, ALICE).await?.len(), 1);
    assert_eq!(memory.flush_updates(authed(FlushUpdatesRequest::default(), ALICE)).await?.into_inner().flushed, 1);
    Ok(())
}

#[tokio::test]
async fn injection_puts_profile_first_and_respects_the_budget_to_the_token() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_memory(&db, "")?;
    let mut memory = client(&server).await?;
    let document = r#"{"version": "2.0", "revision": 3, "user": {"workContext": {"summary": "Staff engineer at <Acme>", "updatedAt": "2026-01-02T03:04:05Z"},
        "personalContext": {"summary": "Speaks German and English"}, "topOfMind": {"summary": ""}},
        "history": {"recentMonths": {"summary": "Led the billing migration"}}}"#;
    memory.import_memory(authed(ImportMemoryRequest { document: document.into(), ..Default::default() }, ALICE)).await?;
    for i in 0..60 {
        let text = format!("Fact {i}: the user keeps notes about topic number {i} in a notebook");
        add_fact(&mut memory, ALICE, add(&text, FactCategory::Knowledge, 0.7 + f64::from(i % 30) * 0.01)).await?;
    }
    let mut correction = add("Deploys with Helm, not kubectl apply", FactCategory::Correction, 0.98);
    correction.source_error = "suggested kubectl apply".into();
    let correction = add_fact(&mut memory, ALICE, correction).await?;

    for budget in [100u32, 150, 333, 1000] {
        let r =
            memory.render_injection(authed(RenderInjectionRequest { max_tokens: budget, ..Default::default() }, ALICE)).await?.into_inner();
        let counted = tiktoken(&r.text);
        assert_eq!(r.token_estimate as usize, counted, "budget {budget}: the estimate is the exact cl100k count");
        assert_eq!(r.token_counting(), TokenCounting::Tiktoken);
        let correction_line = "- [correction | 0.98] Deploys with Helm, not kubectl apply (avoid: suggested kubectl apply)\n";
        assert!(r.text.contains(correction_line), "{}", r.text);
        let regular = counted - tiktoken(correction_line);
        assert!(regular <= budget as usize, "budget {budget}: {regular} tokens of summaries and facts");
        assert!(r.text.starts_with("User Context:\n- Work: Staff engineer at &lt;Acme&gt;\n- Personal: Speaks German and English\nHistory:\n- Recent: Led the billing migration\nFacts:\n"), "{}", r.text);
        assert_eq!(r.included_fact_ids[0], correction.id, "corrections first");
        assert_eq!(r.included_fact_ids.len() + r.omitted_fact_count as usize, 61);
        // To the token: the next fact in rank order would not have fitted.
        if r.omitted_fact_count > 0 {
            let facts = active_facts(&mut memory, ALICE).await?;
            let mut rest: Vec<_> = facts.iter().filter(|f| !r.included_fact_ids.contains(&f.id)).collect();
            rest.sort_by(|a, b| {
                b.confidence
                    .total_cmp(&a.confidence)
                    .then(b.created_at.as_ref().map(|t| (t.seconds, t.nanos)).cmp(&a.created_at.as_ref().map(|t| (t.seconds, t.nanos))))
            });
            let next = antler_memory::facts::line("knowledge", "", rest[0].confidence, &rest[0].content, "");
            assert!(regular + tiktoken(&next) > budget as usize, "budget {budget}: {next:?} would have fitted");
        }
        let again =
            memory.render_injection(authed(RenderInjectionRequest { max_tokens: budget, ..Default::default() }, ALICE)).await?.into_inner();
        assert_eq!(again.text, r.text, "stable text for the same inputs");
    }
    // Relevance to the current message moves a matching fact to the front of the regular facts.
    let r = memory
        .render_injection(authed(
            RenderInjectionRequest { max_tokens: 200, query: "what is topic number 42 about?".into(), ..Default::default() },
            ALICE,
        ))
        .await?
        .into_inner();
    let facts = active_facts(&mut memory, ALICE).await?;
    let fact_42 = facts.iter().find(|f| f.content.starts_with("Fact 42:")).map(|f| f.id.clone()).unwrap_or_default();
    assert_eq!(r.included_fact_ids.get(1), Some(&fact_42), "{}", r.text);
    let summaries =
        memory.render_injection(authed(RenderInjectionRequest { summaries_only: true, ..Default::default() }, ALICE)).await?.into_inner();
    assert!(summaries.included_fact_ids.is_empty() && !summaries.text.contains("Facts:") && summaries.text.contains("- Work:"));
    Ok(())
}

#[tokio::test]
async fn deerflow_memory_json_imports_and_round_trips() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_memory(&db, "")?;
    let mut memory = client(&server).await?;
    // Shaped like DeerFlow 1.x's memory.json (facts inside the file, source = thread id).
    let v1 = r#"{
      "version": "1.0",
      "lastUpdated": "2025-11-20T08:15:00.000000Z",
      "user": {
        "workContext": {"summary": "Data scientist at a logistics startup; works in Python and dbt.", "updatedAt": "2025-11-20T08:15:00.000000Z"},
        "personalContext": {"summary": "Based in Singapore; prefers concise answers.", "updatedAt": "2025-11-18T10:00:00.000000Z"},
        "topOfMind": {"summary": "Evaluating DuckDB for the nightly reports.", "updatedAt": "2025-11-20T08:15:00.000000Z"}
      },
      "history": {
        "recentMonths": {"summary": "Moved the forecasting pipeline to Airflow.", "updatedAt": "2025-11-01T00:00:00.000000Z"},
        "earlierContext": {"summary": "", "updatedAt": ""},
        "longTermBackground": {"summary": "PhD in operations research.", "updatedAt": "2025-09-01T00:00:00.000000Z"}
      },
      "facts": [
        {"id": "fact_5b1e0c2a", "content": "Prefers concise answers with code first", "category": "preference", "confidence": 0.95, "createdAt": "2025-11-18T10:00:00.000000Z", "source": "9f1c2d3e-thread"},
        {"id": "fact_7a9d1e44", "content": "Uses dbt for transformations", "category": "knowledge", "confidence": 0.9, "createdAt": "2025-11-19T11:30:00.000000Z", "source": "9f1c2d3e-thread"},
        {"id": "fact_0c3f8b10", "content": "Wants to cut report runtime below 10 minutes", "category": "goal", "confidence": 0.8, "createdAt": "2025-11-20T08:15:00.000000Z", "source": "a7e4b2c1-thread"},
        {"id": "fact_dup", "content": "uses dbt  for transformations", "category": "knowledge", "confidence": 0.7, "createdAt": "2025-11-20T08:16:00.000000Z", "source": "a7e4b2c1-thread"}
      ]
    }"#;
    let r = memory.import_memory(authed(ImportMemoryRequest { document: v1.into(), ..Default::default() }, ALICE)).await?.into_inner();
    assert_eq!((r.version.as_str(), r.facts_imported, r.facts_skipped, r.sections_imported), ("1.0", 3, 1, 5));
    let facts = active_facts(&mut memory, ALICE).await?;
    let dbt = facts.iter().find(|f| f.content == "Uses dbt for transformations").ok_or_else(|| anyhow::anyhow!("dbt fact missing"))?;
    assert_eq!(
        dbt.source.as_ref().map(|s| (s.kind(), s.thread_id.as_str(), s.message_id.as_str())),
        Some((FactSourceKind::Import, "9f1c2d3e-thread", "fact_7a9d1e44"))
    );
    assert_eq!(dbt.created_at.as_ref().map(|t| t.seconds), Some(1_763_551_800));

    // Round trip: export v1 and import it as another user; export both as v2 and compare.
    let exported =
        memory.export_memory(authed(ExportMemoryRequest { version: "1.0".into(), ..Default::default() }, ALICE)).await?.into_inner();
    assert_eq!(exported.fact_count, 3);
    let r = memory
        .import_memory(authed(ImportMemoryRequest { document: exported.document.clone(), ..Default::default() }, BOB))
        .await?
        .into_inner();
    assert_eq!((r.facts_imported, r.sections_imported), (3, 5));
    let comparable = |doc: &str| -> anyhow::Result<serde_json::Value> {
        let mut v: serde_json::Value = serde_json::from_str(doc)?;
        if let Some(facts) = v["facts"].as_array_mut() {
            for f in facts {
                if let Some(o) = f.as_object_mut() {
                    o.remove("id");
                }
            }
        }
        v.as_object_mut().map(|o| {
            o.remove("revision");
            o.remove("lastUpdated")
        });
        Ok(v)
    };
    let alice_v2 = memory.export_memory(authed(ExportMemoryRequest::default(), ALICE)).await?.into_inner().document;
    let bob_v2 = memory.export_memory(authed(ExportMemoryRequest::default(), BOB)).await?.into_inner().document;
    assert_eq!(comparable(&alice_v2)?, comparable(&bob_v2)?, "v1 export → import keeps sections, facts, times and provenance");

    // DeerMem v2: the manifest plus front-matter-shaped facts; inactive ones are not imported.
    let v2 = r#"{"version": "2.0", "revision": 12, "lastUpdated": "2026-02-01T09:00:00Z",
      "user": {"workContext": {"summary": "Platform engineer", "updatedAt": "2026-02-01T09:00:00Z"}},
      "history": {"longTermBackground": {"summary": "Ten years of SRE work", "updatedAt": "2026-01-01T00:00:00Z"}},
      "facts": [
        {"id": "fact_1f2e3d4c5b6a79880123456789abcdef", "schemaVersion": 2, "category": "correction", "confidence": 0.97, "status": "active",
         "content": "The staging cluster is in eu-west-1, not us-east-1", "sourceError": "said us-east-1",
         "source": {"type": "conversation", "threadId": "thread-42"}, "createdAt": "2026-01-15T12:00:00Z", "updatedAt": "2026-01-15T12:00:00Z",
         "revision": 2, "confirmationCount": 3, "lastConfirmedAt": "2026-01-30T08:00:00Z"},
        {"id": "fact_aa", "schemaVersion": 2, "category": "hobby", "confidence": 0.8, "status": "active", "content": "Restores old synthesizers",
         "source": {"type": "manual", "threadId": ""}, "createdAt": "2026-01-16T12:00:00Z"},
        {"id": "fact_bb", "schemaVersion": 2, "category": "context", "confidence": 0.8, "status": "archived", "content": "Used to live in Leeds",
         "createdAt": "2025-01-16T12:00:00Z"}
      ]}"#;
    let mut request = ImportMemoryRequest { document: v2.into(), agent_name: "ops".into() };
    let r = memory.import_memory(authed(request.clone(), BOB)).await?.into_inner();
    assert_eq!((r.version.as_str(), r.facts_imported, r.facts_skipped), ("2.0", 2, 1));
    let ops = memory.list_facts(authed(ListFactsRequest { agent_name: "ops".into(), ..Default::default() }, BOB)).await?.into_inner().facts;
    let correction = ops.iter().find(|f| f.category() == FactCategory::Correction).ok_or_else(|| anyhow::anyhow!("correction missing"))?;
    assert_eq!((correction.source_error.as_str(), correction.confirmation_count), ("said us-east-1", 3));
    assert!(ops.iter().any(|f| f.category() == FactCategory::Other && f.category_label == "hobby"));
    let v2_out = memory
        .export_memory(authed(ExportMemoryRequest { agent_name: "ops".into(), version: "2.0".into() }, BOB))
        .await?
        .into_inner()
        .document;
    let doc: serde_json::Value = serde_json::from_str(&v2_out)?;
    assert_eq!(doc["version"], "2.0");
    assert_eq!(doc["user"]["workContext"]["summary"], "Platform engineer");
    assert_eq!(doc["facts"].as_array().map(Vec::len), Some(2));
    assert!(doc["facts"].as_array().into_iter().flatten().any(|f| f["categoryExtension"] == "hobby" && f["status"] == "active"));
    // Importing the same document again adds nothing.
    request.agent_name = "ops".into();
    let r = memory.import_memory(authed(request, BOB)).await?.into_inner();
    assert_eq!((r.facts_imported, r.facts_skipped), (0, 3));
    // A broken document names the JSON path.
    let bad = r#"{"version": "1.0", "facts": [{"content": "ok"}, {"category": "goal"}]}"#;
    let status = memory.import_memory(authed(ImportMemoryRequest { document: bad.into(), ..Default::default() }, ALICE)).await.err();
    assert!(status.is_some_and(|s| s.code() == Code::InvalidArgument && s.message().starts_with("document.facts[1].content")));
    let _ = Role::User;
    Ok(())
}
