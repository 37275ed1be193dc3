//! The program's flags before or after the subcommand (issue #41, as etcdutl takes them):
//! `kine-rs snapshot restore FILE --endpoint sqlite://…` restores as `kine-rs --endpoint
//! sqlite://… snapshot restore FILE` and `KINE_ENDPOINT=… kine-rs snapshot restore FILE` do, and
//! so for `inspect`, `migrate` and `s3-restore` (the datastore, logging and S3 flags); a flag
//! given both before and after the subcommand is refused naming it.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

/// kine-rs with `args` and the `KINE_*` variables `env` (none inherited from the test's
/// environment for the flags used here).
fn kine_rs(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = Command::new(server_bin());
    for var in ["KINE_ENDPOINT", "KINE_LOG_FORMAT", "KINE_S3_BUCKET", "KINE_DEBUG", "RUST_LOG"] {
        cmd.env_remove(var);
    }
    cmd.args(args).envs(env.iter().copied());
    run(&mut cmd)
}

fn sqlite(path: &Path) -> String {
    format!("sqlite://{}", path.display())
}

/// A kine-rs snapshot of a few keys (etcdctl snapshot save).
async fn snapshot(dir: &Path) -> std::path::PathBuf {
    let (server, source) = sqlite_server(&[]);
    let mut c = server.client().await;
    for i in 0..5 {
        c.put(format!("/registry/pods/p{i}"), format!("pod {i}"), None).await.unwrap();
    }
    c.delete("/registry/pods/p3", None).await.unwrap();
    let file = dir.join("backup.db");
    let (ok, out, err) = run(Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &server.url, "snapshot", "save"])
        .arg(&file));
    assert!(ok, "etcdctl snapshot save: {out}{err}");
    drop(server);
    drop(source);
    file
}

/// The keys and values `kine-rs inspect list --values` prints for a datastore (flags after the
/// subcommand).
fn listed(endpoint: &str) -> String {
    let (ok, out, err) = kine_rs(&["inspect", "list", "--values", "--endpoint", endpoint], &[]);
    assert!(ok, "inspect list --endpoint {endpoint}: {err}");
    out
}

#[tokio::test]
async fn snapshot_restore_and_inspect_take_the_endpoint_before_or_after_the_subcommand_or_from_the_environment() {
    let dir = TempDir::new("flag-positions");
    let file = snapshot(dir.path()).await;
    let file = file.to_str().unwrap();
    let [after, before, env] = ["after.db", "before.db", "env.db"].map(|name| sqlite(&dir.path().join(name)));

    let (ok, _, err) = kine_rs(&["snapshot", "restore", file, "--endpoint", &after], &[]);
    assert!(ok && err.contains("snapshot restored"), "{err}");
    let (ok, _, err) = kine_rs(&["--endpoint", &before, "snapshot", "restore", file], &[]);
    assert!(ok && err.contains("snapshot restored"), "{err}");
    let (ok, _, err) = kine_rs(&["snapshot", "restore", file], &[("KINE_ENDPOINT", &env)]);
    assert!(ok && err.contains("snapshot restored"), "{err}");
    for name in ["after.db", "before.db", "env.db"] {
        assert!(dir.path().join(name).is_file(), "{name} restored where its --endpoint said");
    }

    // The same keys in each, read with the flag after, before and from the environment.
    let expected = listed(&after);
    assert!(expected.contains("/registry/pods/p4") && !expected.contains("/registry/pods/p3"), "{expected}");
    assert_eq!(listed(&before), expected);
    let (ok, out, err) = kine_rs(&["--endpoint", &env, "inspect", "list", "--values"], &[]);
    assert!(ok, "{err}");
    assert_eq!(out, expected);
    let (ok, out, err) = kine_rs(&["inspect", "list", "--values"], &[("KINE_ENDPOINT", &env)]);
    assert!(ok, "{err}");
    assert_eq!(out, expected);
    // A flag wins over its variable in either position.
    let (ok, out, err) =
        kine_rs(&["inspect", "list", "--values", "--endpoint", &after], &[("KINE_ENDPOINT", "sqlite:///nowhere")]);
    assert!(ok, "{err}");
    assert_eq!(out, expected);
    // A program flag after a subcommand's own options, and the subcommand's option after it.
    let (ok, out, err) = kine_rs(
        &["inspect", "--output", "json", "get", "/registry/pods/p1", "--log-format", "json", "--endpoint", &after],
        &[],
    );
    assert!(ok, "{err}");
    assert!(out.starts_with('{') && out.contains("\"key\""), "{out}");
}

