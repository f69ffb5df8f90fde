//! Loading, attaching and pinning the socket-LB programs, adopting them after a restart, and
//! removing them.
//!
//! Layout under the pin directory (default `/sys/fs/bpf/mcs-dataplane/v<PIN_VERSION>`):
//! - `maps/<MAP>`: every map (`bpftool map dump pinned <dir>/maps/MCS_FE4`);
//! - `links/cg<cgroup id>/<program>`: the cgroup links, one per hook. Pinned links keep the
//!   programs attached while the agent is down, so connections keep being translated;
//! - `progs/<program>`: the programs those links run. A restarted agent reads their code tag and
//!   maps from these pins; looking a program up by id instead (`BPF_PROG_GET_FD_BY_ID`) needs
//!   CAP_SYS_ADMIN, which the agent does not otherwise need (docs/security.md).
//!
//! On start, the agent takes an exclusive `flock` on the pin directory (two agents never share
//! one). Maps that are already pinned are reused (same map ids, same contents). If every link
//! of the target cgroup is pinned, runs the same program code (same tag) as this build, and
//! uses the pinned maps (not maps whose pins were removed since), the links are adopted
//! untouched. Otherwise the new programs are attached next to the old ones (multi-attach),
//! pinned, and only then are the old links removed: an upgrade never leaves the cgroup without
//! a program. When the pin directory is the versioned default (`.../v<PIN_VERSION>`), the
//! links of older layout versions (`.../v1` and so on) are detached and their pins removed
//! once the node has written its first full sync ([`retire_older_versions`]): until then they
//! keep translating from the maps they left, and after it, attached first, they would keep
//! translating from frozen maps.

use std::{
    collections::BTreeSet,
    fs,
    os::{
        fd::{AsFd as _, AsRawFd as _, OwnedFd},
        unix::fs::MetadataExt as _,
    },
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::MapInfo,
    programs::{
        CgroupAttachMode, Program, ProgramError, links::FdLink, links::PinnedLink, loaded_programs,
    },
};
use dataplane_ebpf::{CONN_SLOTS_GLOBAL, COUNTER_STRIDE_GLOBAL, map_names};
use tracing::{info, warn};

use super::{
    counters,
    kernel::{KernelMapError, KernelMaps},
    maps::Capacities,
};

/// The compiled eBPF object (built by `build.rs`).
static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/dataplane-ebpf"));

/// The compiled eBPF object, as the agent loads it (empty when built with `AYA_BUILD_SKIP`).
/// The benchmark loads its do-nothing and reference programs (`dataplane_ebpf::FLOOR_PROGRAMS`,
/// `LOOKUP_PROGRAMS`) from it.
pub fn ebpf_object() -> &'static [u8] {
    EBPF_OBJECT
}

/// The programs, by function (and section) name, in attach order: the cgroup sock program
/// that forgets a released socket's entry and the reverse translations first, so that no
/// socket is translated on a fresh install before its replies, its peer name and its release
/// are handled; then the forward translations.
pub const PROGRAMS: [&str; 9] = [
    "sock_release",
    "recvmsg4",
    "recvmsg6",
    "getpeername4",
    "getpeername6",
    "connect4",
    "connect6",
    "sendmsg4",
    "sendmsg6",
];

/// The program whose maps the eBPF log reader is found from (one that logs).
const LOGGING_PROGRAM: &str = "connect4";

/// The default pin directory, versioned by the map layout.
pub fn default_pin_dir() -> PathBuf {
    PathBuf::from(format!(
        "/sys/fs/bpf/mcs-dataplane/v{}",
        dataplane_ebpf::PIN_VERSION
    ))
}

/// What to load and where.
#[derive(Clone, Debug)]
pub struct LoaderConfig {
    pub pin_dir: PathBuf,
    /// The cgroup v2 directory the programs attach to.
    pub cgroup: PathBuf,
    pub max_frontends: u32,
    pub max_slots: u32,
    pub max_clusters: u32,
    pub max_affinity: u32,
    pub max_revnat: u32,
    pub max_connected: u32,
    /// Most verbose eBPF log level forwarded to `tracing` (aya-log level numbers: 1 error ..
    /// 5 trace; 0 disables).
    pub bpf_log_level: u8,
}

