//! The native Gemini and Azure OpenAI providers, configured by DeerFlow's config.yaml as it is
//! (`langchain_google_genai:ChatGoogleGenerativeAI`, `langchain_openai:AzureChatOpenAI` in the fixture),
//! in `antler up` against upstream doubles that speak each service's wire format: streamed text and
//! thinking, tool calls and their continuation, usage, finish reasons, and error answers mapped to gRPC
//! codes. A lead-agent run on the Gemini model calls a tool and finishes, the thought signature sent
//! back on the call it came with.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use antler_integration_tests::provider_doubles::{self, Reply, azure, call, gemini};
use antler_integration_tests::runs::user_text;
use antler_integration_tests::{Launch, Process, start};
use antler_proto::common::{ContentPart, Message, Role, TextPart, ToolSpec, content_part};
use antler_proto::models::chat_stream_response::Delta;
use antler_proto::models::model_service_client::ModelServiceClient;
use antler_proto::models::{ChatRequest, ChatStreamFinish, ChatStreamRequest, ChatStreamResponse, FinishReason};
use antler_proto::runs::run_service_client::RunServiceClient;
use antler_proto::runs::{CreateRunRequest, GetRunRequest, RunConfig, RunStatus};
use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;

const GEMINI_KEY: &str = "gemini-key-0123456789";
const AZURE_KEY: &str = "azure-key-0123456789";

/// Models added before the fixture's own: ones the doubles refuse (a wrong key, a deployment the
/// resource does not have).
const EXTRA_MODELS: &str = "models:
  - {name: gemini-badkey, use: 'langchain_google_genai:ChatGoogleGenerativeAI', model: gemini-2.5-flash, gemini_api_key: wrong-key-0123456789, base_url: $GEMINI_DOUBLE_URL, max_retries: 0}
  - {name: azure-badkey, use: 'langchain_openai:AzureChatOpenAI', model: gpt-4o, azure_endpoint: $AZURE_DOUBLE_URL, azure_deployment: chat-prod, openai_api_version: 2024-10-21, api_key: wrong-key-0123456789, max_retries: 0}
  - {name: azure-missing, use: 'langchain_openai:AzureChatOpenAI', model: gpt-4o, azure_endpoint: $AZURE_DOUBLE_URL, azure_deployment: chat-staging, openai_api_version: 2024-10-21, api_key: $AZURE_OPENAI_API_KEY, max_retries: 0}
";

/// `antler up` with the fixture (plus [`EXTRA_MODELS`]) and its models pointed at the doubles.
fn start_up(dir: &Path, gemini_url: &str, azure_url: &str) -> anyhow::Result<Process> {
    let fixture = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/deerflow/config.yaml"))?;
    std::fs::create_dir_all(dir.join("skills/public"))?;
    let mut launch = Launch::new(["up"]).config(fixture.replacen("models:\n", EXTRA_MODELS, 1));
    for key in
        ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "MOONSHOT_API_KEY", "MIMO_API_KEY", "STEPFUN_API_KEY", "MINIMAX_API_KEY", "VLLM_API_KEY"]
    {
        launch = launch.env(key, "unused-key-0123456789");
    }
    launch = launch
        .env("GEMINI_API_KEY", GEMINI_KEY)
        .env("AZURE_OPENAI_API_KEY", AZURE_KEY)
        .env("GEMINI_DOUBLE_URL", gemini_url)
        .env("AZURE_DOUBLE_URL", azure_url)
        .env("OPENAI_DOUBLE_URL", "http://127.0.0.1:9/v1")
        .env("DEERFLOW_SKILLS_PATH", dir.join("skills").display().to_string());
    start("antler", launch)
}

fn text_message(role: Role, text: &str) -> Message {
    Message {
        role: role as i32,
        content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: text.to_owned() })) }],
        ..Message::default()
    }
}

fn request(model: &str, messages: Vec<Message>) -> ChatRequest {
    ChatRequest { model_name: model.to_owned(), messages, ..ChatRequest::default() }
}

/// One ChatStream: the deltas and the finish, or the status it failed with.
async fn stream(
    client: &ModelServiceClient<Channel>,
    request: ChatRequest,
) -> Result<(Vec<ChatStreamResponse>, ChatStreamFinish), tonic::Status> {
    let mut client = client.clone();
    let work = async move {
        let mut stream = client.chat_stream(ChatStreamRequest { request: Some(request) }).await?.into_inner();
        let mut deltas = Vec::new();
        while let Some(item) = stream.message().await? {
            if let Some(Delta::Finish(finish)) = item.delta {
                return Ok((deltas, finish));
            }
            deltas.push(item);
        }
        Err(tonic::Status::internal("the stream ended without a finish"))
    };
    tokio::time::timeout(Duration::from_secs(60), work)
        .await
        .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("ChatStream took 60 s")))
}

