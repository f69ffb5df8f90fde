//! Running the agent binary against a test topology, and reading its maps.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use dataplane_agent::bpf::inspect::{FrontendRow, Inspection};

use crate::netns::{Topology, agent_bin};

/// A running `dataplane-agent` process; killed on drop (its pinned dataplane stays until the
/// topology is dropped).
pub struct Agent {
    child: Option<Child>,
    pub log: PathBuf,
    pub pin_dir: PathBuf,
}

impl Agent {
    /// Starts `dataplane-agent <args> --pin-dir <topology pin dir> --cgroup <topology cgroup>`.
    pub fn start(topo: &Topology, args: &[&str]) -> anyhow::Result<Agent> {
        Self::start_with_env(topo, args, &[])
    }

    /// [`start`](Self::start) with extra environment variables (e.g. `KUBECONFIG`).
    pub fn start_with_env(
        topo: &Topology,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Agent> {
        Self::start_in(topo, &topo.pin_dir, args, env)
    }

    /// [`start_with_env`](Self::start_with_env) with another pin directory than the
    /// topology's (which must contain it, so the topology's cleanup removes it).
    pub fn start_in(
        topo: &Topology,
        pin_dir: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Agent> {
        Self::start_wrapped(topo, pin_dir, &[], args, env)
    }

    /// [`start_in`](Self::start_in), run as `wrapper... dataplane-agent ARGS` (e.g. `setpriv`
    /// with a capability set); the wrappers must `exec` the agent, so that [`pid`](Self::pid)
    /// is the agent's.
    pub fn start_wrapped(
        topo: &Topology,
        pin_dir: &Path,
        wrapper: &[&str],
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Agent> {
        let n = fs::read_dir(&topo.dir).map(|d| d.count()).unwrap_or(0);
        let log = topo.dir.join(format!("agent-{n}.log"));
        let out = fs::File::create(&log)?;
        let mut cmd = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut cmd = Command::new(program);
                cmd.args(rest).arg(agent_bin());
                cmd
            }
            None => Command::new(agent_bin()),
        };
        // The agent takes its flags from MCS_* variables too: only `env` sets any, so that a
        // variable exported where the tests run (MCS_FRONTEND_METRICS=true, say) changes
        // nothing.
        for (key, _) in std::env::vars_os() {
            if key.to_str().is_some_and(|k| k.starts_with("MCS_")) {
                cmd.env_remove(&key);
            }
        }
        let child = crate::netns::die_with_parent(&mut cmd)
            .args(args)
            .arg("--pin-dir")
            .arg(pin_dir)
            .arg("--cgroup")
            .arg(&topo.cgroup)
            .env("RUST_LOG", "info,dataplane_agent=debug")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", agent_bin().display()))?;
        Ok(Agent {
            child: Some(child),
            log,
            pin_dir: pin_dir.to_owned(),
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the process with `signal` and waits for it.
    pub fn kill(&mut self, signal: i32) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill has no memory preconditions; the pid is our child's.
            unsafe { libc::kill(c.id() as i32, signal) };
            let _ = c.wait();
        }
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Waits until the maps satisfy `pred`, or fails with the agent's log after `timeout`.
    pub fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Inspection) -> bool,
    ) -> anyhow::Result<Inspection> {
        self.wait_until(what, timeout, |agent| {
            inspect(&agent.pin_dir).ok().filter(|i| pred(i))
        })
    }

    /// Waits until the agent's log satisfies `pred` (while it runs), or fails with the log
    /// after `timeout`. Returns the log.
    pub fn wait_log(
        &mut self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> anyhow::Result<String> {
        self.wait_until(what, timeout, |agent| {
            Some(agent.log_text()).filter(|log| pred(log))
        })
    }

    /// Polls `check` until it gives a value, while the agent runs and `timeout` lasts.
    fn wait_until<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        check: impl Fn(&Agent) -> Option<T>,
    ) -> anyhow::Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(found) = check(self) {
                return Ok(found);
            }
            if Instant::now() > deadline || !self.running() {
                bail!(
                    "timed out waiting for {what} (agent running: {}); agent log:\n{}",
                    self.running(),
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill(libc::SIGKILL);
    }
}

/// Reads the pinned maps (the same code as `dataplane-agent inspect`).
pub fn inspect(pin_dir: &Path) -> anyhow::Result<Inspection> {
    Ok(dataplane_agent::bpf::inspect::inspect(pin_dir)?)
}

/// Finds a frontend row by `ip` and `port` (0 for the wildcard).
pub fn frontend<'a>(
    i: &'a Inspection,
    ip: &str,
    port: u16,
    protocol: &str,
) -> Option<&'a FrontendRow> {
    i.frontends
        .iter()
        .find(|f| f.ip == ip && f.port == port && f.protocol == protocol)
}

/// A node directory's YAML for one service: `name` (namespace `demo`) at `vip`:80 over TCP,
/// served by cluster a's hosts `10.99.1.<h>` for `h` in `hosts`, on port 8080.
pub fn one_service_yaml(name: &str, vip: &str, hosts: &[u8]) -> String {
    let endpoints: Vec<String> = hosts
        .iter()
        .map(|h| format!("{{addresses: [10.99.1.{h}]}}"))
        .collect();
    format!(
        "apiVersion: multicluster.x-k8s.io/v1beta1\nkind: ServiceImport\n\
         metadata: {{name: {name}, namespace: demo}}\n\
         spec: {{type: ClusterSetIP, ips: [{vip}], ipFamilies: [IPv4], ports: [{{name: http, protocol: TCP, port: 80}}]}}\n\
         ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: {name}-a-ipv4, namespace: demo, labels: {{multicluster.kubernetes.io/service-name: {name}, multicluster.kubernetes.io/source-cluster: a}}}}\n\
         addressType: IPv4\nports: [{{name: http, protocol: TCP, port: 8080}}]\nendpoints: [{}]\n",
        endpoints.join(", ")
    )
}
