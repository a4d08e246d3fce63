#!/usr/bin/env bash
# Time-sliced shares on a real NVIDIA GPU (run when a GPU machine is lent).
# Three busy PyTorch processes in a high, a normal and a low share
# (4:2:1), measured under (a) no control, (b) the cgroup freezer alone,
# (c) gpuslice's launch shim, (d) NVIDIA MPS with thread percentages:
# each share's throughput against 4:2:1; for (b) and (c) the time from a
# share being stopped until the GPU is idle (nvidia-smi samples every
# 100 ms); for (c) and (d) an allocation past a 4 GiB cap.
#
# Read-only towards the GPU's settings: it never changes MIG mode, clocks,
# compute mode or time-slice settings. MPS is started with a private pipe
# directory and always told to quit (trap), so it is left stopped.
#
#   scripts/device-timeslice.sh [SHIM] [SECONDS]
#   SHIM: libgpuslice_shim.so (default target/release/libgpuslice_shim.so,
#         built by cargo build --release -p gpuslice-shim)
set -euo pipefail
cd "$(dirname "$0")/.."
shim=$(readlink -f "${1:-target/release/libgpuslice_shim.so}")
secs=${2:-20}
[ -f "$shim" ] || { echo "error: no shim at $shim (cargo build --release -p gpuslice-shim)" >&2; exit 1; }
command -v nvidia-smi >/dev/null || { echo "error: no NVIDIA driver here" >&2; exit 1; }
work=$(mktemp -d /tmp/gpuslice-device.XXXXXX)
mps_pipe="$work/mps-pipe"
cleanup() {
  if [ -S "$mps_pipe/control" ]; then echo quit | CUDA_MPS_PIPE_DIRECTORY="$mps_pipe" nvidia-cuda-mps-control || true; fi
  [ -d /sys/fs/cgroup/gpuslice-device ] && { for g in /sys/fs/cgroup/gpuslice-device/*/; do echo 0 > "$g/cgroup.freeze" 2>/dev/null || true; done; }
  pkill -f "$work/burn.py" 2>/dev/null || true
  sleep 1
  rmdir /sys/fs/cgroup/gpuslice-device/* /sys/fs/cgroup/gpuslice-device 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
nvidia-smi --query-gpu=name,mig.mode.current,compute_mode --format=csv,noheader

cat > "$work/burn.py" <<'PY'
# A busy share: 2048x2048 matmuls queued without synchronising (PyTorch
# runs ahead as far as the driver's queue allows); every 100 ms it writes
# how many it has completed (an event per batch tells) to COUNT.
import os, sys, time, torch
count, cap = sys.argv[1], float(os.environ.get("ALLOC_GIB", "0"))
if cap:
    try:
        x = torch.empty(int(cap * 2**30), dtype=torch.uint8, device="cuda")
        print("alloc ok", flush=True)
    except torch.cuda.OutOfMemoryError:
        print("alloc out_of_memory", flush=True)
    sys.exit(0)
a = torch.randn(2048, 2048, device="cuda")
done, pending, last = 0, [], 0.0
while True:
    for _ in range(8):
        a = a @ a
        a = a / a.norm()
    ev = torch.cuda.Event(); ev.record(); pending.append(ev)
    while pending and (len(pending) > 64 or pending[0].query()):
        pending.pop(0).synchronize(); done += 8
    if time.time() - last > 0.1:
        with open(count + ".tmp", "w") as f: f.write(str(done))
        os.replace(count + ".tmp", count); last = time.time()
PY

cat > "$work/drive.py" <<'PY'
# Runs one experiment: three shares (4:2:1), enforced as MODE says.
import mmap, os, struct, subprocess, sys, time
work, mode, secs, shim = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
weights, slices = [4, 2, 1], [0.100, 0.050, 0.025]
procs, ctl = [], []
cg = "/sys/fs/cgroup/gpuslice-device"
def now(): return time.clock_gettime_ns(time.CLOCK_MONOTONIC)
for i in range(3):
    env = dict(os.environ)
    if mode == "shim":
        c, r = f"{work}/s{i}.control", f"{work}/s{i}.report"
        with open(c, "wb") as f: f.write(b"\0" * 48)
        with open(r, "wb") as f: f.write(b"\0" * 2096)
        f = open(c, "r+b"); m = mmap.mmap(f.fileno(), 48)
        struct.pack_into("<I", m, 0, 0x67736331)
        struct.pack_into("<Q", m, 32, 4 << 30)        # 4 GiB cap
        struct.pack_into("<Q", m, 40, 2_000_000)      # 2 ms queued
        fr = open(r, "r+b"); mr = mmap.mmap(fr.fileno(), 2096)
        ctl.append((m, mr))
        env.update(LD_PRELOAD=shim, GPUSLICE_SHARE_CONTROL=c, GPUSLICE_SHARE_REPORT=r)
    if mode == "mps":
        env.update(CUDA_MPS_PIPE_DIRECTORY=f"{work}/mps-pipe",
                   CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(round(100 * weights[i] / 7)),
                   CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=4G")
    p = subprocess.Popen([sys.executable, f"{work}/burn.py", f"{work}/count{i}"], env=env)
    procs.append(p)
    if mode == "freezer":
        os.makedirs(f"{cg}/s{i}", exist_ok=True)
        open(f"{cg}/s{i}/cgroup.procs", "w").write(str(p.pid))
def count(i):
    try: return int(open(f"{work}/count{i}").read())
    except (OSError, ValueError): return 0
def turn(i, on):
    if mode == "freezer":
        open(f"{cg}/s{i}/cgroup.freeze", "w").write("0" if on else "1")
    elif mode == "shim":
        m, mr = ctl[i]
        if on:
            used = struct.unpack_from("<Q", mr, 8)[0]
            struct.pack_into("<QQ", m, 16, now() + int(slices[i] * 1e9), used + int(slices[i] * 1e9))
            struct.pack_into("<I", m, 4, 1)
        else:
            struct.pack_into("<I", m, 4, 0)
        g = struct.unpack_from("<I", m, 8)[0]; struct.pack_into("<I", m, 8, (g + 1) & 0xffffffff)
def run_for(t):
    end = time.time() + t
    while time.time() < end:
        if mode in ("freezer", "shim"):
            for i in range(3):
                turn(i, True)
                for j in range(3):
                    if j != i: turn(j, False)
                time.sleep(slices[i])
        else:
            time.sleep(0.1)
while min(count(i) for i in range(3)) == 0: run_for(0.5)   # all started
run_for(3)
before = [count(i) for i in range(3)]
run_for(secs)
got = [count(i) - b for i, b in zip(range(3), before)]
total = sum(got) or 1
parts = [g / total for g in got]
err = max(abs(p - w / 7) / (w / 7) for p, w in zip(parts, weights))
line = f"{mode:8} parts " + ", ".join(f"{p:.3f}" for p in parts) + f" (4:2:1 is 0.571, 0.286, 0.143), worst error {100*err:.1f} %, {total/secs:.0f} batches/s in all"
if mode in ("freezer", "shim"):
    # Stop share 0 alone and time until the GPU is idle (100 ms samples).
    for j in (1, 2): turn(j, False)
    turn(0, True); time.sleep(1.0)
    t0 = time.time(); turn(0, False)
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "100"],
                           stdout=subprocess.PIPE, text=True)
    idle = None
    for l in smi.stdout:
        if l.strip().isdigit() and int(l) == 0: idle = time.time() - t0; break
        if time.time() - t0 > 20: break
    smi.kill()
    line += f"; stopped share idle after {idle:.2f} s" if idle is not None else "; GPU not idle within 20 s"
    for i in range(3): turn(i, True)
print(line, flush=True)
for p in procs: p.kill(); p.wait()
PY

for mode in none freezer shim; do
  if [ "$mode" = freezer ]; then
    if [ -f /sys/fs/cgroup/cgroup.controllers ] && [ "$(id -u)" = 0 ]; then mkdir -p /sys/fs/cgroup/gpuslice-device
    else echo "freezer  skipped: needs root and cgroup v2"; continue; fi
  fi
  python3 "$work/drive.py" "$work" "$mode" "$secs" "$shim"
done
if command -v nvidia-cuda-mps-control >/dev/null; then
  mkdir -p "$mps_pipe" "$work/mps-log"
  CUDA_MPS_PIPE_DIRECTORY="$mps_pipe" CUDA_MPS_LOG_DIRECTORY="$work/mps-log" nvidia-cuda-mps-control -d
  python3 "$work/drive.py" "$work" mps "$secs" "$shim"
  echo -n "mps      allocation of 6 GiB under a 4 GiB pinned limit: "
  CUDA_MPS_PIPE_DIRECTORY="$mps_pipe" CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=4G" ALLOC_GIB=6 python3 "$work/burn.py" "$work/x"
  echo quit | CUDA_MPS_PIPE_DIRECTORY="$mps_pipe" nvidia-cuda-mps-control
else
  echo "mps      skipped: nvidia-cuda-mps-control not installed"
fi
printf '0' > "$work/cap.control"; python3 - "$work/cap.control" "$work/cap.report" <<'PY'
import mmap, struct, sys
open(sys.argv[1], "wb").write(b"\0" * 48); open(sys.argv[2], "wb").write(b"\0" * 2096)
m = mmap.mmap(open(sys.argv[1], "r+b").fileno(), 48)
struct.pack_into("<IIIIQQQQ", m, 0, 0x67736331, 1, 0, 0, 2**64 - 1, 2**64 - 1, 4 << 30, 2_000_000)
PY
echo -n "shim     allocation of 6 GiB under a 4 GiB cap: "
LD_PRELOAD="$shim" GPUSLICE_SHARE_CONTROL="$work/cap.control" GPUSLICE_SHARE_REPORT="$work/cap.report" ALLOC_GIB=6 python3 "$work/burn.py" "$work/x"
