//! Token usage of a thread: the run totals kept as columns (so GetTokenUsage is two aggregate
//! queries, whatever the number of runs), and how full the model's context window is at the head.

use std::collections::HashMap;

use antler_proto::common::{Message, Role, Usage};
use antler_proto::runs::{CallerUsage, ContextUsage, ModelUsage, RunUsage};
use sea_orm::{ConnectionTrait, DbBackend, EntityTrait};

use crate::engine::Engine;
use crate::error::RunsError;
use crate::status::Status;

use crate::store::entity::{runs, threads};
use crate::store::statement;

fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn uint(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// The run-row columns that mirror `usage` (written with it, in the same statement).
pub fn columns(usage: &RunUsage) -> Vec<(runs::Column, sea_orm::Value)> {
    let by_model: serde_json::Map<String, serde_json::Value> = usage
        .by_model
        .iter()
        .map(|(model, per)| {
            let u = per.usage.unwrap_or_default();
            let counts = serde_json::json!({
                "input_tokens": u.input_tokens,
                "output_tokens": u.output_tokens,
                "total_tokens": u.total_tokens,
                "cache_read_tokens": u.cache_read_tokens,
                "reasoning_tokens": u.reasoning_tokens,
                "llm_calls": per.llm_calls,
            });
            (model.clone(), counts)
        })
        .collect();
    vec![
        (runs::Column::UsageInputTokens, int(usage.input_tokens).into()),
        (runs::Column::UsageOutputTokens, int(usage.output_tokens).into()),
        (runs::Column::UsageTotalTokens, int(usage.total_tokens).into()),
        (runs::Column::UsageCacheReadTokens, int(usage.cache_read_tokens).into()),
        (runs::Column::UsageReasoningTokens, int(usage.reasoning_tokens).into()),
        (runs::Column::UsageLlmCalls, int(usage.llm_calls).into()),
        (runs::Column::UsageLeadAgentTokens, int(usage.lead_agent_tokens).into()),
        (runs::Column::UsageSubagentTokens, int(usage.subagent_tokens).into()),
        (runs::Column::UsageMiddlewareTokens, int(usage.middleware_tokens).into()),
        (runs::Column::UsageByModel, serde_json::Value::Object(by_model).to_string().into()),
    ]
}

/// What GetTokenUsage sums over a thread's runs.
#[derive(Debug, Default)]
pub struct ThreadUsage {
    pub total: Usage,
    pub runs: u64,
    pub llm_calls: u64,
    pub by_caller: CallerUsage,
    pub by_model: HashMap<String, ModelUsage>,
}

/// Sums the usage of the thread's terminal runs (and RUNNING / FINALIZING ones with
/// `include_active`) in SQL: one SUM over the run columns, one GROUP BY over the per-model JSON.
pub async fn thread_usage(engine: &Engine, user_id: &str, thread_id: &str, include_active: bool) -> Result<ThreadUsage, RunsError> {
    let db = engine.store().db();
    let backend = engine.store().backend();
    let mut statuses = vec![Status::Success, Status::Error, Status::Interrupted, Status::Timeout];
    if include_active {
        statuses.extend([Status::Running, Status::Finalizing]);
    }
    let marks = vec!["?"; statuses.len()].join(", ");
    let mut values: Vec<sea_orm::Value> = vec![user_id.into(), thread_id.into()];
    values.extend(statuses.iter().map(|s| sea_orm::Value::from(*s)));
    let sum = |column: &str| format!("CAST(COALESCE(SUM({column}), 0) AS BIGINT) AS {column}");
    let totals_sql = format!(
        "SELECT COUNT(*) AS runs, {} FROM runs WHERE user_id = ? AND thread_id = ? AND status IN ({marks})",
        runs::USAGE_COLUMNS.map(sum).join(", ")
    );
    let row = db
        .query_one_raw(statement(backend, &totals_sql, values.clone()))
        .await?
        .ok_or_else(|| RunsError::Store(crate::store::StoreError::Corrupt("an aggregate returned no row".to_owned())))?;
    let get = |column: &str| row.try_get::<i64>("", column).map(uint);
    let mut usage = ThreadUsage {
        total: Usage {
            input_tokens: get("usage_input_tokens")?,
            output_tokens: get("usage_output_tokens")?,
            total_tokens: get("usage_total_tokens")?,
            cache_read_tokens: get("usage_cache_read_tokens")?,
            reasoning_tokens: get("usage_reasoning_tokens")?,
            // Runs do not keep cache writes apart (RunUsage has no such total).
            ..Usage::default()
        },
        runs: get("runs")?,
        llm_calls: get("usage_llm_calls")?,
        by_caller: CallerUsage {
            lead_agent_tokens: get("usage_lead_agent_tokens")?,
            subagent_tokens: get("usage_subagent_tokens")?,
            middleware_tokens: get("usage_middleware_tokens")?,
        },
        by_model: HashMap::new(),
    };
    if usage.runs == 0 {
        return Ok(usage);
    }
    const FIELDS: [&str; 6] = ["input_tokens", "output_tokens", "total_tokens", "cache_read_tokens", "reasoning_tokens", "llm_calls"];
    let (from, field) = match backend {
        DbBackend::Postgres => ("jsonb_each(runs.usage_by_model::jsonb) AS m(key, value)", "(m.value ->> '{}')::bigint"),
        _ => ("json_each(runs.usage_by_model) AS m", "json_extract(m.value, '$.{}')"),
    };
    let sums: Vec<String> = FIELDS.iter().map(|f| format!("CAST(COALESCE(SUM({}), 0) AS BIGINT) AS {f}", field.replace("{}", f))).collect();
    let by_model_sql = format!(
        "SELECT m.key AS model, COUNT(*) AS runs, {} FROM runs, {from} \
         WHERE runs.user_id = ? AND runs.thread_id = ? AND runs.status IN ({marks}) GROUP BY m.key",
        sums.join(", ")
    );
    for row in db.query_all_raw(statement(backend, &by_model_sql, values)).await? {
        let get = |column: &str| row.try_get::<i64>("", column).map(uint);
        let per = ModelUsage {
            usage: Some(Usage {
                input_tokens: get("input_tokens")?,
                output_tokens: get("output_tokens")?,
                total_tokens: get("total_tokens")?,
                cache_read_tokens: get("cache_read_tokens")?,
                reasoning_tokens: get("reasoning_tokens")?,
                ..Usage::default()
            }),
            llm_calls: get("llm_calls")?,
            runs: get("runs")?,
        };
        usage.by_model.insert(row.try_get::<String>("", "model")?, per);
    }
    Ok(usage)
}

/// How many tokens the next model call on `messages` would send: the input of the last model call
/// that reported usage, plus its answer, plus an estimate of every message after it (DeerFlow's
/// count, as summarization uses); the estimate of all of them when no call reported usage. None
/// when there are no messages.
pub fn context_tokens(messages: &[Message]) -> Option<u64> {
    if messages.is_empty() {
        return None;
    }
    let reported = messages.iter().rposition(|m| m.role == Role::Assistant as i32 && m.usage.is_some_and(|u| u.input_tokens > 0));
    Some(match reported {
        Some(at) => {
            let usage = messages[at].usage.unwrap_or_default();
            usage.input_tokens + usage.output_tokens + antler_agent::lead::middleware::summarization::approx_tokens(&messages[at + 1..])
        }
        None => antler_agent::lead::middleware::summarization::approx_tokens(messages),
    })
}

/// `token_count` against `max_context_tokens` (0 when unknown).
pub fn context_usage(token_count: u64, max_context_tokens: u64) -> ContextUsage {
    let fraction = if max_context_tokens > 0 { token_count as f64 / max_context_tokens as f64 } else { 0.0 };
    ContextUsage { token_count, max_context_tokens, fraction }
}

/// The context window fill at the thread's head: None when the thread has no messages. The window
/// is the models service's `context_window` of the model the thread's latest run used (the default
/// model when it named none), asked as the caller (`ctx`); 0 when the models service cannot say.
pub async fn thread_context(
    engine: &Engine,
    ctx: &antler_kit::CallContext,
    thread: &threads::Model,
) -> Result<Option<ContextUsage>, RunsError> {
    let Some(checkpoint) = crate::threads::checkpoint(engine, thread, None, true).await? else { return Ok(None) };
    let Some(tokens) = context_tokens(&checkpoint.messages) else { return Ok(None) };
    let model_name = match &thread.latest_run_id {
        Some(run_id) => runs::Entity::find_by_id(run_id.clone()).one(engine.store().db()).await?.map(|r| r.model_name).unwrap_or_default(),
        None => String::new(),
    };
    Ok(Some(context_usage(tokens, context_window(engine, ctx, &model_name).await)))
}

/// The model's context window from the models service (GetModel, or the default of ListModels for
/// an empty name); 0 when there is no models client, the model is unknown or the call fails.
async fn context_window(engine: &Engine, ctx: &antler_kit::CallContext, model_name: &str) -> u64 {
    use antler_proto::models::model_service_client::ModelServiceClient;
    use antler_proto::models::{GetModelRequest, ListModelsRequest};
    let Some(client) = engine.clients().get("models") else { return 0 };
    let mut grpc = ModelServiceClient::new(client.channel());
    let model = if model_name.is_empty() {
        grpc.list_models(client.request(ctx, ListModelsRequest::default())).await.map(|r| {
            let models = r.into_inner().models;
            let default = models.iter().position(|m| m.is_default);
            default.and_then(|i| models.into_iter().nth(i))
        })
    } else {
        grpc.get_model(client.request(ctx, GetModelRequest { name: model_name.to_owned() })).await.map(|r| r.into_inner().model)
    };
    match model {
        Ok(model) => model.map_or(0, |m| u64::from(m.context_window)),
        Err(status) => {
            tracing::warn!(model = model_name, code = ?status.code(), "context window unknown: the models service answered {}", status.message());
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(role: Role, text: &str, usage: Option<Usage>) -> Message {
        Message {
            role: role as i32,
            content: vec![antler_proto::common::ContentPart {
                part: Some(antler_proto::common::content_part::Part::Text(antler_proto::common::TextPart { text: text.to_owned() })),
            }],
            usage,
            ..Message::default()
        }
    }

    #[test]
    fn the_last_reported_call_counts_and_later_messages_are_estimated() {
        assert_eq!(context_tokens(&[]), None);
        // No usage anywhere: DeerFlow's estimate (40 characters → 10 tokens, + 3 per message).
        let user = message(Role::User, &"x".repeat(40), None);
        assert_eq!(context_tokens(std::slice::from_ref(&user)), Some(13));
        let answered = Usage { input_tokens: 1_000, output_tokens: 200, total_tokens: 1_200, ..Usage::default() };
        let messages = vec![
            user.clone(),
            message(Role::Assistant, "early", Some(Usage { input_tokens: 10, ..Usage::default() })),
            message(Role::Assistant, "late", Some(answered)),
            message(Role::Tool, &"y".repeat(400), None),
        ];
        assert_eq!(context_tokens(&messages), Some(1_000 + 200 + 100 + 3));
    }

    #[test]
    fn the_fraction_is_zero_when_the_window_is_unknown() {
        assert_eq!(context_usage(500, 0).fraction, 0.0);
        let usage = context_usage(3_000, 4_000);
        assert!((usage.fraction - 0.75).abs() < 1e-9, "{usage:?}");
    }
}
