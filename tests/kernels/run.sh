#!/bin/sh
# Boots the agent's eBPF programs on other kernels: each Debian kernel package named on the
# command line (default: the newest 6.1 in the archive) runs in a throwaway VM (qemu), with an
# initramfs holding busybox, the agent and the test client and backend. Inside,
# the agent loads, verifies and attaches every program to a child cgroup, programs one service,
# and a client in that cgroup connects to the VIP over TCP and UDP; the backend listens on a
# loopback address of the VM. The VM has no network device, so nothing leaves it.
#
#   cargo xtask kernels                                  # the newest 6.1 package
#   cargo xtask kernels linux-image-6.1.0-57-amd64 ...   # named kernel packages
#
# `cargo xtask test` runs it too, on the default kernel. Needs root (apt-get), qemu-system-x86
# and busybox-static (installed here when missing), and the binaries of `cargo xtask build`
# (MCS_KERNELS_BIN: their directory, default target/debug). The VM runs on TCG, not KVM: some
# nested-virtualisation hosts hang a KVM guest's kernel at its start, and a TCG boot with
# the checks takes about 20 s. Prints one PASS or FAIL line per kernel; exits non-zero on any
# FAIL.
set -eu

root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${MCS_KERNELS_BIN:-$root/target/debug}
work=$(mktemp -d /tmp/mcs-kernels.XXXXXX)
[ -n "${MCS_KERNELS_KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
trap 'exit 1' INT TERM HUP

need() {
    command -v "$1" >/dev/null 2>&1 && return
    # The lists fetched first when the install fails on them (empty on a slim image).
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$2" >/dev/null ||
        { apt-get update >/dev/null &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$2" >/dev/null; }
}
need qemu-system-x86_64 qemu-system-x86
need busybox busybox-static
busybox=$(command -v busybox)

if [ $# -eq 0 ]; then
    # The newest 6.1 kernel package the archive has (the lists fetched first when they are
    # empty, as on a slim image whose packages were all installed already).
    newest_61() {
        apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64$' |
            awk '{print $1}' | sort -V | tail -1
    }
    newest=$(newest_61)
    if [ -z "$newest" ]; then
        apt-get update >/dev/null
        newest=$(newest_61)
    fi
    if [ -z "$newest" ]; then
        echo "no linux-image-6.1.0-*-amd64 package in the apt lists (run apt-get update; on a Debian other than bookworm, name the packages)" >&2
        exit 1
    fi
    set -- "$newest"
fi

# The initramfs: busybox, the binaries and the libraries they link, a fixture and /init.
rd=$work/initramfs
mkdir -p "$rd/bin" "$rd/input" "$rd/proc" "$rd/sys" "$rd/dev" "$rd/tmp"
cp "$busybox" "$rd/bin/busybox"
for b in dataplane-agent mcs-echo mcs-probe; do
    cp "$bin/$b" "$rd/bin/$b"
    for lib in $(ldd "$bin/$b" | awk '/=> \// {print $3} /^\t*\/.*ld-linux/ {print $1}'); do
        mkdir -p "$rd$(dirname "$lib")"
        cp -L "$lib" "$rd$lib"
    done
done
cp "$root/tests/kernels/web.yaml" "$rd/input/web.yaml"
cat >"$rd/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mkdir /sys/fs/cgroup/mcs-test
ip link set lo up
ip addr add 10.99.1.10/32 dev lo
result=FAIL
why="the agent did not program the service"
mcs-echo --id a/10.99.1.10 tcp:10.99.1.10:8080 udp:10.99.1.10:5353 >/tmp/echo.log 2>&1 &
dataplane-agent node --from-dir /input --pin-dir /sys/fs/bpf/mcs --cgroup /sys/fs/cgroup/mcs-test \
    >/tmp/agent.log 2>&1 &
i=0
while [ $i -lt 60 ]; do
    if dataplane-agent inspect --pin-dir /sys/fs/bpf/mcs 2>/dev/null | grep -q 241.0.0.10; then
        tcp=$(mcs-probe --cgroup /sys/fs/cgroup/mcs-test --count 5 tcp 241.0.0.10:80 2>&1)
        udp=$(mcs-probe --cgroup /sys/fs/cgroup/mcs-test --count 5 udp 241.0.0.10:53 2>&1)
        # Answered by the backend, and seen as the VIP (getpeername, recvmsg): both directions.
        ntcp=$(echo "$tcp" | grep '"ok":true' | grep '"peer":"241.0.0.10:80"' | grep -c 'a/10.99.1.10')
        nudp=$(echo "$udp" | grep '"ok":true' | grep '"from":"241.0.0.10:53"' | grep -c 'a/10.99.1.10')
        if [ "$ntcp" = 5 ] && [ "$nudp" = 5 ]; then
            result=PASS
            why="programs loaded and attached; 5/5 TCP connects and 5/5 UDP exchanges reached the backend through the VIP and saw the VIP as their peer"
        else
            why="TCP $ntcp/5, UDP $nudp/5 through the VIP: $tcp $udp"
        fi
        break
    fi
    sleep 0.5
    i=$((i + 1))
done
echo "MCS-KERNEL-CHECK $result $(uname -r): $why"
[ $result = PASS ] || tail -20 /tmp/agent.log
poweroff -f
EOF
chmod +x "$rd/init"
(cd "$rd" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 >"$work/initramfs.gz")

failed=0
for pkg in "$@"; do
    # As root, apt warns that it downloads unsandboxed (_apt cannot write here): harmless.
    (cd "$work" && apt-get download "$pkg" >/dev/null)
    # Only the kernel image, not its modules.
    rm -rf "$work/k" && mkdir "$work/k"
    dpkg-deb --fsys-tarfile "$work/$pkg"_*.deb | tar -x -C "$work/k" --wildcards './boot/vmlinuz-*'
    rm -f "$work/$pkg"_*.deb
    kernel=$(ls "$work"/k/boot/vmlinuz-*)
    line=$(timeout "${MCS_KERNELS_TIMEOUT:-300}" qemu-system-x86_64 -machine accel=tcg -cpu max -smp 2 -m 1024 \
        -nographic -no-reboot -nic none -kernel "$kernel" -initrd "$work/initramfs.gz" \
        -append "console=ttyS0 quiet panic=-1 rdinit=/init" 2>&1 |
        tr -d '\r' | sed 's/\x1b\[[0-9;?]*[a-zA-Z]//g; s/\x1bc//g' | grep -iE 'MCS-KERNEL-CHECK|error|verifier|panic' | tail -25)
    echo "$pkg: $(echo "$line" | grep MCS-KERNEL-CHECK || echo "MCS-KERNEL-CHECK FAIL: no result (VM did not finish)")"
    echo "$line" | grep -q "MCS-KERNEL-CHECK PASS" || {
        failed=1
        echo "$line" | grep -v MCS-KERNEL-CHECK || true
    }
done
exit $failed
