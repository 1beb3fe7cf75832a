//! Answering a clarification with `CreateRunRequest.resume`: the answer is checked against the
//! thread's pending ClarificationEvent (its id, option ids, form fields and their types) and becomes
//! the run's input — one user message that states the question and the answer, so every agent reads
//! it the same way and the transcript shows it.

use antler_proto::common::{ContentPart, Message, Role, TextPart, content_part};
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{ClarificationEvent, CreateRunRequest, EventKind, FormField, FormFieldKind, ResumeInput};
use prost_types::value::Kind as V;
use sea_orm::EntityTrait;

use crate::engine::Engine;
use crate::error::RunsError;
use crate::status::Status;
use crate::store::entity::{runs, threads};
use crate::stream::read_after;

/// Longest free-text answer, in bytes.
const MAX_TEXT_BYTES: usize = 32 * 1024;

/// When `req.resume` is set: checks it and puts the answer into `req.input`.
pub async fn apply(engine: &Engine, user_id: &str, req: &mut CreateRunRequest) -> Result<(), RunsError> {
    let Some(resume) = req.resume.clone() else { return Ok(()) };
    if req.thread_id.is_empty() {
        return Err(RunsError::invalid("thread_id", "is required with `resume`: name the thread whose clarification is answered"));
    }
    let pending = pending(engine, user_id, &req.thread_id).await?;
    // A retry of an answer already admitted: the idempotency key finds that run (the fingerprint
    // ignores the input written from the answer), although the clarification is no longer pending.
    if pending.is_none() && super::one::find_by_key(engine, user_id, &req.idempotency_key).await?.is_some() {
        return Ok(());
    }
    let pending = pending.ok_or_else(|| {
        RunsError::FailedPrecondition(format!(
            "thread {} has no pending clarification to answer\nhint: send the message as `input` instead",
            req.thread_id
        ))
    })?;
    if !resume.interrupt_id.is_empty() && resume.interrupt_id != pending.interrupt_id {
        return Err(RunsError::FailedPrecondition(format!(
            "clarification {} is not pending on thread {} (the pending one is {})\nhint: leave resume.interrupt_id empty to answer the pending one",
            resume.interrupt_id, req.thread_id, pending.interrupt_id
        )));
    }
    let text = answer_text(&pending, &resume)?;
    req.input = vec![Message {
        role: Role::User as i32,
        name: "clarification-answer".to_owned(),
        content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text })) }],
        ..Message::default()
    }];
    Ok(())
}

/// The clarification the thread waits on: the last one of its latest run, when that run stopped to ask.
async fn pending(engine: &Engine, user_id: &str, thread_id: &str) -> Result<Option<ClarificationEvent>, RunsError> {
    let thread = threads::Entity::find_by_id((user_id.to_owned(), thread_id.to_owned())).one(engine.store().db()).await?;
    let Some(thread) = thread else { return Err(RunsError::NotFound(format!("thread {thread_id}"))) };
    let Some(latest) = thread.latest_run_id else { return Ok(None) };
    let Some(run) = runs::Entity::find_by_id(latest).one(engine.store().db()).await? else { return Ok(None) };
    if run.status != Status::Success || run.stop_reason.as_deref() != Some("clarification") {
        return Ok(None);
    }
    let events = read_after(engine.store(), &run.run_id, 0, &[EventKind::Clarification as i32], 1000).await?;
    Ok(events.into_iter().rev().find_map(|e| match e.kind {
        Some(Kind::Clarification(c)) => Some(c),
        _ => None,
    }))
}

