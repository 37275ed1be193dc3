//! The process's Prometheus metrics, in one registry that `/metrics` serves. Where kine or etcd
//! has a metric for the same thing its name and labels are used, so existing dashboards keep
//! working; docs/operations.md lists every family. Recording is a few atomic operations; the
//! gauges that describe the datastore (revisions, size) are read when scraped.

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};
use std::sync::LazyLock;

/// For backends that keep a handle to one of the gauges.
pub use prometheus::IntGauge;

pub struct Metrics {
    pub registry: Registry,
    /// Backend operations: `kine_backend_total{backend,operation,error_code}`.
    pub backend_total: IntCounterVec,
    /// `kine_backend_time_seconds{backend,operation}`.
    pub backend_seconds: HistogramVec,
    /// The same observations under kine's SQL names, for SQL datastores.
    pub sql_total: IntCounterVec,
    pub sql_seconds: HistogramVec,
    /// Backend operations slower than `--slow-sql-threshold`.
    pub slow_total: IntCounterVec,
    /// 1 while the backend's connection to its datastore works, per connection role.
    pub backend_connected: IntGaugeVec,
    /// kine's `kine_compact_total{result}`: automatic and requested compactions.
    pub compact_total: IntCounterVec,
    pub compaction_ms: Histogram,
    pub current_revision: IntGauge,
    pub compact_revision: IntGauge,
    pub db_size: IntGauge,
    pub db_size_in_use: IntGauge,
    pub watch_streams: IntGauge,
    /// RangeStream RPCs being answered (their tasks).
    pub range_streams: IntGauge,
    pub watchers: IntGauge,
    pub events_sent: IntCounter,
    pub progress_sent: IntCounter,
    /// Watches sent back to history because their client read too slowly (kine-rs never
    /// cancels a slow watcher; it catches up from the log instead).
    pub slow_watcher_resyncs: IntCounter,
    /// NATS: read barriers that waited beyond the stream leader's stored last sequence, by why
    /// (`leader_applying`: the leader in this process had committed entries it had not applied;
    /// `proposals`: the leader had accepted writes it had not stored yet). Each is a read that
    /// would have missed a write another node may already have served.
    pub barrier_waits: IntCounterVec,
    pub leases_granted: IntCounter,
    pub leases_revoked: IntCounter,
    pub leases_renewed: IntCounter,
    pub leases_expired: IntCounter,
    pub leases_alive: IntGauge,
    pub grpc_started: IntCounterVec,
    pub grpc_handled: IntCounterVec,
    pub grpc_seconds: HistogramVec,
    pub health_success: IntCounter,
    pub health_failures: IntCounter,
    /// etcd's: 1 while this node serves a read-only copy (or a superseded datastore).
    pub is_learner: IntGauge,
    /// A read-only copy's distance to its origin (docs/nats.md, "Lag"); 0 elsewhere.
    pub copy_lag_revisions: IntGauge,
    pub copy_lag_seconds: prometheus::Gauge,
    pub copy_link_up: IntGauge,
    pub copy_last_contact_seconds: prometheus::Gauge,
    pub build_info: IntGaugeVec,
    pub server_version: IntGaugeVec,
    pub process_cpu_seconds: prometheus::Gauge,
    pub process_resident_bytes: IntGauge,
    pub process_open_fds: IntGauge,
    pub process_start_time: IntGauge,
    pub runtime_tasks: IntGauge,
}

/// kine's SQL latency buckets (etcd's backend commit buckets): 1 ms … 8.192 s.
fn kine_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(0.001, 2.0, 14).expect("valid buckets")
}

