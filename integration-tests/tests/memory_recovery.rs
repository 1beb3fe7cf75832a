//! The extraction queue is durable: updates queued before a kill -9 are processed once after the
//! restart, an update whose worker died mid-call is taken over when its lease expires, and two replicas
//! on PostgreSQL process every update exactly once.

use std::time::{Duration, Instant};

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, LlmDouble, Turn};
use antler_integration_tests::memory::*;
use antler_integration_tests::runs::authed;
use antler_proto::memory::FactCategory;

const WAIT: Duration = Duration::from_secs(90);

fn numbered(n: usize) -> Vec<Turn> {
    (1..=n).map(|i| Turn::text(&adds(&[(&format!("Remembered fact number {i}"), "context", 0.9)]))).collect()
}

#[tokio::test]
async fn updates_queued_before_kill_9_are_processed_once_after_restart() -> anyhow::Result<()> {
    let double = LlmDouble::start(numbered(3), AfterLast::Refuse).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let mut server = start_up(&db, "  debounce_seconds: 300\n", &double.models_yaml(), None)?;
    let mut memory = client(&server).await?;
    for thread in ["t-a", "t-b", "t-c"] {
        queue(&mut memory, ALICE, thread, conversation(&format!("Something worth keeping from {thread}")), false).await?;
    }
    server.signal(libc::SIGKILL)?;
    server.wait_exit(Duration::from_secs(10))?;
    assert!(double.requests().is_empty(), "nothing was processed before the kill (debounce 300 s)");

    let server = start_up(&db, "  debounce_seconds: 300\n", &double.models_yaml(), None)?;
    let mut memory = client(&server).await?;
    let flushed = flush_wait(&mut memory, ALICE, WAIT).await?;
    assert!(flushed.completed && flushed.flushed == 3, "{flushed:?}");
    assert!(flushed.outcomes.iter().all(|o| o.facts_added == 1 && o.error.is_empty()), "{:?}", flushed.outcomes);
    assert_eq!(double.requests().len(), 3, "each update extracted once");
    let facts = active_facts(&mut memory, ALICE).await?;
    assert_eq!(facts.len(), 3);
    assert!(facts.iter().all(|f| f.confirmation_count == 0));
    Ok(())
}

