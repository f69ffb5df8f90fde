//! Test topologies in network namespaces, a child cgroup and a private bpffs pin directory.
//!
//! Safety (see DEVELOPERS.md): every namespace holds only `lo` and the test's own veths; veths
//! are created inside the namespaces (never in the root namespace); no namespace has a default
//! route, so a VIP the programs do not rewrite fails with ENETUNREACH and never leaves the
//! machine. Programs attach to a child cgroup that only the probe processes join. Everything
//! is removed on drop, and leftovers of crashed runs (dead owner pid) are removed on start.
//!
//! Cluster `i` (1-based, in the order given) owns `10.99.i.0/24` and `fd00:99:i::/64`; its
//! endpoint `h` is `10.99.i.h` / `fd00:99:i::h`. The client side of each veth is `.1`.

use std::{
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Mutex, MutexGuard,
        atomic::{AtomicU32, Ordering},
    },
};

use anyhow::{Context as _, bail};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Topologies of one test binary take turns: the tests measure what reaches which backend,
/// and running them side by side on a small machine only adds timeouts and noise.
static SERIAL: Mutex<()> = Mutex::new(());

/// Makes a spawned child die with the test process, even when the test process is killed
/// before it can clean up.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        })
    }
}

/// Runs a command and fails with its stderr when it fails.
pub fn sh(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether this process can run the privileged tests (root, bpffs, cgroup2).
pub fn privileged() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Skips (returns early from) a test that needs root, loudly, so a non-root run is not
/// mistaken for a pass. `cargo xtask test` always runs as root and sets MCS_REQUIRE_ROOT=1,
/// which turns the skip into a failure.
#[macro_export]
macro_rules! require_root {
    () => {
        if !$crate::netns::privileged() {
            if std::env::var_os("MCS_REQUIRE_ROOT").is_some() {
                panic!("this test needs root (MCS_REQUIRE_ROOT is set)");
            }
            eprintln!("SKIPPED: needs root");
            return;
        }
    };
}

pub fn cgroup2_root() -> anyhow::Result<PathBuf> {
    dataplane_agent::bpf::loader::cgroup2_root().context("no cgroup2 mount")
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes namespaces, cgroups and pins left by test processes that no longer run.
pub fn clean_stale() {
    if let Ok(list) = sh("ip", &["netns", "list"]) {
        for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
            if let Some(pid) = name
                .strip_prefix("mcst")
                .and_then(|r| r.split('x').next())
                .and_then(|p| p.parse::<u32>().ok())
                && !pid_alive(pid)
            {
                let _ = sh("ip", &["netns", "del", name]);
            }
        }
    }
    let stale = |name: &str| {
        name.strip_prefix("mcs-test-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
            .is_some_and(|pid| !pid_alive(pid))
    };
    if let Ok(entries) = fs::read_dir("/sys/fs/bpf") {
        for e in entries.flatten() {
            if stale(&e.file_name().to_string_lossy()) {
                uninstall_tree(&e.path());
            }
        }
    }
    if let Ok(root) = cgroup2_root()
        && let Ok(entries) = fs::read_dir(&root)
    {
        for e in entries.flatten() {
            if stale(&e.file_name().to_string_lossy()) {
                remove_cgroup(&e.path());
            }
        }
    }
}

/// Removes a pin directory and the pin directories inside it (tests that run agents with
/// versioned layouts under the topology's).
fn uninstall_tree(dir: &Path) {
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name();
        if !["links", "maps", "progs"].contains(&name.to_str().unwrap_or("")) && e.path().is_dir() {
            uninstall_tree(&e.path());
        }
    }
    let _ = dataplane_agent::bpf::loader::uninstall(dir);
}

fn remove_cgroup(path: &Path) {
    // A cgroup with children cannot be removed: the children first.
    for e in fs::read_dir(path).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup(&e.path());
        }
    }
    if let Ok(procs) = fs::read_to_string(path.join("cgroup.procs")) {
        for pid in procs.lines().filter_map(|p| p.parse::<i32>().ok()) {
            // SAFETY: kill has no memory preconditions; the pid is one of our probe processes.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    for _ in 0..50 {
        if fs::remove_dir(path).is_ok() || !path.exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// One member cluster's namespace.
#[derive(Clone, Debug)]
pub struct ClusterNet {
    pub name: String,
    pub netns: String,
    pub index: u8,
}

impl ClusterNet {
    pub fn v4(&self, host: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 99, self.index, host))
    }

    /// `fd00:99:<index>::<host>`, with index and host written in decimal digits (so host 10
    /// is `::10`, as the fixtures spell it).
    pub fn v6(&self, host: u8) -> IpAddr {
        format!("fd00:99:{}::{host}", self.index)
            .parse::<Ipv6Addr>()
            .map(IpAddr::V6)
            .unwrap_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED))
    }
}

