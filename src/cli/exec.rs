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

/// `gpuslice exec --docker-args`: prints the container arguments the
/// worker gave, on one line (for `$(...)` in a shell).
pub fn docker_args(socket: &std::path::Path, booking: i64) -> Result<()> {
    let reply = crate::sched::exec::request(socket, booking).map_err(|e| anyhow!(e))?;
    if !reply.ok {
        bail!(
            "{}",
            reply.error.unwrap_or_else(|| "the worker refused".into())
        );
    }
    if reply.docker_args.is_empty() {
        bail!("booking {booking} has no container arguments on this node (no cgroups)");
    }
    println!("{}", reply.docker_args.join(" "));
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shim_goes_first_in_ld_preload_with_its_regions() {
        let reply = crate::sched::exec::Reply {
            ok: true,
            device: Some("GPU-1".into()),
            isolated: true,
            error: None,
            device_nodes: Vec::new(),
            enforcement: Some(crate::sched::launch::Enforcement::Launch),
            preload: Some("/usr/lib/gpuslice/libgpuslice_shim.so".into()),
            env: vec![("GPUSLICE_SHARE_CONTROL".into(), "/s/7.control".into())],
            docker_args: Vec::new(),
        };
        let docker = crate::sched::exec::docker_args("n1", 7, "GPU-1", &reply);
        assert_eq!(
            docker,
            [
                "--cgroup-parent=/gpuslice-n1/booking-7",
                "--gpus",
                "\"device=GPU-1\"",
                "-v",
                "/usr/lib/gpuslice/libgpuslice_shim.so:/usr/lib/gpuslice/libgpuslice_shim.so:ro",
                "-e",
                "LD_PRELOAD=/usr/lib/gpuslice/libgpuslice_shim.so",
                "-v",
                "/s/7.control:/s/7.control:ro",
                "-e",
                "GPUSLICE_SHARE_CONTROL=/s/7.control",
            ]
        );
        let env = command_env(&reply, "GPU-1", 7, Some("libjemalloc.so".into()));
        assert!(env.contains(&(
            "LD_PRELOAD".into(),
            "/usr/lib/gpuslice/libgpuslice_shim.so:libjemalloc.so".into()
        )));
        assert!(env.contains(&("GPUSLICE_SHARE_CONTROL".into(), "/s/7.control".into())));
        assert!(env.contains(&("CUDA_VISIBLE_DEVICES".into(), "GPU-1".into())));
        let freezer = crate::sched::exec::Reply {
            preload: None,
            env: Vec::new(),
            ..reply
        };
        let env = command_env(&freezer, "GPU-1", 7, Some("libjemalloc.so".into()));
        assert!(
            !env.iter().any(|(k, _)| k == "LD_PRELOAD"),
            "left as it was"
        );
    }
}
