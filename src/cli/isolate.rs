//! `gpuslice exec --isolate pid`: the command runs in its own PID
//! namespace (it sees only its own processes) with a private `/dev` that
//! holds the ordinary pseudo-devices and the booking's device files, and
//! nothing else of the node's. As root the namespaces are made directly;
//! an ordinary account makes them inside a user namespace of its own (its
//! uid mapped to itself), as unprivileged containers do. The booking's
//! cgroup, joined before, still decides which devices open.
//!
//! Runs before any thread exists (`main` handles `exec` without the async
//! runtime): unsharing a user namespace needs a single-threaded process,
//! and the forks below allocate.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult};

use crate::sched::devices::DeviceNode;

/// The pseudo-devices every program expects.
const PSEUDO: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// Where a booking's device file appears in the private `/dev`.
pub fn private_path(node: &DeviceNode) -> PathBuf {
    let p = Path::new(&node.path);
    let name = p.file_name().map(PathBuf::from).unwrap_or_default();
    let in_caps = p
        .parent()
        .and_then(|d| d.file_name())
        .is_some_and(|d| d == "nvidia-caps");
    if in_caps {
        Path::new("/dev/nvidia-caps").join(name)
    } else {
        Path::new("/dev").join(name)
    }
}

/// Runs `cmd` isolated; returns its exit status (to exit with).
pub fn run(cmd: &[String], env: &[(&str, String)], nodes: &[DeviceNode]) -> Result<i32> {
    let root = nix::unistd::geteuid().is_root();
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    let mut flags = CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWPID;
    if !root {
        flags |= CloneFlags::CLONE_NEWUSER;
    }
    unshare(flags).map_err(|e| {
        anyhow!(
            "cannot make the namespaces for --isolate pid: {e}{}",
            if root {
                ""
            } else {
                " (does this node allow unprivileged user namespaces?)"
            }
        )
    })?;
    if !root {
        std::fs::write("/proc/self/setgroups", "deny").context("setgroups")?;
        std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1")).context("uid_map")?;
        std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1")).context("gid_map")?;
    }
    // Sources opened before /dev is covered.
    let open = |p: &Path| -> Result<OwnedFd> {
        use std::os::unix::fs::OpenOptionsExt;
        // O_PATH: a handle to the file itself (a device is not opened).
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(p)
            .with_context(|| format!("cannot open {}", p.display()))?;
        Ok(f.into())
    };
    let mut binds: Vec<(OwnedFd, PathBuf, bool)> = Vec::new();
    for name in PSEUDO {
        let p = Path::new("/dev").join(name);
        if p.exists() {
            binds.push((open(&p)?, p, false));
        }
    }
    if Path::new("/dev/pts").is_dir() {
        binds.push((
            open(Path::new("/dev/pts"))?,
            PathBuf::from("/dev/pts"),
            true,
        ));
    }
    for n in nodes {
        let p = Path::new(&n.path);
        binds.push((open(p)?, private_path(n), false));
    }
    // SAFETY: this process has one thread (see the module's note).
    match unsafe { fork() }.context("fork")? {
        ForkResult::Parent { child } => wait_exit(child),
        ForkResult::Child => {
            let code = match init(cmd, env, &binds) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("gpuslice: --isolate pid: {e:#}");
                    127
                }
            };
            std::process::exit(code)
        }
    }
}

/// A child's end as a shell reports it: its exit code, or 128 + the
/// signal that ended it; `None` for any other wait status.
fn exit_code(status: WaitStatus) -> Option<(nix::unistd::Pid, i32)> {
    match status {
        WaitStatus::Exited(pid, code) => Some((pid, code)),
        WaitStatus::Signaled(pid, sig, _) => Some((pid, 128 + sig as i32)),
        _ => None,
    }
}

/// The exit status of `child` as a shell reports it.
fn wait_exit(child: nix::unistd::Pid) -> Result<i32> {
    loop {
        match waitpid(child, None) {
            Ok(st) => match exit_code(st) {
                Some((_, code)) => return Ok(code),
                None => continue,
            },
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => bail!("waiting for the isolated command: {e}"),
        }
    }
}

/// PID 1 of the new namespace: builds the private `/dev` and `/proc`,
/// starts the command, reaps every orphan and exits with the command's
/// status (which ends whatever is left in the namespace).
fn init(cmd: &[String], env: &[(&str, String)], binds: &[(OwnedFd, PathBuf, bool)]) -> Result<i32> {
    let none: Option<&str> = None;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
        .context("making the mounts private")?;
    mount(
        Some("tmpfs"),
        "/dev",
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=65536k"),
    )
    .context("a private /dev")?;
    std::fs::create_dir_all("/dev/nvidia-caps")?;
    for (fd, target, dir) in binds {
        if *dir {
            std::fs::create_dir_all(target)?;
        } else {
            std::fs::write(target, b"")?;
        }
        let source = format!("/proc/self/fd/{}", fd.as_raw_fd());
        mount(
            Some(source.as_str()),
            target.as_path(),
            none,
            MsFlags::MS_BIND,
            none,
        )
        .with_context(|| format!("placing {}", target.display()))?;
    }
    for (link, to) in [
        ("/dev/ptmx", "pts/ptmx"),
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
    ] {
        let _ = std::os::unix::fs::symlink(to, link);
    }
    std::fs::create_dir_all("/dev/shm")?;
    mount(
        Some("tmpfs"),
        "/dev/shm",
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        none,
    )
    .context("/dev/shm")?;
    // This namespace's processes only.
    mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        none,
    )
    .context("a private /proc")?;
    let program = CString::new(cmd[0].as_bytes())?;
    let args: Vec<CString> = cmd
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()?;
    for (k, v) in env {
        std::env::set_var(k, v);
    }
    // SAFETY: still one thread.
    match unsafe { fork() }.context("fork")? {
        ForkResult::Child => {
            let err = nix::unistd::execvp(&program, &args).unwrap_err();
            eprintln!("gpuslice: cannot run {}: {err}", cmd[0]);
            std::process::exit(127)
        }
        ForkResult::Parent { child } => {
            // Reap orphans until the command itself ends.
            loop {
                match waitpid(None, None) {
                    Ok(st) => match exit_code(st) {
                        Some((pid, code)) if pid == child => return Ok(code),
                        _ => continue,
                    },
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => bail!("waiting for the command: {e}"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_files_keep_their_names_under_the_private_dev() {
        let n = |p: &str| DeviceNode {
            path: p.into(),
            major: 195,
            minor: 0,
        };
        assert_eq!(
            private_path(&n("/data/sim/dev/node-a/nvidia0")),
            PathBuf::from("/dev/nvidia0")
        );
        assert_eq!(
            private_path(&n("/dev/nvidia-caps/nvidia-cap12")),
            PathBuf::from("/dev/nvidia-caps/nvidia-cap12")
        );
    }
}
