//! The Antler sandbox service: per-thread workspaces, file tools and isolated command execution.
//!
//! [`SERVICE`] plugs it into a server binary (`antler-sandbox`, or `antler up` with every other service).
//! Where things are:
//!
//! * `paths.rs` (what a client may name) and `resolve.rs` (opening it beneath its root with
//!   `openat2(RESOLVE_BENEATH)`) are the path policy; `workspace.rs` is the on-disk layout;
//! * `registry.rs` holds live sandboxes (LRU, lifecycle, running commands), `locks.rs` the per-file locks;
//! * `files/` has one module per file tool; `exec/` runs commands; `providers/` builds their processes
//!   (`local.rs`, `bwrap.rs`); `seccomp/` is the system-call filter of bwrap sandboxes (`policy.rs`
//!   lists what it refuses and why); `confine.rs` runs one host program under bwrap with one writable
//!   directory (the runs service's external ACP agents);
//! * `service.rs` is the domain entry point, `api.rs` the thin gRPC layer, `error.rs` the status mapping.

pub mod api;
pub mod config;
pub mod confine;
pub mod convert;
pub mod error;
pub mod exec;
pub mod fence;
pub mod files;
pub mod ids;
pub mod locks;
pub mod mask;
pub mod metrics_catalog;
pub mod paths;
pub mod providers;
pub mod registry;
pub mod resolve;
pub mod seccomp;
pub mod service;
pub mod skills;
pub mod workspace;

use std::sync::Arc;

use antler_kit::ServiceSet;
use antler_kit::cli::{BoxError, RegisterFuture, Registration, ServiceContext};
use antler_proto::sandbox::{sandbox_service_server, skill_service_server};

/// How `antler-sandbox` and `antler up` mount this service.
pub const SERVICE: Registration =
    Registration { name: "sandbox", validate: config::validate, register, metrics: &[metrics_catalog::CATALOGUE] };

fn register<'a>(set: &'a mut ServiceSet, ctx: &'a ServiceContext) -> RegisterFuture<'a> {
    Box::pin(async move {
        let config = ctx.config.clone();
        let shutdown = ctx.shutdown.clone();
        // Provider selection runs a probe process and creates directories: keep it off the async threads.
        let sandboxes = tokio::task::spawn_blocking(move || build(&config, shutdown)).await.map_err(|e| e.to_string())??;
        sandboxes.spawn_background(ctx.shutdown.clone());
        set.describe(antler_proto::FILE_DESCRIPTOR_SET);
        sandboxes.skills().set_moderator(skills::moderation::Moderator {
            config: sandboxes.config().skills.moderation.clone(),
            clients: ctx.clients.clone(),
        });
        let skills = skills::api::SkillApi::new(sandboxes.skills().clone(), sandboxes.config());
        antler_kit::add_service!(set, sandbox_service_server::SandboxServiceServer::new(api::SandboxApi::new(sandboxes)));
        antler_kit::add_service!(set, skill_service_server::SkillServiceServer::new(skills));
        Ok(())
    })
}

