//! The GPU backend conformance suite. Every rule is written once against the
//! `GpuBackend` trait; `sim` runs it here. (The NVML backend on the stand-in
//! library will run the same functions: issue 3.)

use std::process::Command;
use std::time::Duration;

use gpuslice::gpu::catalog::{self, Placement};
use gpuslice::gpu::fleet::Fleet;
use gpuslice::gpu::mig::MigError;
use gpuslice::gpu::sim::SimBackend;
use gpuslice::gpu::{BackendError, GpuBackend, GpuInfo};

const FLEET: &str = r#"
[[node]]
name = "n1"
[[node.gpu]]
model = "H100-80GB"
mode = "mig"
count = 2
[[node.gpu]]
model = "A30-24GB"
mode = "mig"
[[node.gpu]]
model = "L40S-48GB"
mode = "timeslice"
"#;

fn sim(dir: Option<&std::path::Path>) -> SimBackend {
    SimBackend::open(&Fleet::parse(FLEET).unwrap(), "n1", dir).unwrap()
}

fn gpu(b: &dyn GpuBackend, model: &str) -> GpuInfo {
    b.inventory()
        .unwrap()
        .into_iter()
        .find(|g| g.model.as_deref() == Some(model))
        .unwrap()
}

fn pid(b: &dyn GpuBackend, model: &str, profile: &str) -> u32 {
    let _ = b;
    catalog::model(model)
        .unwrap()
        .profile(profile)
        .unwrap()
        .nvml_id
}

fn pl(start: u8, size: u8) -> Placement {
    Placement { start, size }
}

fn is_uuid_form(s: &str, prefix: &str) -> bool {
    let Some(rest) = s.strip_prefix(prefix) else {
        return false;
    };
    let parts: Vec<&str> = rest.split('-').collect();
    parts.iter().map(|p| p.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12]
        && parts
            .iter()
            .all(|p| p.chars().all(|c| c.is_ascii_hexdigit()))
}

// ------------------------------------------------------------ the rules

fn inventory_reports_models_uuids_and_modes(b: &dyn GpuBackend) {
    let inv = b.inventory().unwrap();
    assert_eq!(inv.len(), 4);
    assert!(inv.iter().all(|g| is_uuid_form(&g.uuid, "GPU-")), "{inv:?}");
    let h100 = gpu(b, "H100-80GB");
    assert!(h100.mig_current && !h100.mode_change_pending());
    assert_eq!(h100.memory_mib, 80 * 1024);
    let l40s = gpu(b, "L40S-48GB");
    assert!(!l40s.mig_current);
}

fn only_allowed_placements(b: &dyn GpuBackend) {
    let g = gpu(b, "H100-80GB").uuid;
    let three_g = pid(b, "H100-80GB", "3g.40gb");
    let e = b.create_instance(&g, three_g, pl(2, 4)).unwrap_err();
    assert!(
        matches!(e, BackendError::Mig(MigError::BadPlacement { .. })),
        "{e}"
    );
    let e = b.create_instance(&g, three_g, pl(0, 2)).unwrap_err();
    assert!(
        matches!(e, BackendError::Mig(MigError::BadPlacement { .. })),
        "wrong size: {e}"
    );
    assert!(
        b.instances(&g).unwrap().is_empty(),
        "a refusal changes nothing"
    );
}

fn overlap_is_insufficient_resources(b: &dyn GpuBackend) {
    let g = gpu(b, "H100-80GB").uuid;
    let one_g = pid(b, "H100-80GB", "1g.10gb");
    let four_g = pid(b, "H100-80GB", "4g.40gb");
    let i = b.create_instance(&g, one_g, pl(2, 1)).unwrap();
    let e = b.create_instance(&g, four_g, pl(0, 4)).unwrap_err();
    match &e {
        BackendError::Mig(m) => assert_eq!(m.nvml_code(), 23, "{e}"),
        other => panic!("{other}"),
    }
    b.destroy_instance(&g, i.gi_id, Duration::ZERO).unwrap();
    b.create_instance(&g, four_g, pl(0, 4)).unwrap();
}

fn max_counts_and_media_engines(b: &dyn GpuBackend) {
    let g = gpu(b, "H100-80GB").uuid;
    let me = pid(b, "H100-80GB", "1g.10gb+me");
    b.create_instance(&g, me, pl(0, 1)).unwrap();
    let e = b.create_instance(&g, me, pl(1, 1)).unwrap_err();
    assert!(
        matches!(e, BackendError::Mig(MigError::MaxCount { .. })),
        "{e}"
    );
    let seven = pid(b, "H100-80GB", "1g.10gb");
    for s in 1..7 {
        b.create_instance(&g, seven, pl(s, 1)).unwrap();
    }
    assert_eq!(b.instances(&g).unwrap().len(), 7);
    let a30 = gpu(b, "A30-24GB").uuid;
    b.create_instance(&a30, pid(b, "A30-24GB", "2g.12gb+me"), pl(0, 2))
        .unwrap();
    let e = b
        .create_instance(&a30, pid(b, "A30-24GB", "1g.6gb+me"), pl(2, 1))
        .unwrap_err();
    assert!(
        matches!(e, BackendError::Mig(MigError::MediaEnginesTaken { .. })),
        "{e}"
    );
}

fn created_instances_have_mig_uuids_and_placements(b: &dyn GpuBackend) {
    let g = gpu(b, "H100-80GB").uuid;
    let i = b
        .create_instance(&g, pid(b, "H100-80GB", "3g.40gb"), pl(4, 4))
        .unwrap();
    assert_eq!(i.profile, "3g.40gb");
    assert!(i.ci_id.is_some());
    let dev = i.device_uuid.clone().unwrap();
    assert!(is_uuid_form(&dev, "MIG-"), "{dev}");
    assert_eq!(b.instances(&g).unwrap(), vec![i]);
    assert!(b.processes(&dev).unwrap().is_empty());
}