#[tokio::test]
async fn an_update_whose_worker_was_killed_mid_call_is_taken_over_after_its_lease() -> anyhow::Result<()> {
    // The first call streams so slowly that the process is killed in the middle of it.
    let answer = adds(&[("Keeps a sourdough starter", "behavior", 0.9)]);
    let double = LlmDouble::start(vec![Turn::text(&answer).slow(5_000), Turn::text(&answer)], AfterLast::Refuse).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let extra = "  lease_secs: 3\n  poll_interval_ms: 200\n";
    let mut server = start_up(&db, extra, &double.models_yaml(), None)?;
    let mut memory = client(&server).await?;
    queue(&mut memory, ALICE, "t-bread", conversation("I bake bread every Sunday with my sourdough starter"), true).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while double.requests().is_empty() {
        anyhow::ensure!(Instant::now() < deadline, "the worker never called the model");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.signal(libc::SIGKILL)?;
    server.wait_exit(Duration::from_secs(10))?;

    let server = start_up(&db, extra, &double.models_yaml(), None)?;
    let mut memory = client(&server).await?;
    let flushed = flush_wait(&mut memory, ALICE, WAIT).await?;
    assert!(flushed.completed, "{flushed:?}");
    assert_eq!(flushed.outcomes.len(), 1);
    assert_eq!(flushed.outcomes[0].facts_added, 1, "{:?}", flushed.outcomes);
    assert_eq!(double.requests().len(), 2, "the killed attempt and the takeover");
    assert_eq!(active_facts(&mut memory, ALICE).await?.len(), 1, "applied once");
    Ok(())
}

#[tokio::test]
async fn two_replicas_on_postgres_process_each_update_exactly_once() -> anyhow::Result<()> {
    const UPDATES: usize = 40;
    let double = LlmDouble::start(numbered(UPDATES), AfterLast::Refuse).await?;
    let db = TestDb::new(Backend::Postgres).await?;
    let extra = "  workers: 4\n  poll_interval_ms: 100\n  debounce_seconds: 1\n";
    let a = start_up(&db, extra, &double.models_yaml(), None)?;
    let b = start_up(&db, extra, &double.models_yaml(), None)?;
    let (mut ma, mut mb) = (client(&a).await?, client(&b).await?);
    for i in 0..UPDATES {
        let client = if i % 2 == 0 { &mut ma } else { &mut mb };
        queue(client, ALICE, &format!("thread-{i}"), conversation(&format!("Detail {i} about my life")), i % 3 == 0).await?;
    }
    let flushed = flush_wait(&mut ma, ALICE, WAIT).await?;
    assert!(flushed.completed, "{flushed:?}");
    let other = flush_wait(&mut mb, ALICE, WAIT).await?;
    assert_eq!(other.pending, 0);
    assert_eq!(double.requests().len(), UPDATES, "exactly one extraction per update across both replicas");
    let facts = active_facts(&mut ma, ALICE).await?;
    assert_eq!(facts.len(), UPDATES);
    let mut contents: Vec<&str> = facts.iter().map(|f| f.content.as_str()).collect();
    contents.sort();
    contents.dedup();
    assert_eq!(contents.len(), UPDATES, "no fact written twice");
    assert!(facts.iter().all(|f| f.confirmation_count == 0), "no update applied twice");
    let a_log = a.stderr();
    let b_log = b.stderr();
    let a_did = a_log.matches("memory update applied").count();
    let b_did = b_log.matches("memory update applied").count();
    assert_eq!(a_did + b_did, UPDATES, "a {a_did} + b {b_did}");
    Ok(())
}

/// The group commit across replicas: every thread is queued through both replicas at once (c = 16), so
/// batches on A and B race for the same keys; whichever commits second replaces the first's row. Each
/// thread ends as one update, extracted exactly once.
#[tokio::test]
async fn two_replicas_queueing_the_same_threads_at_once_extract_each_thread_once() -> anyhow::Result<()> {
    const THREADS: usize = 30;
    let double = LlmDouble::start(numbered(THREADS), AfterLast::Refuse).await?;
    let db = TestDb::new(Backend::Postgres).await?;
    let extra = "  workers: 4\n  poll_interval_ms: 100\n  debounce_seconds: 300\n";
    let a = start_up(&db, extra, &double.models_yaml(), None)?;
    let b = start_up(&db, extra, &double.models_yaml(), None)?;
    let (ma, mb) = (client(&a).await?, client(&b).await?);
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..16 {
        let mut memory = if t % 2 == 0 { ma.clone() } else { mb.clone() };
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let mut replaced = 0;
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= 2 * THREADS {
                    return anyhow::Ok(replaced);
                }
                let (thread, via) = (i / 2, if i.is_multiple_of(2) { "first" } else { "second" });
                let text = format!("Detail {thread} about my life, told the {via} time");
                let r = queue(&mut memory, ALICE, &format!("thread-{thread}"), conversation(&text), false).await?;
                replaced += usize::from(r.replaced_pending);
            }
        }));
    }
    let mut replaced = 0;
    for task in tasks {
        replaced += task.await??;
    }
    assert_eq!(replaced, THREADS, "one of each thread's two updates replaced the other");
    assert!(double.requests().is_empty(), "nothing is due before the flush (debounce 300 s)");
    let (mut ma, mut mb) = (ma, mb);
    let flushed = flush_wait(&mut ma, ALICE, WAIT).await?;
    assert!(flushed.completed && flushed.flushed as usize == THREADS, "{flushed:?}");
    assert_eq!(flush_wait(&mut mb, ALICE, WAIT).await?.pending, 0);
    assert_eq!(double.requests().len(), THREADS, "exactly one extraction per thread across both replicas");
    let facts = active_facts(&mut ma, ALICE).await?;
    assert_eq!(facts.len(), THREADS, "no update applied twice");
    let applied = a.stderr().matches("memory update applied").count() + b.stderr().matches("memory update applied").count();
    assert_eq!(applied, THREADS);
    Ok(())
}

