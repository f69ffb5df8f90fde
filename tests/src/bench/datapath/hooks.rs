//! What each socket-LB program costs per call, next to a do-nothing program of the same hook.
//!
//! The kernel counts, per program, how often it ran and for how long (`run_cnt`, `run_time_ns`
//! of `bpf_prog_info`) while `kernel.bpf_stats_enabled` is on; [`StatsGuard`] turns it on for
//! as long as it lives (the kernel drops it when the last holder closes its fd). [`Floor`]
//! attaches the object's do-nothing programs (`dataplane_ebpf::FLOOR_PROGRAMS`, `r0 = 1; exit`)
//! to the same child cgroup, next to the agent's links (cgroup multi-attach), so both run on
//! exactly the same calls: the floor's time per call is what any program of that hook costs to
//! run (the dispatch and the stats bookkeeping included), and the ratio to it is the part our
//! code adds.

use std::{collections::BTreeMap, fs, path::Path};

use anyhow::{Context as _, bail};
use aya::{
    Ebpf, EbpfLoader,
    programs::{CgroupAttachMode, CgroupSockAddr, links::FdLink},
};
use serde::Serialize;

/// One program's cost over one measured stretch of load.
#[derive(Clone, Debug, Serialize)]
pub struct HookCost {
    /// The program (`connect4`, `connect6`, `sendmsg4`, `recvmsg4`).
    pub hook: String,
    /// The calls it ran on.
    pub calls_on: String,
    pub services: usize,
    /// Runs of our program in the stretch (the do-nothing program ran as often).
    pub calls: u64,
    pub ns_per_call: f64,
    /// The do-nothing program of the same hook, on the same calls.
    pub floor_ns_per_call: f64,
}

impl HookCost {
    /// Our cost per call over the floor's.
    pub fn ratio(&self) -> f64 {
        if self.floor_ns_per_call > 0.0 {
            self.ns_per_call / self.floor_ns_per_call
        } else {
            0.0
        }
    }
}

/// Keeps the kernel's BPF run-time statistics on while it lives.
pub struct StatsGuard(#[allow(dead_code)] std::os::fd::OwnedFd);

impl StatsGuard {
    pub fn enable() -> anyhow::Result<Self> {
        aya::sys::enable_stats(aya::sys::Stats::RunTime)
            .map(StatsGuard)
            .context("enabling BPF run-time statistics")
    }
}

/// (runs, run time in ns) of a loaded program.
fn stats(program_id: u32) -> Option<(u64, u64)> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .find(|p| p.id() == program_id)
        .map(|p| (p.run_count(), p.run_time().as_nanos() as u64))
}

/// The do-nothing programs, attached to a cgroup until dropped.
pub struct Floor {
    /// Program id per hook name.
    ids: BTreeMap<&'static str, u32>,
    _links: Vec<FdLink>,
    _ebpf: Ebpf,
}

impl Floor {
    /// Loads the do-nothing programs from the agent's eBPF object and attaches them to
    /// `cgroup`. The object's maps are created for this load only (no pins) and go with it.
    pub fn attach(cgroup: &Path) -> anyhow::Result<Self> {
        let object = dataplane_agent::bpf::loader::ebpf_object();
        if object.is_empty() {
            bail!("the agent was built without its eBPF object (AYA_BUILD_SKIP)");
        }
        let mut ebpf = EbpfLoader::new()
            .load(object)
            .context("loading the eBPF object")?;
        let cgroup_fd = fs::File::open(cgroup)
            .with_context(|| format!("opening cgroup {}", cgroup.display()))?;
        let mut ids = BTreeMap::new();
        let mut links = Vec::new();
        for (hook, name) in dataplane_ebpf::FLOOR_PROGRAMS {
            let prog: &mut CgroupSockAddr = ebpf
                .program_mut(name)
                .with_context(|| format!("no program {name} in the object"))?
                .try_into()?;
            prog.load().with_context(|| format!("loading {name}"))?;
            let link_id = prog
                .attach(&cgroup_fd, CgroupAttachMode::Single)
                .with_context(|| format!("attaching {name}"))?;
            let link: FdLink = prog.take_link(link_id)?.try_into()?;
            ids.insert(hook, prog.info()?.id());
            links.push(link);
        }
        Ok(Floor {
            ids,
            _links: links,
            _ebpf: ebpf,
        })
    }
}

/// Counters of our program and the floor for some hooks, read before a stretch of load.
pub struct Window {
    start: Vec<Pair>,
    services: usize,
}

struct Pair {
    hook: &'static str,
    calls_on: String,
    ours: u32,
    floor: u32,
    ours_at: (u64, u64),
    floor_at: (u64, u64),
}

impl Window {
    /// Starts a stretch for `hooks` (name, what the calls are) of the agent linked under
    /// `pin_dir`. Statistics must be on (a live [`StatsGuard`]).
    pub fn open(
        pin_dir: &Path,
        floor: &Floor,
        services: usize,
        hooks: &[(&'static str, &str)],
    ) -> anyhow::Result<Self> {
        let links = dataplane_agent::bpf::inspect::links(pin_dir);
        let mut start = Vec::new();
        for (hook, calls_on) in hooks {
            let ours = links
                .iter()
                .find(|l| l.program == *hook)
                .map(|l| l.program_id)
                .with_context(|| {
                    format!(
                        "no pinned link of {hook} under {} (found {:?})",
                        pin_dir.display(),
                        links.iter().map(|l| &l.pin).collect::<Vec<_>>()
                    )
                })?;
            let floor_id = *floor
                .ids
                .get(hook)
                .with_context(|| format!("no do-nothing program for {hook}"))?;
            start.push(Pair {
                hook,
                calls_on: (*calls_on).to_owned(),
                ours,
                floor: floor_id,
                ours_at: stats(ours).context("our program is gone")?,
                floor_at: stats(floor_id).context("the do-nothing program is gone")?,
            });
        }
        Ok(Window { start, services })
    }

    /// What ran since [`Window::open`]; hooks that did not run are left out.
    pub fn close(self) -> Vec<HookCost> {
        let mut out = Vec::new();
        for p in self.start {
            let (Some(ours), Some(floor)) = (stats(p.ours), stats(p.floor)) else {
                continue;
            };
            let runs = ours.0.saturating_sub(p.ours_at.0);
            let floor_runs = floor.0.saturating_sub(p.floor_at.0);
            if runs == 0 || floor_runs == 0 {
                continue;
            }
            out.push(HookCost {
                hook: p.hook.to_owned(),
                calls_on: p.calls_on,
                services: self.services,
                calls: runs,
                ns_per_call: ours.1.saturating_sub(p.ours_at.1) as f64 / runs as f64,
                floor_ns_per_call: floor.1.saturating_sub(p.floor_at.1) as f64 / floor_runs as f64,
            });
        }
        out
    }
}
