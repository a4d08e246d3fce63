//! `gpuslice gpu-check`: a read-only look at a real GPU machine: whether
//! it is locked down (see [`crate::sched::lockdown`]), then its GPUs and
//! MIG profiles as NVML reports them.

use anyhow::{anyhow, bail, Result};

/// `gpu-check`: the lock-down report, then (unless `lockdown_only`) the
/// NVML part.
pub fn run(
    lib: Option<&std::path::Path>,
    json: bool,
    lockdown_only: bool,
    dev_dir: &std::path::Path,
    probe_cgroup: &str,
) -> Result<()> {
    if probe_cgroup.contains("..") || probe_cgroup.starts_with('/') {
        bail!("--probe-cgroup: give a cgroup path relative to the hierarchy, such as user.slice");
    }
    if json && !lockdown_only {
        // JSON is for diffing NVML's answers; the lock-down report is text.
        return gpu_check(lib, true);
    }
    if nix::unistd::Uid::effective().is_root() {
        let cgroups = crate::sched::lockdown::login_cgroups(
            std::path::Path::new("/sys/fs/cgroup"),
            probe_cgroup,
        );
        let nobody = nix::unistd::User::from_name("nobody")
            .ok()
            .flatten()
            .map(|u| u.uid.as_raw())
            .unwrap_or(65534);
        let report = crate::sched::lockdown::check(dev_dir, &cgroups, nobody);
        print!("{}", crate::sched::lockdown::render(&report));
    } else {
        println!("Lock-down: not checked (run gpu-check as root: the probe runs as another account in the login cgroup)");
    }
    if lockdown_only {
        return Ok(());
    }
    println!();
    gpu_check(lib, false)
}

/// `gpu-check`: prints what NVML reports (versions, user, GPUs, every
/// GPU-instance profile next to the catalog, instances, MIG devices, the
/// time of one walk), as text or as JSON. Read-only.
pub fn gpu_check(lib: Option<&std::path::Path>, json: bool) -> Result<()> {
    use crate::gpu::nvml::NvmlBackend;
    let b = NvmlBackend::open(lib, None, false).map_err(|e| anyhow!(e))?;
    let r = b.report()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    println!(
        "driver {}, NVML {}, running as {} (uid {})",
        r.driver_version, r.nvml_version, r.effective_user, r.effective_uid
    );
    if !r.missing_privileges.is_empty() {
        println!(
            "as this user it cannot: {}",
            r.missing_privileges.join(", ")
        );
    }
    println!();
    println!(
        "{:<5} {:<40} {:<32} {:<12} {:>12} {:>10}  mig (now/after reset)",
        "gpu", "uuid", "product", "catalog", "pci id", "MiB"
    );
    for g in &r.gpus {
        println!(
            "{:<5} {:<40} {:<32} {:<12} {:>12} {:>10}  {}/{}",
            g.index,
            g.uuid,
            g.name,
            g.catalog.as_deref().unwrap_or("(unknown)"),
            g.pci_device_id.as_deref().unwrap_or("-"),
            g.memory_mib
                .map(|m| m.to_string())
                .unwrap_or_else(|| format!("rc {}", g.memory_rc)),
            if g.mig_current { "on" } else { "off" },
            if g.mig_pending { "on" } else { "off" }
        );
    }
    println!();
    println!(
        "{:<5} {:>4} {:>3} {:<12} {:<14} {:>4} {:>6} {:>5} {:>8}  {:<40} verdict",
        "gpu",
        "enum",
        "rc",
        "catalog",
        "driver name",
        "id",
        "slices",
        "max",
        "MiB",
        "possible placements (start:size)"
    );
    for r in &r.profiles {
        let opt = |v: Option<u32>| v.map(|x| x.to_string()).unwrap_or_else(|| "-".into());
        let placements = r
            .placements
            .as_ref()
            .map(|p| {
                p.iter()
                    .map(|x| format!("{}:{}", x.start, x.size))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_else(|| "-".into());
        let verdict = match (&r.catalog_name, r.nvml_id, r.agrees) {
            (_, _, true) => "agrees",
            (None, Some(_), _) => "NOT IN CATALOG",
            (Some(_), None, _) => "not offered by the driver",
            _ => "DIFFERS",
        };
        let mib = |m: Option<u64>| m.map(|m| m.to_string()).unwrap_or_else(|| "-".into());
        println!(
            "{:<5} {:>4} {:>3} {:<12} {:<14} {:>4} {:>6} {:>5} {:>8} {:>8}  {:<40} {verdict}",
            r.gpu_index,
            r.nvml_enum,
            r.rc,
            r.catalog_name.as_deref().unwrap_or("?"),
            r.driver_name.as_deref().unwrap_or("-"),
            opt(r.nvml_id),
            opt(r.slices),
            opt(r.instance_count),
            mib(r.memory_mib),
            mib(r.catalog_memory_mib),
            placements
        );
    }
    let agree = r.profiles.iter().filter(|p| p.agrees).count();
    println!();
    println!(
        "{agree} of {} profiles agree with the catalog",
        r.profiles.len()
    );
    println!();
    println!("GPU instances: {}", r.instances.len());
    for i in &r.instances {
        println!(
            "  {} gi {} {} (id {}) at {}:{}{}{}",
            i.gpu_uuid,
            i.gi_id,
            i.profile,
            i.profile_id,
            i.placement.start,
            i.placement.size,
            i.device_uuid
                .as_deref()
                .map(|u| format!(", device {u}"))
                .unwrap_or_default(),
            if i.foreign {
                "  FOREIGN (not made by gpuslice)"
            } else {
                ""
            }
        );
    }
    println!("MIG devices: {}", r.mig_devices.len());
    for m in &r.mig_devices {
        println!(
            "  GPU {} gi {} ci {} {} processes {}",
            m.gpu_index,
            m.gi_id,
            m.ci_id,
            m.uuid,
            m.processes
                .map(|n| n.to_string())
                .unwrap_or_else(|| "?".into())
        );
    }
    println!("one full walk: {:.1} ms", r.walk_ms);
    Ok(())
}
