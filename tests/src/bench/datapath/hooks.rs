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
    /// The program: ours, named by its hook (`connect4`, `connect6`, `sendmsg4`, `recvmsg4`),
    /// or a reference program of the hook (`lookup_connect4`, `lookup_sendmsg4`).
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

/// Programs of the object, attached to a cgroup until dropped.
struct Attached {
    /// Program id per hook name.
    ids: BTreeMap<&'static str, u32>,
    _links: Vec<FdLink>,
    _ebpf: Ebpf,
}

/// The do-nothing programs, attached to a cgroup until dropped.
pub struct Floor(Attached);

impl Floor {
    /// Loads the do-nothing programs from the agent's eBPF object and attaches them to
    /// `cgroup`. The object's maps are created for this load only (no pins) and go with it.
    pub fn attach(cgroup: &Path) -> anyhow::Result<Self> {
        attach_programs(cgroup, &dataplane_ebpf::FLOOR_PROGRAMS, None).map(Floor)
    }
}

/// The reference programs (`dataplane_ebpf::LOOKUP_PROGRAMS`: the frontend lookup alone), on the
/// agent's pinned frontend maps, attached to a cgroup until dropped. In a child cgroup of the
/// agent's they run before the agent's programs (a cgroup's own programs run before its
/// parent's), so they meet the destination as the application gave it, a VIP.
pub struct Reference(Attached);

impl Reference {
    /// Attaches the reference programs to `cgroup`, a child of the agent's, and checks that the
    /// kernel runs each before the agent's program of its hook (linked under `pin_dir`): run
    /// after it, a reference would look up the backend the agent wrote, not the VIP.
    pub fn attach(cgroup: &Path, pin_dir: &Path) -> anyhow::Result<Self> {
        let maps = pin_dir.join("maps");
        let reference = attach_programs(cgroup, &dataplane_ebpf::LOOKUP_PROGRAMS, Some(&maps))
            .map(Reference)?;
        for (hook, id) in &reference.0.ids {
            let ours = agent_program(pin_dir, hook)?;
            let order = effective_programs(cgroup, hook)?;
            let at = |p: u32| order.iter().position(|&q| q == p);
            match (at(*id), at(ours)) {
                (Some(r), Some(o)) if r < o => {}
                _ => bail!(
                    "the kernel runs {hook}'s programs on {} in the order {order:?}: the reference \
                     ({id}) is not before the agent's ({ours})",
                    cgroup.display()
                ),
            }
        }
        Ok(reference)
    }
}

/// The id of the agent's program of `hook`, linked under `pin_dir`.
fn agent_program(pin_dir: &Path, hook: &str) -> anyhow::Result<u32> {
    let links = dataplane_agent::bpf::inspect::links(pin_dir);
    links
        .iter()
        .find(|l| l.program == hook)
        .map(|l| l.program_id)
        .with_context(|| {
            format!(
                "no pinned link of {hook} under {} (found {:?})",
                pin_dir.display(),
                links.iter().map(|l| &l.pin).collect::<Vec<_>>()
            )
        })
}

/// The ids of the programs that run on `hook` for processes of `cgroup`, in the order the kernel
/// runs them (`BPF_PROG_QUERY` with `BPF_F_QUERY_EFFECTIVE`; aya has no call for it).
fn effective_programs(cgroup: &Path, hook: &str) -> anyhow::Result<Vec<u32>> {
    // From the kernel's uapi (linux/bpf.h).
    const BPF_PROG_QUERY: libc::c_long = 16;
    const BPF_F_QUERY_EFFECTIVE: u32 = 1;
    let attach_type: u32 = match hook {
        "connect4" => 10, // BPF_CGROUP_INET4_CONNECT
        "sendmsg4" => 14, // BPF_CGROUP_UDP4_SENDMSG
        _ => bail!("no attach type known for {hook}"),
    };
    /// `bpf_attr.query` up to `revision` (6.16 and newer write it back; older kernels require
    /// the bytes past their own fields to be zero, which they are).
    #[repr(C)]
    #[derive(Default)]
    struct Query {
        target_fd: u32,
        attach_type: u32,
        query_flags: u32,
        attach_flags: u32,
        prog_ids: u64,
        prog_cnt: u32,
        _pad: u32,
        prog_attach_flags: u64,
        link_ids: u64,
        link_attach_flags: u64,
        revision: u64,
    }
    const _: () = assert!(std::mem::size_of::<Query>() == 64);
    let dir =
        fs::File::open(cgroup).with_context(|| format!("opening cgroup {}", cgroup.display()))?;
    let mut ids = vec![0u32; 64];
    loop {
        let mut attr = Query {
            target_fd: std::os::fd::AsRawFd::as_raw_fd(&dir) as u32,
            attach_type,
            query_flags: BPF_F_QUERY_EFFECTIVE,
            prog_ids: ids.as_mut_ptr() as u64,
            prog_cnt: ids.len() as u32,
            ..Query::default()
        };
        // SAFETY: `attr` is a `bpf_attr.query` of the size passed, which the kernel reads and
        // writes (`prog_cnt`, `attach_flags`, `revision`); it writes at most `prog_cnt` ids into
        // `ids`, which outlives the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_QUERY,
                &mut attr as *mut Query,
                std::mem::size_of::<Query>(),
            )
        };
        let err = std::io::Error::last_os_error();
        if rc == 0 {
            ids.truncate((attr.prog_cnt as usize).min(ids.len()));
            return Ok(ids);
        }
        // More programs than room: the kernel said how many there are.
        if err.raw_os_error() == Some(libc::ENOSPC) && attr.prog_cnt as usize > ids.len() {
            ids = vec![0; attr.prog_cnt as usize];
            continue;
        }
        return Err(err)
            .with_context(|| format!("querying {hook}'s programs on {}", cgroup.display()));
    }
}

