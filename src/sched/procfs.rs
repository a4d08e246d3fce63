//! What `/proc` says about a process: whether it has ended, its real uid,
//! its start time and its command name. One reader for `exec`, the
//! security detectors and the simulated driver.

/// The fields of `/proc/PID/stat` after the command name (which may hold
/// spaces and parentheses): the state first.
fn stat_rest(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat[stat.rfind(')')? + 2..].to_string())
}

/// Whether the pid names no running process (gone, or a zombie waiting
/// for its parent).
pub fn ended(pid: u32) -> bool {
    stat_rest(pid).is_none_or(|rest| rest.starts_with('Z'))
}

/// The process's real uid.
pub fn uid(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// When the process started, in clock ticks since boot.
pub fn start_ticks(pid: u32) -> Option<u64> {
    stat_rest(pid)?.split_whitespace().nth(19)?.parse().ok()
}

/// The command name (`gone` once it ended), for evidence and logs.
pub fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "gone".into())
}

/// A pidfd of a running process (`pidfd_open`): it names that process
/// and no other, even once its pid is reused.
pub fn pidfd(pid: u32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: the kernel just opened it for us.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Sends `sig` through a pidfd (0: is it still alive?); whether the
/// kernel took it.
pub fn pidfd_signal(fd: &std::os::fd::OwnedFd, sig: libc::c_int) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: a signal through a pidfd the caller owns, no siginfo.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        ) == 0
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_is_running_and_a_reaped_one_has_ended() {
        let me = std::process::id();
        assert!(!super::ended(me));
        assert_eq!(super::uid(me), Some(nix::unistd::getuid().as_raw()));
        assert!(super::start_ticks(me).is_some());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(super::ended(pid));
    }
}
