//! Skills in the lead agent, through `antler up` and the LLM upstream double: the user's enabled
//! skills are listed in the prompt's `<available_skills>` (a disabled one is not), and once the model
//! has read a skill's SKILL.md its `allowed-tools` apply: the next request offers only those tools and
//! a call to another one is refused without running.

use std::time::Duration;

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, LlmDouble, Turn, call, route};
use antler_integration_tests::runs::*;
use antler_proto::runs::{RunConfig, RunStatus};
use anyhow::{Result, ensure};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

fn offered(request: &Value) -> Vec<String> {
    let mut names: Vec<String> = request["tools"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["function"]["name"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    names.sort();
    names
}

fn system_prompt(request: &Value) -> String {
    request["messages"][0]["content"].as_str().map(str::to_owned).unwrap_or_else(|| request["messages"][0]["content"].to_string())
}

fn write_skill(root: &std::path::Path, name: &str, description: &str, extra: &str) -> Result<()> {
    std::fs::create_dir_all(root.join(name))?;
    std::fs::write(
        root.join(name).join("SKILL.md"),
        format!("---\nname: {name}\ndescription: {description}\n{extra}---\n# {name}\nUse bash only. MARKER-{name}\n"),
    )?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enabled_skills_are_listed_and_an_activated_skill_limits_the_tools() -> Result<()> {
    let skills = tempfile::tempdir()?;
    let public = skills.path().join("public");
    write_skill(&public, "shell-only", "Work with the shell only.", "allowed-tools: [bash]\n")?;
    write_skill(&public, "free-form", "No tool policy.", "")?;
    write_skill(&public, "hidden", "Disabled by the operator.", "")?;
    let operator = skills.path().join("extensions_config.json");
    std::fs::write(&operator, r#"{"skills": {"hidden": {"enabled": false}}}"#)?;

    let double = LlmDouble::start(
        vec![
            Turn::tools(
                "Reading the skill first.",
                vec![call("r1", "read_file", json!({"description": "read the skill", "path": "/mnt/skills/public/shell-only/SKILL.md"}))],
            ),
            Turn::tools(
                "Now working.",
                vec![
                    call("w1", "write_file", json!({"description": "w", "path": "/mnt/user-data/outputs/a.txt", "content": "x"})),
                    call("b1", "bash", json!({"description": "b", "command": "echo from-bash"})),
                ],
            ),
            Turn::text("Done."),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let data = tempfile::tempdir()?;
    let sandbox = format!("  skills:\n    public_dir: {}\n    extensions_config: {}\n", public.display(), operator.display());
    let up = start_agent_up(&db, &format!("{sandbox}{}", double.models_yaml()), "", Some(data.path()))?;
    let (mut runs, _) = clients(&up).await?;
    let run = runs.create_run(authed(prompt_request("", "Make a report."), ALICE)).await?.into_inner().run.unwrap_or_default();
    let run = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
    ensure!(run.status() == RunStatus::Success, "{:?}\n{}", run.error, up.stderr());

    let requests = double.requests();
    ensure!(requests.len() == 3, "{} requests\n{}", requests.len(), up.stderr());
    let prompt = system_prompt(&requests[0]);
    ensure!(prompt.contains("<available_skills>"), "{prompt}");
    for name in ["shell-only", "free-form"] {
        ensure!(prompt.contains(&format!("<name>{name}</name>")), "{name} listed: {prompt}");
        ensure!(prompt.contains(&format!("<location>/mnt/skills/public/{name}/SKILL.md</location>")), "{prompt}");
    }
    ensure!(prompt.contains("<description>Work with the shell only. [built-in]</description>"), "{prompt}");
    ensure!(!prompt.contains("hidden"), "a disabled skill is not listed: {prompt}");

    // Before the skill is read every tool is offered; after, only its allowed ones and the framework's.
    let first = offered(&requests[0]);
    ensure!(first.iter().any(|t| t == "write_file") && first.iter().any(|t| t == "bash"), "{first:?}");
    ensure!(requests[1]["messages"].to_string().contains("MARKER-shell-only"), "the read returned SKILL.md");
    let second = offered(&requests[1]);
    ensure!(second == ["bash", "read_file"], "{second:?}");
    let last = requests[2]["messages"].to_string();
    ensure!(last.contains("Error: Tool 'write_file' is not allowed by the active skill policy."), "{last}");
    ensure!(last.contains("from-bash"), "bash, which the skill allows, ran: {last}");
    ensure!(offered(&requests[2]) == ["bash", "read_file"], "still restricted");
    ensure!(
        !data.path().join("sandbox/users/alice/threads").read_dir()?.flatten().any(|t| t.path().join("user-data/outputs/a.txt").exists())
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skill_without_a_policy_restricts_nothing_and_skills_can_be_switched_off() -> Result<()> {
    let skills = tempfile::tempdir()?;
    let public = skills.path().join("public");
    write_skill(&public, "free-form", "No tool policy.", "")?;
    let double = LlmDouble::start(
        vec![
            Turn::tools(
                "Reading.",
                vec![call("r1", "read_file", json!({"description": "r", "path": "/mnt/skills/public/free-form/SKILL.md"}))],
            ),
            Turn::text("Done."),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let sandbox = format!("  skills:\n    public_dir: {}\n", public.display());
    let up = start_agent_up(&db, &format!("{sandbox}{}", double.models_yaml()), "", None)?;
    let (mut runs, _) = clients(&up).await?;
    let run = runs.create_run(authed(prompt_request("", "Go."), ALICE)).await?.into_inner().run.unwrap_or_default();
    let run = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
    ensure!(run.status() == RunStatus::Success, "{:?}", run.error);
    let requests = double.requests();
    ensure!(offered(&requests[0]) == offered(&requests[1]), "no allowed-tools: nothing removed");
    drop(up);

    // runs.lead.skills.enabled: false: no section, no policy.
    let double = LlmDouble::start(vec![Turn::text("Plain.")], AfterLast::Refuse).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let up = start_agent_up(&db, &format!("{sandbox}{}", double.models_yaml()), "  lead:\n    skills:\n      enabled: false\n", None)?;
    let (mut runs, _) = clients(&up).await?;
    let run = runs.create_run(authed(prompt_request("", "Go."), ALICE)).await?.into_inner().run.unwrap_or_default();
    let run = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
    ensure!(run.status() == RunStatus::Success, "{:?}", run.error);
    ensure!(!system_prompt(&double.requests()[0]).contains("<available_skills>"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subagent_type_with_a_skill_list_sees_and_activates_only_those() -> Result<()> {
    let skills = tempfile::tempdir()?;
    let public = skills.path().join("public");
    write_skill(&public, "shell-only", "Work with the shell only.", "allowed-tools: [bash]\n")?;
    write_skill(&public, "free-form", "No tool policy.", "")?;
    let task = |id: &str, subagent_type: &str, prompt: &str| {
        call(id, "task", json!({"description": format!("work {id}"), "prompt": prompt, "subagent_type": subagent_type}))
    };
    let read_shell_only = || {
        Turn::tools(
            "Reading the skill.",
            vec![call("r", "read_file", json!({"description": "r", "path": "/mnt/skills/public/shell-only/SKILL.md"}))],
        )
    };
    let double = LlmDouble::start_routed(
        vec![
            route(
                "LEAD skills",
                vec![
                    Turn::tools("", vec![task("t-picky", "picky", "CHILD-PICKY go"), task("t-any", "general-purpose", "CHILD-ANY go")]),
                    Turn::text("ok"),
                ],
            ),
            route("CHILD-PICKY", vec![read_shell_only(), Turn::text("picky done")]),
            route("CHILD-ANY", vec![read_shell_only(), Turn::text("any done")]),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let sandbox = format!("  skills:\n    public_dir: {}\n", public.display());
    let agents = "  lead:\n    subagents:\n      custom_agents:\n        picky:\n          description: Knows one skill\n          skills: [free-form]\n";
    let up = start_agent_up(&db, &format!("{sandbox}{}", double.models_yaml()), agents, None)?;
    let (mut runs, _) = clients(&up).await?;
    let mut request = prompt_request("", "LEAD skills");
    request.config = Some(RunConfig { subagents_enabled: true, ..RunConfig::default() });
    let run = runs.create_run(authed(request, ALICE)).await?.into_inner().run.unwrap_or_default();
    let run = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
    ensure!(run.status() == RunStatus::Success, "{:?}\n{}", run.error, up.stderr());

    // The listed skill only, in the picky type's prompt; every enabled one in the general-purpose one's.
    let picky = double.requests_of("CHILD-PICKY");
    ensure!(picky.len() == 2, "{} requests\n{}", picky.len(), up.stderr());
    let prompt = system_prompt(&picky[0]);
    ensure!(prompt.contains("<name>free-form</name>") && !prompt.contains("shell-only"), "{prompt}");
    let any = double.requests_of("CHILD-ANY");
    ensure!(any.len() == 2, "{} requests", any.len());
    let prompt = system_prompt(&any[0]);
    ensure!(prompt.contains("<name>free-form</name>") && prompt.contains("<name>shell-only</name>"), "{prompt}");
    // Reading a skill the type may not use does not activate it: the tools stay as they were; the
    // general-purpose child that read the same file is restricted to the skill's tools.
    ensure!(offered(&picky[1]) == offered(&picky[0]) && offered(&picky[1]).len() > 2, "{:?}", offered(&picky[1]));
    ensure!(offered(&any[1]) == ["bash", "read_file"], "{:?}", offered(&any[1]));
    Ok(())
}
