//! What this binary is: version, git commit, cargo features (recorded by `build.rs`).

pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const COMMIT: &str = env!("KINE_RS_COMMIT");
pub const FEATURES: &str = env!("KINE_RS_FEATURES");

/// `kine-rs --version`.
pub const LONG: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("KINE_RS_COMMIT"),
    ", features: ",
    env!("KINE_RS_FEATURES"),
    ")"
);
