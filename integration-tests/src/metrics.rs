//! Scraping a process's Prometheus endpoint (`server.metrics`) and reading the text format back.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::Process;

/// `yaml` (an `antler.yaml` with a `server:` section first) with the metrics endpoint on a free
/// loopback port and `buckets` as the histogram buckets.
pub fn with_metrics(yaml: &str, buckets: &str) -> String {
    let metrics = format!("server:\n  metrics:\n    listen: \"127.0.0.1:0\"\n    buckets: {buckets}\n");
    if yaml.starts_with("server:\n") { yaml.replacen("server:\n", &metrics, 1) } else { format!("{metrics}{yaml}") }
}

/// The `/metrics` URL the process printed after its listening line (`  metrics:  http://…/metrics`).
pub fn metrics_url(process: &Process) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    loop {
        for line in process.stdout_lines() {
            if let Some(url) = line.trim().strip_prefix("metrics:") {
                return Ok(url.trim().to_owned());
            }
            seen.push(line);
        }
        if Instant::now() > deadline {
            bail!("the process printed no metrics line; stdout after the listening line: {seen:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One sample line: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// One scrape, parsed.
#[derive(Debug, Clone)]
pub struct Scrape {
    pub text: String,
    pub samples: Vec<Sample>,
}

impl Scrape {
    /// The sum over the samples named `name` whose labels include every pair of `labels` (None when
    /// there is no such sample at all, which a test can tell apart from zero).
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let matching: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
            .map(|s| s.value)
            .collect();
        (!matching.is_empty()).then(|| matching.iter().sum())
    }

    /// [`Scrape::get`], with 0 for a metric never recorded.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or(0.0)
    }

    /// The `# TYPE` the endpoint declared for `name`.
    pub fn kind(&self, name: &str) -> Option<&str> {
        self.text.lines().find_map(|l| l.strip_prefix("# TYPE ")?.strip_prefix(name)?.strip_prefix(' '))
    }

    /// Every label value of every sample.
    pub fn label_values(&self) -> impl Iterator<Item = (&str, &str, &str)> {
        self.samples.iter().flat_map(|s| s.labels.iter().map(move |(k, v)| (s.name.as_str(), k.as_str(), v.as_str())))
    }
}

/// GETs `url` and parses the Prometheus text format.
pub async fn scrape(url: &str) -> Result<Scrape> {
    let response = reqwest::get(url).await.with_context(|| format!("GET {url}"))?;
    let status = response.status();
    let content_type = response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let text = response.text().await?;
    if !status.is_success() || !content_type.starts_with("text/plain") {
        bail!("GET {url}: {status} ({content_type}): {text}");
    }
    let samples = text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')).map(parse_sample).collect::<Result<Vec<_>>>()?;
    Ok(Scrape { text, samples })
}

/// Polls `url` until `done` holds for a scrape (at most `timeout`), and returns that scrape.
pub async fn scrape_until(url: &str, timeout: Duration, done: impl Fn(&Scrape) -> bool) -> Result<Scrape> {
    let deadline = Instant::now() + timeout;
    loop {
        let scrape = scrape(url).await?;
        if done(&scrape) {
            return Ok(scrape);
        }
        if Instant::now() > deadline {
            bail!("the awaited metrics did not appear in {timeout:?}; last scrape:\n{}", scrape.text);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn parse_sample(line: &str) -> Result<Sample> {
    let bad = || anyhow::anyhow!("not a sample line: {line:?}");
    let (head, value) = line.rsplit_once(' ').ok_or_else(bad)?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().map_err(|_| bad())?,
    };
    let (name, labels) = match head.split_once('{') {
        None => (head, BTreeMap::new()),
        Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}').ok_or_else(bad)?).ok_or_else(bad)?),
    };
    Ok(Sample { name: name.to_owned(), labels, value })
}

/// `k="v",k2="v2"` with `\"`, `\\` and `\n` escapes in values.
fn parse_labels(mut text: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    while !text.is_empty() {
        let (key, rest) = text.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(key.trim_start_matches(',').to_owned(), value);
        text = rest[end + 1..].trim_start_matches(',');
    }
    Some(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_lines_parse_with_escapes() -> Result<()> {
        let s = parse_sample(r#"antler_x_bucket{le="+Inf",model="a\"b",to="running"} 3"#)?;
        assert_eq!(s.name, "antler_x_bucket");
        assert_eq!(s.labels.get("model").map(String::as_str), Some("a\"b"));
        assert_eq!(s.labels.get("le").map(String::as_str), Some("+Inf"));
        assert_eq!(s.value, 3.0);
        assert_eq!(parse_sample("antler_live 0.5")?.value, 0.5);
        assert!(parse_sample("garbage").is_err());
        Ok(())
    }
}
