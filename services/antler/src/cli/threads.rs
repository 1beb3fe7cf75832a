//! `antler threads list|show|delete`: ThreadService.ListThreads / GetThread (+ GetThreadState) /
//! DeleteThread.

use antler_proto::runs::thread_service_client::ThreadServiceClient;
use antler_proto::runs::{DeleteThreadRequest, GetThreadRequest, GetThreadStateRequest, ListThreadsRequest, ThreadStatus};
use clap::{Subcommand, ValueEnum};

use super::{Conn, Page, print_json, short, time};
use crate::output::Style;

/// Inspect and delete threads (conversations).
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    conn: Conn,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List your threads, most recently updated first.
    List {
        /// Only threads with this status.
        #[arg(long)]
        status: Option<Status>,
        #[command(flatten)]
        page: Page,
    },
    /// Show one thread: status, title, runs and its state at the head.
    Show {
        /// Thread id.
        thread_id: String,
    },
    /// Delete a thread with its runs, events, checkpoints and files. Irreversible.
    Delete {
        /// Thread id.
        thread_id: String,
        /// Cancel an active run first instead of refusing (FAILED_PRECONDITION).
        #[arg(long)]
        cancel_active_run: bool,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Status {
    Idle,
    Busy,
    Interrupted,
    Error,
}

impl Status {
    fn proto(self) -> ThreadStatus {
        match self {
            Status::Idle => ThreadStatus::Idle,
            Status::Busy => ThreadStatus::Busy,
            Status::Interrupted => ThreadStatus::Interrupted,
            Status::Error => ThreadStatus::Error,
        }
    }
}

/// Runs `antler threads …`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let conn = args.conn;
    let mut client = ThreadServiceClient::new(conn.channel().await?);
    let style = Style::stdout(conn.color);
    match args.command {
        Command::List { status, page } => {
            let request = ListThreadsRequest {
                status: status.map_or(ThreadStatus::Unspecified, Status::proto) as i32,
                page: Some(page.request()),
                ..Default::default()
            };
            let reply = client.list_threads(conn.request(request)?).await?.into_inner();
            if conn.json {
                return print_json(&reply, "antler.runs.v1.ListThreadsResponse");
            }
            if reply.threads.is_empty() {
                outln!("no threads")?;
            }
            for thread in &reply.threads {
                let status = short(thread.status().as_str_name(), "THREAD_STATUS_");
                let title = if thread.title.is_empty() { "(untitled)" } else { &thread.title };
                outln!("{}  {:<11}  {}  {title}", thread.thread_id, style.status(&status), style.dim(&time(thread.updated_at.as_ref())))?;
            }
            super::next_page(style, reply.page.as_ref())?;
        }
        Command::Show { thread_id } => {
            let thread = client.get_thread(conn.request(GetThreadRequest { thread_id: thread_id.clone() })?).await?.into_inner();
            let state =
                client.get_thread_state(conn.request(GetThreadStateRequest { thread_id, ..Default::default() })?).await?.into_inner();
            if conn.json {
                let json = serde_json::json!({
                    "thread": super::to_json(&thread, "antler.runs.v1.GetThreadResponse")?["thread"],
                    "state": super::to_json(&state, "antler.runs.v1.GetThreadStateResponse")?["state"],
                });
                outln!("{json}")?;
                return Ok(());
            }
            let Some(thread) = thread.thread else { anyhow::bail!("the server sent no thread") };
            outln!("{}", style.bold(&format!("thread {}", thread.thread_id)))?;
            outln!("  status:      {}", style.status(&short(thread.status().as_str_name(), "THREAD_STATUS_")))?;
            outln!("  title:       {}", if thread.title.is_empty() { "(untitled)" } else { &thread.title })?;
            outln!("  created:     {}", time(thread.created_at.as_ref()))?;
            outln!("  updated:     {}", time(thread.updated_at.as_ref()))?;
            outln!("  active run:  {}", if thread.active_run_id.is_empty() { "-" } else { &thread.active_run_id })?;
            outln!("  latest run:  {}", if thread.latest_run_id.is_empty() { "-" } else { &thread.latest_run_id })?;
            if let Some(state) = state.state {
                let checkpoint = state.checkpoint.unwrap_or_default();
                outln!("  checkpoint:  {} (step {}, {} messages)", checkpoint.checkpoint_id, checkpoint.step, checkpoint.messages.len())?;
                if let Some(question) = state.pending_clarification {
                    outln!("  waiting for an answer to: {}", question.question)?;
                }
            }
        }
        Command::Delete { thread_id, cancel_active_run } => {
            let reply = client.delete_thread(conn.request(DeleteThreadRequest { thread_id, cancel_active_run })?).await?.into_inner();
            if conn.json {
                return print_json(&reply, "antler.runs.v1.DeleteThreadResponse");
            }
            outln!("deleted thread {} with {} runs", reply.thread_id, reply.deleted_runs)?;
        }
    }
    Ok(())
}
