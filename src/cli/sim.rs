//! `gpuslice sim`: stages faults and load on the simulated fleet by
//! writing a node's state file, which is its hardware (the running worker
//! reads it at its next sample). Simulated backend only; needs no database.

use anyhow::{anyhow, bail, Result};

use super::args::{GpuArgs, SimCommand};
use crate::gpu::fleet::Fleet;
use crate::gpu::sim::SimBackend;
use crate::gpu::EventKind;

fn open(gpu: &GpuArgs, data_dir: &std::path::Path, node: &str) -> Result<SimBackend> {
    if gpu.backend == "nvml" {
        bail!("gpuslice sim drives the simulated backend only; GPUSLICE_BACKEND is nvml");
    }
    let fleet = Fleet::load(gpu.fleet.as_deref()).map_err(|e| anyhow!(e))?;
    let dir = data_dir.join("sim");
    std::fs::create_dir_all(&dir)?;
    SimBackend::open(&fleet, node, Some(&dir)).map_err(|e| anyhow!(e))
}

fn check_gpu(b: &SimBackend, node: &str, index: u32) -> Result<String> {
    b.uuid_of(index)
        .map_err(|_| anyhow!("node {node} has no GPU {index}"))
}

/// Runs one `sim` command and says what it did.
pub fn sim(cmd: &SimCommand, gpu: &GpuArgs, data_dir: &std::path::Path) -> Result<String> {
    match cmd {
        SimCommand::Set(a) => {
            let b = open(gpu, data_dir, &a.node)?;
            let uuid = check_gpu(&b, &a.node, a.gpu)?;
            if a.utilization.is_some_and(|u| u > 100) {
                bail!("--utilization: give a percentage from 0 to 100");
            }
            if a.power.is_some_and(|p| !(0.0..=5000.0).contains(&p)) {
                bail!("--power: give watts from 0 to 5000");
            }
            if a.temperature.is_some_and(|t| t > 200) {
                bail!("--temperature: give degrees Celsius from 0 to 200");
            }
            b.stage(a.gpu, |s| {
                s.temperature_c = a.temperature.or(s.temperature_c);
                s.utilization_pct = a.utilization.or(s.utilization_pct);
                s.power_w = a.power.or(s.power_w);
                s.memory_used_mib = a.memory_used_mib.or(s.memory_used_mib);
                s.ecc_uncorrectable = a.ecc_uncorrectable.or(s.ecc_uncorrectable);
                if a.lost {
                    s.lost = true;
                }
                if a.found {
                    s.lost = false;
                }
            })?;
            Ok(format!("{} GPU {} ({uuid}) staged", a.node, a.gpu))
        }
        SimCommand::Xid {
            node,
            gpu: index,
            code,
        } => {
            let b = open(gpu, data_dir, node)?;
            let uuid = check_gpu(&b, node, *index)?;
            b.raise_event(*index, EventKind::Xid, *code)?;
            Ok(format!("{node} GPU {index} ({uuid}) reports XID {code}"))
        }
        SimCommand::Process {
            node,
            device,
            pid,
            used_mib,
        } => {
            let b = open(gpu, data_dir, node)?;
            b.attach_process(device, *pid, *used_mib)
                .map_err(|_| anyhow!("node {node} has no GPU or MIG device {device}"))?;
            Ok(format!("process {pid} uses {used_mib} MiB on {device}"))
        }
        SimCommand::Clear { node, gpu: index } => {
            let b = open(gpu, data_dir, node)?;
            let uuid = check_gpu(&b, node, *index)?;
            b.clear(*index)?;
            Ok(format!(
                "{node} GPU {index} ({uuid}) reports its modelled values again"
            ))
        }
    }
}
