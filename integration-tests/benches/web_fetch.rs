//! What `web_fetch` costs on a 1 MiB HTML page from loopback, against curl fetching the same page in
//! the same run.
//!
//! Three kinds of process, as in the other benches the measured side is not the driver:
//! * the **fetcher** (this bench re-executed with `WEB_FETCH_BENCH_ROLE=fetcher`): the lead agent's
//!   `web_fetch` tool, built from a `runs.lead.web.fetch` block exactly as the runs process builds it
//!   (direct fetcher, SSRF checks, loopback allowlisted), on a two-worker tokio runtime. It reads a URL
//!   per line on stdin, fetches and converts it, and answers one line. Its CPU per call is what a runs
//!   process spends on one `web_fetch` of the page (connection, HTTP, SSRF checks, HTML to Markdown).
//! * **curl** (`curl -s -o /dev/null`), one process per call: the baseline, fetching only.
//! * the **driver** (this process): serves the pages on its own runtime (threads `page-server`, whose
//!   CPU is counted apart), sends the URLs, times each call from the line sent to the line read.
//!
//! Pages: `landmark` — 1 MiB with the article in `<main>` (the fast path: one parse, no scoring) and
//! scripts, styles, menus and a footer around it, like a news or documentation page; `readability` —
//! the same content without landmarks, so Readability's scoring finds the article. Both are also
//! converted in this process alone (no network) to give the conversion's own CPU per MB; the goal is
//! at most 20 ms per MB.
//!
//! Run: `cargo bench -p antler-integration-tests --bench web_fetch`. Environment: `BENCH_CALLS` (per
//! path and page, default 200), `BENCH_CONVERSIONS` (default 50).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use antler_agent::lead::tools::web::config::FetchConfig;
use antler_agent::lead::tools::web::convert::html_to_markdown;
use antler_agent::lead::tools::web_fetch::Fetched;
use antler_integration_tests::percentile::percentile;
use antler_integration_tests::web_double::{Answer, PageServer};

const PAGE_BYTES: usize = 1 << 20;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Fields of `/proc/<pid>/stat` after the command name, as text (`fields[0]` is the state; some
/// fields, such as tpgid, can be -1).
fn stat_fields(pid: &str) -> Vec<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default().split_whitespace().map(str::to_owned).collect()
}

/// The sum of `/proc/<pid>/stat` fields `indices` (10 ms ticks) as a duration.
fn ticks(pid: &str, indices: [usize; 2]) -> Duration {
    let fields = stat_fields(pid);
    Duration::from_millis(indices.iter().filter_map(|&i| fields.get(i).and_then(|v| v.parse::<u64>().ok())).sum::<u64>() * 10)
}

/// User + system CPU of process `pid` (utime, stime).
fn cpu_of(pid: &str) -> Duration {
    ticks(pid, [11, 12])
}

/// CPU of this process's reaped children (curl): cutime + cstime.
fn children_cpu() -> Duration {
    ticks("self", [13, 14])
}

/// CPU of this process's threads named `prefix…`.
fn threads_cpu(prefix: &str) -> Duration {
    let mut ticks = 0u64;
    for task in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let Some((head, rest)) = stat.rsplit_once(')') else { continue };
        if !head.split_once('(').is_some_and(|(_, name)| name.starts_with(prefix)) {
            continue;
        }
        let fields: Vec<&str> = rest.split_whitespace().collect();
        ticks += [11, 12].iter().filter_map(|&i| fields.get(i).and_then(|v| v.parse::<u64>().ok())).sum::<u64>();
    }
    Duration::from_millis(ticks * 10)
}

/// This thread's CPU, in nanoseconds (schedstat: finer than the 10 ms ticks of stat).
fn thread_cpu() -> Duration {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    Duration::from_nanos(text.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0))
}