/// A client namespace linked to one namespace per cluster, plus a child cgroup and a pin dir.
pub struct Topology {
    pub id: String,
    pub client: String,
    pub clusters: Vec<ClusterNet>,
    pub cgroup: PathBuf,
    pub pin_dir: PathBuf,
    /// A scratch directory for fixtures, logs and reports.
    pub dir: PathBuf,
    children: Vec<Child>,
    /// Released after the cleanup in `drop`, so the next topology starts on a clean slate.
    _serial: MutexGuard<'static, ()>,
}

impl Topology {
    /// Builds the namespaces for `clusters` (names), the cgroup and the pin directory.
    pub fn new(clusters: &[&str]) -> anyhow::Result<Topology> {
        // A test that panicked while holding the lock has cleaned up in its own drop.
        let serial = SERIAL
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        clean_stale();
        // Mount bpffs only where there is none: mounting it again would stack a new, empty
        // instance over the one in use and hide every pin in it (other tests', an agent's).
        if !dataplane_agent::bpf::loader::is_on_bpffs(Path::new("/sys/fs/bpf")) {
            sh("mount", &["-t", "bpf", "bpf", "/sys/fs/bpf"])?;
        }
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let id = format!("{pid}x{n}");
        let tag = format!("mcs-test-{pid}-{n}");
        let dir = std::env::temp_dir().join(&tag);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        let mut topo = Topology {
            client: format!("mcst{id}c"),
            clusters: Vec::new(),
            cgroup: cgroup2_root()?.join(&tag),
            pin_dir: PathBuf::from("/sys/fs/bpf").join(&tag),
            id,
            dir,
            children: Vec::new(),
            _serial: serial,
        };
        // From here on, Drop cleans up whatever was created.
        sh("ip", &["netns", "add", &topo.client])?;
        sh("ip", &["-n", &topo.client, "link", "set", "lo", "up"])?;
        for (i, name) in clusters.iter().enumerate() {
            let index = (i + 1) as u8;
            let netns = format!("mcst{}k{index}", topo.id);
            sh("ip", &["netns", "add", &netns])?;
            topo.clusters.push(ClusterNet {
                name: (*name).to_owned(),
                netns: netns.clone(),
                index,
            });
            sh("ip", &["-n", &netns, "link", "set", "lo", "up"])?;
            let near = format!("to{index}");
            // Both ends are created inside namespaces: the root namespace never sees them.
            sh(
                "ip",
                &[
                    "-n",
                    &topo.client,
                    "link",
                    "add",
                    &near,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "uplink",
                    "netns",
                    &netns,
                ],
            )?;
            sh(
                "ip",
                &[
                    "-n",
                    &topo.client,
                    "addr",
                    "add",
                    &format!("10.99.{index}.1/24"),
                    "dev",
                    &near,
                ],
            )?;
            sh(
                "ip",
                &[
                    "-n",
                    &topo.client,
                    "addr",
                    "add",
                    &format!("fd00:99:{index}::1/64"),
                    "dev",
                    &near,
                    "nodad",
                ],
            )?;
            sh("ip", &["-n", &topo.client, "link", "set", &near, "up"])?;
            sh("ip", &["-n", &netns, "link", "set", "uplink", "up"])?;
        }
        fs::create_dir_all(&topo.cgroup)
            .with_context(|| format!("creating cgroup {}", topo.cgroup.display()))?;
        Ok(topo)
    }

    pub fn cluster(&self, name: &str) -> &ClusterNet {
        self.clusters
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no cluster {name} in this topology"))
    }

    /// Adds endpoint address `host` (v4 and v6) to a cluster's namespace.
    pub fn add_endpoint(&self, cluster: &str, host: u8) -> anyhow::Result<()> {
        let c = self.cluster(cluster).clone();
        sh(
            "ip",
            &[
                "-n",
                &c.netns,
                "addr",
                "add",
                &format!("10.99.{}.{host}/24", c.index),
                "dev",
                "uplink",
            ],
        )?;
        sh(
            "ip",
            &[
                "-n",
                &c.netns,
                "addr",
                "add",
                &format!("fd00:99:{}::{host}/64", c.index),
                "dev",
                "uplink",
                "nodad",
            ],
        )?;
        Ok(())
    }

    /// Adds an address to a cluster's namespace (it must lie in the cluster's subnets).
    pub fn add_address(&self, cluster: &str, ip: IpAddr) -> anyhow::Result<()> {
        let c = self.cluster(cluster).clone();
        let (addr, extra) = match ip {
            IpAddr::V4(v4) => (format!("{v4}/24"), None),
            IpAddr::V6(v6) => (format!("{v6}/64"), Some("nodad")),
        };
        let mut args = vec!["-n", &c.netns, "addr", "add", &addr, "dev", "uplink"];
        args.extend(extra);
        sh("ip", &args)?;
        Ok(())
    }

