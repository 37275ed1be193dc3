//! Moving a JetStream stream's leader, for the fault runs that want it on a given server.

use anyhow::Context;
use std::time::Duration;

/// Moves `stream`'s leader to the server named `leader` (a stepdown with a preferred server)
/// and waits until it leads.
pub async fn place_leader(
    servers: &[String],
    credentials: Option<(&str, &str)>,
    stream: &str,
    leader: &str,
) -> anyhow::Result<()> {
    let addrs = servers.iter().map(|s| s.parse::<async_nats::ServerAddr>()).collect::<Result<Vec<_>, _>>()?;
    let options = match credentials {
        Some((user, password)) => async_nats::ConnectOptions::with_user_and_password(user.into(), password.into()),
        None => async_nats::ConnectOptions::new(),
    };
    let client = options.connect(addrs).await.with_context(|| format!("connect to {servers:?}"))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let info = client.request(format!("$JS.API.STREAM.INFO.{stream}"), "".into()).await.context("STREAM.INFO")?;
        let info: serde_json::Value = serde_json::from_slice(&info.payload)?;
        if info["cluster"]["leader"] == leader {
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "{stream}'s leader is still {}",
            info["cluster"]["leader"]
        );
        let request = serde_json::json!({ "placement": { "preferred": leader } }).to_string();
        let _ = client.request(format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}"), request.into()).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