/// Builds the service from configuration: picks the provider (logging which and why) and creates the data
/// directory layout. Blocking (it may run the bwrap probe). The caller starts the idle reaper with
/// [`service::Sandboxes::spawn_background`].
pub fn build(config: &antler_kit::Config, shutdown: tokio_util::sync::CancellationToken) -> Result<Arc<service::Sandboxes>, BoxError> {
    let sandbox_config = config::load(config)?;
    // Compiled once here, before anything runs under bwrap; a filter that cannot be built stops the
    // start (the error names sandbox.seccomp) rather than leaving commands unfiltered.
    let bwrap_possible = sandbox_config.provider != config::ProviderChoice::Local
        || sandbox_config.uploads.convert.isolation == config::ConvertIsolation::Bwrap;
    let seccomp = if bwrap_possible { seccomp::Filter::for_mode(sandbox_config.seccomp)? } else { None };
    let selection = providers::select(&sandbox_config, &config.server.data_dir, seccomp.clone())
        .map_err(|e| format!("cannot prepare the sandbox directories under {}: {e}", config.server.data_dir.display()))?;
    let provider = selection.provider.kind().label();
    match &selection.unusable {
        Some(why) => {
            tracing::error!(provider = "bwrap", reason = %why, "the configured sandbox provider cannot run here: AcquireSandbox will fail")
        }
        None if selection.fell_back => tracing::warn!(
            provider,
            exec_enabled = selection.provider.exec_refusal().is_none(),
            reason = %selection.reason,
            "sandbox provider selected (fallback)"
        ),
        None => tracing::info!(
            provider,
            exec_enabled = selection.provider.exec_refusal().is_none(),
            network = selection.provider.network_enabled(),
            reason = %selection.reason,
            "sandbox provider selected"
        ),
    }
    // Which provider runs commands, where a scrape (or a test) can see it: a fallback to `local` is
    // not only a log line.
    let fallback = if selection.unusable.is_some() {
        "unusable"
    } else if selection.fell_back {
        "true"
    } else {
        "false"
    };
    metrics::gauge!("antler_sandbox_provider", "provider" => provider, "fallback" => fallback).set(1.0);
    let bwrap_commands = selection.provider.kind() == providers::ProviderKind::Bwrap && selection.unusable.is_none();
    let converter = start_converter(&sandbox_config, bwrap_commands, seccomp.clone());
    log_seccomp(&sandbox_config, seccomp.as_ref(), bwrap_commands, converter.mode() == "bwrap");
    Ok(Arc::new(service::Sandboxes::new(sandbox_config, selection, shutdown).with_converter(converter)))
}

/// Says at start-up whether the bwrap sandboxes (commands, the document converter) run under the
/// seccomp filter: a log line and the gauge `antler_sandbox_seccomp{mode}` (`strict` only when commands
/// run under bwrap with the filter).
fn log_seccomp(config: &config::SandboxConfig, filter: Option<&seccomp::Filter>, bwrap_commands: bool, bwrap_converter: bool) {
    match filter {
        Some(filter) if bwrap_commands || bwrap_converter => tracing::info!(
            seccomp = "strict",
            commands_filtered = bwrap_commands,
            converter_filtered = bwrap_converter,
            arch = filter.arch(),
            refused_calls = filter.refused_calls(),
            instructions = filter.instructions(),
            "bwrap sandboxes run under the seccomp filter (sandbox.seccomp: strict)"
        ),
        None if bwrap_commands || bwrap_converter => {
            tracing::warn!(seccomp = "off", "bwrap sandboxes run without a seccomp filter (sandbox.seccomp: off)")
        }
        _ => tracing::info!(
            seccomp = config.seccomp.label(),
            "no seccomp filter in use: nothing runs under bwrap (sandbox.seccomp applies to bwrap sandboxes only)"
        ),
    }
    let mode = if filter.is_some() && bwrap_commands { "strict" } else { "off" };
    metrics::gauge!("antler_sandbox_seccomp", "mode" => mode).set(1.0);
}

/// Starts document conversion (probing the converter, so a broken setup shows at start-up) and logs how
/// it runs. Blocking; needs a Tokio runtime (the probe runs the converter).
fn start_converter(config: &config::SandboxConfig, bwrap_commands: bool, seccomp: Option<seccomp::Filter>) -> convert::launch::Converter {
    let convert = &config.uploads.convert;
    if !config.uploads.auto_convert_documents {
        tracing::info!("document conversion is off (sandbox.uploads.auto_convert_documents: false)");
        return convert::launch::Converter::disabled(
            convert,
            "document conversion is switched off (sandbox.uploads.auto_convert_documents: false)",
        );
    }
    let (converter, reason) = convert::launch::Converter::start(convert, &config.bwrap, bwrap_commands, seccomp);
    match converter.unusable() {
        Some(_) => tracing::error!(reason = %reason, "document conversion cannot run here: uploads are stored without Markdown"),
        None if converter.mode() == "process" && bwrap_commands => {
            tracing::warn!(isolation = converter.mode(), reason = %reason, "document conversion ready (fallback)")
        }
        None => tracing::info!(isolation = converter.mode(), reason = %reason, "document conversion ready"),
    }
    converter
}
