//! `antler-memory`: serves the memory service alone (for a multi-process or Kubernetes install).

antler_kit::service_main!("antler-memory", "memory service (long-term facts, extraction queue, injection)", antler_memory::SERVICE);