/// Loads `programs` (hook, name) from the agent's eBPF object and attaches them to `cgroup`.
/// With `pinned_maps`, `MCS_FE4` (the only map the reference programs read) is the agent's
/// pinned one; every other map of the object is created for this load only (no pins) and goes
/// with it.
fn attach_programs(
    cgroup: &Path,
    programs: &[(&'static str, &'static str)],
    pinned_maps: Option<&Path>,
) -> anyhow::Result<Attached> {
    let object = dataplane_agent::bpf::loader::ebpf_object();
    if object.is_empty() {
        bail!("the agent was built without its eBPF object (AYA_BUILD_SKIP)");
    }
    let fe4 = dataplane_ebpf::map_names::FRONTENDS4;
    let pin = pinned_maps.map(|dir| dir.join(fe4));
    let mut loader = EbpfLoader::new();
    if let Some(pin) = &pin {
        // Else the load would create the map and pin it in the agent's directory.
        if !pin.exists() {
            bail!("no pinned map {} (is the agent up?)", pin.display());
        }
        loader.map_pin_path(fe4, pin);
    }
    let mut ebpf = loader.load(object).context("loading the eBPF object")?;
    // A pin removed between the check above and the load would have left the programs on a
    // new, empty map: they must use the pinned one.
    let pinned_id = pin
        .map(|pin| {
            aya::maps::MapData::from_pin(&pin)
                .and_then(|m| Ok(m.info()?.id()))
                .with_context(|| format!("reading the pinned map {}", pin.display()))
        })
        .transpose()?;
    let cgroup_fd =
        fs::File::open(cgroup).with_context(|| format!("opening cgroup {}", cgroup.display()))?;
    let mut ids = BTreeMap::new();
    let mut links = Vec::new();
    for &(hook, name) in programs {
        let prog: &mut CgroupSockAddr = ebpf
            .program_mut(name)
            .with_context(|| format!("no program {name} in the object"))?
            .try_into()?;
        prog.load().with_context(|| format!("loading {name}"))?;
        let link_id = prog
            .attach(&cgroup_fd, CgroupAttachMode::Single)
            .with_context(|| format!("attaching {name}"))?;
        let link: FdLink = prog.take_link(link_id)?.try_into()?;
        let info = prog.info()?;
        let uses = info.map_ids().ok().flatten().unwrap_or_default();
        if let Some(id) = pinned_id
            && !uses.contains(&id)
        {
            bail!("{name} does not use the pinned frontend map (id {id}; it uses {uses:?})");
        }
        ids.insert(hook, info.id());
        links.push(link);
    }
    Ok(Attached {
        ids,
        _links: links,
        _ebpf: ebpf,
    })
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

impl Pair {
    /// Reads the counters of `program` (reported as `name`) and of the do-nothing program of
    /// `hook`.
    fn start(
        name: &'static str,
        hook: &str,
        calls_on: &str,
        program: u32,
        floor: &Floor,
    ) -> anyhow::Result<Self> {
        let floor_id = *floor
            .0
            .ids
            .get(hook)
            .with_context(|| format!("no do-nothing program for {hook}"))?;
        Ok(Pair {
            hook: name,
            calls_on: calls_on.to_owned(),
            ours: program,
            floor: floor_id,
            ours_at: stats(program).context("the measured program is gone")?,
            floor_at: stats(floor_id).context("the do-nothing program is gone")?,
        })
    }
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
        let mut start = Vec::new();
        for (hook, calls_on) in hooks {
            let ours = agent_program(pin_dir, hook)?;
            start.push(Pair::start(hook, hook, calls_on, ours, floor)?);
        }
        Ok(Window { start, services })
    }

    /// The same for the reference program of `hook` (reported as `lookup_<hook>`) and, on the
    /// same calls, the agent's own program of `hook` linked under `pin_dir`.
    pub fn open_with_reference(
        pin_dir: &Path,
        floor: &Floor,
        reference: &Reference,
        services: usize,
        (hook, reference_calls_on, ours_calls_on): (&'static str, &str, &str),
    ) -> anyhow::Result<Self> {
        let mut window = Window::open(pin_dir, floor, services, &[(hook, ours_calls_on)])?;
        let (name, id) = dataplane_ebpf::LOOKUP_PROGRAMS
            .iter()
            .find(|(h, _)| *h == hook)
            .and_then(|(h, name)| Some((*name, *reference.0.ids.get(h)?)))
            .with_context(|| format!("no reference program for {hook}"))?;
        window
            .start
            .insert(0, Pair::start(name, hook, reference_calls_on, id, floor)?);
        Ok(window)
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