impl LoaderConfig {
    pub fn new(pin_dir: PathBuf, cgroup: PathBuf) -> Self {
        use dataplane_ebpf::defaults::*;
        LoaderConfig {
            pin_dir,
            cgroup,
            max_frontends: MAX_FRONTENDS,
            max_slots: MAX_SLOTS,
            max_clusters: MAX_CLUSTERS,
            max_affinity: MAX_AFFINITY,
            max_revnat: MAX_REVNAT,
            max_connected: MAX_CONNECTED,
            bpf_log_level: 2,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "{path} is not on a bpffs; mount it with `mount -t bpf bpf /sys/fs/bpf` (or pass --pin-dir on a bpffs)"
    )]
    NotBpffs { path: PathBuf },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "this agent was built without its eBPF object (AYA_BUILD_SKIP); build it with `cargo xtask build`"
    )]
    NoObject,
    #[error("loading the eBPF object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("program {name}: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("link of program {name}: {source}")]
    Link {
        name: &'static str,
        #[source]
        source: aya::programs::links::LinkError,
    },
    #[error("pinning {path}: {source}")]
    Pin {
        path: PathBuf,
        #[source]
        source: aya::pin::PinError,
    },
    #[error(transparent)]
    Maps(#[from] KernelMapError),
    #[error("nothing is installed under {0}")]
    NotInstalled(PathBuf),
    #[error(
        "the counters of {frontends} frontends on {cpus} CPUs do not fit one map; lower --max-frontends"
    )]
    TooManyCounters { frontends: u32, cpus: u32 },
    #[error(
        "{0} is in use by another agent (it holds the pin directory's lock); run one agent per pin directory"
    )]
    Busy(PathBuf),
    /// An EPERM or EACCES (a verifier refusal included) from any of the above.
    #[error(
        "not permitted (the agent needs uid 0 with CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON; see docs/security.md)"
    )]
    NotPermitted(#[source] Box<LoadError>),
}

/// Wraps an error caused by missing privileges (EPERM, EACCES anywhere in its chain) so that
/// its message says which capabilities the agent needs.
fn hint_privileges(e: LoadError) -> LoadError {
    let denied = std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source())
        .filter_map(|e| e.downcast_ref::<std::io::Error>())
        .any(|io| matches!(io.raw_os_error(), Some(libc::EPERM | libc::EACCES)));
    if denied {
        LoadError::NotPermitted(Box::new(e))
    } else {
        e
    }
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> LoadError + 'a {
    move |source| LoadError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

/// `statfs` magic of bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe4a11;

/// Whether `path` (or its closest existing ancestor) is on a bpffs.
pub fn is_on_bpffs(path: &Path) -> bool {
    let mut p = Some(path);
    while let Some(dir) = p {
        if dir.exists() {
            let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
                return false;
            };
            let mut st: libc::statfs = unsafe { std::mem::zeroed() };
            // SAFETY: c is a valid NUL-terminated path and st a writable statfs.
            let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
            return rc == 0 && st.f_type as i64 == BPF_FS_MAGIC;
        }
        p = dir.parent();
    }
    false
}

/// The cgroup v2 mount point, from `/proc/self/mounts`.
pub fn cgroup2_root() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|line| {
        let mut f = line.split_whitespace();
        let (_dev, dir, fstype) = (f.next()?, f.next()?, f.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(dir))
    })
}

/// What `install` found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attachment {
    /// The pinned links already ran this build's programs; nothing was attached.
    Adopted,
    /// Programs were attached (first install, upgrade, or a new cgroup).
    Attached { replaced_links: usize },
}

