//! Containers inside a booking: the arguments that put a Docker or Podman
//! container into the booking's cgroup (`--cgroup-parent`, with the
//! runtime's `cgroupfs` driver), so the booking's memory limit, CPU set,
//! turns on a shared GPU (the freezer is hierarchical) and device
//! confinement (a child group never gets more devices than its parent)
//! hold for the container too; and the GPU it may use.

/// The directory the node's booking groups live in under every cgroup
/// hierarchy: `gpuslice-<node>`, the node name made path-safe.
pub fn group_prefix(node: &str) -> String {
    let safe: String = node
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("gpuslice-{safe}")
}

/// A booking's group as a container runtime's `--cgroup-parent` names it
/// (a path from the hierarchy's root, the `cgroupfs` driver's form).
pub fn cgroup_parent(node: &str, booking: i64) -> String {
    format!("/{}/booking-{booking}", group_prefix(node))
}

/// `docker run` arguments (before the image) for a booking's container:
/// inside the booking's cgroup, with only the booking's GPU or MIG device
/// (the NVIDIA Container Toolkit adds that device's files and no others).
pub fn docker_args(node: &str, booking: i64, device_uuid: &str) -> Vec<String> {
    vec![
        format!("--cgroup-parent={}", cgroup_parent(node, booking)),
        "--gpus".into(),
        format!("\"device={device_uuid}\""),
    ]
}

/// The same as one shell line (quoted for a POSIX shell), with an image and
/// a command.
pub fn docker_line(node: &str, booking: i64, device_uuid: &str, rest: &str) -> String {
    let args = docker_args(node, booking, device_uuid);
    format!(
        "docker run --rm {} {} '{}' {rest}",
        args[0], args[1], args[2]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_goes_into_the_booking_group_with_its_device() {
        assert_eq!(
            cgroup_parent("gpu-node-1", 42),
            "/gpuslice-gpu-node-1/booking-42"
        );
        assert_eq!(group_prefix("rack 3/gpu.a"), "gpuslice-rack_3_gpu_a");
        assert_eq!(
            docker_args("n1", 7, "MIG-abc"),
            [
                "--cgroup-parent=/gpuslice-n1/booking-7",
                "--gpus",
                "\"device=MIG-abc\""
            ]
        );
        assert_eq!(
            docker_line("n1", 7, "MIG-abc", "img nvidia-smi -L"),
            "docker run --rm --cgroup-parent=/gpuslice-n1/booking-7 --gpus '\"device=MIG-abc\"' img nvidia-smi -L"
        );
    }
}
