//! `gpuslice exec BOOKING -- CMD`: the node's worker listens on a Unix
//! socket; a caller names a booking, the worker checks who is calling
//! (SO_PEERCRED: root, or the Unix account linked to the booking's owner,
//! as pam_slurm_adopt does) and that the booking is active on one of its
//! nodes, moves the caller's process into the booking's cgroup and answers
//! with the device. The caller then sets `CUDA_VISIBLE_DEVICES` and
//! `NVIDIA_VISIBLE_DEVICES` and replaces itself with CMD.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::db;
use crate::domain::booking::Status;
use crate::sched::cgroup::{Layout, Limits};

#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    pub booking: i64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    #[serde(default)]
    pub device: Option<String>,
    /// The process is in the booking's cgroup (false: this node has no
    /// cgroups, the command runs without isolation).
    #[serde(default)]
    pub isolated: bool,
    #[serde(default)]
    pub error: Option<String>,
    /// The device files the process may open (its cgroup denies NVIDIA's
    /// others), where the node confines bookings.
    #[serde(default)]
    pub device_nodes: Vec<crate::sched::devices::DeviceNode>,
    /// How a time-sliced share is enforced on this node (`launch`,
    /// `freezer`, `mps`); `None` for MIG bookings.
    #[serde(default)]
    pub enforcement: Option<crate::sched::launch::Enforcement>,
    /// The launch shim the command must run with (prepended to
    /// `LD_PRELOAD`).
    #[serde(default)]
    pub preload: Option<String>,
    /// Environment the command runs with (the shim's regions, or MPS's
    /// limits).
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// `docker run` arguments (before the image) that put a container
    /// into the booking with the same environment (`--docker-args`).
    #[serde(default)]
    pub docker_args: Vec<String>,
}

fn refuse(msg: impl Into<String>) -> Reply {
    Reply {
        ok: false,
        device: None,
        isolated: false,
        error: Some(msg.into()),
        device_nodes: Vec::new(),
        enforcement: None,
        preload: None,
        env: Vec::new(),
        docker_args: Vec::new(),
    }
}

/// The nodes this process runs, with their cgroup layouts and the limits
/// a booking's group is created with.
pub type Nodes = HashMap<String, Option<(Layout, Limits)>>;

/// Serves the socket at `path` until the task is dropped; time-sliced
/// shares are joined as `slicing` says.
pub async fn serve(
    pool: PgPool,
    path: PathBuf,
    nodes: Nodes,
    slicing: crate::sched::launch::TimeSlicing,
) {
    let slicing = std::sync::Arc::new(slicing);
    // unlink and bind never follow a symlink at the path; the mode is set
    // on what bind made, never through a link planted after it.
    let _ = std::fs::remove_file(&path);
    let listener = match UnixListener::bind(&path) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(socket = %path.display(), error = %e, "cannot open the exec socket; gpuslice exec will not work");
            return;
        }
    };
    // Anyone on the node may connect; who they are decides what they get.
    if let Err(e) = open_to_all(&path) {
        tracing::error!(socket = %path.display(), error = %e, "cannot open the exec socket to the node's users");
    }
    tracing::info!(socket = %path.display(), "exec socket ready");
    // Connections served at once: a local user cannot take every file
    // descriptor of the worker.
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let refusals = std::sync::Arc::new(Refusals::default());
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream);
            tracing::warn!("exec socket: too many connections at once; one refused");
            continue;
        };
        let (pool, nodes, refusals, slicing) = (
            pool.clone(),
            nodes.clone(),
            refusals.clone(),
            slicing.clone(),
        );
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = handle(&pool, &nodes, &slicing, &refusals, stream).await {
                tracing::warn!(error = %e, "exec request failed");
            }
        });
    }
}

/// Makes the socket at `path` connectable by everyone (mode 0666) without
/// following a symlink: the file is opened with `O_PATH | O_NOFOLLOW`,
/// checked to be a socket, and changed through its descriptor.
fn open_to_all(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
        .open(path)?;
    if !f.metadata()?.file_type().is_socket() {
        return Err(std::io::Error::other("the path is no longer the socket"));
    }
    use std::os::fd::AsRawFd;
    // chmod through /proc reaches the file the descriptor holds (an
    // O_PATH descriptor takes no fchmod), as glibc's fchmodat does.
    std::fs::set_permissions(
        format!("/proc/self/fd/{}", f.as_raw_fd()),
        std::fs::Permissions::from_mode(0o666),
    )
}

