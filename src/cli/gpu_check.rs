//! `gpuslice gpu-check`: a read-only look at a real GPU machine: whether
//! it is locked down (see [`crate::sched::lockdown`]), then its GPUs and
//! MIG profiles as NVML reports them.

use anyhow::{anyhow, bail, Result};

/// `gpu-check`: the lock-down report, then (unless `lockdown_only`) the
/// NVML part.
pub fn run(
    lib: Option<&std::path::Path>,
    lockdown_only: bool,
    dev_dir: &std::path::Path,
    probe_cgroup: &str,
) -> Result<()> {
    if probe_cgroup.contains("..") || probe_cgroup.starts_with('/') {
        bail!("--probe-cgroup: give a cgroup path relative to the hierarchy, such as user.slice");
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
    gpu_check(lib)
}

/// `gpu-check`: prints the GPUs and every GPU-instance profile as NVML
/// reports them, flagging where the catalog disagrees. Read-only.
pub fn gpu_check(lib: Option<&std::path::Path>) -> Result<()> {
    use crate::gpu::{nvml::NvmlBackend, GpuBackend};
    let b = NvmlBackend::open(lib, None, false).map_err(|e| anyhow!(e))?;
    println!(
        "{:<5} {:<40} {:<32} {:<12} {:>10}  mig (now/after reset)",
        "gpu", "uuid", "product", "catalog", "MiB"
    );
    for g in b.inventory()? {
        println!(
            "{:<5} {:<40} {:<32} {:<12} {:>10}  {}/{}",
            g.index,
            g.uuid,
            g.product,
            g.model.as_deref().unwrap_or("(unknown)"),
            g.memory_mib,
            if g.mig_current { "on" } else { "off" },
            if g.mig_pending { "on" } else { "off" }
        );
    }
    println!();
    println!(
        "{:<5} {:>4} {:<12} {:>4} {:>6} {:>5} {:>8}  {:<40} verdict",
        "gpu", "enum", "profile", "id", "slices", "max", "MiB", "possible placements (start:size)"
    );
    let rows = b.check_profiles()?;
    for r in &rows {
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
        println!(
            "{:<5} {:>4} {:<12} {:>4} {:>6} {:>5} {:>8}  {:<40} {verdict}",
            r.gpu_index,
            r.nvml_enum,
            r.catalog_name.as_deref().unwrap_or("?"),
            opt(r.nvml_id),
            opt(r.slices),
            opt(r.instance_count),
            r.memory_mib
                .map(|m| m.to_string())
                .unwrap_or_else(|| "-".into()),
            placements
        );
    }
    let agree = rows.iter().filter(|r| r.agrees).count();
    println!();
    println!("{agree} of {} profiles agree with the catalog", rows.len());
    Ok(())
}
