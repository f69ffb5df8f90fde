//! Waiting, from userspace, until no socket-LB program that started earlier is still running.
//!
//! The programs run inside an RCU read-side section (`bpf_prog_run_array_cg` holds
//! `rcu_read_lock`), so one RCU grace period is enough: `membarrier(MEMBARRIER_CMD_GLOBAL)` is
//! exactly `synchronize_rcu()` (kernel/sched/membarrier.c; the BPF selftests use it the same
//! way, `kern_sync_rcu`). Kernels booted with `nohz_full` refuse that command (EINVAL); there
//! the agent waits [`FALLBACK`] instead, far longer than a program run (microseconds), and the
//! programs' slot-tag check stays the second line of defence.

use std::{io, time::Duration};

/// `MEMBARRIER_CMD_GLOBAL` (include/uapi/linux/membarrier.h).
const MEMBARRIER_CMD_GLOBAL: libc::c_int = 1;
/// The wait when the kernel refuses `MEMBARRIER_CMD_GLOBAL`.
pub const FALLBACK: Duration = Duration::from_millis(50);

/// Returns after an RCU grace period (see the module docs).
pub fn wait() -> io::Result<()> {
    // SAFETY: membarrier takes no pointers; command and flags are plain integers.
    let rc = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EINVAL) {
        std::thread::sleep(FALLBACK);
        return Ok(());
    }
    Err(e)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_grace_period_returns() {
        // Any process may call it; it only waits.
        super::wait().unwrap();
    }
}