/// A 1 MiB page: ~15% scripts and styles, menus and a footer, the rest an article of headed sections
/// with paragraphs, links, lists and a table now and then.
fn page(landmarks: bool) -> String {
    let (open, close) =
        if landmarks { ("<main><article>", "</article></main>") } else { ("<div class=\"content\"><div class=\"body\">", "</div></div>") };
    let mut html = String::with_capacity(PAGE_BYTES + 4096);
    html.push_str("<!doctype html><html lang=en><head><meta charset=utf-8><title>Harbour services after the storm</title>");
    html.push_str("<style>");
    while html.len() < PAGE_BYTES / 20 {
        html.push_str(
            ".nav-item{display:inline-block;padding:4px 8px;margin:0 2px;color:#333}.card{border:1px solid #ddd;border-radius:4px}\n",
        );
    }
    html.push_str("</style><script>");
    while html.len() < PAGE_BYTES * 3 / 20 {
        html.push_str("window.dataLayer=window.dataLayer||[];function gtag(){dataLayer.push(arguments)}gtag('js',new Date());gtag('config','G-XXXX');\n");
    }
    html.push_str("</script></head><body><header><nav><ul>");
    for i in 0..400 {
        html.push_str(&format!("<li class=\"nav-item\"><a href=\"/section/{i}\">Section {i}</a></li>"));
    }
    html.push_str("</ul></nav></header>");
    html.push_str(open);
    html.push_str("<h1>Harbour services after the storm</h1>");
    let mut section = 0;
    while html.len() < PAGE_BYTES - 2048 {
        html.push_str(&format!("<h2>Part {section}: the port reopens</h2>"));
        for p in 0..4 {
            html.push_str(&format!(
                "<p>Paragraph {p} of part {section}: the harbour master said on <b>Monday</b> that ferries would run every hour, \
                 weather permitting, and that the <a href=\"/reports/{section}-{p}\">damage report</a> would follow, with \
                 figures on the <em>breakwater</em>, the pontoons and the fuel berth.</p>"
            ));
        }
        html.push_str("<ul><li>Departures from 06:00</li><li>Last crossing 22:00</li><li>Freight by appointment</li></ul>");
        if section % 10 == 0 {
            html.push_str("<table><tr><th>Route</th><th>Frequency</th></tr><tr><td>North</td><td>Hourly</td></tr><tr><td>South</td><td>Two-hourly</td></tr></table>");
        }
        section += 1;
    }
    html.push_str(close);
    html.push_str("<footer><p>Copyright, privacy, cookie settings.</p></footer></body></html>");
    html
}

fn fetcher_config() -> FetchConfig {
    FetchConfig {
        ports: Vec::new(),
        allow_cidrs: vec!["127.0.0.1/32".to_owned()],
        max_bytes: 4 * PAGE_BYTES as u64,
        cut_chars: 1_000_000,
        timeout_ms: 30_000,
        ..FetchConfig::default()
    }
}

/// The fetcher process: URLs in on stdin, `ok <chars>` or `err <message>` out.
fn fetcher() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let tool = antler_agent::lead::tools::web::web_fetch(&fetcher_config(), &|_| None)?;
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let url = line?;
        let answer = match runtime.block_on(tool.fetch(&url)) {
            Ok(Fetched::Text(text)) => format!("ok {}", text.chars().count()),
            Ok(Fetched::File { media_type, .. }) => format!("err a file of {media_type}"),
            Err(error) => format!("err {}", error.replace('\n', " ")),
        };
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}

struct Phase {
    p50: Duration,
    p99: Duration,
    cpu_per_call: Duration,
    server_cpu_per_call: Duration,
}