/// The installed dataplane: the maps to sync, and the log reader of the running programs.
pub struct Dataplane {
    pub maps: KernelMaps,
    pub attachment: Attachment,
    /// Ids of the programs attached now, by name.
    pub program_ids: Vec<(&'static str, u32)>,
    pub logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
}

fn links_dir(pin_dir: &Path, cgroup: &Path) -> Result<PathBuf, LoadError> {
    let ino = fs::metadata(cgroup)
        .map_err(io("cannot open cgroup", cgroup))?
        .ino();
    Ok(pin_dir.join("links").join(format!("cg{ino}")))
}

/// The program a pinned link runs: its id, tag and the ids of the maps it uses.
struct Linked {
    id: u32,
    tag: u64,
    map_ids: BTreeSet<u32>,
}

impl From<super::sys::ProgIdentity> for Linked {
    fn from(p: super::sys::ProgIdentity) -> Self {
        Linked {
            id: p.id,
            tag: p.tag,
            map_ids: p.map_ids.into_iter().collect(),
        }
    }
}

/// The program the link pinned at `path` runs, read from its pin at `prog_pin` (no capability
/// needed) or, for layouts pinned without it, looked up by id (CAP_SYS_ADMIN).
fn pinned_link_program(path: &Path, prog_pin: &Path) -> Option<Linked> {
    let link = PinnedLink::from_pin(path).ok()?;
    let fd: FdLink = link.into();
    let prog_id = fd.info().ok()?.program_id();
    if let Ok(p) = super::sys::obj_get(prog_pin).and_then(|fd| super::sys::prog_identity(&fd))
        && p.id == prog_id
    {
        return Some(p.into());
    }
    let info = loaded_programs()
        .filter_map(Result::ok)
        .find(|p| p.id() == prog_id)?;
    Some(Linked {
        id: prog_id,
        tag: info.tag(),
        map_ids: info
            .map_ids()
            .ok()
            .flatten()
            .unwrap_or_default()
            .into_iter()
            .collect(),
    })
}

/// Takes an exclusive lock on the pin directory for as long as the returned fd lives (bpffs
/// holds no regular files, so the directory itself is locked).
fn lock_pin_dir(pin_dir: &Path) -> Result<OwnedFd, LoadError> {
    let dir = fs::File::open(pin_dir).map_err(io("cannot open", pin_dir))?;
    // SAFETY: flock on an fd we own; no memory is passed.
    let rc = unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(LoadError::Busy(pin_dir.to_owned()));
        }
        return Err(LoadError::Io {
            what: "cannot lock",
            path: pin_dir.to_owned(),
            source: e,
        });
    }
    Ok(dir.into())
}

/// The pinned maps' ids (what programs attached by this pin directory must use).
fn pinned_map_ids(maps_dir: &Path) -> BTreeSet<u32> {
    map_names::ALL
        .iter()
        .filter_map(|name| aya::maps::MapData::from_pin(maps_dir.join(name)).ok())
        .filter_map(|m| m.info().ok().map(|i| i.id()))
        .collect()
}

/// When `pin_dir` is the versioned default layout (`<root>/v<PIN_VERSION>`), detaches the links
/// of every older layout under `<root>` and removes its pins. Returns how many links it
/// detached.
///
/// The node calls it after its first full sync, not at install: an older layout's programs,
/// attached first, keep translating from its maps as they were left until the new maps hold
/// the inputs (an upgrade must not drop VIP traffic while the new agent waits for its lists).
pub fn retire_older_versions(pin_dir: &Path) -> usize {
    let ours = format!("v{}", dataplane_ebpf::PIN_VERSION);
    if pin_dir.file_name().and_then(|n| n.to_str()) != Some(ours.as_str()) {
        return 0;
    }
    let Some(root) = pin_dir.parent() else {
        return 0;
    };
    let mut detached = 0;
    for entry in fs::read_dir(root).into_iter().flatten().flatten() {
        let older = layout_version(&entry.path()).is_some_and(|v| v < dataplane_ebpf::PIN_VERSION);
        if !older {
            continue;
        }
        for cg in fs::read_dir(entry.path().join("links"))
            .into_iter()
            .flatten()
            .flatten()
        {
            for link in fs::read_dir(cg.path()).into_iter().flatten().flatten() {
                match super::sys::detach_pinned_link(&link.path()) {
                    Ok(()) => detached += 1,
                    Err(e) => {
                        warn!(pin = %link.path().display(), error = %e, "cannot detach an old link")
                    }
                }
            }
        }
        match uninstall(&entry.path()) {
            Ok(done) => {
                info!(dir = %entry.path().display(), links = done.links, maps = done.maps, "removed an older layout's pins")
            }
            Err(e) => {
                warn!(dir = %entry.path().display(), error = %e, "cannot remove an older layout's pins")
            }
        }
    }
    detached
}

