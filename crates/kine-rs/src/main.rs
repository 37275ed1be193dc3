//! The `kine-rs` binary: flags, logging, signals; everything else is in `app`.

mod app;
mod cli;
mod duration;
mod endpoint;
mod listen;

use clap::Parser;
use tracing_subscriber::EnvFilter;

fn init_logging(cli: &cli::Cli) {
    // async-nats logs every (re)connection at info; kine-rs logs those itself.
    let default = if cli.debug { "debug" } else { "info,async_nats=warn" };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    if cli.log_format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    init_logging(&cli);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kine-rs: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let (trigger, stop) = app::shutdown_channel();
        let signals = tokio::spawn(signals(trigger.clone()));
        let result = app::run(cli, trigger, stop).await;
        signals.abort();
        result
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// First SIGINT/SIGTERM: graceful shutdown. Second: exit at once with status 1.
async fn signals(trigger: kine_core::shutdown::ShutdownTrigger) {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut int, mut term) = match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
        (Ok(i), Ok(t)) => (i, t),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(error = %e, "cannot install SIGINT/SIGTERM handlers");
            return;
        }
    };
    let name = tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    };
    tracing::info!("received {name}; shutting down (send it again to exit at once)");
    trigger.trigger();
    let name = tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    };
    tracing::warn!("received a second {name}; exiting without a clean shutdown");
    std::process::exit(1);
}