/// The calling process, held as its connection reported it: a pidfd
/// (SO_PEERPIDFD, Linux 6.5+), which names that process and no other
/// even once its pid is reused; else its pid with the start time it must
/// not be later than.
struct Caller {
    uid: u32,
    pid: i32,
    pidfd: Option<std::os::fd::OwnedFd>,
    /// Clock ticks since boot when the connection was accepted.
    accepted_ticks: u64,
}

const SO_PEERPIDFD: libc::c_int = 77;

impl Caller {
    fn of(stream: &UnixStream) -> std::io::Result<Caller> {
        use std::os::fd::{AsRawFd, FromRawFd};
        let cred = stream.peer_cred()?;
        let mut fd: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `fd` and `len` are live locals of the sizes the option
        // uses; the socket descriptor is open for the call.
        let rc = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERPIDFD,
                (&mut fd as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        let pidfd = (rc == 0 && fd >= 0).then(|| {
            // SAFETY: the kernel just opened this descriptor for us.
            unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
        });
        Ok(Caller {
            uid: cred.uid(),
            pid: cred.pid().unwrap_or(0),
            pidfd,
            accepted_ticks: boot_ticks(),
        })
    }

    /// Whether the pid still names the process that connected.
    fn still_there(&self) -> bool {
        if self.pid <= 0 {
            return false;
        }
        match &self.pidfd {
            Some(fd) => {
                super::procfs::pidfd_signal(fd, 0)
                    && pidfd_pid(fd) == Some(self.pid)
                    && !super::procfs::ended(self.pid as u32)
            }
            None => {
                // Without a pidfd: the pid's process must belong to the
                // caller and have started before the connection.
                let pid = self.pid as u32;
                let (Some(uid), Some(start)) =
                    (super::procfs::uid(pid), super::procfs::start_ticks(pid))
                else {
                    return false;
                };
                uid == self.uid && start <= self.accepted_ticks && !super::procfs::ended(pid)
            }
        }
    }
}

/// The pid a pidfd names (`Pid:` in its fdinfo; `None` once it exited).
fn pidfd_pid(fd: &std::os::fd::OwnedFd) -> Option<i32> {
    use std::os::fd::AsRawFd;
    std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Pid:"))?
        .trim()
        .parse()
        .ok()
        .filter(|p: &i32| *p > 0)
}

/// Clock ticks since boot (the unit of `/proc/PID/stat`'s start time).
fn boot_ticks() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    ts.tv_sec as u64 * hz + (ts.tv_nsec as u64 * hz) / 1_000_000_000 + 1
}

/// Connections the socket serves at once.
const MAX_CONNECTIONS: usize = 64;
/// Longest request line read from the socket (a request is ~20 bytes).
pub const MAX_REQUEST_BYTES: u64 = 4096;
/// How long a client may take to send its request line.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// One request line as sent by `gpuslice exec`: `{"booking": N}`, N > 0.
/// Anything else (not UTF-8, not that JSON, a booking id out of range) is
/// `None`.
pub fn parse_request(line: &[u8]) -> Option<Request> {
    let text = std::str::from_utf8(line).ok()?;
    serde_json::from_str::<Request>(text.trim_end())
        .ok()
        .filter(|r| r.booking > 0)
}