/// One of [`PROGRAMS`] in the loaded object.
fn program<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut Program, LoadError> {
    ebpf.program_mut(name).ok_or(LoadError::Program {
        name,
        source: ProgramError::UnexpectedProgramType,
    })
}

/// Loads one of [`PROGRAMS`] (a cgroup sock_addr or sock program) into the kernel.
fn load_program(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<super::sys::ProgIdentity, LoadError> {
    let err = |source| LoadError::Program { name, source };
    let prog = program(ebpf, name)?;
    match prog {
        Program::CgroupSockAddr(p) => p.load(),
        Program::CgroupSock(p) => p.load(),
        _ => Err(ProgramError::UnexpectedProgramType),
    }
    .map_err(err)?;
    // Read through the program's own fd: looking programs up by id needs CAP_SYS_ADMIN.
    let fd = prog.fd().map_err(err)?;
    super::sys::prog_identity(&fd.as_fd().as_raw_fd()).map_err(|source| LoadError::Io {
        what: "cannot read the program info of",
        path: PathBuf::from(name),
        source,
    })
}

/// Attaches one of [`PROGRAMS`] to `cgroup` and returns its link.
fn attach_program(
    ebpf: &mut Ebpf,
    name: &'static str,
    cgroup: &fs::File,
) -> Result<FdLink, LoadError> {
    let err = |source| LoadError::Program { name, source };
    let link = |source| LoadError::Link { name, source };
    // A bpf_link (flags 0) always attaches in multi mode: an old link (previous version) keeps
    // running until the new one is pinned, and other programs on the cgroup are left alone.
    // (BPF_F_ALLOW_MULTI itself is rejected for links.)
    match program(ebpf, name)? {
        Program::CgroupSockAddr(p) => {
            let id = p.attach(cgroup, CgroupAttachMode::Single).map_err(err)?;
            p.take_link(id).map_err(err)?.try_into().map_err(link)
        }
        Program::CgroupSock(p) => {
            let id = p.attach(cgroup, CgroupAttachMode::Single).map_err(err)?;
            p.take_link(id).map_err(err)?.try_into().map_err(link)
        }
        _ => Err(err(ProgramError::UnexpectedProgramType)),
    }
}

/// Loads the programs and maps, attaches (or adopts) them on `cfg.cgroup`, and pins
/// everything under `cfg.pin_dir`.
pub fn install(cfg: &LoaderConfig) -> Result<Dataplane, LoadError> {
    install_as_allowed(cfg).map_err(hint_privileges)
}

/// The size of `MCS_CONN_REVNAT`: the pinned map's when there is one (an agent restart reuses
/// it, and the programs must index exactly its entries), else `max_connected` rounded up to a
/// power of two (the programs index it with a mask).
fn conn_revnat_size(maps_dir: &Path, max_connected: u32) -> u32 {
    match MapInfo::from_pin(maps_dir.join(map_names::CONN_REVNAT)) {
        Ok(info) => info.max_entries(),
        Err(_) => max_connected
            .max(1)
            .checked_next_power_of_two()
            .unwrap_or(1 << 31),
    }
}

/// The entries of one CPU's row of `MCS_COUNTERS`: the pinned map's when there is one (the
/// programs and the agent index it with the stride it was created with), else one per frontend
/// id, `1..=max_frontends`. A pinned map of another layout (an older agent's, in a pin
/// directory without the version in its path) is refused before any program is loaded.
fn counter_stride(maps_dir: &Path, max_frontends: u32, cpus: u32) -> Result<u32, LoadError> {
    match MapInfo::from_pin(maps_dir.join(map_names::COUNTERS)) {
        Ok(info) => counters::stride_of(
            info.map_type().ok(),
            info.value_size(),
            info.max_entries(),
            cpus,
        )
        .map_err(|why| KernelMapError::CounterLayout(why).into()),
        Err(_) => Ok(max_frontends.saturating_add(1)),
    }
}

fn install_as_allowed(cfg: &LoaderConfig) -> Result<Dataplane, LoadError> {
    if EBPF_OBJECT.is_empty() {
        return Err(LoadError::NoObject);
    }
    if !is_on_bpffs(&cfg.pin_dir) {
        return Err(LoadError::NotBpffs {
            path: cfg.pin_dir.clone(),
        });
    }
    let maps_dir = cfg.pin_dir.join("maps");
    fs::create_dir_all(&maps_dir).map_err(io("cannot create", &maps_dir))?;
    let lock = lock_pin_dir(&cfg.pin_dir)?;
    let links = links_dir(&cfg.pin_dir, &cfg.cgroup)?;
    fs::create_dir_all(&links).map_err(io("cannot create", &links))?;
    let progs = cfg.pin_dir.join("progs");
    fs::create_dir_all(&progs).map_err(io("cannot create", &progs))?;

    let conn_slots = conn_revnat_size(&maps_dir, cfg.max_connected);
    let cpus = counters::possible_cpus()?;
    let counter_stride = counter_stride(&maps_dir, cfg.max_frontends, cpus)?;
    let counter_entries = counter_stride
        .checked_mul(cpus)
        .ok_or(LoadError::TooManyCounters {
            frontends: cfg.max_frontends,
            cpus,
        })?;
    let mut loader = EbpfLoader::new();
    // BTF-defined maps carry no pinning attribute in aya-ebpf 0.2: pin each one by path. An
    // existing pin is reused as it is (an agent restart keeps the maps and their contents).
    for name in map_names::ALL {
        loader.map_pin_path(name, maps_dir.join(name));
    }
    let mut ebpf: Ebpf = loader
        .map_max_entries(map_names::FRONTENDS4, cfg.max_frontends)
        .map_max_entries(map_names::FRONTENDS6, cfg.max_frontends)
        // A row per CPU, indexed by frontend id within it.
        .map_max_entries(map_names::COUNTERS, counter_entries)
        .map_max_entries(map_names::FRONTEND_NAMES, cfg.max_frontends)
        .map_max_entries(map_names::SLOTS, cfg.max_slots)
        .map_max_entries(map_names::CLUSTER_NAMES, cfg.max_clusters)
        .map_max_entries(map_names::AFFINITY_MATCH, cfg.max_slots)
        .map_max_entries(map_names::AFFINITY, cfg.max_affinity)
        .map_max_entries(map_names::REVNAT4, cfg.max_revnat)
        .map_max_entries(map_names::REVNAT6, cfg.max_revnat)
        .map_max_entries(map_names::CONN_REVNAT, conn_slots)
        .override_global(CONN_SLOTS_GLOBAL, &conn_slots, true)
        .override_global(COUNTER_STRIDE_GLOBAL, &counter_stride, true)
        .override_global("AYA_LOG_LEVEL", &cfg.bpf_log_level, false)
        .load(EBPF_OBJECT)?;
    // Must outlive the program loads: it holds the log ring buffer's fd.
    let fresh_logger = aya_log::EbpfLogger::init(&mut ebpf).ok();

    let mut tags = Vec::new();
    for name in PROGRAMS {
        let info = load_program(&mut ebpf, name)?;
        let maps: BTreeSet<u32> = info.map_ids.into_iter().collect();
        tags.push((name, info.id, info.tag, maps));
    }

    // A pinned link is adopted when it runs this build's code on the pinned maps: a program
    // loaded before a map pin was removed (and the map recreated) writes to maps nobody syncs.
    let pinned_maps = pinned_map_ids(&maps_dir);
    let pinned: Vec<Option<Linked>> = PROGRAMS
        .iter()
        .map(|name| pinned_link_program(&links.join(name), &progs.join(name)))
        .collect();
    let adopt = pinned.iter().zip(&tags).all(|(p, (_, _, tag, maps))| {
        p.as_ref().is_some_and(|p| {
            p.tag == *tag
                && maps
                    .intersection(&pinned_maps)
                    .all(|m| p.map_ids.contains(m))
        })
    });

    let (attachment, program_ids, logger) = if adopt {
        let ids: Vec<(&'static str, u32)> = PROGRAMS
            .iter()
            .zip(&pinned)
            .map(|(n, p)| (*n, p.as_ref().map_or(0, |p| p.id)))
            .collect();
        drop(fresh_logger);
        let logger = ids
            .iter()
            .find(|(name, _)| *name == LOGGING_PROGRAM)
            .and_then(|(_, id)| aya_log::EbpfLogger::init_from_id(*id).ok());
        info!(pin_dir = %cfg.pin_dir.display(), "adopted the pinned programs and links");
        (Attachment::Adopted, ids, logger)
    } else {
        let cgroup = fs::File::open(&cfg.cgroup).map_err(io("cannot open cgroup", &cfg.cgroup))?;
        let mut replaced = 0;
        for (name, _, _, _) in &tags {
            let link = attach_program(&mut ebpf, name, &cgroup)?;
            let final_path = links.join(name);
            // bpffs reserves names with a dot.
            let staging = links.join(format!("{name}_new"));
            let _ = fs::remove_file(&staging);
            let pinned = link.pin(&staging).map_err(|source| LoadError::Pin {
                path: staging.clone(),
                source,
            })?;
            if final_path.exists() {
                // Unpinning drops the old link's last reference: it detaches now.
                if let Ok(old) = PinnedLink::from_pin(&final_path) {
                    let _ = old.unpin();
                    replaced += 1;
                }
            }
            fs::rename(&staging, &final_path).map_err(io("cannot rename", &staging))?;
            drop(pinned);
            // The program next to its link, for the next start's adoption check. The old pin
            // (the replaced link's program) goes first; the program stays loaded while a link
            // or pin holds it.
            let prog_pin = progs.join(name);
            let _ = fs::remove_file(&prog_pin);
            let pinned = match program(&mut ebpf, name)? {
                Program::CgroupSockAddr(p) => p.pin(&prog_pin),
                Program::CgroupSock(p) => p.pin(&prog_pin),
                _ => Err(aya::pin::PinError::NoFd {
                    name: (*name).to_owned(),
                }),
            };
            pinned.map_err(|source| LoadError::Pin {
                path: prog_pin.clone(),
                source,
            })?;
        }
        // Links pinned for another cgroup belong to an earlier configuration.
        replaced += remove_other_link_dirs(&cfg.pin_dir, &links);
        let ids = tags.iter().map(|(n, id, _, _)| (*n, *id)).collect();
        info!(pin_dir = %cfg.pin_dir.display(), cgroup = %cfg.cgroup.display(), replaced, "attached the socket-LB programs");
        (
            Attachment::Attached {
                replaced_links: replaced,
            },
            ids,
            fresh_logger,
        )
    };
    drop(ebpf);

    let mut maps = KernelMaps::open_pinned(&maps_dir)?;
    maps.hold_lock(lock);
    let caps = maps.capacities();
    let wanted = Capacities {
        frontends: cfg.max_frontends,
        slots: cfg.max_slots,
        clusters: cfg.max_clusters,
    };
    if caps != wanted {
        warn!(
            ?caps,
            ?wanted,
            "the pinned maps were created with other sizes and keep them; run `dataplane-agent uninstall` to recreate them"
        );
    }
    Ok(Dataplane {
        maps,
        attachment,
        program_ids,
        logger,
    })
}

fn remove_other_link_dirs(pin_dir: &Path, keep: &Path) -> usize {
    let mut removed = 0;
    let Ok(entries) = fs::read_dir(pin_dir.join("links")) else {
        return 0;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        if dir == keep {
            continue;
        }
        removed += remove_links_in(&dir);
        let _ = fs::remove_dir(&dir);
    }
    removed
}

fn remove_links_in(dir: &Path) -> usize {
    let mut removed = 0;
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        match PinnedLink::from_pin(&path) {
            Ok(link) => {
                if link.unpin().is_ok() {
                    removed += 1;
                }
            }
            // Without bpf(2) (no CAP_BPF, as in deploy/uninstall/), the pin is removed as a
            // file: the link goes with its last reference all the same.
            Err(_) => {
                if fs::remove_file(&path).is_ok() {
                    removed += 1;
                }
            }
        }
    }
    removed
}

/// What `uninstall` removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Uninstalled {
    pub links: usize,
    pub maps: usize,
}

