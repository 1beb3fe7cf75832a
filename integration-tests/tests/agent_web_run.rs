//! A research run through `antler up`: a replay model searches (a SearXNG or Tavily double), fetches
//! the page the search found (served on loopback, which the test's configuration allowlists), writes
//! a report that cites it into outputs/ and presents it. The run ends SUCCESS with a satisfied
//! receipt, and the fetched page reaches the model as Markdown of its article, menus left out.
//! Changing the search block is all it takes to go from SearXNG to Tavily.
//!
//! Also: a fetched page counts in the run's token usage like any other input (and a token budget
//! stops a run that a large page pushes over it), and a web block that cannot work is a start-up
//! error naming the setting.

use std::time::Duration;

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::runs::*;
use antler_integration_tests::web_double::{Answer, Api, PageServer, SearchDouble, article_page, hit};
use antler_integration_tests::{Launch, start, try_start};
use antler_proto::common::content_part::Part;
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{Run, RunEvent, RunStatus};
use anyhow::{Result, ensure};

const T: Duration = Duration::from_secs(90);
const REPORT: &str = "/mnt/user-data/outputs/report.md";
const TAVILY_KEY: &str = "tvly-test-7d1c0e9b5a24";

const PARAGRAPHS: [&str; 3] = [
    "The harbour reopened on <b>Monday</b> after the storm closed it for three days.",
    "Ferries now run every hour between 06:00 and 22:00, weather permitting.",
    "The breakwater repairs will take until spring, the harbour master said.",
];

/// The replay script of a researcher: search, fetch `page`, write and present a report citing it.
fn researcher(page: &str) -> String {
    let report = format!("# Harbour report\\n\\nFerries run hourly again since Monday [1].\\n\\n## Sources\\n\\n1. {page}\\n");
    format!(
        r#"models:
  models:
    - name: researcher
      provider: replay
      replay:
        turns:
          - tool_calls:
              - {{id: s1, name: web_search, arguments: {{query: "harbour ferries storm"}}}}
          - tool_calls:
              - {{id: f1, name: web_fetch, arguments: {{url: "{page}"}}}}
          - tool_calls:
              - {{id: w1, name: write_file, arguments: {{description: write the report, path: "{REPORT}", content: "{report}"}}}}
          - tool_calls:
              - {{id: p1, name: present_files, arguments: {{filepaths: ["{REPORT}"]}}}}
          - text: "The report is in {REPORT}; it cites [1] {page}."
"#
    )
}

/// `runs.lead.web` for the tests: `search` as given, fetch direct with loopback allowlisted.
fn web_block(search: &str) -> String {
    format!("  lead:\n    web:\n      search: {search}\n      fetch: {{allow_cidrs: [\"127.0.0.1/32\"], ports: [], cut_chars: 200000}}\n")
}

/// The full text of the TOOL message answering `call_id`.
fn tool_result(events: &[RunEvent], call_id: &str) -> String {
    events
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::Message(m)) => m.message.as_ref().filter(|m| m.tool_call_id == call_id).map(|m| {
                m.content
                    .iter()
                    .filter_map(|p| match &p.part {
                        Some(Part::Text(t)) => Some(t.text.clone()),
                        _ => None,
                    })
                    .collect::<String>()
            }),
            _ => None,
        })
        .unwrap_or_default()
}

async fn research(search_block: &str, launch_env: &[(&str, &str)], pages: &PageServer) -> Result<(Run, Vec<RunEvent>, String)> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let page = pages.url("/harbour.html");
    let mut launch = Launch::new(["up"]).config(agent_config(&db, &researcher(&page), &web_block(search_block)));
    for (key, value) in launch_env {
        launch = launch.env(*key, *value);
    }
    let server = start("antler", launch)?;
    let (mut runs, _) = clients(&server).await?;
    let mut request = prompt_request("", "Research the harbour reopening and write a cited report");
    request.expected_outputs = vec![REPORT.to_owned()];
    let run = run_to_end(&mut runs, request, T).await?;
    let events = run_events(&mut runs, ALICE, &run.run_id).await?;
    Ok((run, events, server.stderr()))
}

