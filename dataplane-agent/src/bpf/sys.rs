//! The `bpf(2)` commands aya 0.14 does not wrap, through the raw syscall:
//! - batched map operations: `BPF_MAP_UPDATE_BATCH`, `BPF_MAP_DELETE_BATCH` and
//!   `BPF_MAP_LOOKUP_BATCH` on a map's fd. One syscall writes or reads thousands of entries,
//!   which is what makes a full sync of a million slots fast. The kernel applies the elements
//!   in order and, on an error, reports how many it applied, so the caller knows exactly where
//!   it stopped;
//! - `BPF_LINK_DETACH` of a pinned link (kernel 5.9+), which detaches it even while other fds
//!   or pins still hold it;
//! - `BPF_OBJ_GET_INFO_BY_FD` of a program fd for its map ids: aya's `ProgramInfo::map_ids`
//!   reopens the program by id (`BPF_PROG_GET_FD_BY_ID`), which needs CAP_SYS_ADMIN.

use std::{
    ffi::CString,
    io,
    mem::size_of,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::Path,
};

const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
const BPF_MAP_DELETE_BATCH: libc::c_long = 27;
const BPF_LINK_DETACH: libc::c_long = 34;

/// The `batch` member of `union bpf_attr` (include/uapi/linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// `bpf(cmd, attr, sizeof(*attr))`: the raw return value (negative with `errno` set on failure).
///
/// # Safety
/// `attr` must be the `union bpf_attr` member that `cmd` reads, and every pointer inside it
/// must be valid for the kernel's reads and writes for the duration of the call.
unsafe fn sys_bpf<T>(cmd: libc::c_long, attr: &mut T) -> libc::c_long {
    // SAFETY: the caller's contract; `attr` is valid for `size_of::<T>()` bytes.
    unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T,
            size_of::<T>() as libc::c_uint,
        )
    }
}

/// Runs one batch command; returns the kernel's element count (done, or filled for a lookup)
/// and the error, if any.
fn batch(cmd: libc::c_long, attr: &mut BatchAttr) -> (u32, Option<io::Error>) {
    // SAFETY: `attr` is a valid, initialized `bpf_attr` batch member of the size we pass. The
    // pointers inside it (set by the callers below) point at buffers that live for the call and
    // hold `count` keys (and values) of the map's key and value sizes; the kernel writes only
    // within them (and into `attr.count` / `out_batch`).
    let rc = unsafe { sys_bpf(cmd, attr) };
    let err = (rc < 0).then(io::Error::last_os_error);
    (attr.count, err)
}

/// Keys and values, packed as the kernel reads them: `count` keys of `K`, `count` values of
/// `value_size` bytes each (per-CPU maps: the values of every CPU, each rounded to 8 bytes).
pub struct Elems<'a> {
    pub keys: &'a [u8],
    pub values: &'a [u8],
    pub count: u32,
}

/// `BPF_MAP_UPDATE_BATCH`. On failure, the number of elements applied before the failing one.
pub fn update(fd: &impl AsRawFd, e: &Elems<'_>) -> Result<(), (u32, io::Error)> {
    let mut attr = BatchAttr {
        keys: e.keys.as_ptr() as u64,
        values: e.values.as_ptr() as u64,
        count: e.count,
        map_fd: fd.as_raw_fd() as u32,
        ..Default::default()
    };
    match batch(BPF_MAP_UPDATE_BATCH, &mut attr) {
        (_, None) => Ok(()),
        (done, Some(err)) => Err((done, err)),
    }
}

/// `BPF_MAP_DELETE_BATCH` of `count` keys. On failure, the number deleted before the failing
/// one (a missing key fails with ENOENT).
pub fn delete(fd: &impl AsRawFd, keys: &[u8], count: u32) -> Result<(), (u32, io::Error)> {
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        count,
        map_fd: fd.as_raw_fd() as u32,
        ..Default::default()
    };
    match batch(BPF_MAP_DELETE_BATCH, &mut attr) {
        (_, None) => Ok(()),
        (done, Some(err)) => Err((done, err)),
    }
}

