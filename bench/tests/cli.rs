//! Bad command lines are refused with a message naming the flag, before any connection (no
//! server runs here). Being an integration test, this also makes `cargo test --workspace`
//! build `target/debug/kine-rs-bench`, which `scripts/bench-smoke.sh` runs next in CI.

use std::process::Command;

/// Runs the bench with `args` against a port nothing listens on; returns its stderr.
fn refused(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kine-rs-bench"))
        .args(["--endpoint", "http://127.0.0.1:1"])
        .args(args)
        .output()
        .expect("run kine-rs-bench");
    assert!(!out.status.success(), "{args:?} was accepted");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bad_input_is_refused_with_a_clear_message() {
    for (args, message) in [
        (&["--workload", "watch", "--watchers", "0"][..], "--watchers must be at least 1"),
        (&["--workload", "watch", "--rate", "0"], "--rate must be at least 1"),
        (&["--workload", "watch", "--watchers", "2", "--clients", "3"], "--watchers must be at least --clients"),
        (&["--workload", "watch", "--shape", "k8s"], "--shape k8s does not apply to watch"),
        (&["--workload", "put", "--shape", "k8s"], "--shape k8s does not apply to put"),
        (&["--workload", "get", "--keys", "0"], "--keys must be at least 1 for get"),
        (&["--workload", "delete", "--keys", "0"], "--keys must be at least 1 for delete"),
        (&["--workload", "list", "--shape", "k8s", "--keys", "10000001"], "--keys must be at most 10000000"),
        (&["--workload", "list", "--limit", "0"], "--limit must be at least 1"),
        (&["--workload", "get", "--clients", "0"], "--clients must be at least 1"),
        (&["--workload", "get", "--seconds", "0"], "--seconds must be a number more than 0"),
        (&["--workload", "replay", "--events", "0"], "replay needs --events and --keys of at least 1"),
        (&["--workload", "replay", "--keys", "0"], "replay needs --events and --keys of at least 1"),
        (&["--workload", "replay", "--shape", "k8s"], "--shape k8s does not apply to replay"),
        (&["--workload", "compaction", "--events", "0"], "compaction needs --events and --keys of at least 1"),
        (&["--workload", "compaction", "--keys", "0"], "compaction needs --events and --keys of at least 1"),
        (&["--workload", "compaction", "--shape", "k8s"], "--shape k8s does not apply to compaction"),
        (&["--workload", "compaction", "--seconds", "2"], "--seconds must be more than 2 for compaction"),
        (
            &["--workload", "watch", "--clients", "2", "--slow-clients", "2"],
            "--slow-clients must be fewer than --clients",
        ),
        (&["--workload", "get", "--slow-clients", "1"], "--slow-clients applies to watch only"),
        (&["--workload", "put", "--watch-on", "key"], "--watch-on applies to watch only"),
    ] {
        let stderr = refused(args);
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
}