/// Checks `resume` against `pending` and writes the answer as the model will read it.
fn answer_text(pending: &ClarificationEvent, resume: &ResumeInput) -> Result<String, RunsError> {
    if resume.text.len() > MAX_TEXT_BYTES {
        return Err(RunsError::invalid("resume.text", format!("{} bytes; the limit is {MAX_TEXT_BYTES}", resume.text.len())));
    }
    let mut chosen = Vec::new();
    for id in &resume.selected_option_ids {
        let option = pending.options.iter().find(|o| &o.id == id).ok_or_else(|| {
            let valid: Vec<&str> = pending.options.iter().map(|o| o.id.as_str()).collect();
            RunsError::invalid(
                "resume.selected_option_ids",
                format!(
                    "`{id}` is not an option of this clarification (options: {})",
                    if valid.is_empty() { "none".to_owned() } else { valid.join(", ") }
                ),
            )
        })?;
        chosen.push(option.label.clone());
    }
    if chosen.len() > 1 && !pending.multi_select {
        return Err(RunsError::invalid("resume.selected_option_ids", "this clarification takes one option"));
    }
    let values = resume.values.clone().unwrap_or_default();
    if let Some(unknown) = values.fields.keys().find(|k| !pending.fields.iter().any(|f| &f.name == *k)) {
        return Err(RunsError::invalid(format!("resume.values.{unknown}"), "is not a field of this clarification"));
    }
    let mut answers = Vec::new();
    for field in &pending.fields {
        match values.fields.get(&field.name) {
            None | Some(prost_types::Value { kind: None | Some(V::NullValue(_)) }) if field.required => {
                return Err(RunsError::invalid(format!("resume.values.{}", field.name), "is required"));
            }
            None | Some(prost_types::Value { kind: None | Some(V::NullValue(_)) }) => {}
            Some(value) => answers.push(format!("{}: {}", field.label, field_answer(field, value)?)),
        }
    }
    if chosen.is_empty() && answers.is_empty() && resume.text.trim().is_empty() {
        return Err(RunsError::invalid("resume", "answers nothing: give text, selected_option_ids or values"));
    }

    let mut text = format!("Answer to your clarification question \"{}\":", pending.question);
    if !chosen.is_empty() {
        text.push_str(&format!("\n- chosen: {}", chosen.join(", ")));
    }
    for answer in answers {
        text.push_str(&format!("\n- {answer}"));
    }
    if !resume.text.trim().is_empty() {
        text.push_str(&format!("\n{}", resume.text.trim()));
    }
    Ok(text)
}

/// One form value, type-checked against its field, as text.
fn field_answer(field: &FormField, value: &prost_types::Value) -> Result<String, RunsError> {
    let path = format!("resume.values.{}", field.name);
    let wrong = |expected: &str| RunsError::invalid(path.clone(), format!("must be {expected}"));
    let label_of = |id: &str| {
        field.options.iter().find(|o| o.id == id).map(|o| o.label.clone()).ok_or_else(|| {
            let valid: Vec<&str> = field.options.iter().map(|o| o.id.as_str()).collect();
            RunsError::invalid(path.clone(), format!("`{id}` is not an option (options: {})", valid.join(", ")))
        })
    };
    match (field.kind(), &value.kind) {
        (FormFieldKind::Number, Some(V::NumberValue(n))) if n.is_finite() => Ok(n.to_string()),
        (FormFieldKind::Number, _) => Err(wrong("a number")),
        (FormFieldKind::Checkbox, Some(V::BoolValue(b))) => Ok(if *b { "yes" } else { "no" }.to_owned()),
        (FormFieldKind::Checkbox, _) => Err(wrong("true or false")),
        (FormFieldKind::Select, Some(V::StringValue(id))) => label_of(id),
        (FormFieldKind::Select, _) => Err(wrong("an option id (a string)")),
        (FormFieldKind::MultiSelect, Some(V::ListValue(list))) => {
            let mut labels = Vec::new();
            for item in &list.values {
                match &item.kind {
                    Some(V::StringValue(id)) => labels.push(label_of(id)?),
                    _ => return Err(wrong("a list of option ids")),
                }
            }
            Ok(labels.join(", "))
        }
        (FormFieldKind::MultiSelect, _) => Err(wrong("a list of option ids")),
        (FormFieldKind::Date, Some(V::StringValue(date))) if is_date(date) => Ok(date.clone()),
        (FormFieldKind::Date, _) => Err(wrong("a date \"YYYY-MM-DD\"")),
        (FormFieldKind::Text, Some(V::StringValue(s))) if s.chars().count() > 200 => Err(wrong("at most 200 characters")),
        (FormFieldKind::Text | FormFieldKind::Textarea | FormFieldKind::Unspecified, Some(V::StringValue(s))) => {
            if s.len() > MAX_TEXT_BYTES { Err(wrong(&format!("at most {MAX_TEXT_BYTES} bytes"))) } else { Ok(s.clone()) }
        }
        (_, _) => Err(wrong("a string")),
    }
}

