//! `antler events <run> [--follow] [--after N]`: RunService.ListRunEvents (what is stored) or, with
//! --follow, RunService.JoinRun (stored, then live, until the run ends).

use antler_proto::runs::run_service_client::RunServiceClient;
use antler_proto::runs::{GetRunRequest, JoinRunRequest, ListRunEventsRequest, RunEvent, RunStatus};
use tokio_stream::StreamExt;

use super::{Conn, print_json};
use crate::client::Failure;
use crate::client::Printer;

/// Print a run's events.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Run id.
    run_id: String,
    /// The run's thread (optional; NOT_FOUND if the run is not in it).
    #[arg(long, default_value = "")]
    thread: String,
    /// Only events with seq greater than N (resume after the last one you saw).
    #[arg(long, value_name = "N", default_value_t = 0)]
    after: u64,
    /// Keep streaming live events until the run ends; the exit code then tells how it ended
    /// (0 SUCCESS, 10 ERROR, 11 INTERRUPTED, 12 TIMEOUT).
    #[arg(long, short)]
    follow: bool,
    #[command(flatten)]
    conn: Conn,
}

/// Runs `antler events …`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let conn = args.conn;
    let mut client = RunServiceClient::new(conn.channel().await?);
    let mut printer = Printer::new(crate::output::Style::stdout(conn.color));
    let mut show = |event: RunEvent| -> anyhow::Result<()> {
        if conn.json {
            return print_json(&event, "antler.runs.v1.RunEvent");
        }
        if let Some(kind) = event.kind {
            printer.print(event.seq, kind)?;
        }
        Ok(())
    };
    if args.follow {
        let (thread, run_id) = (args.thread, args.run_id);
        let request = JoinRunRequest { thread_id: thread.clone(), run_id: run_id.clone(), after_seq: args.after, ..Default::default() };
        let mut stream = client.join_run(conn.request(request)?).await?.into_inner();
        let mut end = None;
        while let Some(item) = stream.next().await {
            let Some(event) = item?.event else { continue };
            if let Some(antler_proto::runs::run_event::Kind::End(e)) = &event.kind {
                end = Some(e.status());
            }
            show(event)?;
        }
        // A run that had ended before --after reached its end event: its outcome is on the run itself.
        let status = match end {
            Some(status) => status,
            None => {
                let request = GetRunRequest { thread_id: thread, run_id };
                client.get_run(conn.request(request)?).await?.into_inner().run.map(|r| r.status()).unwrap_or_default()
            }
        };
        if status != RunStatus::Success {
            return Err(Failure::RunEnded(status).into());
        }
        return Ok(());
    }
    let mut token = String::new();
    loop {
        let request = ListRunEventsRequest {
            thread_id: args.thread.clone(),
            run_id: args.run_id.clone(),
            after_seq: args.after,
            page: Some(antler_proto::common::PageRequest { page_size: 0, page_token: token }),
            ..Default::default()
        };
        let reply = client.list_run_events(conn.request(request)?).await?.into_inner();
        for event in reply.events {
            show(event)?;
        }
        token = reply.page.map(|p| p.next_page_token).unwrap_or_default();
        if token.is_empty() {
            return Ok(());
        }
    }
}