fn text_of(deltas: &[ChatStreamResponse]) -> String {
    deltas.iter().filter_map(|d| if let Some(Delta::Text(t)) = &d.delta { Some(t.text.as_str()) } else { None }).collect()
}

fn thinking_of(deltas: &[ChatStreamResponse]) -> String {
    deltas.iter().filter_map(|d| if let Some(Delta::Thinking(t)) = &d.delta { Some(t.text.as_str()) } else { None }).collect()
}

fn tool_spec(name: &str) -> ToolSpec {
    let schema = json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": false});
    let parameters = match schema {
        Value::Object(map) => Some(antler_proto_struct(&map)),
        _ => None,
    };
    ToolSpec { name: name.to_owned(), description: format!("{name} a path"), parameters, ..ToolSpec::default() }
}

fn antler_proto_struct(map: &serde_json::Map<String, Value>) -> prost_types::Struct {
    fn value(v: &Value) -> prost_types::Value {
        use prost_types::value::Kind;
        let kind = match v {
            Value::Null => Kind::NullValue(0),
            Value::Bool(b) => Kind::BoolValue(*b),
            Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
            Value::String(s) => Kind::StringValue(s.clone()),
            Value::Array(items) => Kind::ListValue(prost_types::ListValue { values: items.iter().map(value).collect() }),
            Value::Object(map) => Kind::StructValue(antler_proto_struct(map)),
        };
        prost_types::Value { kind: Some(kind) }
    }
    prost_types::Struct { fields: map.iter().map(|(k, v)| (k.clone(), value(v))).collect() }
}

