//! Configuration errors stop start-up with the YAML path in the message; `antler config check` shows
//! the resolved file with secrets masked.

use std::process::Command;

use antler_integration_tests::{Launch, binary, try_start};

fn start_failure(yaml: &str) -> anyhow::Result<String> {
    match try_start("antler", Launch::new(["up"]).config(yaml))? {
        Ok(_) => anyhow::bail!("started with an invalid config:\n{yaml}"),
        Err(failure) => {
            assert!(failure.status.is_some_and(|s| !s.success()), "{:?}", failure.status);
            Ok(failure.stderr)
        }
    }
}

#[test]
fn a_missing_environment_variable_names_the_variable_and_its_path() -> anyhow::Result<()> {
    let stderr =
        start_failure("server:\n  auth:\n    enabled: true\n    api_keys:\n      - key: $ANTLER_TEST_UNSET_KEY\n        user: alice\n")?;
    assert!(stderr.contains("ANTLER_TEST_UNSET_KEY"), "{stderr}");
    assert!(stderr.contains("server.auth.api_keys[0].key"), "{stderr}");
    Ok(())
}

#[test]
fn unknown_keys_are_named_with_their_path() -> anyhow::Result<()> {
    let stderr = start_failure("server:\n  shutdown_grace_sec: 5\n")?;
    assert!(stderr.contains("shutdown_grace_sec") && stderr.contains("server"), "{stderr}");
    let stderr = start_failure("sandbox:\n  provder: bwrap\n")?;
    assert!(stderr.contains("provder") && stderr.contains("sandbox"), "{stderr}");
    let stderr = start_failure("sandbx: {}\n")?;
    assert!(stderr.contains("unknown top-level section `sandbx`"), "{stderr}");
    Ok(())
}

#[test]
fn out_of_range_values_name_the_limit() -> anyhow::Result<()> {
    let stderr = start_failure("server:\n  concurrency_limit: 0\n")?;
    assert!(stderr.contains("server.concurrency_limit") && stderr.contains("between 1 and"), "{stderr}");
    Ok(())
}

#[test]
fn config_check_prints_the_resolved_file_with_secrets_masked() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("antler.yaml");
    std::fs::write(&path, "server:\n  auth:\n    enabled: true\n    api_keys:\n      - key: ${ANTLER_TEST_KEY}\n        user: alice\n")?;
    let output = Command::new(binary("antler")?)
        .args(["config", "check", "--config"])
        .arg(&path)
        .env("ANTLER_TEST_KEY", "super-secret-value-123")
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("user: alice") && stdout.contains("****"), "{stdout}");
    assert!(!stdout.contains("super-secret-value-123"), "{stdout}");

    std::fs::write(&path, "server:\n  listn: 1\n")?;
    let output = Command::new(binary("antler")?).args(["config", "check", "--config"]).arg(&path).output()?;
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("listn"));
    Ok(())
}

#[test]
fn the_example_configs_are_valid() -> anyhow::Result<()> {
    for name in ["antler.yaml", "mcp-demo.yaml"] {
        let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name);
        let output = Command::new(binary("antler")?).args(["config", "check", "--config"]).arg(&example).output()?;
        assert!(output.status.success(), "{name}: {}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(())
}
