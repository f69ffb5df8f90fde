//! The agent's command line on bad input (no root: each case fails before loading anything).

use std::process::Command;

use tests::netns::agent_bin;

/// Runs the agent with `args` and `env`; its exit success and stderr.
fn agent(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(agent_bin());
    for (key, _) in std::env::vars_os() {
        if key
            .to_str()
            .is_some_and(|k| k.starts_with("MCS_") || k.starts_with("POD_"))
        {
            cmd.env_remove(&key);
        }
    }
    let out = cmd
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run the agent");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A fatal error is printed once, its causes without repeats.
#[test]
fn a_fatal_error_is_one_line_without_repeated_causes() {
    let (ok, err) = agent(&["run", "--clusterset-dir", "/nonexistent/clusterset"], &[]);
    assert!(!ok);
    assert_eq!(
        err,
        "error: reading the clusterset directory: cannot read /nonexistent/clusterset: No such \
         file or directory (os error 2)\n"
    );
}

/// The pod's environment (POD_NAME and friends, which the manifests set) does not make
/// standalone mode's flags conflict.
#[test]
fn kubernetes_environment_variables_do_not_conflict_with_standalone() {
    let env = [
        ("POD_NAME", "agent-0"),
        ("POD_NAMESPACE", "mcs-system"),
        ("MCS_ROLES", "node"),
        ("MCS_FRONTEND_METRICS", "false"),
    ];
    let (ok, err) = agent(
        &["run", "--clusterset-dir", "/nonexistent/clusterset"],
        &env,
    );
    assert!(!ok);
    assert!(!err.contains("cannot be used with"), "{err}");
    assert!(err.contains("cannot read /nonexistent/clusterset"), "{err}");
}

/// A map size of 0 is refused by name, before any map is created.
#[test]
fn zero_map_sizes_are_refused_by_name() {
    for flag in [
        "--max-frontends",
        "--max-slots",
        "--max-affinity",
        "--max-revnat",
    ] {
        let (ok, err) = agent(&["node", "--from-dir", "/nonexistent", flag, "0"], &[]);
        assert!(!ok);
        assert!(
            err.contains(&format!("invalid value '0' for '{flag}")),
            "{err}"
        );
    }
}

/// Under `--log-format json` the error is a JSON log line; when RUST_LOG filters errors out
/// it is printed all the same.
#[test]
fn a_fatal_error_is_printed_whatever_the_log_filter() {
    let args = [
        "--log-format",
        "json",
        "run",
        "--clusterset-dir",
        "/nonexistent/x",
    ];
    let (ok, err) = agent(&args, &[]);
    assert!(!ok);
    assert!(
        err.starts_with('{') && err.contains(r#""level":"ERROR""#),
        "{err}"
    );
    let (ok, err) = agent(&args, &[("RUST_LOG", "off")]);
    assert!(!ok);
    assert!(
        err.contains("error: reading the clusterset directory"),
        "{err}"
    );
}

/// Kubernetes-mode flags typed with `run --clusterset-dir` are refused by name (their
/// environment variables are not: see above).
#[test]
fn kubernetes_flags_on_the_command_line_are_refused_in_standalone() {
    let (ok, err) = agent(
        &[
            "run",
            "--clusterset-dir",
            "/nonexistent/x",
            "--roles",
            "controller",
            "--identity",
            "a",
        ],
        &[],
    );
    assert!(!ok);
    assert!(
        err.contains(
            "error: --identity, --roles: Kubernetes mode only (--config), not with --clusterset-dir"
        ),
        "{err}"
    );
}

/// A printing command whose reader is gone (`plan ... | head -c1`) ends as command-line tools
/// do, by SIGPIPE, without a panic message.
#[test]
fn a_closed_pipe_ends_a_printing_command_quietly() {
    use std::os::unix::process::ExitStatusExt as _;
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = Command::new(agent_bin())
        .arg("crds")
        .stdout(writer)
        .output()
        .expect("run the agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?} {stderr}",
        out.status
    );
}
