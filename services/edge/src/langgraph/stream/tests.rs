use std::collections::HashMap;

use antler_proto::common::{ContentPart, Message, Role, TextPart, content_part};
use antler_proto::runs::{
    Checkpoint, ClarificationEvent, EndEvent, Heartbeat, MessageDelta, MessageEvent, Metadata, RunError, RunEvent, RunStatus,
    ToolCallDelta, ValuesEvent, run_event::Kind,
};
use serde_json::{Value, json};

use super::*;

/// Checkpoints from a map, counting reads.
#[derive(Default)]
struct Fake {
    checkpoints: HashMap<String, Checkpoint>,
    reads: std::sync::atomic::AtomicUsize,
}

impl CheckpointSource for Fake {
    async fn checkpoint(&self, checkpoint_id: &str) -> Option<Checkpoint> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.checkpoints.get(checkpoint_id).cloned()
    }
}

fn message(id: &str, role: Role, text: &str) -> Message {
    Message {
        id: id.to_owned(),
        role: role as i32,
        content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: text.to_owned() })) }],
        tool_call_id: if role == Role::Tool { "c1".to_owned() } else { String::new() },
        ..Message::default()
    }
}

fn event(seq: u64, kind: Kind) -> RunEvent {
    RunEvent { run_id: "r".to_owned(), seq, thread_id: "t".to_owned(), kind: Some(kind), ..RunEvent::default() }
}

fn channels(title: &str) -> Option<prost_types::Struct> {
    Some(antler_kit::json::json_text_to_struct(&json!({"title": title, "lead_step": 3}).to_string()))
}

fn values(seq: u64, checkpoint: &str, ids: &[&str], title: &str) -> RunEvent {
    event(
        seq,
        Kind::Values(ValuesEvent {
            values: channels(title),
            message_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
            checkpoint_id: checkpoint.to_owned(),
            step: 1,
        }),
    )
}

fn names(frames: &[Frame]) -> Vec<String> {
    frames
        .iter()
        .map(|f| match f {
            Frame::Event { name, .. } => name.clone(),
            Frame::Heartbeat => ":".to_owned(),
        })
        .collect()
}

fn data(frames: &[Frame], name: &str) -> Vec<Value> {
    frames.iter().filter_map(|f| if let Frame::Event { name: n, data } = f { (n == name).then(|| data.clone()) } else { None }).collect()
}

/// A short run: metadata, the user's message, a streamed answer, its checkpoint, the end.
fn transcript() -> Vec<RunEvent> {
    vec![
        event(1, Kind::Metadata(Metadata { run_id: "r".to_owned(), thread_id: "t".to_owned(), attempt: 1, ..Metadata::default() })),
        event(2, Kind::Message(MessageEvent { message: Some(message("u1", Role::User, "hi")) })),
        event(3, Kind::MessageDelta(MessageDelta { message_id: "a1".to_owned(), text: "Hel".to_owned(), ..MessageDelta::default() })),
        event(4, Kind::MessageDelta(MessageDelta { message_id: "a1".to_owned(), text: "lo".to_owned(), ..MessageDelta::default() })),
        event(5, Kind::Message(MessageEvent { message: Some(message("a1", Role::Assistant, "Hello")) })),
        values(6, "cp1", &["u1", "a1"], "Greeting"),
        event(7, Kind::End(EndEvent { status: RunStatus::Success as i32, ..EndEvent::default() })),
    ]
}

async fn run_all(modes: Vec<StreamMode>, events: &[RunEvent], source: &Fake) -> Vec<Frame> {
    let mut translator = Translator::new(modes, "r", "t", 0);
    let mut out = Vec::new();
    for e in events {
        out.extend(translator.translate(e, source).await);
    }
    out
}

#[tokio::test]
async fn values_mode_sends_the_whole_state_with_messages_and_no_bookkeeping() {
    let frames = run_all(vec![StreamMode::Values], &transcript(), &Fake::default()).await;
    assert_eq!(names(&frames), ["metadata", "values", "end"]);
    let values = &data(&frames, "values")[0];
    assert_eq!(values["title"], "Greeting");
    assert!(values.get("lead_step").is_none(), "{values}");
    let types: Vec<&str> = values["messages"].as_array().map(|m| m.iter().filter_map(|m| m["type"].as_str()).collect()).unwrap_or_default();
    assert_eq!(types, ["human", "ai"]);
    assert_eq!(values["messages"][1]["content"], "Hello");
    assert_eq!(data(&frames, "end"), [Value::Null]);
}

