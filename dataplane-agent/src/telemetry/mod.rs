//! Telemetry. Logging here: `tracing` with fields, as text or JSON; `log` records (aya-log's
//! eBPF logs) are forwarded into `tracing`. [`metrics`]: Prometheus metrics; [`server`]: the
//! `/metrics`, `/healthz` and `/readyz` endpoints.

pub mod metrics;
pub mod server;

use std::{
    sync::{Mutex, PoisonError},
    time::Duration,
};

use tokio::time::Instant;
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// Keeps a repeated warning to one at WARN per [`WarnLimit::INTERVAL`] (the others go to
/// DEBUG): a failure that cannot clear by itself (a watch without its RBAC rule, a DNS
/// client over its limit) would otherwise fill the log.
#[derive(Debug, Default)]
pub struct WarnLimit {
    last: Mutex<Option<Instant>>,
}

impl WarnLimit {
    /// The least time between two warnings of one kind.
    pub const INTERVAL: Duration = Duration::from_secs(600);

    /// Whether to log at WARN now (and count it as the last warning).
    pub fn now(&self) -> bool {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.is_some_and(|at| at.elapsed() < Self::INTERVAL) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }
}

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Installs the global subscriber. The filter comes from `RUST_LOG` (default `info`).
pub fn init(format: LogFormat) {
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // hickory-server logs every DNS query at info: too much for a node's log, unless asked for.
    if !std::env::var("RUST_LOG").is_ok_and(|v| v.contains("hickory"))
        && let Ok(quiet) = "hickory_server=warn".parse()
    {
        filter = filter.add_directive(quiet);
    }
    let registry = tracing_subscriber::registry().with(filter);
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let installed = match format {
        LogFormat::Text => registry
            .with(fmt::layer().with_ansi(ansi).with_writer(std::io::stderr))
            .try_init(),
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
    if installed.is_ok() {
        let _ = tracing_log::LogTracer::init();
    }
}
