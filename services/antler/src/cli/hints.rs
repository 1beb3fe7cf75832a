//! The servers' hints speak to every gRPC client, so they name request fields and RPCs
//! (`multitask_strategy=MULTITASK_STRATEGY_ENQUEUE`, `cancel_active_run`, GetRun). A command-line user
//! needs the flag or command to type instead; this module says the same hint that way. What it does
//! not know passes through unchanged. `integration-tests/tests/cli_terminal.rs` provokes the runs
//! service's hints through the real binary, so a reworded server message shows up there.

/// `message` (a server's error text, hint lines included) with the hints phrased for the `antler` CLI.
pub fn for_the_cli(message: &str) -> String {
    let Some((head, hint)) = message.split_once("\nhint: ") else { return message.to_owned() };
    let run = active_run(head).or_else(|| subject_run(head));
    let run_arg = run.unwrap_or("<run>");
    let mut hint = hint.to_owned();

    // Admission (runs): "retry with multitask_strategy=MULTITASK_STRATEGY_ENQUEUE (or INTERRUPT) or cancel r-9".
    const MULTITASK: &str = "multitask_strategy=MULTITASK_STRATEGY_ENQUEUE (or INTERRUPT)";
    if let Some(at) = hint.find(MULTITASK) {
        let rest = &hint[at + MULTITASK.len()..];
        let cancel = match rest.strip_prefix(" or cancel ") {
            Some(id) => format!(", or cancel {id} with `antler runs cancel {id}`"),
            None => rest.to_owned(),
        };
        hint = format!("{}--multitask enqueue (or --multitask interrupt){cancel}", &hint[..at]);
    }
    let replacements: [(&str, String); 7] = [
        // DeleteThread (runs): "cancel it first, or set cancel_active_run".
        (
            "cancel it first, or set cancel_active_run",
            format!("cancel it first with `antler runs cancel {run_arg}`, or pass --cancel-active-run"),
        ),
        // CancelRun (runs).
        ("read its outcome with GetRun", format!("read its outcome with `antler runs show {run_arg}`")),
        ("read the outcome with GetRun", format!("read the outcome with `antler runs show {run_arg}`")),
        // Per-user caps (runs).
        ("(WaitRun, JoinRun)", "(`antler events <run> --follow`)".to_owned()),
        // InstallSkill (sandbox).
        ("set replace to overwrite it (antler skills install --replace)", "pass --replace to overwrite it".to_owned()),
        ("ask for replace to overwrite it", "pass --replace to overwrite it".to_owned()),
        // Facts (memory).
        ("ListFacts shows the facts of an agent scope", "`antler memory list [--agent NAME]` shows the facts of an agent scope".to_owned()),
    ];
    for (server, cli) in replacements {
        hint = hint.replace(server, &cli);
    }
    format!("{head}\nhint: {hint}")
}

/// The run id of "… has an active run r-9 …".
fn active_run(text: &str) -> Option<&str> {
    let (_, rest) = text.split_once("has an active run ")?;
    rest.split_whitespace().next()
}

/// The run id of a message about one run: "run r-9 is not cancellable …".
fn subject_run(text: &str) -> Option<&str> {
    let rest = text.strip_prefix("run ")?;
    rest.split_whitespace().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runs_services_hints_name_flags_and_commands() {
        // The texts of services/runs (lifecycle/admission.rs, threads.rs, lifecycle/cancel.rs).
        assert_eq!(
            for_the_cli("thread t has an active run\nhint: retry with multitask_strategy=MULTITASK_STRATEGY_ENQUEUE (or INTERRUPT)"),
            "thread t has an active run\nhint: retry with --multitask enqueue (or --multitask interrupt)"
        );
        assert_eq!(
            for_the_cli("thread t has an active run r-9\nhint: cancel it first, or set cancel_active_run"),
            "thread t has an active run r-9\nhint: cancel it first with `antler runs cancel r-9`, or pass --cancel-active-run"
        );
        assert_eq!(
            for_the_cli("run r-9 is not cancellable (status: SUCCESS): it already ended\nhint: read the outcome with GetRun"),
            "run r-9 is not cancellable (status: SUCCESS): it already ended\nhint: read the outcome with `antler runs show r-9`"
        );
    }

    #[test]
    fn no_request_field_is_left_in_a_known_hint() {
        for message in [
            "thread t has an active run r-1\nhint: retry with multitask_strategy=MULTITASK_STRATEGY_ENQUEUE (or INTERRUPT) or cancel r-1",
            "thread t has an active run r-1\nhint: cancel it first, or set cancel_active_run",
            "the custom skill \"x\" already exists\nhint: set replace to overwrite it (antler skills install --replace)",
            "skill \"x\" already exists\nhint: ask for replace to overwrite it",
        ] {
            let said = for_the_cli(message);
            for field in ["multitask_strategy", "MULTITASK_STRATEGY", "cancel_active_run", "set replace", "for replace"] {
                assert!(!said.contains(field), "{said}");
            }
        }
    }

    #[test]
    fn other_messages_pass_through() {
        for message in ["run r-1 not found", "old_str was not found in /a\nhint: read the file first", ""] {
            assert_eq!(for_the_cli(message), message);
        }
    }
}
