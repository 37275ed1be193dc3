//! The `--s3-*` flags (what they do: `crate::s3`, docs/s3.md).

use std::time::Duration;

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = kine_core::duration::parse(s)?;
    if d.is_zero() {
        return Err("must be greater than 0".into());
    }
    Ok(d)
}

/// kine's t4 flag names where they exist.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct S3Args {
    /// S3 bucket that keeps a copy of the SQLite datastore (WAL segments and checkpoints);
    /// an empty database is restored from it at start. docs/s3.md
    #[arg(long, env = "KINE_S3_BUCKET")]
    pub s3_bucket: Option<String>,
    /// Folder (key prefix) in the bucket; one store per folder
    #[arg(long, env = "KINE_S3_FOLDER", default_value = "")]
    pub s3_folder: String,
    /// S3-compatible server URL (MinIO, Ceph, versitygw…), addressed path-style; default: AWS
    #[arg(long, env = "KINE_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// Region (default: AWS_REGION, else us-east-1)
    #[arg(long, env = "KINE_S3_REGION")]
    pub s3_region: Option<String>,
    /// PEM file of the CA certificates to trust for an HTTPS --s3-endpoint (instead of the
    /// system's)
    #[arg(long, env = "KINE_S3_CA_BUNDLE")]
    pub s3_ca_bundle: Option<std::path::PathBuf>,
    /// Access key (default: AWS_ACCESS_KEY_ID, then the AWS SDK's chain: profile files, web
    /// identity, ECS, EC2 instance role)
    #[arg(long, env = "KINE_S3_ACCESS_KEY")]
    pub s3_access_key: Option<String>,
    /// Secret key (default: AWS_SECRET_ACCESS_KEY)
    #[arg(long, env = "KINE_S3_SECRET_KEY", hide_env_values = true)]
    pub s3_secret_key: Option<String>,
    /// Session token (default: AWS_SESSION_TOKEN)
    #[arg(long, env = "KINE_S3_SESSION_TOKEN", hide_env_values = true)]
    pub s3_session_token: Option<String>,
    /// Acknowledge a write only once it is in S3 (RPO 0; each write waits for an upload)
    #[arg(long, env = "KINE_S3_SYNC")]
    pub s3_sync: bool,
    /// Without --s3-sync: a write is in S3 at most this long after it was acknowledged (RPO)
    #[arg(long, env = "KINE_S3_SHIP_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub s3_ship_interval: Duration,
    /// How often a full checkpoint is written (older segments and checkpoints are then removed)
    #[arg(long, env = "KINE_S3_CHECKPOINT_INTERVAL", default_value = "1h", value_parser = parse_duration)]
    pub s3_checkpoint_interval: Duration,
    /// A checkpoint is also written once this many WAL segments were shipped since the last
    /// one (a restore then reads at most about as many)
    #[arg(long, env = "KINE_S3_CHECKPOINT_SEGMENTS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub s3_checkpoint_segments: u64,
    /// The S3 writer lock's lease: a node that stopped renewing it is replaced after this
    #[arg(long, env = "KINE_S3_LOCK_LEASE", default_value = "10s", value_parser = parse_duration)]
    pub s3_lock_lease: Duration,
}