async fn handle(
    pool: &PgPool,
    nodes: &Nodes,
    slicing: &crate::sched::launch::TimeSlicing,
    refusals: &std::sync::Arc<Refusals>,
    stream: UnixStream,
) -> anyhow::Result<()> {
    use tokio::io::AsyncReadExt;
    let caller = Caller::of(&stream)?;
    let (read, mut write) = stream.into_split();
    // Any local user can connect: read one bounded line, in bounded time.
    let mut line = Vec::new();
    let mut reader = BufReader::new(read.take(MAX_REQUEST_BYTES));
    let reply = match tokio::time::timeout(REQUEST_TIMEOUT, reader.read_until(b'\n', &mut line))
        .await
    {
        Err(_) => refuse("no request within 10 seconds"),
        Ok(read) => {
            read?;
            match parse_request(&line) {
                Some(req) => decide(pool, nodes, slicing, refusals, req.booking, &caller).await,
                None => refuse("the request is not understood; use gpuslice exec BOOKING -- CMD"),
            }
        }
    };
    let mut out = serde_json::to_vec(&reply)?;
    out.push(b'\n');
    write.write_all(&out).await?;
    Ok(())
}

async fn decide(
    pool: &PgPool,
    nodes: &Nodes,
    slicing: &crate::sched::launch::TimeSlicing,
    refusals: &std::sync::Arc<Refusals>,
    booking: i64,
    caller: &Caller,
) -> Reply {
    let uid = caller.uid;
    // A stranger learns nothing about other people's bookings: a booking
    // that does not exist and one that is not theirs get the same answer.
    let not_yours = || {
        refuse(format!(
            "there is no booking {booking} that your Unix account (uid {uid}) may run in; \
             an admin links accounts to people on the user's page"
        ))
    };
    let target = match db::bookings::exec_target(pool, booking).await {
        Ok(Some(t)) => t,
        Ok(None) => {
            refusals.note(pool, nodes, uid, booking);
            return not_yours();
        }
        Err(e) => {
            tracing::warn!(error = %e, "exec: database error");
            return refuse("the worker cannot reach its database; try again in a moment");
        }
    };
    if uid != 0 {
        let owner_uid = target
            .owner_unix_user
            .as_deref()
            .and_then(|u| nix::unistd::User::from_name(u).ok().flatten())
            .map(|u| u.uid.as_raw());
        if owner_uid != Some(uid) {
            refusals.note(pool, nodes, uid, booking);
            return not_yours();
        }
    }
    if target.owner_disabled {
        return refuse(format!(
            "booking {booking}'s owner account is disabled; it cannot run anything"
        ));
    }
    let Some(node) = target.node.as_deref().filter(|n| nodes.contains_key(*n)) else {
        return refuse(format!(
            "booking {booking} is not on this node{}",
            target
                .node
                .as_deref()
                .map(|n| format!("; it is on {n}"))
                .unwrap_or_default()
        ));
    };
    if target.status != Status::Active {
        return refuse(format!(
            "booking {booking} is {}, not active: nothing to run on yet",
            target.status
        ));
    }
    let Some(device) = target.device_uuid else {
        return refuse(format!("booking {booking} has no device yet"));
    };
    if caller.pid <= 0 {
        return refuse("cannot tell which process is calling");
    }
    // The process that connected must still be the one the pid names:
    // a caller that handed its socket on and exited would otherwise get a
    // stranger's process (which reused the pid) moved into the booking.
    if !caller.still_there() {
        return refuse("the process that connected has exited; run gpuslice exec itself, do not pass its socket on");
    }
    let pid = caller.pid;
    let nodes_of = crate::sched::devices::from_json(target.device_nodes.as_ref());
    let isolated = match nodes.get(node).cloned().flatten() {
        Some((layout, limits)) => {
            let g = layout.group(booking);
            let added = if g.exists() {
                // Confined again before anyone joins: a group made before
                // this node confined devices, or whose confinement failed,
                // must not take a process as it is.
                match &limits.devices {
                    Some(d) => g.restrict_devices(&d.policy(&nodes_of)).map(|_| ()),
                    None => Ok(()),
                }
                .and_then(|_| g.add(pid as u32))
            } else {
                // Gone (a reboot): made again with its limits, not bare.
                layout
                    .create_for(booking, target.compute_slices, &limits, &nodes_of)
                    .and_then(|g| g.add(pid as u32))
            };
            // Nothing is moved back if the caller went in between: the
            // window is microseconds (a pid cannot come round again in it),
            // and moving a process out of a booking would free it of every
            // limit. The caller is told, and the process stays confined.
            if added.is_ok() && !caller.still_there() {
                return refuse("the process that connected has exited");
            }
            match added {
                Ok(()) => true,
                Err(e) => return refuse(format!("cannot join booking {booking}'s cgroup: {e}")),
            }
        }
        None => false,
    };
    let mut reply = Reply {
        ok: true,
        device: Some(device.clone()),
        isolated,
        error: None,
        device_nodes: if isolated { nodes_of } else { Vec::new() },
        enforcement: None,
        preload: None,
        env: Vec::new(),
        docker_args: Vec::new(),
    };
    if target.kind == crate::domain::booking::Kind::Timeslice && isolated {
        if let Err(msg) = share_launch(pool, node, slicing, booking, &device, uid, &mut reply).await
        {
            return refuse(msg);
        }
    }
    if isolated {
        reply.docker_args = docker_args(node, booking, &device, &reply);
    }
    reply
}

