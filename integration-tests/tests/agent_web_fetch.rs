//! The direct fetcher's limits against a page server on loopback (allowlisted, as in a test or an
//! intranet configuration): redirects followed up to `max_redirects`, content types outside the list
//! refused by name, text longer than `max_bytes` read up to it with a note, a binary over it refused,
//! a slow server cut at `timeout_ms`, plain text and JSON returned as they are, and long text cut at
//! `cut_chars` with a marker.

use std::time::{Duration, Instant};

use antler_agent::lead::tools::web::config::FetchConfig;
use antler_agent::lead::tools::web::web_fetch;
use antler_agent::lead::tools::web_fetch::{Fetched, WebFetch};
use antler_integration_tests::web_double::{Answer, PNG, PageServer, article_page};
use anyhow::{Result, anyhow, ensure};

fn tool(change: impl FnOnce(&mut FetchConfig)) -> Result<WebFetch> {
    let mut config = FetchConfig { ports: Vec::new(), allow_cidrs: vec!["127.0.0.1/32".to_owned()], ..FetchConfig::default() };
    change(&mut config);
    Ok(web_fetch(&config, &|_| None)?)
}

async fn text(tool: &WebFetch, url: &str) -> Result<String> {
    match tool.fetch(url).await {
        Ok(Fetched::Text(text)) => Ok(text),
        Ok(other) => Err(anyhow!("{url}: not text: {other:?}")),
        Err(error) => Err(anyhow!("{url}: {error}")),
    }
}

async fn error(tool: &WebFetch, url: &str) -> Result<String> {
    match tool.fetch(url).await {
        Err(error) => Ok(error),
        Ok(other) => Err(anyhow!("{url} was fetched: {other:?}")),
    }
}

#[tokio::test]
async fn the_direct_fetcher_keeps_to_its_limits() -> Result<()> {
    let long: Vec<String> = (0..400).map(|i| format!("Line {i} of a long page about the harbour and its ferries.")).collect();
    let long: Vec<&str> = long.iter().map(String::as_str).collect();
    let pages = PageServer::start(vec![
        ("/article", Answer::bytes(200, "text/html; charset=utf-8", article_page("Ferries", &["Back on <b>Monday</b>."]))),
        ("/hop1", Answer::redirect(302, "/hop2")),
        ("/hop2", Answer::redirect(301, "/article")),
        ("/notes.txt", Answer::bytes(200, "text/plain", "plain <b>text</b> stays as it is")),
        ("/data.json", Answer::bytes(200, "application/json", r#"{"ferries": [1, 2]}"#)),
        ("/latin1.txt", Answer::bytes(200, "text/plain; charset=ISO-8859-1", b"caf\xe9".to_vec())),
        ("/long", Answer::bytes(200, "text/html", article_page("Long", &long))),
        ("/app.zip", Answer::bytes(200, "application/zip", vec![0x50, 0x4b, 3, 4])),
        ("/big.png", Answer::bytes(200, "image/png", [PNG, &[0u8; 4096]].concat())),
        ("/missing", Answer::bytes(404, "text/html", "<h1>no</h1>")),
        ("/slow", Answer { delay: Duration::from_secs(5), ..Answer::bytes(200, "text/plain", "late") }),
    ])
    .await?;
    let url = |path: &str| pages.url(path);
    let fetch = tool(|_| {})?;

    let page = text(&fetch, &url("/hop1")).await?;
    ensure!(page.starts_with(&format!("# Ferries\n\nSource: {}\n\n", url("/article"))), "the final URL is the source: {page}");
    ensure!(page.contains("Back on **Monday**."), "{page}");
    let limited = tool(|c| c.max_redirects = 1)?;
    let too_many = error(&limited, &url("/hop1")).await?;
    ensure!(too_many.contains("more than 1 redirects (runs.lead.web.fetch.max_redirects)"), "{too_many}");

    ensure!(text(&fetch, &url("/notes.txt")).await?.ends_with("\n\nplain <b>text</b> stays as it is"), "text as it is");
    ensure!(text(&fetch, &url("/data.json")).await?.ends_with("\n\n{\"ferries\": [1, 2]}"), "JSON as it is");
    ensure!(text(&fetch, &url("/latin1.txt")).await?.ends_with("café"), "charset from the Content-Type");

    let refused = error(&fetch, &url("/app.zip")).await?;
    ensure!(refused.contains("is application/zip, which web_fetch does not read (runs.lead.web.fetch.allowed_content_types"), "{refused}");
    let missing = error(&fetch, &url("/missing")).await?;
    ensure!(missing.contains("answered HTTP 404 Not Found"), "{missing}");

    let small = tool(|c| c.max_bytes = 2048)?;
    let partial = text(&small, &url("/long")).await?;
    ensure!(partial.contains("Line 0 of a long page") && !partial.contains("Line 399"), "read up to max_bytes: {partial}");
    ensure!(
        partial.ends_with("[… the page is longer than 2048 bytes (runs.lead.web.fetch.max_bytes); only that much was read.]"),
        "{partial}"
    );
    let image = error(&small, &url("/big.png")).await?;
    ensure!(image.contains("over the 2048-byte limit (runs.lead.web.fetch.max_bytes)"), "{image}");

    let cut = tool(|c| c.cut_chars = 1000)?;
    let short = text(&cut, &url("/long")).await?;
    ensure!(short.contains("[… cut: showing the first") && short.contains("runs.lead.web.fetch.cut_chars = 1000"), "{short}");
    ensure!(short.chars().count() < 1200, "{} characters", short.chars().count());

    let hurried = tool(|c| c.timeout_ms = 400)?;
    let started = Instant::now();
    let late = error(&hurried, &url("/slow")).await?;
    ensure!(started.elapsed() < Duration::from_secs(3), "the timeout was not kept: {:?}", started.elapsed());
    ensure!(late.contains("did not finish within 400 ms (runs.lead.web.fetch.timeout_ms)"), "{late}");
    Ok(())
}
