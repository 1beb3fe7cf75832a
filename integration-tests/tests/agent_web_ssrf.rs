//! The SSRF corpus: every URL a web_fetch must not reach — loopback, private, link-local (cloud
//! metadata), CGNAT and unspecified addresses in every spelling, IPv6 forms that embed them, names
//! that resolve to them, redirects from an allowed host to them, other schemes, other ports — is
//! refused by the rule it breaks, and nothing connects.
//!
//! The fetching runs inside a network namespace that has only loopback (`unshare --net`, re-executing
//! this test), so a broken defence fails here instead of reaching a real private or public address:
//! the namespace has no route anywhere else. The private, link-local and CGNAT addresses of the corpus
//! are added to its loopback device, and one dual-stack listener on one port counts connections to
//! all of them (and to 127.0.0.1 and ::1); it must count none. A mount namespace gives the test its
//! own /etc/hosts, so "a name that resolves to loopback" goes through the system resolver. If the
//! namespaces cannot be made, the test fails; it never skips.

use std::process::Command;
use std::time::Duration;

use antler_agent::lead::tools::web::config::FetchConfig;
use antler_agent::lead::tools::web::web_fetch;
use antler_agent::lead::tools::web_fetch::Fetched;
use antler_integration_tests::web_double::{Answer, ConnectionCounter, PageServer};
use anyhow::{Context, Result, ensure};

const INSIDE: &str = "ANTLER_SSRF_INSIDE_NETNS";
const TEST_NAME: &str = "every_ssrf_target_is_refused_by_name_and_nothing_connects";
/// Added to the namespace's loopback device, so the counting listener also answers for them.
const EXTRA_ADDRESSES: [&str; 5] = ["10.0.0.1/32", "172.16.0.1/32", "192.168.0.1/32", "169.254.169.254/32", "100.64.0.1/32"];