/// Where a container finds the shim (the image path of gpuslice's own
/// image; the node's file is mounted there).
pub const CONTAINER_SHIM: &str = "/usr/lib/gpuslice/libgpuslice_shim.so";

/// The container's `docker run` arguments: into the booking's cgroup with
/// its device, and for a share under launch enforcement the shim and the
/// share's regions mounted at the same paths and preloaded (under MPS: the
/// pipe directory, the host's IPC namespace and the MPS limits).
pub fn docker_args(node: &str, booking: i64, device: &str, reply: &Reply) -> Vec<String> {
    let mut args = crate::sched::container::docker_args(node, booking, device);
    match reply.enforcement {
        Some(crate::sched::launch::Enforcement::Launch) => {
            if let Some(shim) = &reply.preload {
                args.extend(["-v".into(), format!("{shim}:{CONTAINER_SHIM}:ro")]);
                args.extend(["-e".into(), format!("LD_PRELOAD={CONTAINER_SHIM}")]);
            }
            for (k, v) in &reply.env {
                let mode = if k == crate::sched::launch::ENV_CONTROL {
                    ":ro"
                } else {
                    ""
                };
                args.extend(["-v".into(), format!("{v}:{v}{mode}")]);
            }
        }
        Some(crate::sched::launch::Enforcement::Mps) => {
            args.push("--ipc=host".into());
            if let Some((_, pipe)) = reply
                .env
                .iter()
                .find(|(k, _)| k == "CUDA_MPS_PIPE_DIRECTORY")
            {
                args.extend(["-v".into(), format!("{pipe}:{pipe}")]);
            }
        }
        _ => {}
    }
    for (k, v) in &reply.env {
        args.extend(["-e".into(), format!("{k}={v}")]);
    }
    args
}

/// Fills in how a time-sliced share's command runs: with the launch shim
/// and its share's regions, or with its MPS limits.
async fn share_launch(
    pool: &PgPool,
    node: &str,
    slicing: &crate::sched::launch::TimeSlicing,
    booking: i64,
    device: &str,
    uid: u32,
    reply: &mut Reply,
) -> Result<(), String> {
    use crate::sched::launch::{self, Enforcement, Regions};
    let shares = db::bookings::active_shares(pool, node)
        .await
        .map_err(|_| "the worker cannot reach its database; try again in a moment".to_string())?;
    let Some(me) = shares.iter().find(|s| s.id == booking) else {
        return Err(format!(
            "booking {booking} is not an active share on {node}"
        ));
    };
    let mode = slicing.mode(device);
    reply.enforcement = Some(mode);
    match mode {
        Enforcement::Freezer => {}
        Enforcement::Launch => {
            let memory = u64::try_from(me.memory_gib).unwrap_or(0) << 30;
            let shim = slicing.shim.as_ref().ok_or("no launch shim on this node")?;
            Regions::ensure(&slicing.dir, booking, memory)
                .map_err(|e| format!("cannot prepare booking {booking}'s launch regions: {e}"))?;
            if uid != 0 {
                Regions::give_to(&slicing.dir, booking, uid).map_err(|e| {
                    format!("cannot hand booking {booking}'s launch region to uid {uid}: {e}")
                })?;
            }
            let (control, report) = gpuslice_cuda::region::paths(&slicing.dir, booking);
            reply.preload = Some(shim.display().to_string());
            reply.env = vec![
                (launch::ENV_CONTROL.into(), control.display().to_string()),
                (launch::ENV_REPORT.into(), report.display().to_string()),
            ];
        }
        Enforcement::Mps => {
            let weights: Vec<f64> = shares
                .iter()
                .filter(|s| s.gpu_uuid == me.gpu_uuid)
                .map(|s| launch::weight(s.priority))
                .collect();
            reply.env = launch::mps_env(
                &slicing.mps_pipe(device),
                launch::weight(me.priority),
                &weights,
                me.memory_gib,
            );
        }
    }
    Ok(())
}