fn is_date(text: &str) -> bool {
    let bytes = text.as_bytes();
    if bytes.len() != 10 || bytes[4] != b'-' || bytes[7] != b'-' {
        return false;
    }
    let number = |range: std::ops::Range<usize>| text.get(range).and_then(|s| s.parse::<u32>().ok());
    matches!((number(0..4), number(5..7), number(8..10)), (Some(_), Some(1..=12), Some(1..=31)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use antler_proto::runs::ClarificationOption;

    fn option(id: &str, label: &str) -> ClarificationOption {
        ClarificationOption { id: id.to_owned(), label: label.to_owned(), description: String::new() }
    }

    fn pending() -> ClarificationEvent {
        ClarificationEvent {
            interrupt_id: "q1".to_owned(),
            question: "Which report?".to_owned(),
            options: vec![option("1", "markdown"), option("2", "pdf")],
            fields: vec![
                FormField {
                    name: "budget".to_owned(),
                    label: "Budget".to_owned(),
                    kind: FormFieldKind::Number as i32,
                    required: true,
                    ..FormField::default()
                },
                FormField { name: "due".to_owned(), label: "Due".to_owned(), kind: FormFieldKind::Date as i32, ..FormField::default() },
            ],
            ..ClarificationEvent::default()
        }
    }

    fn values(pairs: &[(&str, V)]) -> Option<prost_types::Struct> {
        Some(prost_types::Struct {
            fields: pairs.iter().map(|(k, v)| ((*k).to_owned(), prost_types::Value { kind: Some(v.clone()) })).collect(),
        })
    }

    fn field_of(error: RunsError) -> String {
        match error {
            RunsError::InvalidArgument { field, .. } => field,
            other => format!("not INVALID_ARGUMENT: {other}"),
        }
    }

    #[test]
    fn a_valid_answer_reads_as_the_question_and_the_choices() -> Result<(), RunsError> {
        let resume = ResumeInput {
            selected_option_ids: vec!["2".to_owned()],
            values: values(&[("budget", V::NumberValue(500.0)), ("due", V::StringValue("2026-12-31".to_owned()))]),
            text: "Keep it short.".to_owned(),
            ..ResumeInput::default()
        };
        let text = answer_text(&pending(), &resume)?;
        assert_eq!(
            text,
            "Answer to your clarification question \"Which report?\":\n- chosen: pdf\n- Budget: 500\n- Due: 2026-12-31\nKeep it short."
        );
        Ok(())
    }

    #[test]
    fn bad_answers_name_the_field() {
        let budget = || ("budget", V::NumberValue(1.0));
        let cases = [
            (
                ResumeInput { selected_option_ids: vec!["9".to_owned()], values: values(&[budget()]), ..ResumeInput::default() },
                "resume.selected_option_ids",
            ),
            (
                ResumeInput {
                    selected_option_ids: vec!["1".to_owned(), "2".to_owned()],
                    values: values(&[budget()]),
                    ..ResumeInput::default()
                },
                "resume.selected_option_ids",
            ),
            (ResumeInput { text: "x".to_owned(), ..ResumeInput::default() }, "resume.values.budget"),
            (
                ResumeInput { values: values(&[("budget", V::StringValue("lots".to_owned()))]), ..ResumeInput::default() },
                "resume.values.budget",
            ),
            (
                ResumeInput { values: values(&[budget(), ("due", V::StringValue("31/12/2026".to_owned()))]), ..ResumeInput::default() },
                "resume.values.due",
            ),
            (
                ResumeInput { values: values(&[budget(), ("colour", V::StringValue("red".to_owned()))]), ..ResumeInput::default() },
                "resume.values.colour",
            ),
            (ResumeInput { text: "y".repeat(MAX_TEXT_BYTES + 1), ..ResumeInput::default() }, "resume.text"),
        ];
        for (resume, field) in cases {
            assert_eq!(answer_text(&pending(), &resume).err().map(field_of).as_deref(), Some(field), "{resume:?}");
        }
        let bare = ClarificationEvent { question: "Go on?".to_owned(), ..ClarificationEvent::default() };
        assert_eq!(answer_text(&bare, &ResumeInput::default()).err().map(field_of).as_deref(), Some("resume"));
    }
}