#[tokio::test]
async fn gemini_streams_thinking_text_tool_calls_and_usage_and_maps_its_errors() -> anyhow::Result<()> {
    let double = gemini::start(
        GEMINI_KEY,
        vec![
            Reply::text("Hello from Gemini.").thinking("The user greets; greet back."),
            Reply::tools("", vec![call("call_g1", "read_file", json!({"path": "/mnt/user-data/a.txt"}))]).signed("c2lnLWdlbS0x"),
            Reply::text("The file says hi."),
            Reply::error(429, "Resource has been exhausted (e.g. check quota)."),
            Reply::error(429, "Resource has been exhausted (e.g. check quota)."),
            Reply::text("I cannot continue with that.").finish("SAFETY"),
            Reply::error(400, "Invalid value at 'contents[0].parts[0]'"),
            Reply::text("a partial answer that breaks off").broken_after(2),
        ],
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let server = start_up(dir.path(), &double.url(), "http://127.0.0.1:9")?;
    let models = ModelServiceClient::new(server.channel().await?);

    // Thinking, then text; usage with thoughts and cached tokens; the model the API reported.
    let mut first = request("gemini-flash", vec![text_message(Role::System, "Be brief."), user_text("Hi!")]);
    first.thinking_enabled = true;
    let (deltas, finish) = stream(&models, first).await?;
    assert_eq!(thinking_of(&deltas), "The user greets; greet back.");
    assert_eq!(text_of(&deltas), "Hello from Gemini.");
    let info = finish.info.unwrap_or_default();
    assert_eq!(info.finish_reason(), FinishReason::Stop);
    assert_eq!(info.upstream_model, "gemini-2.5-flash");
    let usage = info.usage.unwrap_or_default();
    let expected_output = provider_doubles::OUTPUT_TOKENS + provider_doubles::THOUGHT_TOKENS;
    assert_eq!((usage.input_tokens, usage.output_tokens), (provider_doubles::PROMPT_TOKENS, expected_output));
    assert_eq!((usage.cache_read_tokens, usage.reasoning_tokens), (provider_doubles::CACHED_TOKENS, provider_doubles::THOUGHT_TOKENS));
    assert!(!info.usage_estimated);
    let seen = double.seen();
    assert_eq!(seen[0].target, "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse");
    assert_eq!(seen[0].header("x-goog-api-key"), Some(GEMINI_KEY));
    assert_eq!(seen[0].body["systemInstruction"], json!({"parts": [{"text": "Be brief."}]}));
    assert_eq!(seen[0].body["contents"], json!([{"role": "user", "parts": [{"text": "Hi!"}]}]));
    assert_eq!(seen[0].body["generationConfig"], json!({"maxOutputTokens": 8192, "thinkingConfig": {"includeThoughts": true}}));

    // A whole functionCall becomes a tool call; STOP with calls is TOOL_CALLS.
    let mut second = request("gemini-flash", vec![user_text("Read a.txt")]);
    second.tools = vec![tool_spec("read_file")];
    let (deltas, finish) = stream(&models, second.clone()).await?;
    let starts: Vec<String> =
        deltas.iter().filter_map(|d| if let Some(Delta::ToolCallStart(s)) = &d.delta { Some(s.name.clone()) } else { None }).collect();
    assert_eq!(starts, ["read_file"]);
    let info = finish.info.clone().unwrap_or_default();
    assert_eq!(info.finish_reason(), FinishReason::ToolCalls);
    let assistant = finish.message.unwrap_or_default();
    assert_eq!(assistant.tool_calls.len(), 1);
    let declaration = &double.seen()[1].body["tools"][0]["functionDeclarations"][0];
    assert_eq!(declaration["name"], "read_file");
    assert!(declaration["parameters"].get("additionalProperties").is_none(), "a keyword the API's Schema lacks is not sent");

    // The continuation: the call goes back with its signature, the result as a functionResponse by name.
    let mut result = text_message(Role::Tool, "hi");
    result.tool_call_id = assistant.tool_calls[0].id.clone();
    second.messages.extend([assistant, result]);
    let (deltas, _) = stream(&models, second).await?;
    assert_eq!(text_of(&deltas), "The file says hi.");
    let contents = &double.seen()[2].body["contents"];
    assert_eq!(
        contents[1],
        json!({"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {"path": "/mnt/user-data/a.txt"}}, "thoughtSignature": "c2lnLWdlbS0x"}]})
    );
    assert_eq!(contents[2], json!({"role": "user", "parts": [{"functionResponse": {"name": "read_file", "response": {"output": "hi"}}}]}));

    // 429 on both attempts (max_retries: 1): RESOURCE_EXHAUSTED, waiting the RetryInfo delay between.
    let started = Instant::now();
    let status = stream(&models, request("gemini-flash", vec![user_text("again")])).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.metadata().get("retry-after").is_some());
    assert!(started.elapsed() >= Duration::from_secs(1), "the second attempt waited for the RetryInfo delay");
    assert_eq!(double.seen().len(), 5);

    // A safety stop is CONTENT_FILTER.
    let (_, finish) = stream(&models, request("gemini-flash", vec![user_text("something")])).await?;
    assert_eq!(finish.info.unwrap_or_default().finish_reason(), FinishReason::ContentFilter);

    // A 400 is the caller's INVALID_ARGUMENT with Google's message, not retried.
    let status = stream(&models, request("gemini-flash", vec![user_text("bad")])).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("Invalid value at 'contents[0].parts[0]'"), "{}", status.message());
    assert_eq!(double.seen().len(), 7);

    // A stream cut after its first text: the caller has output, so it ends in-band with ERROR.
    let (deltas, finish) = stream(&models, request("gemini-flash", vec![user_text("long")])).await?;
    assert!(!text_of(&deltas).is_empty());
    let info = finish.info.unwrap_or_default();
    assert_eq!(info.finish_reason(), FinishReason::Error);
    assert!(info.error.is_some_and(|e| e.message.contains("finishReason")), "the cut is named");

    // A key the API does not take (400 API_KEY_INVALID) is a credential failure.
    let status = stream(&models, request("gemini-badkey", vec![user_text("hi")])).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("gemini-badkey") && !status.message().contains("wrong-key-0123456789"), "{}", status.message());
    Ok(())
}