fn not_mig_mode_refuses_instances(b: &dyn GpuBackend) {
    let g = gpu(b, "L40S-48GB").uuid;
    let e = b.create_instance(&g, 19, pl(0, 1)).unwrap_err();
    assert!(matches!(e, BackendError::NotMig(_)), "{e}");
    assert!(matches!(
        b.instances("GPU-nope").unwrap_err(),
        BackendError::NoSuchGpu(_)
    ));
    assert!(matches!(
        b.destroy_instance(&gpu(b, "H100-80GB").uuid, 999, Duration::ZERO)
            .unwrap_err(),
        BackendError::NoSuchInstance(..)
    ));
}

fn telemetry_follows_the_hardware(b: &dyn GpuBackend) {
    let mig = b.telemetry(&gpu(b, "H100-80GB").uuid).unwrap();
    assert_eq!(
        mig.utilization_pct, None,
        "no whole-GPU utilisation in MIG mode"
    );
    assert_eq!(mig.memory_total_mib, 80 * 1024);
    let shared = b.telemetry(&gpu(b, "L40S-48GB").uuid).unwrap();
    assert!(shared.utilization_pct.is_some());
}

#[test]
fn sim_conforms() {
    inventory_reports_models_uuids_and_modes(&sim(None));
    only_allowed_placements(&sim(None));
    overlap_is_insufficient_resources(&sim(None));
    max_counts_and_media_engines(&sim(None));
    created_instances_have_mig_uuids_and_placements(&sim(None));
    not_mig_mode_refuses_instances(&sim(None));
    telemetry_follows_the_hardware(&sim(None));
}

// --------------------------------------------- sim-only: state and faults

#[test]
fn destroy_ends_the_processes_holding_the_instance() {
    let b = sim(None);
    let g = gpu(&b, "H100-80GB").uuid;
    let i = b.create_instance(&g, 19, pl(0, 1)).unwrap();
    let dev = i.device_uuid.clone().unwrap();
    // A real process that ignores nothing: SIGTERM ends it.
    let mut child = Command::new("sleep").arg("60").spawn().unwrap();
    b.attach_process(&dev, child.id(), 512).unwrap();
    assert_eq!(b.processes(&dev).unwrap().len(), 1);
    assert_eq!(b.telemetry(&g).unwrap().memory_used_mib, 512);
    let ended = b
        .destroy_instance(&g, i.gi_id, Duration::from_millis(200))
        .unwrap();
    assert_eq!(
        ended.iter().map(|p| p.pid).collect::<Vec<_>>(),
        [child.id()]
    );
    let status = child.wait().unwrap();
    assert!(!status.success(), "the process was ended");
    assert!(b.instances(&g).unwrap().is_empty());
}

#[test]
fn a_restart_finds_the_instances_it_left() {
    let dir = tempdir("restart");
    let g;
    let made;
    {
        let b = sim(Some(&dir));
        g = gpu(&b, "H100-80GB").uuid;
        made = b.create_instance(&g, 9, pl(4, 4)).unwrap();
    }
    let b = sim(Some(&dir));
    assert_eq!(b.instances(&g).unwrap(), vec![made]);
    // And the rules still see it.
    assert!(b.create_instance(&g, 5, pl(0, 4)).is_ok());
    assert!(b.create_instance(&g, 9, pl(4, 4)).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mig_mode_changes_wait_for_a_reset() {
    let b = sim(None);
    let l40s = gpu(&b, "L40S-48GB").uuid;
    assert!(b.set_mig_mode(&l40s, true).is_err(), "L40S has no MIG");
    let g = gpu(&b, "H100-80GB").uuid;
    let i = b.create_instance(&g, 19, pl(0, 1)).unwrap();
    assert!(matches!(
        b.set_mig_mode(&g, false).unwrap_err(),
        BackendError::NotEmpty { .. }
    ));
    b.destroy_instance(&g, i.gi_id, Duration::ZERO).unwrap();
    b.set_mig_mode(&g, false).unwrap();
    let info = gpu(&b, "H100-80GB");
    assert!(
        info.mig_current && info.mode_change_pending(),
        "pending until reset"
    );
    b.create_instance(&g, 19, pl(0, 1)).unwrap();
    b.reset(&g).unwrap();
    let info = b
        .inventory()
        .unwrap()
        .into_iter()
        .find(|x| x.uuid == g)
        .unwrap();
    assert!(!info.mig_current && !info.mode_change_pending());
    assert!(matches!(
        b.create_instance(&g, 19, pl(0, 1)).unwrap_err(),
        BackendError::NotMig(_)
    ));
}

#[test]
fn injected_faults() {
    let b = sim(None);
    let g = gpu(&b, "H100-80GB").uuid;
    b.fail_next_create("simulated driver error");
    assert_eq!(
        b.create_instance(&g, 19, pl(0, 1)).unwrap_err(),
        BackendError::Driver("simulated driver error".into())
    );
    assert!(
        b.create_instance(&g, 19, pl(0, 1)).is_ok(),
        "only the next one fails"
    );
    b.set_lost(&g, true);
    assert_eq!(
        b.inventory().unwrap().len(),
        3,
        "a lost GPU disappears from the inventory"
    );
    assert!(matches!(
        b.instances(&g).unwrap_err(),
        BackendError::GpuLost(_)
    ));
    b.set_lost(&g, false);
    assert_eq!(b.instances(&g).unwrap().len(), 1);
    b.set_delay(Duration::from_millis(30));
    let t = std::time::Instant::now();
    b.inventory().unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(30),
        "slow calls are slow"
    );
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("gpuslice-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
