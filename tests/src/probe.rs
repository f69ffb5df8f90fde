//! What `mcs-probe` reports, and helpers to summarise it.

use std::collections::BTreeMap;

use anyhow::{Context as _, bail};
use serde::Deserialize;

/// One connect (TCP) or request (UDP).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Attempt {
    pub i: u64,
    pub ok: bool,
    /// The backend's answer: `<cluster>/<ipv4 endpoint> <local addr>`.
    #[serde(default)]
    pub reply: Option<String>,
    /// `getpeername()` of the connected socket.
    #[serde(default)]
    pub peer: Option<String>,
    /// The source `recvfrom()` reported (UDP).
    #[serde(default)]
    pub from: Option<String>,
    #[serde(default)]
    pub errno: Option<i32>,
    #[serde(default)]
    pub error: Option<String>,
    pub start_us: u64,
    pub end_us: u64,
}

impl Attempt {
    /// The answering backend's identity, `<cluster>/<ipv4 endpoint>`.
    pub fn backend(&self) -> Option<&str> {
        self.reply.as_deref()?.split_whitespace().next()
    }

    /// The answering cluster.
    pub fn cluster(&self) -> Option<&str> {
        self.backend()?.split('/').next()
    }
}

/// Parses the probe's output; fails if it did not finish.
pub fn parse(stdout: &str, stderr: &str) -> anyhow::Result<Vec<Attempt>> {
    let mut attempts = Vec::new();
    let mut done = false;
    for line in stdout.lines().filter(|l| !l.trim().is_empty()) {
        if line.contains("\"done\"") {
            done = true;
            continue;
        }
        if line.contains("\"holding\"") {
            continue;
        }
        attempts.push(serde_json::from_str(line).with_context(|| format!("probe line {line:?}"))?);
    }
    if !done {
        bail!("mcs-probe did not finish: {stderr}");
    }
    Ok(attempts)
}

/// `getpeername()` of every socket `mcs-probe --hold` held, read again after all its attempts.
pub fn held_peers(stdout: &str) -> anyhow::Result<Vec<Option<String>>> {
    #[derive(Deserialize)]
    struct Done {
        held_peers: Vec<Option<String>>,
    }
    let line = stdout
        .lines()
        .find(|l| l.contains("\"held_peers\""))
        .context("mcs-probe printed no held_peers (was it run with --hold?)")?;
    Ok(serde_json::from_str::<Done>(line)?.held_peers)
}

/// How many attempts each cluster answered, with failures counted under `error:<errno>`.
pub fn by_cluster(attempts: &[Attempt]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for a in attempts {
        let key = match (a.ok, a.cluster()) {
            (true, Some(c)) => c.to_owned(),
            _ => format!("error:{}", a.errno.unwrap_or(-1)),
        };
        *out.entry(key).or_default() += 1;
    }
    out
}

/// How many attempts each backend answered.
pub fn by_backend(attempts: &[Attempt]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for a in attempts.iter().filter(|a| a.ok) {
        *out.entry(a.backend().unwrap_or("?").to_owned())
            .or_default() += 1;
    }
    out
}