    /// Starts an echo server in `cluster`'s namespace on endpoint `host`, answering with
    /// `<cluster>/<ipv4>` on each of `listens` (`tcp:PORT`, `udp:PORT`), on IPv4 and IPv6.
    pub fn start_backend(
        &mut self,
        cluster: &str,
        host: u8,
        listens: &[&str],
    ) -> anyhow::Result<()> {
        self.add_endpoint(cluster, host)?;
        let c = self.cluster(cluster).clone();
        // The reply names the cluster and the IPv4 endpoint: one identity for both families.
        let id = format!("{}/{}", c.name, c.v4(host));
        let mut specs = Vec::new();
        for l in listens {
            let (proto, port) = l.split_once(':').context("listen spec is proto:port")?;
            specs.push(format!("{proto}:{}:{port}", c.v4(host)));
            specs.push(format!("{proto}:[{}]:{port}", c.v6(host)));
        }
        self.start_echo(cluster, &id, &specs)
    }

    /// Starts `mcs-echo --id ID SPECS...` in `cluster`'s namespace (addresses already added)
    /// and waits until it listens.
    pub fn start_echo(&mut self, cluster: &str, id: &str, specs: &[String]) -> anyhow::Result<()> {
        let c = self.cluster(cluster).clone();
        let mut args = vec![
            "netns".to_owned(),
            "exec".to_owned(),
            c.netns.clone(),
            echo_bin().display().to_string(),
            "--id".to_owned(),
            id.to_owned(),
        ];
        args.extend(specs.iter().cloned());
        let mut child = die_with_parent(&mut Command::new("ip"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting mcs-echo")?;
        // Wait for "ready" so the test never races the bind.
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            use std::io::BufRead as _;
            let _ = std::io::BufReader::new(out).read_line(&mut line);
        }
        if line.trim() != "ready" {
            let _ = child.kill();
            bail!("mcs-echo in {cluster} did not start");
        }
        self.children.push(child);
        Ok(())
    }

    /// Writes a fixture file into `<dir>/<sub>/` and returns the directory.
    pub fn write_fixture(&self, sub: &str, file: &str, yaml: &str) -> anyhow::Result<PathBuf> {
        let d = self.dir.join(sub);
        fs::create_dir_all(&d)?;
        // Write then rename, so a watcher never reads a half-written file.
        let tmp = d.join(format!(".{file}.tmp"));
        fs::write(&tmp, yaml)?;
        fs::rename(&tmp, d.join(file))?;
        Ok(d)
    }

    /// Creates a cgroup under the topology's (removed with it). Programs attached to it run
    /// before those attached to the topology's cgroup, on the calls of its processes.
    pub fn child_cgroup(&self, name: &str) -> anyhow::Result<PathBuf> {
        let path = self.cgroup.join(name);
        fs::create_dir(&path).with_context(|| format!("creating cgroup {}", path.display()))?;
        Ok(path)
    }

    /// Runs `mcs-probe` in the client namespace and cgroup and returns its attempts.
    /// The programs attached to the test's cgroup (`bpftool cgroup show`), by name.
    pub fn attached_programs(&self) -> std::collections::BTreeMap<String, usize> {
        let json = sh(
            "bpftool",
            &["-j", "cgroup", "show", &self.cgroup.to_string_lossy()],
        )
        .expect("bpftool cgroup show");
        let progs: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap_or_default();
        let mut out = std::collections::BTreeMap::new();
        for p in progs {
            if let Some(name) = p["name"].as_str() {
                *out.entry(name.to_owned()).or_default() += 1;
            }
        }
        out
    }

    pub fn probe(
        &self,
        mode: &str,
        addr: &str,
        extra: &[&str],
    ) -> anyhow::Result<Vec<crate::probe::Attempt>> {
        let out = self.probe_command(mode, addr, extra).output()?;
        crate::probe::parse(
            &String::from_utf8_lossy(&out.stdout),
            &String::from_utf8_lossy(&out.stderr),
        )
    }

    /// The `mcs-probe` command (for tests that run it in the background).
    pub fn probe_command(&self, mode: &str, addr: &str, extra: &[&str]) -> Command {
        let mut cmd = Command::new(probe_bin());
        die_with_parent(&mut cmd);
        cmd.arg("--netns")
            .arg(&self.client)
            .arg("--cgroup")
            .arg(&self.cgroup)
            .args(extra)
            .args([mode, addr]);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        remove_cgroup(&self.cgroup);
        for c in &self.clusters {
            let _ = sh("ip", &["netns", "del", &c.netns]);
        }
        let _ = sh("ip", &["netns", "del", &self.client]);
        uninstall_tree(&self.pin_dir);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Path of a binary of this workspace next to the test executable's `deps/` directory (or an
/// example's `examples/` directory).
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") || dir.ends_with("examples") {
        dir.pop();
    }
    dir.join(name)
}

pub fn echo_bin() -> PathBuf {
    std::env::var_os("CARGO_BIN_EXE_mcs-echo")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_bin("mcs-echo"))
}

pub fn probe_bin() -> PathBuf {
    std::env::var_os("CARGO_BIN_EXE_mcs-probe")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_bin("mcs-probe"))
}

/// The agent binary: `MCS_AGENT_BIN`, else `dataplane-agent` next to the test executable
/// (`cargo xtask test` builds it first).
pub fn agent_bin() -> PathBuf {
    std::env::var_os("MCS_AGENT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_bin("dataplane-agent"))
}
