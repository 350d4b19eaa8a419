#!/bin/sh
# Runs inside the cgroup v2 test VM (scripts/cgroup2-vm.sh boots it with
# this repository at /repo, read-only, and a results directory at /out).
# Two passes over the isolation tests:
#  1. as on a host: the engine in the root cgroup of a unified hierarchy;
#  2. as in a Kubernetes pod: the tests and the engine in a cgroup
#     namespace whose root is a group with processes in it (the engine must
#     move them into a leaf before it can give controllers to containers).
# The exit status of each goes to /out/rc-host and /out/rc-pod, the
# output to the console.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
mkdir -p /dev/pts /dev/shm /run /tmp
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 shm /dev/shm
mount -t tmpfs tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
ip link set lo up
hostname staccato-cgroup2-vm
. /out/env
echo "cgroup: $(stat -fc %T /sys/fs/cgroup), controllers: $(cat /sys/fs/cgroup/cgroup.controllers), kernel $(uname -r), $(nproc) vCPUs"
cd /repo
pytest() { python3 -m pytest -p no:cacheprovider -q -rfE "$@" 2>&1; }

# STACCATO_VM_RUN=script (cgroup2-vm.sh copies it to /out/run.sh): run
# that instead of the tests, e.g. to look at a failure from inside.
if [ -f /out/run.sh ]; then
    sh /out/run.sh 2>&1
    echo $? >/out/rc-host
    echo 0 >/out/rc-pod
    sync
    echo o >/proc/sysrq-trigger
    sleep 30
fi

echo "== pass 1: on the host's root cgroup"
start=$(date +%s)
pytest "$STACCATO_VM_TESTS" -k "$STACCATO_VM_SELECT"
echo $? >/out/rc-host
echo "== pass 1 took $(($(date +%s) - start)) s"

echo "== pass 2: in a cgroup namespace whose root has processes (a pod)"
start=$(date +%s)
# The pod's group gets the controllers a kubelet would give it.
echo "+memory +pids +cpu" >/sys/fs/cgroup/cgroup.subtree_control
mkdir /sys/fs/cgroup/pod
echo $$ >/sys/fs/cgroup/pod/cgroup.procs
unshare --cgroup --mount --propagation private sh -c '
    umount /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup || exit 1
    echo "in the namespace: /proc/self/cgroup is $(cat /proc/self/cgroup)"
    python3 -m pytest -p no:cacheprovider -q -rfEs "$STACCATO_VM_TESTS" -k "$STACCATO_VM_POD_SELECT" >/tmp/pod.out 2>&1
    rc=$?
    cat /tmp/pod.out
    echo "groups in the pod: $(cd /sys/fs/cgroup && ls -d */ | tr "\\n" " ")"
    # A skip here means the cgroup tests did not run at all.
    if grep -q "skipped" /tmp/pod.out || ! grep -q "passed" /tmp/pod.out; then
        echo "pass 2 ran no test or skipped one: failing it"
        exit 1
    fi
    exit $rc'
echo $? >/out/rc-pod
echo "== pass 2 took $(($(date +%s) - start)) s"
sync
echo o >/proc/sysrq-trigger
sleep 30
