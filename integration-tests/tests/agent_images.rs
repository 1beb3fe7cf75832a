//! `view_image` through the LLM upstream double: offered only to a model that supports vision; the
//! image reaches the next model call only (as the provider's image content, read from the sandbox by
//! the models service) and is never stored in the thread's state.

use std::time::Duration;

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, LlmDouble, Turn, call};
use antler_integration_tests::runs::*;
use antler_proto::runs::{CreateThreadRequest, GetThreadStateRequest, RunStatus};
use anyhow::{Result, ensure};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);
/// A 1×1 PNG.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 0x0d, 0x49, 0x48, 0x44, 0x52, 0, 0, 0, 1, 0, 0, 0, 1, 8, 6, 0, 0, 0, 0x1f,
    0x15, 0xc4, 0x89, 0, 0, 0, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0xf0, 0x1f, 0, 0x05, 0x00, 0x01, 0xff,
    0x89, 0x99, 0x3d, 0x1d, 0, 0, 0, 0, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];

fn offered(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["function"]["name"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

fn has_image(request: &Value) -> bool {
    request["messages"].to_string().contains("data:image/png;base64,")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewed_image_reaches_the_next_model_call_only() -> Result<()> {
    let double = LlmDouble::start(
        vec![
            Turn::tools("Looking at it.", vec![call("v1", "view_image", json!({"image_path": "/mnt/user-data/uploads/dot.png"}))]),
            Turn::tools("And a missing one.", vec![call("v2", "view_image", json!({"image_path": "/mnt/user-data/uploads/none.png"}))]),
            Turn::text("A single pixel."),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let data = tempfile::tempdir()?;
    let models = format!("{}    supports_vision: true\n", double.models_yaml());
    let up = start_agent_up(&db, &models, "", Some(data.path()))?;
    let (mut runs, mut threads) = clients(&up).await?;
    threads.create_thread(authed(CreateThreadRequest { thread_id: "pics".into(), ..Default::default() }, ALICE)).await?;
    let uploads = data.path().join("sandbox/users/alice/threads/pics/user-data/uploads");
    std::fs::create_dir_all(&uploads)?;
    std::fs::write(uploads.join("dot.png"), PNG)?;

    let run = runs.create_run(authed(prompt_request("pics", "What is in dot.png?"), ALICE)).await?.into_inner().run.unwrap_or_default();
    let run = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
    ensure!(run.status() == RunStatus::Success, "{:?}\n{}", run.error, up.stderr());
    let requests = double.requests();
    ensure!(requests.len() == 3, "{}", requests.len());
    ensure!(offered(&requests[0]).iter().any(|t| t == "view_image"), "a vision model gets view_image");
    ensure!(!has_image(&requests[0]) && has_image(&requests[1]) && !has_image(&requests[2]), "the image goes with the next call only");
    ensure!(requests[2]["messages"].to_string().contains("image not found"), "a missing image is an error result the model reads");

    let state = threads
        .get_thread_state(authed(GetThreadStateRequest { thread_id: "pics".into(), ..Default::default() }, ALICE))
        .await?
        .into_inner();
    let stored = format!("{state:?}");
    ensure!(!stored.contains("base64") && !stored.contains("Here are the images"), "no image in the stored state");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_vision_is_not_offered_view_image() -> Result<()> {
    let double = LlmDouble::start(vec![Turn::text("No eyes here.")], AfterLast::Refuse).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let up = start_agent_up(&db, &double.models_yaml(), "", None)?;
    let (mut runs, _) = clients(&up).await?;
    let run = runs.create_run(authed(prompt_request("", "Look"), ALICE)).await?.into_inner().run.unwrap_or_default();
    let run = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
    ensure!(run.status() == RunStatus::Success, "{:?}", run.error);
    let tools = offered(&double.requests()[0]);
    ensure!(!tools.iter().any(|t| t == "view_image") && tools.iter().any(|t| t == "read_file"), "{tools:?}");
    Ok(())
}
