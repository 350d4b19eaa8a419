#!/usr/bin/env bash
# The container isolation tests (tests/test_isolation.py) on a cgroup v2
# host: a Debian 12 VM under qemu whose kernel mounts only the unified
# hierarchy (cgroup_no_v1=all, systemd.unified_cgroup_hierarchy=1), with
# this repository shared read-only over 9p and the host's built binaries
# run inside. `make test-cgroup-v2`; root; needs `make build` first.
#
# The first run makes the VM's root file system with debootstrap from the
# Debian mirror (a few minutes) and keeps it in $STACCATO_VM_DIR
# (default /var/tmp/staccato-cgroup2-vm); later runs boot it directly.
# KVM when /dev/kvm works, software emulation otherwise (slower).
#
# Two passes (scripts/cgroup2-vm-guest.sh): the whole file with the engine
# in the root cgroup, then the cgroup tests again from inside a cgroup
# namespace whose root has processes, as an engine in a pod is. Left out:
# the package-cache test (it installs from PyPI and npm, which the VM does
# not reach), and the two pool-reuse tests: under software emulation (this
# machine kind has no nested KVM) a cleaned container's warm Python
# launcher takes longer than the engine's 20 s limit to come up, so the
# pool destroys the container instead of reusing it. They exercise the
# pool, the same code on both hierarchies; freezing and thawing is covered
# by the pause test. And the test of pausing while a worker starts: its
# function is Node.js, which the VM's image does not have.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
VM_DIR=${STACCATO_VM_DIR:-/var/tmp/staccato-cgroup2-vm}
ROOTFS=$VM_DIR/rootfs
IMAGE=$VM_DIR/root.img
OUT=$VM_DIR/out
MIRROR=${STACCATO_VM_MIRROR:-http://deb.debian.org/debian}
TESTS=${STACCATO_VM_TESTS:-tests/test_isolation.py}
SELECT=${STACCATO_VM_SELECT:-not package_cache and not cleaned_before_reuse and not frozen_pooled and not paused_while}
# The second pass, as in a Kubernetes pod: what the cgroup files do.
POD_SELECT=${STACCATO_VM_POD_SELECT:-(out_of_memory or pids_limit or paused or cpu_weight or unprivileged) and not paused_while}

say() { printf '==> %s\n' "$*"; }
die() { printf 'cgroup2-vm: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, and runc inside the VM)"
[ -x "$REPO/target/release/staccato" ] || die "run \`make build\` first: the VM runs this machine's binaries"

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
if [ ${#need[@]} -gt 0 ]; then
    say "apt-get install ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
fi

mkdir -p "$VM_DIR"
if [ ! -f "$ROOTFS/.staccato-ready" ]; then
    say "making the VM's root file system (debootstrap bookworm; once, a few minutes)"
    rm -rf "$ROOTFS"
    # What the tests need inside: the kernel and its modules, runc, Python
    # with pytest (the functions under test are Python), ip and nft for
    # the isolated network, and the tools the tests call.
    debootstrap --variant=minbase \
        --include=linux-image-amd64,initramfs-tools,kmod,runc,python3,python3-pytest,iproute2,nftables,procps,util-linux,mount \
        bookworm "$ROOTFS" "$MIRROR" >"$VM_DIR/debootstrap.log" 2>&1 ||
        die "debootstrap failed: see $VM_DIR/debootstrap.log"
    echo 9pnet_virtio >>"$ROOTFS/etc/initramfs-tools/modules"
    touch "$ROOTFS/.staccato-ready"
    rm -f "$IMAGE"
fi
# PID 1 of the VM: the shared directories, then the guest script from the
# repository (scripts/cgroup2-vm-guest.sh), so changing the tests never
# needs a new image.
init=$(cat <<'INIT'
#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sys /sys
mountpoint -q /dev || mount -t devtmpfs dev /dev
mkdir -p /repo /out
modprobe 9pnet_virtio
mount -t 9p -o trans=virtio,version=9p2000.L,ro repo /repo
mount -t 9p -o trans=virtio,version=9p2000.L out /out
exec /bin/sh /repo/scripts/cgroup2-vm-guest.sh
INIT
)
if [ "$(cat "$ROOTFS/sbin/staccato-vm-init" 2>/dev/null)" != "$init" ]; then
    printf '%s\n' "$init" >"$ROOTFS/sbin/staccato-vm-init"
    chmod 755 "$ROOTFS/sbin/staccato-vm-init"
    rm -f "$IMAGE"
fi
if [ ! -f "$IMAGE" ]; then
    say "making the VM's disk image"
    mkfs.ext4 -q -F -L staccato-vm -d "$ROOTFS" "$IMAGE" 3G
fi

rm -rf "$OUT"
mkdir -p "$OUT"
if [ -n "${STACCATO_VM_RUN:-}" ]; then cp "$STACCATO_VM_RUN" "$OUT/run.sh"; fi
printf 'export STACCATO_VM_TESTS=%q STACCATO_VM_SELECT=%q STACCATO_VM_POD_SELECT=%q\n' "$TESTS" "$SELECT" "$POD_SELECT" >"$OUT/env"

accel=(-accel tcg -cpu max)
if [ -w /dev/kvm ] && grep -qE '\<(vmx|svm)\>' /proc/cpuinfo; then accel=(-accel kvm -cpu host); fi
kernel=$(ls "$ROOTFS"/boot/vmlinuz-* | head -n 1)
initrd=$(ls "$ROOTFS"/boot/initrd.img-* | head -n 1)
say "booting the VM (${accel[1]}, 2 vCPUs, 4 GiB; cgroup v2 only), running $TESTS"
start=$(date +%s)
timeout 3600 qemu-system-x86_64 "${accel[@]}" -m 4096 -smp 2 -nographic -no-reboot \
    -kernel "$kernel" -initrd "$initrd" \
    -append "root=/dev/vda rw console=ttyS0 quiet init=/sbin/staccato-vm-init systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all" \
    -drive "file=$IMAGE,format=raw,if=virtio" \
    -virtfs "local,path=$REPO,mount_tag=repo,security_model=none,readonly=on" \
    -virtfs "local,path=$OUT,mount_tag=out,security_model=none" \
    -nic none | tee "$VM_DIR/console.log"
took=$(($(date +%s) - start))
host=$(cat "$OUT/rc-host" 2>/dev/null || echo "none")
pod=$(cat "$OUT/rc-pod" 2>/dev/null || echo "none")
say "the VM ran for ${took} s; tests' exit status: $host on the host's root cgroup, $pod as in a pod"
[ "$host" = 0 ] && [ "$pod" = 0 ]
