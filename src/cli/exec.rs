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
    let device = reply.device.unwrap_or_default();
    if !reply.isolated {
        eprintln!(
            "gpuslice: this node has no cgroups; {cmd:?} runs without isolation",
            cmd = cmd[0]
        );
    }
    if isolate {
        if reply.device_nodes.is_empty() {
            bail!("--isolate pid: the worker confined no device files for booking {booking} (a node without cgroups or without NVIDIA device numbering); run without --isolate");
        }
        let env = [
            ("CUDA_VISIBLE_DEVICES", device.clone()),
            ("NVIDIA_VISIBLE_DEVICES", device.clone()),
            ("GPUSLICE_BOOKING", booking.to_string()),
        ];
        let code = super::isolate::run(cmd, &env, &reply.device_nodes)?;
        std::process::exit(code);
    }
    let err = std::process::Command::new(&cmd[0])
        .args(&cmd[1..])
        .env("CUDA_VISIBLE_DEVICES", &device)
        .env("NVIDIA_VISIBLE_DEVICES", &device)
        .env("GPUSLICE_BOOKING", booking.to_string())
        .exec();
    bail!("cannot run {}: {err}", cmd[0])
}
