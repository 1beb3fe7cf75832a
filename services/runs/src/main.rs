//! `antler-runs`: serves the runs service alone (for a multi-process or Kubernetes install).

antler_kit::service_main!(
    "antler-runs",
    "runs service (threads and runs: admission, leases, cancellation, event streams)",
    antler_runs::SERVICE
);
