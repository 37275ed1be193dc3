//! The `kine-rs` binary: flags, logging, signals; everything else is in `app`.

mod app;
mod cli;
mod datastore;
#[cfg(feature = "embedded-nats")]
mod embedded;
mod endpoint;
#[cfg(feature = "embedded-nats")]
mod etcd_snapshot;
mod health_probe;
mod inspect;
mod listen;
mod metrics_http;
mod migrate;
mod notify;
mod restore;
mod s3;
mod self_docs;
mod tls_config;
mod version;

use tracing_subscriber::EnvFilter;

fn init_logging(cli: &cli::Cli) {
    // async-nats logs every (re)connection at info, and the PostgreSQL client every server notice
    // ("relation kv already exists, skipping" at each start); kine-rs logs what matters itself.
    let default = if cli.debug { "debug" } else { "info,async_nats=warn,postgres=warn" };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    if cli.log_format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// The exit status of a command that ran to `result`; an error is logged.
fn ended(result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::from_args();
    init_logging(&cli);
    match &cli.command {
        Some(cli::Command::Snapshot(cli::SnapshotCommand::Restore { file })) => {
            return ended(restore::run(&cli.endpoint, file));
        }
        Some(cli::Command::Health) => return ended(health_probe::run(&cli)),
        Some(cli::Command::Completions { shell }) => {
            return ended(self_docs::completions(*shell, &mut std::io::stdout().lock()));
        }
        Some(cli::Command::Man { dir }) => return ended(self_docs::man(dir.as_deref())),
        _ => {}
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kine-rs: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let other = match &cli.command {
        Some(cli::Command::Inspect { output, what }) => Some(runtime.block_on(inspect::run(&cli, *output, what))),
        Some(cli::Command::S3Restore { revision }) => Some(runtime.block_on(s3::restore(&cli, *revision))),
        Some(cli::Command::Migrate { from, to, current_only, to_go_kine, dry_run }) => {
            let how = migrate::How { current_only: *current_only, to_go_kine: *to_go_kine, dry_run: *dry_run };
            Some(runtime.block_on(migrate::run(&cli, from, to, how)))
        }
        _ => None,
    };
    if let Some(result) = other {
        return ended(result);
    }
    let result = runtime.block_on(async {
        let (trigger, stop) = app::shutdown_channel();
        let signals = tokio::spawn(signals(trigger.clone()));
        let result = app::run(cli, trigger, stop).await;
        signals.abort();
        result
    });
    ended(result)
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
    add_sa_onstack(&[libc::SIGINT, libc::SIGTERM]);
    let name = tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    };
    tracing::info!("received {name}; shutting down (send it again to exit at once)");
    notify::notify("STOPPING=1");
    trigger.trigger();
    let name = tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    };
    tracing::warn!("received a second {name}; exiting without a clean shutdown");
    std::process::exit(1);
}

/// The Go runtime of the embedded nats-server requires every signal handler installed by
/// non-Go code to run on the alternate signal stack (`SA_ONSTACK`); tokio's handlers do not
/// ask for it. Re-installs each handler with the flag added.
#[allow(unsafe_code)]
fn add_sa_onstack(signals: &[libc::c_int]) {
    for &signal in signals {
        // SAFETY: reads the current disposition into a zeroed sigaction and writes it back with
        // one flag added; the handler and mask are unchanged.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut action) != 0 {
                continue;
            }
            if action.sa_flags & libc::SA_ONSTACK == 0 {
                action.sa_flags |= libc::SA_ONSTACK;
                if libc::sigaction(signal, &action, std::ptr::null_mut()) != 0 {
                    tracing::warn!(signal, "cannot set SA_ONSTACK on a signal handler");
                }
            }
        }
    }
}
