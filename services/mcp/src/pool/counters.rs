//! Per-server pool counters: what GetPoolStats returns and what the metrics say (each increment goes to
//! both, so they cannot disagree).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Counters of one server since the process started (kept across config reloads).
#[derive(Debug, Default)]
pub struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub creations: AtomicU64,
    pub creation_failures: AtomicU64,
    pub evictions: AtomicU64,
    pub expirations: AtomicU64,
    pub reinitializations: AtomicU64,
    pub restarts: AtomicU64,
    pub in_flight: AtomicU32,
}

/// Which counter.
#[derive(Debug, Clone, Copy)]
pub enum Event {
    Hit,
    Miss,
    Creation,
    CreationFailure,
    Eviction,
    Expiration,
    Reinitialization,
    Restart,
}

impl Event {
    fn metric(self) -> &'static str {
        match self {
            Event::Hit => "antler_mcp_pool_hits_total",
            Event::Miss => "antler_mcp_pool_misses_total",
            Event::Creation => "antler_mcp_pool_creations_total",
            Event::CreationFailure => "antler_mcp_pool_creation_failures_total",
            Event::Eviction => "antler_mcp_pool_evictions_total",
            Event::Expiration => "antler_mcp_pool_expirations_total",
            Event::Reinitialization => "antler_mcp_session_reinitializations_total",
            Event::Restart => "antler_mcp_server_restarts_total",
        }
    }
}

impl Counters {
    /// Counts `event` for `server` here and in the metrics (label: the configured server name, a bounded set).
    pub fn record(&self, server: &str, event: Event, n: u64) {
        let counter = match event {
            Event::Hit => &self.hits,
            Event::Miss => &self.misses,
            Event::Creation => &self.creations,
            Event::CreationFailure => &self.creation_failures,
            Event::Eviction => &self.evictions,
            Event::Expiration => &self.expirations,
            Event::Reinitialization => &self.reinitializations,
            Event::Restart => &self.restarts,
        };
        counter.fetch_add(n, Ordering::Relaxed);
        metrics::counter!(event.metric(), "server" => server.to_owned()).increment(n);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use super::*;

    type Series = Arc<Mutex<BTreeMap<String, u64>>>;

    struct Handle(String, Series);

    impl metrics::CounterFn for Handle {
        fn increment(&self, value: u64) {
            *self.1.lock().unwrap_or_else(|p| p.into_inner()).entry(self.0.clone()).or_default() += value;
        }
        fn absolute(&self, _: u64) {}
    }

    #[derive(Default)]
    struct Recorder(Series);

    impl metrics::Recorder for Recorder {
        fn describe_counter(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
        fn describe_gauge(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
        fn describe_histogram(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
        fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
            let labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
            metrics::Counter::from_arc(Arc::new(Handle(format!("{}{{{}}}", key.name(), labels.join(",")), self.0.clone())))
        }
        fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
            metrics::Gauge::noop()
        }
        fn register_histogram(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Histogram {
            metrics::Histogram::noop()
        }
    }

    #[test]
    fn each_event_reaches_the_stats_and_the_metric_with_only_the_server_label() {
        let recorder = Recorder::default();
        let counters = Counters::default();
        metrics::with_local_recorder(&recorder, || {
            counters.record("github", Event::Hit, 2);
            counters.record("github", Event::Miss, 1);
            counters.record("github", Event::Reinitialization, 1);
        });
        assert_eq!(Counters::get(&counters.hits), 2);
        assert_eq!(Counters::get(&counters.misses), 1);
        let series = recorder.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert_eq!(series.get("antler_mcp_pool_hits_total{server=github}"), Some(&2));
        assert_eq!(series.get("antler_mcp_pool_misses_total{server=github}"), Some(&1));
        assert_eq!(series.get("antler_mcp_session_reinitializations_total{server=github}"), Some(&1));
    }
}
