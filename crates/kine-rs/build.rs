//! Records what `kine-rs --version` and the `kine_build_info` metric report: the git commit
//! the binary was built from ("unknown" outside a git checkout) and its cargo features.

fn main() {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=KINE_RS_COMMIT={commit}");
    let features: Vec<String> = std::env::vars()
        .filter_map(|(k, _)| k.strip_prefix("CARGO_FEATURE_").map(|f| f.to_lowercase().replace('_', "-")))
        .filter(|f| f != "default")
        .collect();
    let features = if features.is_empty() { "none".to_string() } else { features.join(",") };
    println!("cargo:rustc-env=KINE_RS_FEATURES={features}");
    // A new commit changes HEAD or the branch it points to.
    let git = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.git");
    for file in ["HEAD", "refs/heads"] {
        let path = git.join(file);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}