#[tokio::test]
async fn migrate_takes_the_program_s_flags_before_or_after_it() {
    let dir = TempDir::new("flag-positions-migrate");
    let file = snapshot(dir.path()).await;
    let source = sqlite(&dir.path().join("source.db"));
    let (ok, _, err) = kine_rs(&["snapshot", "restore", file.to_str().unwrap(), "--endpoint", &source], &[]);
    assert!(ok, "{err}");
    let expected = listed(&source);
    for (name, args) in [
        ("after.db", vec!["migrate", "--from", &source, "--to", "TARGET", "--log-format", "json"]),
        ("before.db", vec!["--log-format", "json", "migrate", "--from", &source, "--to", "TARGET"]),
    ] {
        let target = sqlite(&dir.path().join(name));
        let args: Vec<&str> = args.iter().map(|a| if *a == "TARGET" { target.as_str() } else { a }).collect();
        let (ok, _, err) = kine_rs(&args, &[]);
        assert!(ok, "{args:?}: {err}");
        // --log-format json: every line kine-rs logged is a JSON object.
        assert!(!err.trim().is_empty(), "{args:?} logged nothing");
        for line in err.lines() {
            assert!(line.starts_with('{') && line.ends_with('}'), "{args:?}: not JSON: {line}");
        }
        assert_eq!(listed(&target), expected, "{args:?}");
    }
    let target = sqlite(&dir.path().join("env.db"));
    let (ok, _, err) = kine_rs(&["migrate", "--from", &source, "--to", &target], &[("KINE_LOG_FORMAT", "json")]);
    assert!(ok && err.lines().all(|l| l.starts_with('{')), "{err}");
}

/// `s3-restore` reads --s3-bucket and --endpoint in either position (and their variables): an
/// existing database is refused before S3 is asked anything.
#[test]
fn s3_restore_takes_the_program_s_flags_before_or_after_it() {
    let dir = TempDir::new("flag-positions-s3");
    let existing = dir.path().join("state.db");
    std::fs::write(&existing, b"").unwrap();
    let endpoint = sqlite(&existing);
    let refusal = format!("--endpoint: {} exists; s3-restore writes a new database", existing.display());
    for (args, env) in [
        (vec!["s3-restore", "--s3-bucket", "b", "--endpoint", &endpoint], vec![]),
        (vec!["--s3-bucket", "b", "--endpoint", &endpoint, "s3-restore"], vec![]),
        (vec!["--s3-bucket", "b", "s3-restore", "--endpoint", &endpoint], vec![]),
        (vec!["s3-restore"], vec![("KINE_S3_BUCKET", "b"), ("KINE_ENDPOINT", endpoint.as_str())]),
    ] {
        let (ok, _, err) = kine_rs(&args, &env);
        assert!(!ok && err.contains(&refusal), "{args:?} {env:?}: {err}");
    }
    let (ok, _, err) = kine_rs(&["s3-restore", "--endpoint", &endpoint], &[]);
    assert!(!ok && err.contains("s3-restore needs --s3-bucket"), "{err}");
}

/// A flag given both before and after the subcommand: an error naming it (status 2, as clap's
/// other usage errors), whatever the subcommand.
#[test]
fn a_flag_before_and_after_the_subcommand_is_refused_naming_it() {
    for (args, flag, sub) in [
        (
            &["--endpoint", "sqlite://a.db", "snapshot", "restore", "f", "--endpoint", "sqlite://b.db"][..],
            "--endpoint",
            "snapshot",
        ),
        (&["--endpoint", "sqlite://a.db", "inspect", "status", "--endpoint", "sqlite://a.db"], "--endpoint", "inspect"),
        (&["--debug", "migrate", "--from", "sqlite://a.db", "--to", "sqlite://b.db", "--debug"], "--debug", "migrate"),
        (&["--s3-bucket=x", "s3-restore", "--s3-bucket=y"], "--s3-bucket", "s3-restore"),
    ] {
        let out = Command::new(server_bin()).args(args).env("KINE_METRICS_BIND_ADDRESS", "0").output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(&format!("error: {flag} is given both before and after the subcommand {sub}; give it once")),
            "{args:?}: {err}"
        );
    }
}
