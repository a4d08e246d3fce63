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
}

fn refuse(msg: impl Into<String>) -> Reply {
    Reply {
        ok: false,
        device: None,
        isolated: false,
        error: Some(msg.into()),
    }
}

/// The nodes this process runs, with their cgroup layouts and the limits
/// a booking's group is created with.
pub type Nodes = HashMap<String, Option<(Layout, Limits)>>;

/// Serves the socket at `path` until the task is dropped.
pub async fn serve(pool: PgPool, path: PathBuf, nodes: Nodes) {
    let _ = std::fs::remove_file(&path);
    let listener = match UnixListener::bind(&path) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(socket = %path.display(), error = %e, "cannot open the exec socket; gpuslice exec will not work");
            return;
        }
    };
    // Anyone on the node may connect; who they are decides what they get.
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666));
    tracing::info!(socket = %path.display(), "exec socket ready");
    // Connections served at once: a local user cannot take every file
    // descriptor of the worker.
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream);
            tracing::warn!("exec socket: too many connections at once; one refused");
            continue;
        };
        let (pool, nodes) = (pool.clone(), nodes.clone());
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = handle(&pool, &nodes, stream).await {
                tracing::warn!(error = %e, "exec request failed");
            }
        });
    }
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

async fn handle(pool: &PgPool, nodes: &Nodes, stream: UnixStream) -> anyhow::Result<()> {
    use tokio::io::AsyncReadExt;
    let cred = stream.peer_cred()?;
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
                Some(req) => decide(pool, nodes, req.booking, cred.uid(), cred.pid()).await,
                None => refuse("the request is not understood; use gpuslice exec BOOKING -- CMD"),
            }
        }
    };
    let mut out = serde_json::to_vec(&reply)?;
    out.push(b'\n');
    write.write_all(&out).await?;
    Ok(())
}

async fn decide(pool: &PgPool, nodes: &Nodes, booking: i64, uid: u32, pid: Option<i32>) -> Reply {
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
        Ok(None) => return not_yours(),
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
    let Some(pid) = pid.filter(|p| *p > 0) else {
        return refuse("cannot tell which process is calling");
    };
    let isolated = match nodes.get(node).cloned().flatten() {
        Some((layout, limits)) => {
            let g = layout.group(booking);
            let added = if g.exists() {
                g.add(pid as u32)
            } else {
                // Gone (a reboot): made again with its limits, not bare.
                layout
                    .create_for(booking, target.compute_slices, &limits)
                    .and_then(|g| g.add(pid as u32))
            };
            match added {
                Ok(()) => true,
                Err(e) => return refuse(format!("cannot join booking {booking}'s cgroup: {e}")),
            }
        }
        None => false,
    };
    Reply {
        ok: true,
        device: Some(device),
        isolated,
        error: None,
    }
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