#[tokio::test]
async fn messages_tuple_streams_chunks_then_a_usage_chunk_and_never_the_whole_turn_again() {
    let frames = run_all(vec![StreamMode::MessagesTuple], &transcript(), &Fake::default()).await;
    assert_eq!(names(&frames), ["metadata", "messages", "messages", "messages", "end"]);
    let chunks = data(&frames, "messages");
    let text: String = chunks.iter().filter_map(|c| c[0]["content"].as_str()).collect();
    assert_eq!(text, "Hello", "the chunks concatenate to the turn exactly once");
    assert!(chunks.iter().all(|c| c[0]["type"] == "AIMessageChunk" && c[0]["id"] == "a1"));
    assert_eq!(chunks[0][1]["langgraph_node"], "model");
    assert_eq!(chunks[2][0]["chunk_position"], "last");
}

#[tokio::test]
async fn tool_call_deltas_become_tool_call_chunks_and_tool_results_whole_messages() {
    let events = [
        event(
            1,
            Kind::MessageDelta(MessageDelta {
                message_id: "a1".to_owned(),
                tool_calls: vec![ToolCallDelta {
                    index: 0,
                    id: "c1".to_owned(),
                    name: "bash".to_owned(),
                    arguments: "{\"comm".to_owned(),
                    ..ToolCallDelta::default()
                }],
                ..MessageDelta::default()
            }),
        ),
        event(2, Kind::Message(MessageEvent { message: Some(message("m2", Role::Tool, "file.txt")) })),
    ];
    let frames = run_all(vec![StreamMode::MessagesTuple], &events, &Fake::default()).await;
    let chunks = data(&frames, "messages");
    assert_eq!(
        chunks[0][0]["tool_call_chunks"][0],
        json!({"type": "tool_call_chunk", "index": 0, "id": "c1", "name": "bash", "args": "{\"comm"})
    );
    assert_eq!(chunks[1][0]["type"], "tool");
    assert_eq!(chunks[1][0]["tool_call_id"], "c1");
    assert_eq!(chunks[1][1]["langgraph_node"], "tools");
}

#[tokio::test]
async fn updates_name_the_node_and_carry_only_what_changed() {
    let mut events = transcript();
    events.insert(6, event(7, Kind::Message(MessageEvent { message: Some(message("m3", Role::Tool, "ok")) })));
    events.insert(7, values(8, "cp2", &["u1", "a1", "m3"], "Greeting"));
    let frames = run_all(vec![StreamMode::Updates], &events, &Fake::default()).await;
    let updates = data(&frames, "updates");
    assert_eq!(updates.len(), 2, "{updates:?}");
    assert_eq!(updates[0]["model"]["messages"][0]["id"], "a1", "the user's input is not a node's update");
    assert_eq!(updates[0]["model"]["title"], "Greeting");
    assert_eq!(updates[1]["tools"]["messages"][0]["id"], "m3");
    assert!(updates[1]["tools"].get("title").is_none(), "an unchanged channel is not repeated: {}", updates[1]);
}

#[tokio::test]
async fn a_resumed_connection_reads_missing_messages_from_the_checkpoint() {
    let mut source = Fake::default();
    source.checkpoints.insert(
        "cp1".to_owned(),
        Checkpoint {
            checkpoint_id: "cp1".to_owned(),
            parent_checkpoint_id: "cp0".to_owned(),
            messages: vec![message("u1", Role::User, "hi"), message("a1", Role::Assistant, "Hello")],
            values: channels("Greeting"),
            ..Checkpoint::default()
        },
    );
    source.checkpoints.insert(
        "cp0".to_owned(),
        Checkpoint { checkpoint_id: "cp0".to_owned(), messages: vec![message("u1", Role::User, "hi")], ..Checkpoint::default() },
    );
    // Resumed after seq 5: only the VALUES and END events arrive on this connection.
    let mut translator = Translator::new(vec![StreamMode::Values, StreamMode::Updates], "r", "t", 5);
    let mut frames = Vec::new();
    for e in &transcript()[5..] {
        frames.extend(translator.translate(e, &source).await);
    }
    assert_eq!(names(&frames), ["values", "updates", "end"]);
    assert_eq!(data(&frames, "values")[0]["messages"][1]["content"], "Hello");
    assert_eq!(data(&frames, "updates")[0]["model"]["messages"][0]["id"], "a1");
}

#[tokio::test]
async fn a_failed_run_ends_with_one_error_frame_then_end() {
    let end = event(
        9,
        Kind::End(EndEvent {
            status: RunStatus::Error as i32,
            error: Some(RunError { code: "model_error".to_owned(), message: "upstream 500".to_owned(), ..RunError::default() }),
            ..EndEvent::default()
        }),
    );
    let frames = run_all(vec![StreamMode::Values, StreamMode::Events], &[end], &Fake::default()).await;
    assert_eq!(names(&frames), ["error", "events", "end"]);
    assert_eq!(data(&frames, "error")[0], json!({"error": "model_error", "message": "upstream 500"}));
    assert_eq!(data(&frames, "events")[0]["event"], "on_chain_end");
}