impl Metrics {
    fn new() -> prometheus::Result<Metrics> {
        let registry = Registry::new();
        let counter_vec = |name: &str, help: &str, labels: &[&str]| -> prometheus::Result<IntCounterVec> {
            let c = IntCounterVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let counter = |name: &str, help: &str| -> prometheus::Result<IntCounter> {
            let c = IntCounter::new(name, help)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let gauge = |name: &str, help: &str| -> prometheus::Result<IntGauge> {
            let g = IntGauge::new(name, help)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| -> prometheus::Result<IntGaugeVec> {
            let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let histogram_vec =
            |name: &str, help: &str, labels: &[&str], buckets: Vec<f64>| -> prometheus::Result<HistogramVec> {
                let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)?;
                registry.register(Box::new(h.clone()))?;
                Ok(h)
            };
        let grpc = ["grpc_type", "grpc_service", "grpc_method"];
        let cpu =
            prometheus::Gauge::new("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.")?;
        registry.register(Box::new(cpu.clone()))?;
        let compaction_ms = Histogram::with_opts(
            HistogramOpts::new(
                "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds",
                "Bucketed histogram of db compaction total duration.",
            )
            .buckets(prometheus::exponential_buckets(100.0, 2.0, 14)?),
        )?;
        registry.register(Box::new(compaction_ms.clone()))?;
        let float_gauge = |name: &str, help: &str| -> prometheus::Result<prometheus::Gauge> {
            let g = prometheus::Gauge::new(name, help)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        Ok(Metrics {
            backend_total: counter_vec(
                "kine_backend_total",
                "Backend operations by datastore, operation and error code (empty on success).",
                &["backend", "operation", "error_code"],
            )?,
            backend_seconds: histogram_vec(
                "kine_backend_time_seconds",
                "Length of time per backend operation.",
                &["backend", "operation"],
                kine_buckets(),
            )?,
            sql_total: counter_vec("kine_sql_total", "Total number of SQL operations", &["name", "error_code"])?,
            sql_seconds: histogram_vec(
                "kine_sql_time_seconds",
                "Length of time per SQL operation",
                &["name", "error_code"],
                kine_buckets(),
            )?,
            slow_total: counter_vec(
                "kine_backend_slow_total",
                "Backend operations slower than --slow-sql-threshold.",
                &["backend", "operation"],
            )?,
            backend_connected: gauge_vec(
                "kine_backend_connected",
                "1 while the connection to the datastore works (per connection role), else 0.",
                &["backend", "connection"],
            )?,
            compact_total: counter_vec("kine_compact_total", "Total number of compactions", &["result"])?,
            compaction_ms,
            current_revision: gauge("etcd_debugging_mvcc_current_revision", "The current revision of store.")?,
            compact_revision: gauge(
                "etcd_debugging_mvcc_compact_revision",
                "The revision of the last compaction in store.",
            )?,
            db_size: gauge(
                "etcd_mvcc_db_total_size_in_bytes",
                "Total size of the underlying database physically allocated in bytes.",
            )?,
            db_size_in_use: gauge(
                "etcd_mvcc_db_total_size_in_use_in_bytes",
                "Total size of the underlying database logically in use in bytes.",
            )?,
            watch_streams: gauge("etcd_debugging_mvcc_watch_stream_total", "Total number of watch streams.")?,
            watchers: gauge("etcd_debugging_mvcc_watcher_total", "Total number of watchers.")?,
            range_streams: gauge("kine_range_streams", "RangeStream RPCs being answered.")?,
            events_sent: counter("etcd_debugging_mvcc_events_total", "Total number of events sent by this member.")?,
            progress_sent: counter(
                "kine_watch_progress_notifications_total",
                "Watch progress notifications sent (periodic and requested).",
            )?,
            slow_watcher_resyncs: counter(
                "kine_watch_slow_resyncs_total",
                "Watch streams that fell behind the live feed and caught up from history.",
            )?,
            barrier_waits: counter_vec(
                "kine_nats_read_barrier_waits_total",
                "NATS read barriers that waited for writes beyond the stream leader's stored last sequence.",
                &["reason"],
            )?,
            leases_granted: counter("etcd_debugging_lease_granted_total", "The total number of granted leases.")?,
            leases_revoked: counter("etcd_debugging_lease_revoked_total", "The total number of revoked leases.")?,
            leases_renewed: counter(
                "etcd_debugging_lease_renewed_total",
                "The number of renewed leases seen by the leader.",
            )?,
            leases_expired: counter(
                "etcd_debugging_server_lease_expired_total",
                "The total number of expired leases.",
            )?,
            leases_alive: gauge("kine_leases_alive", "Leases this node tracks.")?,
            grpc_started: counter_vec(
                "grpc_server_started_total",
                "Total number of RPCs started on the server.",
                &grpc,
            )?,
            grpc_handled: counter_vec(
                "grpc_server_handled_total",
                "Total number of RPCs completed on the server, regardless of success or failure.",
                &["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
            )?,
            grpc_seconds: histogram_vec(
                "grpc_server_handling_seconds",
                "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
                &grpc,
                prometheus::DEFAULT_BUCKETS.to_vec(),
            )?,
            health_success: counter("etcd_server_health_success", "The total number of successful health checks")?,
            health_failures: counter("etcd_server_health_failures", "The total number of failed health checks")?,
            is_learner: gauge(
                "etcd_server_is_learner",
                "Whether or not this member is a learner. 1 if is, 0 otherwise.",
            )?,
            copy_lag_revisions: gauge(
                "kine_copy_lag_revisions",
                "Read-only copy: revisions its origin holds that it has not applied yet.",
            )?,
            copy_lag_seconds: float_gauge(
                "kine_copy_lag_seconds",
                "Read-only copy: 0 when up to date, else the age of the newest change it applied (origin's clock).",
            )?,
            copy_link_up: gauge("kine_copy_link_up", "Read-only copy: 1 while the link to its origin works, else 0.")?,
            copy_last_contact_seconds: float_gauge(
                "kine_copy_last_contact_seconds",
                "Read-only copy: seconds since it last heard from its origin (-1: never).",
            )?,
            build_info: gauge_vec(
                "kine_build_info",
                "kine-rs build: version, commit and cargo features; always 1.",
                &["version", "commit", "features"],
            )?,
            server_version: gauge_vec(
                "etcd_server_version",
                "Which version is running. 1 for 'server_version' label with current version.",
                &["server_version"],
            )?,
            process_cpu_seconds: cpu,
            process_resident_bytes: gauge("process_resident_memory_bytes", "Resident memory size in bytes.")?,
            process_open_fds: gauge("process_open_fds", "Number of open file descriptors.")?,
            process_start_time: gauge(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
            )?,
            runtime_tasks: gauge(
                "kine_runtime_alive_tasks",
                "Tasks alive in kine-rs's async runtime: flat over time unless work is leaking.",
            )?,
            registry,
        })
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics::new().expect("metric definitions are valid"));

pub fn metrics() -> &'static Metrics {
    &METRICS
}

/// Reads this process's CPU time, resident memory and open files from `/proc` into the gauges
/// (called when scraped; silently skipped where `/proc` is missing).
pub fn refresh_process() {
    let m = metrics();
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat")
        && let Some((_, rest)) = stat.rsplit_once(')')
    {
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
        // utime, stime (fields 14, 15 of the line) in USER_HZ ticks; starttime (22) too.
        m.process_cpu_seconds.set((num(11) + num(12)) / 100.0);
        if let Some(boot) = boot_time() {
            m.process_start_time.set(boot + (num(19) / 100.0) as i64);
        }
    }
    if let Ok(status) = std::fs::read_to_string("/proc/self/status")
        && let Some(kib) = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<i64>().ok())
    {
        m.process_resident_bytes.set(kib * 1024);
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        m.process_open_fds.set(dir.count() as i64);
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        m.runtime_tasks.set(runtime.metrics().num_alive_tasks() as i64);
    }
}

fn boot_time() -> Option<i64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
}

/// The registry in Prometheus's text format.
pub fn render() -> String {
    refresh_process();
    let families = metrics().registry.gather();
    let mut out = String::new();
    if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&families, &mut out) {
        tracing::warn!(error = %e, "cannot encode metrics");
    }
    out
}