/// Refused `exec` calls per uid, so that a local user looping on the
/// socket cannot turn each refusal into database work: at most
/// `REFUSALS_REPORTED` pieces of evidence per uid a minute, written in the
/// background by at most `REPORTS_AT_ONCE` tasks (the rest are counted in
/// the log only).
pub struct Refusals {
    by_uid: std::sync::Mutex<HashMap<u32, (std::time::Instant, u32)>>,
    writing: std::sync::Arc<tokio::sync::Semaphore>,
}

impl Default for Refusals {
    fn default() -> Self {
        Refusals {
            by_uid: Default::default(),
            writing: std::sync::Arc::new(tokio::sync::Semaphore::new(REPORTS_AT_ONCE)),
        }
    }
}

const REFUSALS_REPORTED: u32 = 10;
const REPORTS_AT_ONCE: usize = 4;

impl Refusals {
    fn note(&self, pool: &PgPool, nodes: &Nodes, uid: u32, booking: i64) {
        let now = std::time::Instant::now();
        let n = {
            let mut m = self.by_uid.lock().unwrap_or_else(|e| e.into_inner());
            if m.len() > 10_000 {
                m.retain(|_, (at, _)| now.duration_since(*at).as_secs() < 60);
            }
            let e = m.entry(uid).or_insert((now, 0));
            if now.duration_since(e.0).as_secs() >= 60 {
                *e = (now, 0);
            }
            e.1 += 1;
            e.1
        };
        if n > REFUSALS_REPORTED {
            tracing::debug!(uid, refusals = n, "exec refusals over the reporting limit");
            return;
        }
        let Ok(permit) = self.writing.clone().try_acquire_owned() else {
            return;
        };
        let (pool, nodes) = (pool.clone(), nodes.clone());
        tokio::spawn(async move {
            let _permit = permit;
            suspect_refusal(&pool, &nodes, uid, booking).await;
        });
    }
}

/// A Unix account asked for a booking that is not its own (or none):
/// evidence for the security monitor against that account on this node.
async fn suspect_refusal(pool: &PgPool, nodes: &Nodes, uid: u32, booking: i64) {
    use crate::domain::security::{Detector, Suspect};
    use crate::watch::security::{report, Report};
    let mut names: Vec<&String> = nodes.keys().collect();
    names.sort();
    let node = names.first().map(|n| n.to_string()).unwrap_or_default();
    let account = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name);
    let user = match &account {
        Some(name) => db::security::user_of_unix(pool, name).await.ok().flatten(),
        None => None,
    };
    let detail = format!(
        "exec refused uid {uid}{} booking {booking}, which is not theirs or does not exist",
        account.map(|a| format!(" ({a})")).unwrap_or_default()
    );
    report(
        pool,
        Report::new(Suspect::Uid { uid, node }, Detector::ExecRefusals, detail).by_user(user),
    )
    .await;
}

/// The client side: asks the worker at `socket`; returns the device.
pub fn request(socket: &Path, booking: i64) -> Result<Reply, String> {
    use std::io::{BufRead, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket).map_err(|e| {
        format!(
            "cannot reach the gpuslice worker at {} ({e}); run this on the booking's GPU node",
            socket.display()
        )
    })?;
    let mut req = serde_json::to_vec(&Request { booking }).map_err(|e| e.to_string())?;
    req.push(b'\n');
    s.write_all(&req).map_err(|e| e.to_string())?;
    let mut line = String::new();
    std::io::BufReader::new(s)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    serde_json::from_str(&line).map_err(|_| "the worker gave no answer".to_string())
}