/// Without FlushUpdates an update is extracted when it falls due: QueueUpdate wakes the workers only
/// when the update is due before their next look at the queue (`poll_interval_ms`); otherwise they
/// find it when they look, and sleep until it is due.
#[tokio::test]
async fn updates_are_extracted_when_due_without_a_flush() -> anyhow::Result<()> {
    async fn extracted_after(extra: &str, immediate: bool) -> anyhow::Result<Duration> {
        let double = LlmDouble::start(numbered(1), AfterLast::Refuse).await?;
        let db = TestDb::new(Backend::Sqlite).await?;
        let server = start_up(&db, extra, &double.models_yaml(), None)?;
        let mut memory = client(&server).await?;
        // Let the workers settle into their sleep first.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let started = Instant::now();
        queue(&mut memory, ALICE, "t-due", conversation("I keep bees on the roof of my building"), immediate).await?;
        while active_facts(&mut memory, ALICE).await?.is_empty() {
            anyhow::ensure!(started.elapsed() < Duration::from_secs(20), "not extracted after 20 s ({extra:?}, immediate {immediate})");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(double.requests().len(), 1);
        Ok(started.elapsed())
    }
    // Workers that would look again only in a minute: an immediate update wakes them.
    let took = extracted_after("  debounce_seconds: 1\n  poll_interval_ms: 60000\n", true).await?;
    assert!(took < Duration::from_secs(10), "immediate: {took:?}");
    // Due in a second, before their next look: woken to sleep until it is due, not before.
    let took = extracted_after("  debounce_seconds: 1\n  poll_interval_ms: 60000\n", false).await?;
    assert!(took >= Duration::from_millis(1000) && took < Duration::from_secs(10), "debounced, long poll: {took:?}");
    // Due after their next look (every 200 ms): found by looking.
    let took = extracted_after("  debounce_seconds: 1\n  poll_interval_ms: 200\n", false).await?;
    assert!(took >= Duration::from_millis(1000) && took < Duration::from_secs(10), "debounced, short poll: {took:?}");
    Ok(())
}

/// RenderInjection keeps a scope's facts between calls while its revision stands: a fact added
/// through another replica is in the very next render on this one, and a deleted one is gone.
#[tokio::test]
async fn a_render_on_one_replica_sees_a_fact_written_through_another() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Postgres).await?;
    let (a, b) = (start_memory(&db, "")?, start_memory(&db, "")?);
    let (mut ma, mut mb) = (client(&a).await?, client(&b).await?);
    let render = |text: &str| antler_proto::memory::RenderInjectionRequest { query: text.to_owned(), ..Default::default() };
    let mut rendered = Vec::new();
    for content in ["Keeps bees on the roof", "Plays the cello on Sundays"] {
        add_fact(&mut mb, ALICE, add(content, FactCategory::Knowledge, 0.9)).await?;
        // Twice on replica A: the second comes from its kept snapshot.
        for _ in 0..2 {
            let text = ma.render_injection(authed(render("bees and cello"), ALICE)).await?.into_inner().text;
            rendered.push(text);
        }
    }
    assert!(rendered[0].contains("bees") && rendered[1].contains("bees"), "{rendered:?}");
    assert!(rendered[2].contains("cello") && rendered[3].contains("cello"), "the second fact came through B: {rendered:?}");
    let cello = active_facts(&mut mb, ALICE).await?.into_iter().find(|f| f.content.contains("cello")).map(|f| f.id).unwrap_or_default();
    mb.delete_fact(authed(antler_proto::memory::DeleteFactRequest { fact_id: cello, ..Default::default() }, ALICE)).await?;
    let text = ma.render_injection(authed(render("cello"), ALICE)).await?.into_inner().text;
    assert!(!text.contains("cello") && text.contains("bees"), "deleted through B, gone on A: {text}");
    Ok(())
}