/// The layout version of a pin directory named `v<N>` (digits only).
fn layout_version(dir: &Path) -> Option<u32> {
    let digits = dir.file_name()?.to_str()?.strip_prefix('v')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// [`uninstall`] of `pin_dir` and, when it is a layout directory (`v<N>`) of the agent's own
/// root (`root`: the default's parent), of every other layout version there: an older
/// agent's pins, or a newer one's when this binary is older than the agent it cleans up
/// after. Any other directory is uninstalled alone (a `v<N>` beside a custom pin directory
/// may be another program's).
pub fn uninstall_every_version(pin_dir: &Path, root: &Path) -> Result<Uninstalled, LoadError> {
    let versioned = |p: &Path| layout_version(p).is_some();
    // The requested directory first: refused (an agent runs on it), nothing else is touched.
    let mut done = uninstall(pin_dir)?;
    if !(versioned(pin_dir) && pin_dir.parent() == Some(root)) {
        return Ok(done);
    }
    let others = fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| versioned(p) && p != pin_dir);
    // Each on its own: one that cannot go now (its agent still stopping) leaves the others.
    for dir in others {
        match uninstall(&dir) {
            Ok(one) => {
                done.links += one.links;
                done.maps += one.maps;
            }
            Err(e) => {
                warn!(dir = %dir.display(), error = %e, "cannot uninstall this layout version")
            }
        }
    }
    Ok(done)
}