#[tokio::test]
async fn events_mode_speaks_langchain_s_event_names() {
    let frames = run_all(vec![StreamMode::Events], &transcript(), &Fake::default()).await;
    let kinds: Vec<String> = data(&frames, "events").iter().filter_map(|e| e["event"].as_str().map(str::to_owned)).collect();
    assert_eq!(
        kinds,
        ["on_chain_start", "on_chat_model_start", "on_chat_model_stream", "on_chat_model_stream", "on_chat_model_end", "on_chain_end"]
    );
    let stream = &data(&frames, "events")[2];
    assert_eq!(stream["data"]["chunk"]["content"], "Hel");
    assert_eq!(stream["parent_ids"], json!(["r"]));
}

#[tokio::test]
async fn clarifications_are_interrupts_and_heartbeats_comments() {
    let clarification = event(
        3,
        Kind::Clarification(ClarificationEvent {
            interrupt_id: "i1".to_owned(),
            question: "Which colour?".to_owned(),
            ..ClarificationEvent::default()
        }),
    );
    let heartbeat = event(0, Kind::Heartbeat(Heartbeat { last_seq: 3, status: RunStatus::Running as i32 }));
    let frames = run_all(vec![StreamMode::Updates], &[clarification, heartbeat], &Fake::default()).await;
    assert_eq!(data(&frames, "updates")[0]["__interrupt__"][0]["id"], "i1");
    assert_eq!(data(&frames, "updates")[0]["__interrupt__"][0]["value"]["question"], "Which colour?");
    assert_eq!(frames.last(), Some(&Frame::Heartbeat));
    assert_eq!(encode(&Frame::Heartbeat, ""), ": heartbeat\n\n");
}

#[test]
fn frame_ids_resume_between_frames_of_one_event() {
    assert_eq!(frame_ids(7, 1), ["7"]);
    assert_eq!(frame_ids(7, 3), ["6.0", "6.1", "7"]);
    assert_eq!(parse_last_event_id("7"), Ok(Resume { after_seq: 7, skip: 0 }));
    // Got the first two frames of event 7: resume after 6, skipping two of event 7's frames.
    assert_eq!(parse_last_event_id("6.1"), Ok(Resume { after_seq: 6, skip: 2 }));
    assert!(parse_last_event_id("1700000000000-0").is_err(), "LangGraph's own ids are not ours");
    assert!(parse_last_event_id("x.1").is_err());
    // useStream rejoins after a page reload with -1: from the run's first event, as LangGraph does.
    assert_eq!(parse_last_event_id("-1"), Ok(Resume::default()));
    assert_eq!(parse_last_event_id("0"), Ok(Resume::default()));
    assert!(parse_last_event_id("-").is_err() && parse_last_event_id("-1.0").is_err());
}

#[test]
fn the_modes_a_run_may_record_are_the_modes_the_edge_serves() {
    assert_eq!(StreamMode::ALL.map(StreamMode::name), antler_runs::lifecycle::admission::LANGGRAPH_STREAM_MODES);
}

#[test]
fn stream_modes_parse_and_refuse_with_a_reason() {
    assert_eq!(StreamMode::parse("messages-tuple"), Ok(StreamMode::MessagesTuple));
    assert!(StreamMode::parse("messages").is_err_and(|why| why.contains("messages-tuple")));
    assert!(StreamMode::parse("debug").is_err_and(|why| why.contains("not supported")));
    let kinds = kinds_for(&[StreamMode::Values, StreamMode::MessagesTuple]);
    assert_eq!(kinds, [EventKind::Values as i32, EventKind::Message as i32, EventKind::MessageDelta as i32]);
}

#[test]
fn frames_are_one_line_of_data() {
    let frame = Frame::Event { name: "values".to_owned(), data: json!({"text": "a\nb"}) };
    assert_eq!(encode(&frame, "4"), "event: values\ndata: {\"text\":\"a\\nb\"}\nid: 4\n\n");
}

#[tokio::test]
async fn the_run_s_input_is_not_sent_back_as_messages_frames() {
    let seeded = [
        event(1, Kind::Metadata(Metadata { run_id: "r".to_owned(), thread_id: "t".to_owned(), attempt: 1, ..Metadata::default() })),
        event(2, Kind::Message(MessageEvent { message: Some(message("u1", Role::User, "hi")) })),
        event(3, Kind::Message(MessageEvent { message: Some(message("seeded", Role::Assistant, "an earlier answer")) })),
        event(4, Kind::MessageDelta(MessageDelta { message_id: "a1".to_owned(), text: "new".to_owned(), ..MessageDelta::default() })),
        event(5, Kind::Message(MessageEvent { message: Some(message("m2", Role::Tool, "ok")) })),
    ];
    let frames = run_all(vec![StreamMode::MessagesTuple], &seeded, &Fake::default()).await;
    let ids: Vec<Value> = data(&frames, "messages").iter().map(|m| m[0]["id"].clone()).collect();
    assert_eq!(ids, [json!("a1"), json!("m2")], "input echoes are skipped, the agent's own messages are not");
}
