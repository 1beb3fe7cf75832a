//! Metrics as an exporter sees them: the documented names, bounded labels (model, caller bucket), and
//! never a run id. A recorder is installed for this test binary only.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use antler_models::telemetry;
use support::*;

type Series = Arc<Mutex<BTreeMap<String, u64>>>;

/// Counts every increment / record per `name{label=value,...}`.
#[derive(Default, Clone)]
struct Recorder {
    series: Series,
}

struct Handle {
    key: String,
    series: Series,
}

impl Handle {
    fn add(&self, n: u64) {
        *self.series.lock().unwrap_or_else(|p| p.into_inner()).entry(self.key.clone()).or_default() += n;
    }
}

impl metrics::CounterFn for Handle {
    fn increment(&self, value: u64) {
        self.add(value);
    }
    fn absolute(&self, value: u64) {
        self.add(value);
    }
}

impl metrics::HistogramFn for Handle {
    fn record(&self, _value: f64) {
        self.add(1);
    }
}

fn render(key: &metrics::Key) -> String {
    let labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl Recorder {
    fn handle(&self, key: &metrics::Key) -> Arc<Handle> {
        Arc::new(Handle { key: render(key), series: self.series.clone() })
    }
}

impl metrics::Recorder for Recorder {
    fn describe_counter(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_gauge(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_histogram(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(self.handle(key))
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Histogram {
        metrics::Histogram::from_arc(self.handle(key))
    }
}

const CONFIG: &str = r#"models:
  retry: {base_delay_ms: 5, cap_delay_ms: 10}
  models:
    - name: flaky
      provider: replay
      max_retries: 1
      fallbacks: [steady]
      replay:
        turns: [{text: never, fail: {status: 503, times: 0}}]
    - name: steady
      provider: replay
      replay:
        turns: [{text: steady answer, usage: {input_tokens: 9, output_tokens: 3}}]
"#;

#[tokio::test]
async fn calls_are_measured_by_model_and_caller_bucket_without_run_ids() -> anyhow::Result<()> {
    let recorder = Recorder::default();
    let series = recorder.series.clone();
    metrics::set_global_recorder(recorder).map_err(|e| anyhow::anyhow!("{e}"))?;

    let service = serve(CONFIG).await?;
    let mut req = request("flaky", "hi");
    req.caller = "subagent:researcher".into();
    req.run_id = "run-secret-7".into();
    let (_, finish) = stream(&service.client, req).await?;
    assert_eq!(finish.info.map(|i| i.model_name), Some("steady".to_owned()));

    let seen = series.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let count = |key: &str| seen.get(key).copied().unwrap_or(0);
    assert_eq!(count(&format!("{}{{model=flaky,reason=unavailable}}", telemetry::RETRIES)), 1, "{seen:#?}");
    assert_eq!(count(&format!("{}{{from=flaky,to=steady}}", telemetry::FALLBACKS)), 1, "{seen:#?}");
    assert_eq!(count(&format!("{}{{model=steady,caller=subagent,outcome=ok}}", telemetry::REQUESTS)), 1, "{seen:#?}");
    assert_eq!(count(&format!("{}{{model=steady,caller=subagent,kind=input}}", telemetry::TOKENS)), 9, "{seen:#?}");
    assert_eq!(count(&format!("{}{{model=steady,caller=subagent,kind=output}}", telemetry::TOKENS)), 3, "{seen:#?}");
    for name in [telemetry::LATENCY, telemetry::TTFT, telemetry::CHUNK_GAP, telemetry::OVERHEAD] {
        assert!(seen.keys().any(|k| k.starts_with(name)), "{name} missing: {seen:#?}");
    }
    assert!(!seen.keys().any(|k| k.contains("run-secret-7") || k.contains("researcher")), "unbounded label: {seen:#?}");
    Ok(())
}