/// Detaches every pinned link and removes the pins and the pin directory. The maps are freed
/// once nothing references them. Nothing to remove is not an error (cleanup scripts run it
/// again); an agent still running on the directory is ([`LoadError::Busy`]): it would go on
/// writing maps that nothing reads.
pub fn uninstall(pin_dir: &Path) -> Result<Uninstalled, LoadError> {
    if !pin_dir.exists() {
        return Ok(Uninstalled::default());
    }
    // Held until the pins are gone: no agent starts on the directory meanwhile.
    let _lock = lock_pin_dir(pin_dir)?;
    let mut done = Uninstalled::default();
    if let Ok(entries) = fs::read_dir(pin_dir.join("links")) {
        for entry in entries.flatten() {
            done.links += remove_links_in(&entry.path());
            let _ = fs::remove_dir(entry.path());
        }
    }
    let maps_dir = pin_dir.join("maps");
    if let Ok(entries) = fs::read_dir(&maps_dir) {
        for entry in entries.flatten() {
            if fs::remove_file(entry.path()).is_ok() {
                done.maps += 1;
            }
        }
    }
    let progs_dir = pin_dir.join("progs");
    for entry in fs::read_dir(&progs_dir).into_iter().flatten().flatten() {
        let _ = fs::remove_file(entry.path());
    }
    for dir in [
        pin_dir.join("links"),
        maps_dir,
        progs_dir,
        pin_dir.to_owned(),
    ] {
        if dir.exists() {
            fs::remove_dir(&dir).map_err(io("cannot remove", &dir))?;
        }
    }
    // Remove the unversioned parent too when it is now empty (best effort).
    if let Some(parent) = pin_dir.parent() {
        let _ = fs::remove_dir(parent);
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With a versioned pin directory, every layout version beside it goes too (their pins
    /// counted), and nothing else; a second run finds nothing.
    #[test]
    fn uninstall_removes_every_layout_version_and_nothing_else() {
        let root = tempfile::tempdir().expect("tempdir");
        let touch = |p: &str| {
            let path = root.path().join(p);
            fs::create_dir_all(path.parent().expect("parent")).expect("dir");
            fs::write(path, b"").expect("file");
        };
        touch("v1/links/cgroup/connect4");
        touch("v1/maps/MCS_FE4");
        touch("v6/maps/MCS_FE4");
        touch("v6/maps/MCS_SLOTS");
        touch("other/keep");
        touch("v6/maps/MCS_SLOTS2");
        // Elsewhere than the agent's root, a v<N> directory is uninstalled alone.
        let elsewhere = uninstall_every_version(&root.path().join("v6"), Path::new("/nowhere"));
        assert_eq!(elsewhere.expect("alone"), Uninstalled { links: 0, maps: 3 });
        assert!(root.path().join("v1").exists());
        touch("v6/maps/MCS_FE4");
        touch("v6/maps/MCS_SLOTS");
        let done = uninstall_every_version(&root.path().join("v6"), root.path()).expect("all");
        assert_eq!(done, Uninstalled { links: 1, maps: 3 });
        assert!(!root.path().join("v1").exists() && !root.path().join("v6").exists());
        assert!(root.path().join("other/keep").exists());
        let again = uninstall_every_version(&root.path().join("v6"), root.path()).expect("again");
        assert_eq!(again, Uninstalled::default());
    }
}
