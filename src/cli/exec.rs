//! `gpuslice exec BOOKING -- CMD`, the caller's side.

use anyhow::{anyhow, bail, Result};

/// `gpuslice exec`: joins the booking through the local worker, then
/// replaces this process with `cmd` (so its exit status is CMD's).
pub fn exec(socket: &std::path::Path, booking: i64, cmd: &[String], isolate: bool) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let reply = crate::sched::exec::request(socket, booking).map_err(|e| anyhow!(e))?;
    if !reply.ok {
        bail!(
            "{}",
            reply.error.unwrap_or_else(|| "the worker refused".into())
        );
    }
    let device = reply.device.clone().unwrap_or_default();
    if !reply.isolated {
        eprintln!(
            "gpuslice: this node has no cgroups; {cmd:?} runs without isolation",
            cmd = cmd[0]
        );
    }
    let env = command_env(&reply, &device, booking, std::env::var("LD_PRELOAD").ok());
    if isolate {
        if reply.device_nodes.is_empty() {
            bail!("--isolate pid: the worker confined no device files for booking {booking} (a node without cgroups or without NVIDIA device numbering); run without --isolate");
        }
        let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let code = super::isolate::run(cmd, &env, &reply.device_nodes)?;
        std::process::exit(code);
    }
    let err = std::process::Command::new(&cmd[0])
        .args(&cmd[1..])
        .envs(env)
        .exec();
    bail!("cannot run {}: {err}", cmd[0])
}

/// The environment CMD runs with: its device, its booking and, for a
/// time-sliced share, the launch shim first in `LD_PRELOAD` with its
/// share's regions (or MPS's limits).
pub fn command_env(
    reply: &crate::sched::exec::Reply,
    device: &str,
    booking: i64,
    preload_before: Option<String>,
) -> Vec<(String, String)> {
    let mut env = vec![
        ("CUDA_VISIBLE_DEVICES".to_string(), device.to_string()),
        ("NVIDIA_VISIBLE_DEVICES".to_string(), device.to_string()),
        ("GPUSLICE_BOOKING".to_string(), booking.to_string()),
    ];
    if let Some(shim) = &reply.preload {
        let preload = match preload_before.filter(|p| !p.trim().is_empty()) {
            Some(rest) => format!("{shim}:{rest}"),
            None => shim.clone(),
        };
        env.push(("LD_PRELOAD".to_string(), preload));
    }
    env.extend(reply.env.iter().cloned());
    env
}