/// `BPF_MAP_LOOKUP_BATCH` of an array map from index `start` on: fills `values` (room for
/// `count` values of `value_size` bytes) and returns how many it filled (fewer at the end of
/// the array).
pub fn lookup_array(
    fd: &impl AsRawFd,
    start: u32,
    values: &mut [u8],
    value_size: usize,
    count: u32,
) -> io::Result<u32> {
    if value_size == 0 || values.len() < value_size * count as usize {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let mut keys = vec![0u32; count as usize];
    // The batch starts after `in_batch`: the element before `start` (none for 0).
    let mut prev = start.wrapping_sub(1);
    let mut out = 0u32;
    let mut attr = BatchAttr {
        in_batch: if start == 0 {
            0
        } else {
            &mut prev as *mut u32 as u64
        },
        out_batch: &mut out as *mut u32 as u64,
        keys: keys.as_mut_ptr() as u64,
        values: values.as_mut_ptr() as u64,
        count,
        map_fd: fd.as_raw_fd() as u32,
        ..Default::default()
    };
    let filled = match batch(BPF_MAP_LOOKUP_BATCH, &mut attr) {
        (n, None) => n,
        // ENOENT: the end of the array was reached; `n` are filled.
        (n, Some(e)) if e.raw_os_error() == Some(libc::ENOENT) => n,
        (_, Some(e)) => return Err(e),
    };
    // After an index past the end, an array's next key is its first: the kernel then reads
    // from index 0, which is not what was asked for.
    if filled > 0 && keys.first() != Some(&start) {
        return Ok(0);
    }
    Ok(filled)
}

/// The entries of a hash map, counted with `BPF_MAP_LOOKUP_BATCH`, `chunk` at a time: one
/// syscall per chunk where walking the keys takes one per key.
pub fn count_hash(
    fd: &impl AsRawFd,
    key_size: usize,
    value_size: usize,
    chunk: u32,
) -> io::Result<usize> {
    let mut keys = vec![0u8; key_size * chunk as usize];
    let mut values = vec![0u8; value_size * chunk as usize];
    // A hash map's batch position is an opaque bucket index (4 bytes; room for 8).
    let (mut position, mut next) = (0u64, 0u64);
    let mut total = 0usize;
    for first in std::iter::once(true).chain(std::iter::repeat(false)) {
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                &mut position as *mut u64 as u64
            },
            out_batch: &mut next as *mut u64 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk,
            map_fd: fd.as_raw_fd() as u32,
            ..Default::default()
        };
        let (filled, err) = batch(BPF_MAP_LOOKUP_BATCH, &mut attr);
        total += filled as usize;
        match err {
            None => position = next,
            // The end of the map: `filled` are the last ones.
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
            Some(e) => return Err(e),
        }
    }
    Ok(total)
}

/// The bytes of plain-data values, as the kernel reads them.
pub fn bytes_of<T: aya::Pod>(items: &[T]) -> &[u8] {
    // SAFETY: `T: Pod` is `#[repr(C)]` plain data without padding holes (the ABI types are
    // checked for that), so its bytes are initialized; the slice covers exactly `items`.
    unsafe { std::slice::from_raw_parts(items.as_ptr().cast::<u8>(), std::mem::size_of_val(items)) }
}

/// The `obj_pin` member of `union bpf_attr` (`BPF_OBJ_GET`).
#[repr(C)]
#[derive(Default)]
struct ObjAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

/// `BPF_OBJ_GET`: an fd of the object (map, program or link) pinned at `path`.
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut get = ObjAttr {
        pathname: c.as_ptr() as u64,
        ..Default::default()
    };
    // SAFETY: `get` is a valid `bpf_attr` prefix of the size passed; `pathname` points at a
    // NUL-terminated string that outlives the call.
    let fd = unsafe { sys_bpf(BPF_OBJ_GET, &mut get) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Detaches the link pinned at `path` (`BPF_OBJ_GET`, then `BPF_LINK_DETACH`): the cgroup stops
/// running its program at once, whoever else holds the link. The pin itself stays; remove it
/// afterwards.
pub fn detach_pinned_link(path: &Path) -> io::Result<()> {
    let link = obj_get(path)?;
    let mut detach: u32 = link.as_raw_fd() as u32;
    // SAFETY: the `link_detach` member of `bpf_attr` is one u32 (the link fd), passed by size.
    let rc = unsafe { sys_bpf(BPF_LINK_DETACH, &mut detach) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The `info` member of `union bpf_attr` (`BPF_OBJ_GET_INFO_BY_FD`).
#[repr(C)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// `struct bpf_prog_info` up to `map_ids` (include/uapi/linux/bpf.h); the kernel fills as many
/// bytes as it is given.
#[repr(C)]
#[derive(Default)]
struct ProgInfoHead {
    prog_type: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
    load_time: u64,
    created_by_uid: u32,
    nr_map_ids: u32,
    map_ids: u64,
}

/// What identifies a loaded program: its id, its tag (a hash of its code) and the maps it uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgIdentity {
    pub id: u32,
    pub tag: u64,
    pub map_ids: Vec<u32>,
}

/// The id, tag and map ids of the program behind `fd` (`BPF_OBJ_GET_INFO_BY_FD`). Needs no
/// capability beyond holding the fd.
pub fn prog_identity(fd: &impl AsRawFd) -> io::Result<ProgIdentity> {
    let mut map_ids = vec![0u32; 64];
    loop {
        let mut info = ProgInfoHead {
            nr_map_ids: map_ids.len() as u32,
            map_ids: map_ids.as_mut_ptr() as u64,
            ..Default::default()
        };
        let mut attr = InfoAttr {
            bpf_fd: fd.as_raw_fd() as u32,
            info_len: size_of::<ProgInfoHead>() as u32,
            info: &mut info as *mut ProgInfoHead as u64,
        };
        // SAFETY: `attr` is a valid `bpf_attr` info member of the size passed; `info` points at
        // a writable `ProgInfoHead` of `info_len` bytes, and its `map_ids` at room for
        // `nr_map_ids` u32s; all of them outlive the call.
        let rc = unsafe { sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        // The kernel reports how many maps the program uses, and fills at most the room given.
        let used = info.nr_map_ids as usize;
        if used > map_ids.len() {
            map_ids = vec![0u32; used];
            continue;
        }
        map_ids.truncate(used);
        return Ok(ProgIdentity {
            id: info.id,
            tag: u64::from_be_bytes(info.tag),
            map_ids,
        });
    }
}
