//! `antler-sandbox`: serves the sandbox service alone (for a multi-process or Kubernetes install).

antler_kit::service_main!(
    "antler-sandbox",
    "sandbox service (per-thread workspaces, file tools, isolated command execution)",
    antler_sandbox::SERVICE
);