fn check_research(run: &Run, events: &[RunEvent], stderr: &str, page: &str) -> Result<()> {
    let finished = tool_finished(events);
    ensure!(run.status() == RunStatus::Success, "{:?}\n{finished:#?}\n{stderr}", run.error);
    let receipt = run.delivery.clone().unwrap_or_default();
    ensure!(receipt.satisfied && receipt.presented == vec![REPORT.to_owned()], "{receipt:?}");
    let names: Vec<&str> = finished.iter().map(|f| f.name.as_str()).collect();
    ensure!(names == ["web_search", "web_fetch", "write_file", "present_files"], "{names:?}");
    ensure!(finished.iter().all(|f| !f.is_error), "{finished:#?}");

    let search = tool_result(events, "s1");
    let results: serde_json::Value = serde_json::from_str(&search)?;
    ensure!(results[0]["url"] == page && results[0]["title"] == "Harbour reopens", "{search}");

    let fetched = tool_result(events, "f1");
    ensure!(fetched.starts_with(&format!("# Harbour reopens\n\nSource: {page}\n\n# Harbour reopens\n\n")), "{fetched}");
    ensure!(fetched.contains("The harbour reopened on **Monday** after the storm"), "the page's text as Markdown: {fetched}");
    for paragraph in &PARAGRAPHS[1..] {
        ensure!(fetched.contains(paragraph), "{paragraph:?} missing: {fetched}");
    }
    for furniture in ["Home menu", "About menu", "tracking-code", "cookie settings", "font: 14px"] {
        ensure!(!fetched.contains(furniture), "{furniture:?} in {fetched}");
    }
    Ok(())
}