#[tokio::test]
async fn azure_calls_the_deployment_with_its_api_version_and_maps_its_answers() -> anyhow::Result<()> {
    let double = azure::start(
        AZURE_KEY,
        "chat-prod",
        vec![
            Reply::text("Hello from Azure."),
            Reply::tools(
                "Listing.",
                vec![call("call_a1", "ls", json!({"path": "/mnt/user-data"})), call("call_a2", "read_file", json!({"path": "/x"}))],
            ),
            Reply::text("Filtered.").finish("content_filter"),
            Reply::error(429, "Requests to the ChatCompletions_Create Operation have exceeded token rate limit."),
            Reply::error(429, "Requests to the ChatCompletions_Create Operation have exceeded token rate limit."),
        ],
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let server = start_up(dir.path(), "http://127.0.0.1:9", &double.url())?;
    let models = ModelServiceClient::new(server.channel().await?);

    let (deltas, finish) = stream(&models, request("azure-4o", vec![user_text("Hi!")])).await?;
    assert_eq!(text_of(&deltas), "Hello from Azure.");
    let info = finish.info.unwrap_or_default();
    assert_eq!(info.upstream_model, azure::MODEL, "the filter-results event's empty model is not the model");
    let usage = info.usage.unwrap_or_default();
    assert_eq!((usage.input_tokens, usage.output_tokens), (provider_doubles::PROMPT_TOKENS, provider_doubles::OUTPUT_TOKENS));
    let seen = double.seen();
    assert_eq!(seen[0].target, "/openai/deployments/chat-prod/chat/completions?api-version=2024-10-21");
    assert_eq!(seen[0].header("api-key"), Some(AZURE_KEY));
    assert_eq!(seen[0].header("authorization"), None);
    assert_eq!((seen[0].body.get("max_tokens"), seen[0].body["max_completion_tokens"].as_u64()), (None, Some(2048)));

    let mut tools = request("azure-4o", vec![user_text("ls")]);
    tools.tools = vec![tool_spec("ls"), tool_spec("read_file")];
    let (deltas, finish) = stream(&models, tools).await?;
    assert_eq!(text_of(&deltas), "Listing.");
    let calls = finish.message.unwrap_or_default().tool_calls;
    assert_eq!(calls.iter().map(|c| (c.id.as_str(), c.name.as_str())).collect::<Vec<_>>(), [("call_a1", "ls"), ("call_a2", "read_file")]);
    assert_eq!(finish.info.unwrap_or_default().finish_reason(), FinishReason::ToolCalls);

    let (_, finish) = stream(&models, request("azure-4o", vec![user_text("x")])).await?;
    assert_eq!(finish.info.unwrap_or_default().finish_reason(), FinishReason::ContentFilter);

    let status = stream(&models, request("azure-4o", vec![user_text("x")])).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(double.seen().len(), 5, "one retry after the first 429");

    let status = stream(&models, request("azure-missing", vec![user_text("x")])).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(status.message().contains("deployment"), "{}", status.message());
    assert!(double.seen().last().is_some_and(|s| s.target.starts_with("/openai/deployments/chat-staging/")));

    let status = stream(&models, request("azure-badkey", vec![user_text("x")])).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    Ok(())
}

#[tokio::test]
async fn a_lead_run_on_the_deerflow_gemini_model_calls_a_tool_and_finishes() -> anyhow::Result<()> {
    let double = gemini::start(
        GEMINI_KEY,
        vec![
            Reply::tools("", vec![call("", "ls", json!({"path": "/mnt/user-data"}))]).signed("c2lnLXJ1bi0x").thinking("Look first."),
            Reply::text("Your data holds workspace, uploads and outputs."),
        ],
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let server = start_up(dir.path(), &double.url(), "http://127.0.0.1:9")?;
    let mut runs = RunServiceClient::new(server.channel().await?);
    let request = CreateRunRequest {
        input: vec![user_text("What is in my data directory?")],
        config: Some(RunConfig { model_name: "gemini-flash".into(), thinking_enabled: Some(true), ..RunConfig::default() }),
        ..CreateRunRequest::default()
    };
    let run = runs.create_run(request).await?.into_inner().run.unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(90);
    let run = loop {
        let current = runs
            .get_run(GetRunRequest { run_id: run.run_id.clone(), ..GetRunRequest::default() })
            .await?
            .into_inner()
            .run
            .unwrap_or_default();
        if matches!(current.status(), RunStatus::Success | RunStatus::Error | RunStatus::Interrupted | RunStatus::Timeout) {
            break current;
        }
        anyhow::ensure!(Instant::now() < deadline, "the run did not end: {current:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(run.status(), RunStatus::Success, "{run:?}");
    let seen = double.seen();
    assert_eq!(seen.len(), 2, "{seen:#?}");
    let contents = seen[1].body["contents"].as_array().cloned().unwrap_or_default();
    let call = contents.iter().flat_map(|c| c["parts"].as_array().cloned().unwrap_or_default()).find(|p| p.get("functionCall").is_some());
    assert_eq!(call.as_ref().map(|p| p["thoughtSignature"].clone()), Some(json!("c2lnLXJ1bi0x")), "{contents:#?}");
    let response =
        contents.iter().flat_map(|c| c["parts"].as_array().cloned().unwrap_or_default()).find(|p| p.get("functionResponse").is_some());
    let response = response.unwrap_or_default();
    assert_eq!(response["functionResponse"]["name"], "ls");
    let output = response["functionResponse"]["response"]["output"].as_str().unwrap_or_default();
    assert!(output.contains("outputs"), "the tool ran in the sandbox: {output}");
    // The lead agent's tool schemas went through the API's schema rules (the double refuses unknown
    // fields), and the DeerFlow guardrail denies str_replace but still offers it.
    let names: Vec<&str> = seen[0].body["tools"][0]["functionDeclarations"]
        .as_array()
        .map(|d| d.iter().filter_map(|f| f["name"].as_str()).collect())
        .unwrap_or_default();
    assert!(names.contains(&"ls") && names.contains(&"read_file"), "{names:?}");
    Ok(())
}
