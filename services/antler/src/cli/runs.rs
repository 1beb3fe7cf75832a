//! `antler runs list|show|cancel`: RunService.ListRuns / GetRun / CancelRun.

use antler_proto::runs::run_service_client::RunServiceClient;
use antler_proto::runs::{CancelAction, CancelRunRequest, GetRunRequest, ListRunsRequest, Run, RunStatus};
use clap::{Subcommand, ValueEnum};

use super::{Conn, Page, print_json, short, time};
use crate::output::Style;

/// Inspect and cancel runs.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    conn: Conn,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List your runs (or one thread's), newest first.
    List {
        /// Only runs of this thread.
        #[arg(long, default_value = "")]
        thread: String,
        /// Only runs in this status (repeatable).
        #[arg(long = "status")]
        statuses: Vec<Status>,
        #[command(flatten)]
        page: Page,
    },
    /// Show one run: status, stop reason, error, usage and delivery receipt.
    Show {
        /// Run id.
        run_id: String,
        /// The run's thread (optional; NOT_FOUND if the run is not in it).
        #[arg(long, default_value = "")]
        thread: String,
    },
    /// Cancel a PENDING or RUNNING run; it ends INTERRUPTED. Safe to repeat.
    Cancel {
        /// Run id.
        run_id: String,
        /// The run's thread (optional).
        #[arg(long, default_value = "")]
        thread: String,
        /// Also discard the run's checkpoints (the thread reverts to its state before the run).
        #[arg(long)]
        rollback: bool,
        /// Wait until the run is terminal before returning.
        #[arg(long)]
        wait: bool,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Status {
    Pending,
    Running,
    Finalizing,
    Success,
    Error,
    Interrupted,
    Timeout,
}

impl Status {
    fn proto(self) -> RunStatus {
        match self {
            Status::Pending => RunStatus::Pending,
            Status::Running => RunStatus::Running,
            Status::Finalizing => RunStatus::Finalizing,
            Status::Success => RunStatus::Success,
            Status::Error => RunStatus::Error,
            Status::Interrupted => RunStatus::Interrupted,
            Status::Timeout => RunStatus::Timeout,
        }
    }
}

/// Runs `antler runs …`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let conn = args.conn;
    let mut client = RunServiceClient::new(conn.channel().await?);
    let style = Style::stdout(conn.color);
    match args.command {
        Command::List { thread, statuses, page } => {
            let request = ListRunsRequest {
                thread_id: thread,
                statuses: statuses.into_iter().map(|s| s.proto() as i32).collect(),
                page: Some(page.request()),
                ..Default::default()
            };
            let reply = client.list_runs(conn.request(request)?).await?.into_inner();
            if conn.json {
                return print_json(&reply, "antler.runs.v1.ListRunsResponse");
            }
            if reply.runs.is_empty() {
                outln!("no runs")?;
            }
            for run in &reply.runs {
                let status = short(run.status().as_str_name(), "RUN_STATUS_");
                let reason = if run.stop_reason.is_empty() { String::new() } else { format!(" ({})", run.stop_reason) };
                outln!(
                    "{}  {}{reason}  thread {}  {}",
                    run.run_id,
                    style.status(&status),
                    run.thread_id,
                    style.dim(&time(run.created_at.as_ref()))
                )?;
            }
            super::next_page(style, reply.page.as_ref())?;
        }
        Command::Show { run_id, thread } => {
            let reply = client.get_run(conn.request(GetRunRequest { thread_id: thread, run_id })?).await?.into_inner();
            if conn.json {
                return print_json(&reply, "antler.runs.v1.GetRunResponse");
            }
            let Some(run) = reply.run else { anyhow::bail!("the server sent no run") };
            print_run(style, &run)?;
        }
        Command::Cancel { run_id, thread, rollback, wait } => {
            let action = if rollback { CancelAction::Rollback } else { CancelAction::Interrupt };
            let request = CancelRunRequest { thread_id: thread, run_id, action: action as i32, wait };
            let reply = client.cancel_run(conn.request(request)?).await?.into_inner();
            if conn.json {
                return print_json(&reply, "antler.runs.v1.CancelRunResponse");
            }
            let action = short(reply.action().as_str_name(), "CANCEL_ACTION_");
            let Some(run) = reply.run else { anyhow::bail!("the server sent no run") };
            let status = short(run.status().as_str_name(), "RUN_STATUS_");
            outln!("cancel ({}) recorded for run {}: now {}", action.to_ascii_lowercase(), run.run_id, style.status(&status))?;
            if !wait && !run.status().is_terminal() {
                outln!(
                    "{}",
                    style.dim("it stops at its next step boundary; follow it with `antler events <run> --follow`, or pass --wait")
                )?;
            }
        }
    }
    Ok(())
}

/// Terminal statuses.
trait Terminal {
    fn is_terminal(&self) -> bool;
}

impl Terminal for RunStatus {
    fn is_terminal(&self) -> bool {
        matches!(self, RunStatus::Success | RunStatus::Error | RunStatus::Interrupted | RunStatus::Timeout)
    }
}

fn print_run(style: Style, run: &Run) -> std::io::Result<()> {
    let status = short(run.status().as_str_name(), "RUN_STATUS_");
    outln!("{}", style.bold(&format!("run {}", run.run_id)))?;
    outln!("  thread:      {}", run.thread_id)?;
    outln!("  status:      {}", style.status(&status))?;
    if !run.stop_reason.is_empty() {
        outln!("  stop reason: {}", run.stop_reason)?;
    }
    if let Some(error) = &run.error {
        outln!("  error:       {}: {}{}", error.code, error.message, if error.retryable { " (retryable)" } else { "" })?;
    }
    outln!("  model:       {}", if run.model_name.is_empty() { "-" } else { &run.model_name })?;
    outln!("  attempt:     {}", run.attempt)?;
    outln!("  created:     {}", time(run.created_at.as_ref()))?;
    outln!("  started:     {}", time(run.started_at.as_ref()))?;
    outln!("  finished:    {}", time(run.finished_at.as_ref()))?;
    outln!("  events:      {} (last seq)", run.last_seq)?;
    if let Some(usage) = &run.usage {
        outln!(
            "  usage:       {} tokens in {} model calls ({} in, {} out)",
            usage.total_tokens,
            usage.llm_calls,
            usage.input_tokens,
            usage.output_tokens
        )?;
    }
    if let Some(delivery) = &run.delivery {
        let verdict =
            if delivery.satisfied { "satisfied".to_owned() } else { format!("NOT satisfied, missing {}", delivery.missing.join(", ")) };
        outln!("  delivery:    {verdict}")?;
        for file in &delivery.produced {
            outln!("               {} ({} bytes)", file.path, file.size)?;
        }
    }
    Ok(())
}