fn main() -> anyhow::Result<()> {
    if std::env::var("WEB_FETCH_BENCH_ROLE").as_deref() == Ok("fetcher") {
        return fetcher();
    }
    let calls = env_usize("BENCH_CALLS", 200);
    let conversions = env_usize("BENCH_CONVERSIONS", 50);
    let pages = [("landmark", page(true)), ("readability", page(false))];

    let server_runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name("page-server").enable_all().build()?;
    let server = server_runtime.block_on(PageServer::start(
        pages
            .iter()
            .map(|(name, html)| {
                (
                    if *name == "landmark" { "/landmark.html" } else { "/readability.html" },
                    Answer::bytes(200, "text/html; charset=utf-8", html.clone()),
                )
            })
            .collect(),
    ))?;

    let mut child = Command::new(std::env::current_exe()?)
        .env("WEB_FETCH_BENCH_ROLE", "fetcher")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let pid = child.id().to_string();
    let mut to_fetcher = child.stdin.take().ok_or_else(|| anyhow::anyhow!("no stdin"))?;
    let mut from_fetcher = BufReader::new(child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?);

    println!("web_fetch of a {} KiB HTML page from loopback vs curl, {calls} calls each, one at a time\n", PAGE_BYTES / 1024);
    println!("{:<12} {:<10} {:>9} {:>9} {:>14} {:>16}", "page", "path", "p50 ms", "p99 ms", "CPU/call ms", "server CPU/call");
    for (name, html) in &pages {
        let url = server.url(&format!("/{name}.html"));
        let mut line = String::new();
        let mut fetch_once = |line: &mut String| -> anyhow::Result<()> {
            writeln!(to_fetcher, "{url}")?;
            to_fetcher.flush()?;
            line.clear();
            from_fetcher.read_line(line)?;
            anyhow::ensure!(line.starts_with("ok "), "web_fetch failed: {line}");
            Ok(())
        };
        for _ in 0..5 {
            fetch_once(&mut line)?;
        }
        let chars: usize = line.trim().strip_prefix("ok ").and_then(|n| n.parse().ok()).unwrap_or(0);
        let (cpu0, server0) = (cpu_of(&pid), threads_cpu("page-server"));
        let mut samples = Vec::with_capacity(calls);
        for _ in 0..calls {
            let started = Instant::now();
            fetch_once(&mut line)?;
            samples.push(started.elapsed());
        }
        samples.sort();
        let fetch = Phase {
            p50: percentile(&samples, 0.5).unwrap_or_default(),
            p99: percentile(&samples, 0.99).unwrap_or_default(),
            cpu_per_call: (cpu_of(&pid) - cpu0) / calls as u32,
            server_cpu_per_call: (threads_cpu("page-server") - server0) / calls as u32,
        };

        let curl = |url: &str| -> anyhow::Result<()> {
            let status = Command::new("curl").args(["-s", "-o", "/dev/null", "--fail", url]).status()?;
            anyhow::ensure!(status.success(), "curl failed: {status}");
            Ok(())
        };
        for _ in 0..5 {
            curl(&url)?;
        }
        let (cpu0, server0) = (children_cpu(), threads_cpu("page-server"));
        let mut samples = Vec::with_capacity(calls);
        for _ in 0..calls {
            let started = Instant::now();
            curl(&url)?;
            samples.push(started.elapsed());
        }
        samples.sort();
        let baseline = Phase {
            p50: percentile(&samples, 0.5).unwrap_or_default(),
            p99: percentile(&samples, 0.99).unwrap_or_default(),
            cpu_per_call: (children_cpu() - cpu0) / calls as u32,
            server_cpu_per_call: (threads_cpu("page-server") - server0) / calls as u32,
        };
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        for (path, phase) in [("web_fetch", &fetch), ("curl", &baseline)] {
            println!(
                "{name:<12} {path:<10} {:>9.2} {:>9.2} {:>14.2} {:>16.2}",
                ms(phase.p50),
                ms(phase.p99),
                ms(phase.cpu_per_call),
                ms(phase.server_cpu_per_call)
            );
        }
        println!(
            "{name:<12} {:<10} {:>8.1}x {:>8.1}x {:>13.1}x   ({} characters of Markdown)",
            "ratio",
            ms(fetch.p50) / ms(baseline.p50),
            ms(fetch.p99) / ms(baseline.p99),
            ms(fetch.cpu_per_call) / ms(baseline.cpu_per_call).max(0.01),
            chars
        );

        // The conversion alone, in this thread, with the page already in memory.
        let base = reqwest::Url::parse(&url)?;
        let started = thread_cpu();
        for _ in 0..conversions {
            std::hint::black_box(html_to_markdown(html, &base));
        }
        let per_mb = (thread_cpu() - started).as_secs_f64() * 1e3 / conversions as f64 / (html.len() as f64 / (1 << 20) as f64);
        let method = html_to_markdown(html, &base).method;
        println!("{name:<12} conversion alone ({method:?}): {per_mb:.1} ms CPU per MB (goal ≤ 20)\n");
    }
    drop(to_fetcher);
    let _ = child.wait();
    println!(
        "CPU/call: web_fetch = the fetcher process (a runs process's share of one call); curl = the curl process. \
         server CPU/call = the page server's threads in the driver."
    );
    Ok(())
}