#[test]
fn every_ssrf_target_is_refused_by_name_and_nothing_connects() -> Result<()> {
    if std::env::var_os(INSIDE).is_some() {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        return runtime.block_on(corpus());
    }
    let hosts = tempfile::NamedTempFile::new()?;
    std::fs::write(
        hosts.path(),
        "127.0.0.1 localhost\n::1 localhost ip6-localhost\n127.0.0.1 loopback-alias.test\n10.0.0.1 private-alias.test\n\
         169.254.169.254 metadata-alias.test\n",
    )?;
    let mut setup = String::from("set -e\nip link set lo up\n");
    for address in EXTRA_ADDRESSES {
        setup.push_str(&format!("ip addr add {address} dev lo\n"));
    }
    setup.push_str("mount --bind \"$ANTLER_SSRF_HOSTS\" /etc/hosts\nexec \"$ANTLER_SSRF_EXE\" --exact \"$ANTLER_SSRF_TEST\" --nocapture --test-threads=1\n");
    let output = Command::new("unshare")
        .args(["--user", "--map-root-user", "--net", "--mount", "sh", "-c", &setup])
        .env(INSIDE, "1")
        .env("ANTLER_SSRF_HOSTS", hosts.path())
        .env("ANTLER_SSRF_EXE", std::env::current_exe()?)
        .env("ANTLER_SSRF_TEST", TEST_NAME)
        .output()
        .context("running unshare (util-linux) to make a network namespace")?;
    let shown = format!("{}\n{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    ensure!(output.status.success(), "the corpus failed or the namespace could not be made ({}):\n{shown}", output.status);
    ensure!(shown.contains("corpus refused: "), "the inner test did not run the corpus:\n{shown}");
    println!("{shown}");
    Ok(())
}

fn config(ports: Vec<u16>, allow_cidrs: &[&str]) -> FetchConfig {
    FetchConfig { ports, allow_cidrs: allow_cidrs.iter().map(|c| (*c).to_owned()).collect(), timeout_ms: 1_500, ..FetchConfig::default() }
}

async fn corpus() -> Result<()> {
    // The namespace really is loopback-only: a bug below fails locally, it cannot reach anything.
    // /proc/self/net is this process's namespace (/sys/class/net would be the mounter's).
    let mut devices: Vec<String> = std::fs::read_to_string("/proc/self/net/dev")?
        .lines()
        .skip(2)
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.trim().to_owned()))
        .collect();
    devices.sort();
    ensure!(devices == ["lo"], "not a loopback-only namespace: {devices:?}");

    let counter = ConnectionCounter::start("[::]:0").await.context("a dual-stack listener in the namespace")?;
    let port = counter.addr.port();
    let redirector = PageServer::start_on(
        "127.0.0.2:0",
        vec![
            ("/ok", Answer::bytes(200, "text/plain", "reachable")),
            ("/to-loopback", Answer::redirect(302, &format!("http://127.0.0.1:{port}/"))),
            ("/to-private", Answer::redirect(301, &format!("http://10.0.0.1:{port}/"))),
            ("/to-metadata", Answer::redirect(307, &format!("http://169.254.169.254:{port}/latest/meta-data/"))),
            ("/to-name", Answer::redirect(302, &format!("http://loopback-alias.test:{port}/"))),
            ("/to-ipv6", Answer::redirect(302, &format!("http://[::1]:{port}/"))),
            ("/to-file", Answer::redirect(302, "file:///etc/passwd")),
        ],
    )
    .await?;
    let r = redirector.addr().port();
    // The redirector is the one allowed host; every corpus port is allowed, so the address rules
    // (not the port rule) must stop each target.
    let tool = web_fetch(&config(vec![port, r], &["127.0.0.2/32"]), &|_| None)?;

    let ok = tool.fetch(&format!("http://127.0.0.2:{r}/ok")).await;
    ensure!(matches!(&ok, Ok(Fetched::Text(t)) if t.contains("reachable")), "the allowed host must be reachable: {ok:?}");

    let cases: Vec<(String, &str)> = vec![
        (format!("http://127.0.0.1:{port}/"), "loopback"),
        (format!("http://localhost:{port}/"), "loopback"),
        (format!("http://[::1]:{port}/"), "loopback"),
        (format!("http://10.0.0.1:{port}/"), "private"),
        (format!("http://10.255.255.254:{port}/"), "private"),
        (format!("http://172.16.0.1:{port}/"), "private"),
        (format!("http://192.168.0.1:{port}/"), "private"),
        (format!("http://169.254.169.254:{port}/latest/meta-data/"), "link-local"),
        (format!("http://100.64.0.1:{port}/"), "cgnat"),
        (format!("http://0.0.0.0:{port}/"), "unspecified"),
        (format!("http://2130706433:{port}/"), "loopback"),
        (format!("http://0177.0.0.1:{port}/"), "loopback"),
        (format!("http://0x7f000001:{port}/"), "loopback"),
        (format!("http://0x7f.1:{port}/"), "loopback"),
        (format!("http://017700000001:{port}/"), "loopback"),
        (format!("http://167772161:{port}/"), "private"),
        (format!("http://[::ffff:127.0.0.1]:{port}/"), "loopback"),
        (format!("http://[::ffff:a9fe:a9fe]:{port}/"), "link-local"),
        (format!("http://[::ffff:10.0.0.1]:{port}/"), "private"),
        (format!("http://loopback-alias.test:{port}/"), "loopback"),
        (format!("http://private-alias.test:{port}/"), "private"),
        (format!("http://metadata-alias.test:{port}/"), "link-local"),
        (format!("http://127.0.0.2:{r}/to-loopback"), "loopback"),
        (format!("http://127.0.0.2:{r}/to-private"), "private"),
        (format!("http://127.0.0.2:{r}/to-metadata"), "link-local"),
        (format!("http://127.0.0.2:{r}/to-name"), "loopback"),
        (format!("http://127.0.0.2:{r}/to-ipv6"), "loopback"),
        (format!("http://127.0.0.2:{r}/to-file"), "scheme"),
        ("file:///etc/passwd".to_owned(), "scheme"),
        (format!("gopher://127.0.0.1:{port}/_GET"), "scheme"),
        ("ftp://93.184.215.14/".to_owned(), "scheme"),
        // A public address on a port outside the list: if the port rule failed, the connection
        // would fail locally (no route), never leave.
        ("http://93.184.215.14:22/".to_owned(), "port"),
    ];
    let mut refused = 0;
    for (url, rule) in &cases {
        let result = tool.fetch(url).await;
        let Err(text) = result else { anyhow::bail!("{url} was fetched: {result:?}") };
        ensure!(
            text.starts_with("Error: web_fetch refused ") && text.contains(&format!("(rule `{rule}`)")),
            "{url}: expected rule {rule}, got {text}"
        );
        refused += 1;
    }
    ensure!(counter.connections() == 0, "{} connection(s) reached a refused address", counter.connections());
    let redirects = redirector.requests().iter().filter(|r| r.path().starts_with("/to-")).count();
    ensure!(redirects == 6, "each redirect was fetched once from the allowed host: {redirects}");

    // The counter counts: a fetcher that allowlists loopback does connect (and times out, since the
    // counter never answers).
    let open = web_fetch(&config(Vec::new(), &["127.0.0.1/32"]), &|_| None)?;
    let reached = tokio::time::timeout(Duration::from_secs(10), open.fetch(&format!("http://127.0.0.1:{port}/"))).await?;
    ensure!(reached.is_err() && counter.connections() == 1, "the control fetch did not reach the counter: {reached:?}");
    println!("corpus refused: {refused} URLs, 0 connections to refused addresses");
    Ok(())
}