async fn pages() -> Result<PageServer> {
    PageServer::start(vec![("/harbour.html", Answer::bytes(200, "text/html; charset=utf-8", article_page("Harbour reopens", &PARAGRAPHS)))])
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_research_run_with_searxng_searches_fetches_and_delivers_a_cited_report() -> Result<()> {
    let pages = pages().await?;
    let page = pages.url("/harbour.html");
    let searxng = SearchDouble::start(Api::Searxng, "", vec![hit("Harbour reopens", &page, "Ferries are back.")]).await?;
    let (run, events, stderr) = research(&format!("{{provider: searxng, base_url: \"{}\"}}", searxng.base_url()), &[], &pages).await?;
    check_research(&run, &events, &stderr, &page)?;
    ensure!(searxng.requests().len() == 1 && pages.requests().len() == 1, "one search, one fetch");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_run_with_tavily_needs_only_another_search_block_and_keeps_the_key_out_of_events() -> Result<()> {
    let pages = pages().await?;
    let page = pages.url("/harbour.html");
    let tavily = SearchDouble::start(Api::Tavily, TAVILY_KEY, vec![hit("Harbour reopens", &page, "Ferries are back.")]).await?;
    // The key comes from $TAVILY_API_KEY, as in DeerFlow; the block names only the provider.
    let block = format!("{{provider: tavily, base_url: \"{}\"}}", tavily.base_url());
    let (run, events, stderr) = research(&block, &[("TAVILY_API_KEY", TAVILY_KEY)], &pages).await?;
    check_research(&run, &events, &stderr, &page)?;
    let request = tavily.requests().pop().unwrap_or_else(|| panic!("no Tavily request"));
    ensure!(request.header("authorization") == Some(format!("Bearer {TAVILY_KEY}").as_str()), "{request:?}");
    ensure!(!format!("{events:?}").contains(TAVILY_KEY) && !stderr.contains(TAVILY_KEY), "the key leaked into events or logs");
    Ok(())
}

/// A script that fetches `page` and answers.
fn fetcher(page: &str) -> String {
    format!(
        "models:\n  models:\n    - name: fetcher\n      provider: replay\n      replay:\n        turns:\n          - tool_calls:\n              - {{id: f1, name: web_fetch, arguments: {{url: \"{page}\"}}}}\n          - text: done\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetched_page_counts_in_the_runs_tokens_and_a_budget_stops_a_run_it_overruns() -> Result<()> {
    let big: Vec<String> =
        (0..800).map(|i| format!("Sentence {i} about the harbour, its ferries, the storm and the long repairs that follow.")).collect();
    let big: Vec<&str> = big.iter().map(String::as_str).collect();
    let pages = PageServer::start(vec![
        ("/small.html", Answer::bytes(200, "text/html", article_page("Small", &PARAGRAPHS))),
        ("/big.html", Answer::bytes(200, "text/html", article_page("Big", &big))),
    ])
    .await?;
    let searxng = SearchDouble::start(Api::Searxng, "", Vec::new()).await?;
    let block = web_block(&format!("{{provider: searxng, base_url: \"{}\"}}", searxng.base_url()));
    let mut input_tokens = Vec::new();
    for path in ["/small.html", "/big.html"] {
        let db = TestDb::new(Backend::Sqlite).await?;
        let server = start("antler", Launch::new(["up"]).config(agent_config(&db, &fetcher(&pages.url(path)), &block)))?;
        let (mut runs, _) = clients(&server).await?;
        let run = run_to_end(&mut runs, prompt_request("", "Read the page"), T).await?;
        ensure!(run.status() == RunStatus::Success, "{path}: {:?}\n{}", run.error, server.stderr());
        input_tokens.push(run.usage.unwrap_or_default().input_tokens);
    }
    // ~68 KB of Markdown is ~17,000 tokens more in the model call that reads it.
    ensure!(input_tokens[1] > input_tokens[0] + 10_000, "the page is not counted: {input_tokens:?}");

    // The same big page under a 6,000-token budget: the call that reads it goes over, the run stops.
    let db = TestDb::new(Backend::Sqlite).await?;
    let budget = format!("{block}    token_budget: {{default_tokens: 6000}}\n");
    let server = start("antler", Launch::new(["up"]).config(agent_config(&db, &fetcher(&pages.url("/big.html")), &budget)))?;
    let (mut runs, _) = clients(&server).await?;
    let run = run_to_end(&mut runs, prompt_request("", "Read the page"), T).await?;
    ensure!(
        run.status() == RunStatus::Success && run.stop_reason == "token_capped",
        "{:?} {:?} {}",
        run.status(),
        run.error,
        run.stop_reason
    );
    // It was the page that did it: the fetch ran (the first call alone is well under the budget).
    let events = run_events(&mut runs, ALICE, &run.run_id).await?;
    let fetched = tool_finished(&events).iter().any(|f| f.name == "web_fetch" && !f.is_error);
    ensure!(fetched && input_tokens[0] < 6_000, "the budget stopped the run before the fetch: {input_tokens:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_web_block_that_cannot_work_stops_the_start_naming_the_setting() -> Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    for (block, setting) in [
        ("  lead:\n    web:\n      search: {provider: tavily}\n", "runs.lead.web.search.api_key"),
        ("  lead:\n    web:\n      search: {provider: duckduckgo}\n", "runs.lead.web.search.provider"),
        ("  lead:\n    web:\n      fetch: {allow_cidrs: [\"10.0.0.0/40\"]}\n", "runs.lead.web.fetch.allow_cidrs[0]"),
    ] {
        let launch = Launch::new(["up"]).config(agent_config(&db, "", block)).env("TAVILY_API_KEY", "");
        match try_start("antler", launch)? {
            Ok(_) => anyhow::bail!("antler up started with {block}"),
            Err(failure) => ensure!(failure.stderr.contains(setting), "{setting} not named:\n{}", failure.stderr),
        }
    }
    Ok(())
}

/// `examples/research.yaml` with what a test needs on top: the page it fetches is served on
/// loopback, so the fetch block allowlists 127.0.0.1 on any port; `tavily` swaps the search block for
/// the Tavily one, as the README says, pointed at the double.
fn research_example(tavily: Option<&str>) -> Result<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/research.yaml");
    let mut text = std::fs::read_to_string(&path)?;
    let fetch = "        provider: direct           # Antler fetches the page itself; private addresses are refused\n";
    ensure!(text.contains(fetch), "examples/research.yaml changed: no direct fetch line");
    text = text.replace(fetch, &format!("{fetch}        allow_cidrs: [\"127.0.0.1/32\"]\n        ports: []\n"));
    if let Some(base_url) = tavily {
        let searxng = "      search:\n        provider: searxng\n        base_url: ${SEARXNG_URL:-http://localhost:8088}\n";
        ensure!(text.contains(searxng), "examples/research.yaml changed: no SearXNG search block");
        text = text.replace(searxng, &format!("      search:\n        provider: tavily\n        base_url: {base_url}\n"));
    }
    Ok(text)
}

/// Every `report.md` in an outputs directory under `root`.
fn reports(root: &std::path::Path) -> Result<Vec<std::path::PathBuf>> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                stack.push(entry.path());
            } else if entry.path().ends_with("user-data/outputs/report.md") {
                found.push(entry.path());
            }
        }
    }
    Ok(found)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_research_example_delivers_its_report_with_searxng_and_with_tavily() -> Result<()> {
    let pages = pages().await?;
    let page = pages.url("/harbour.html");
    let searxng = SearchDouble::start(Api::Searxng, "", vec![hit("Harbour reopens", &page, "Ferries are back.")]).await?;
    let tavily = SearchDouble::start(Api::Tavily, TAVILY_KEY, vec![hit("Harbour reopens", &page, "Ferries are back.")]).await?;
    for variant in ["searxng", "tavily"] {
        let data = tempfile::tempdir()?;
        let config = research_example((variant == "tavily").then(|| tavily.base_url()).as_deref())?;
        let launch = Launch::new(["up"])
            .config(config)
            .data_dir(data.path())
            .env("SEARXNG_URL", searxng.base_url())
            .env("RESEARCH_URL", page.clone())
            .env("TAVILY_API_KEY", TAVILY_KEY);
        let server = start("antler", launch)?;
        let output = tokio::process::Command::new(antler_integration_tests::binary("antler")?)
            .args(["run", "Research the harbour reopening and write a cited report", "--model", "researcher"])
            .args(["--expect", REPORT, "--addr", &server.url(), "--color", "never"])
            .output()
            .await?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let shown = format!("{variant}: {:?}\n{stdout}\n{}\n{}", output.status, String::from_utf8_lossy(&output.stderr), server.stderr());
        ensure!(output.status.success(), "{shown}");
        ensure!(
            stdout.contains("delivery receipt: satisfied") && stdout.lines().any(|l| l.trim_end().ends_with("end: SUCCESS")),
            "{shown}"
        );
        for tool in ["tool web_search(", "tool web_fetch(", "tool write_file(", "tool present_files("] {
            ensure!(stdout.contains(tool), "{tool:?} missing\n{shown}");
        }
        println!("{variant}:\n{stdout}");
        let written = reports(data.path())?;
        ensure!(written.len() == 1, "{variant}: {written:?}");
        let report = std::fs::read_to_string(&written[0])?;
        ensure!(report.contains(&format!("1. {page}")), "the report cites the fetched page: {report}");
    }
    ensure!(
        searxng.requests().len() == 1 && tavily.requests().len() == 1 && pages.requests().len() == 2,
        "one search per run, one fetch each"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetched_pdf_comes_back_as_its_text_and_a_fetched_image_goes_to_view_image() -> Result<()> {
    use antler_agent::lead::tools::web_fetch::save_path;
    use antler_integration_tests::web_double::{PNG, simple_pdf};
    let pages = PageServer::start(vec![
        (
            "/paper.pdf",
            Answer::bytes(200, "application/pdf", simple_pdf(&["Tidal energy in small harbours", "Turbines produced 4.2 MWh a day."])),
        ),
        ("/fox.png", Answer::bytes(200, "image/png", PNG.to_vec())),
    ])
    .await?;
    let (pdf, png) = (pages.url("/paper.pdf"), pages.url("/fox.png"));
    let saved_png = save_path(&png, "image/png");
    let models = format!(
        r#"models:
  models:
    - name: reader
      provider: replay
      supports_vision: true
      replay:
        turns:
          - tool_calls:
              - {{id: f1, name: web_fetch, arguments: {{url: "{pdf}"}}}}
              - {{id: f2, name: web_fetch, arguments: {{url: "{png}"}}}}
          - tool_calls:
              - {{id: v1, name: view_image, arguments: {{image_path: "{saved_png}"}}}}
          - text: done
"#
    );
    let searxng = SearchDouble::start(Api::Searxng, "", Vec::new()).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let block = web_block(&format!("{{provider: searxng, base_url: \"{}\"}}", searxng.base_url()));
    let server = start("antler", Launch::new(["up"]).config(agent_config(&db, &models, &block)))?;
    let (mut runs, _) = clients(&server).await?;
    let run = run_to_end(&mut runs, prompt_request("", "Read the paper and look at the fox"), T).await?;
    let events = run_events(&mut runs, ALICE, &run.run_id).await?;
    ensure!(run.status() == RunStatus::Success, "{:?}\n{:#?}\n{}", run.error, tool_finished(&events), server.stderr());

    let paper = tool_result(&events, "f1");
    ensure!(paper.starts_with(&format!("Source: {pdf}\n(a PDF of ")), "{paper}");
    ensure!(paper.contains("/mnt/user-data/workspace/web/") && paper.contains("-paper.pdf"), "{paper}");
    ensure!(
        paper.contains("Tidal energy in small harbours") && paper.contains("Turbines produced 4.2 MWh a day."),
        "the PDF's text: {paper}"
    );

    let fox = tool_result(&events, "f2");
    ensure!(fox.contains(&format!("to {saved_png}")) && fox.contains("view_image"), "{fox}");
    let viewed = tool_finished(&events).into_iter().find(|f| f.name == "view_image").map(|f| (f.is_error, f.result_summary));
    ensure!(matches!(&viewed, Some((false, text)) if text.contains("Successfully read image")), "{viewed:?}");
    Ok(())
}
