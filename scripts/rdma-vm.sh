#!/usr/bin/env bash
# scripts/rdma-vm.sh CMD [ARGS...]
#
# Runs CMD inside a throwaway QEMU VM that has a real RDMA stack: Debian's
# stock kernel with Soft-RoCE (rdma_rxe) brought up as rxe0, so the verbs
# transport can be tested on a machine without an RDMA NIC or a kernel
# with InfiniBand support. The guest sees this host's whole filesystem
# read-only (with a RAM overlay) and the current directory read-write at
# the same path, and runs CMD with this host's own binaries and libraries
# as root, in the same directory, with this shell's exported environment.
# Prints CMD's output (stdout and stderr merged) and exits with its status;
# 124 when MEP_VM_TIMEOUT ran out, 125 when the VM or rxe could not be set
# up (the guest console's tail is printed).
#
# In the guest: rxe0 on a dummy netdev eth0, 10.77.0.1/24, MTU 4500 (RoCE
# active MTU 4096), RoCE v2; GID index 1 is ::ffff:10.77.0.1. One device,
# so "hosts" are processes of one guest. No network leaves the guest.
#
# Needs: Debian (12) on x86_64, root (apt, and the 9p export of /), and
# Debian's mirror the first time. The first run installs the packages
# below and builds a kernel + initramfs cache (about 70 MB) in
# MEP_VM_CACHE; later runs take about 4 s from start to CMD.
#
# Environment: MEP_VM_TIMEOUT (s, default 1200, a hard limit for the whole
# VM), MEP_VM_MEM (4G), MEP_VM_SMP (2), MEP_VM_SHARE (the directory shared
# read-write, default the current one; it must contain it), MEP_VM_ACCEL
# (auto|tcg|kvm), MEP_VM_CACHE (/var/cache/mep-rdma-vm), MEP_VM_APPEND
# (more kernel arguments), MEP_VM_VERBOSE=1.
# `scripts/rdma-vm.sh --check` only says whether a VM can run here (exit 0)
# or why not (exit 1, one line).
#
# Timing: on hosts whose /dev/kvm cannot run a stock kernel (or has none),
# the VM runs under QEMU's TCG software emulation: CPU-bound code is 5 to
# 30 times slower than on the host and timings are noisy; compare ratios
# within one run only.
set -euo pipefail
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | cut -c3-; exit 0 ;; esac

TIMEOUT=${MEP_VM_TIMEOUT:-1200}
MEM=${MEP_VM_MEM:-4G}
SMP=${MEP_VM_SMP:-2}
CACHE=${MEP_VM_CACHE:-/var/cache/mep-rdma-vm}
ACCEL=${MEP_VM_ACCEL:-auto}
VERBOSE=${MEP_VM_VERBOSE:-0}
APPEND=${MEP_VM_APPEND:-}
MTU=4500
PKGS="qemu-system-x86 busybox-static kmod cpio xz-utils rdma-core ibverbs-utils
      ibverbs-providers libibverbs-dev iproute2 perftest"
MODS="virtio_pci virtio_console 9pnet_virtio 9p overlay dummy crc32_generic
      rdma_rxe ib_uverbs ib_umad"

say() { if [ "$VERBOSE" = 1 ]; then echo "rdma-vm: $*" >&2; fi; }
die() { echo "rdma-vm: $*" >&2; exit 125; }

# Whether a VM can run here at all: one line on stdout when it cannot.
cannot_run() {
  [ "$(uname -m)" = x86_64 ] || { echo "not an x86_64 host"; return 0; }
  [ "$(id -u)" = 0 ] || { echo "not root (apt and the 9p export of / need it)"; return 0; }
  command -v apt-get >/dev/null || { echo "no apt-get (a Debian host is needed)"; return 0; }
  return 1
}

if [ "${1:-}" = --check ]; then
  if why=$(cannot_run); then echo "rdma-vm: cannot run a VM here: $why"; exit 1; fi
  exit 0
fi
[ $# -ge 1 ] || { echo "usage: $0 CMD [ARGS...] | --check" >&2; exit 2; }
if why=$(cannot_run); then die "cannot run a VM here: $why"; fi

CWD=$(pwd -P)
SHARE=$(cd "${MEP_VM_SHARE:-$CWD}" && pwd -P)
case "$CWD/" in "$SHARE"/*) ;; *) echo "rdma-vm: $CWD is not inside MEP_VM_SHARE=$SHARE" >&2; exit 2;; esac

# ------------------------------------------------------------ host side
install_packages() {
  local missing="" p
  for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing="$missing $p"
  done
  [ -z "$missing" ] && return 0
  say "apt-get install$missing"
  export DEBIAN_FRONTEND=noninteractive
  local inst="apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=600"
  { $inst $missing || { apt-get update -qq && $inst $missing; }; } \
    >"$CACHE/apt.log" 2>&1 </dev/null || { tail -20 "$CACHE/apt.log" >&2; die "apt-get install failed"; }
}

# The version of Debian's current kernel package (linux-image-amd64's).
kernel_package() {
  apt-cache depends linux-image-amd64 2>/dev/null |
    awk '/Depends: linux-image-[0-9]/ {print $2; exit}'
}

# The guest's /init: modules, the host's root over 9p under a RAM overlay,
# the share read-write, then the job script in a chroot of that root.
write_init() {
  cat >"$1" <<EOF
#!/bin/busybox sh
/bin/busybox --install -s /bin; ln -s /bin/modprobe /sbin/modprobe; export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(echo $MODS); do modprobe \$m || echo "rdma-vm: modprobe \$m failed"; done
o=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o \$o,ro,cache=loose hostroot /lower && mount -t tmpfs -o size=50% rw /rw &&
  mkdir -p /rw/u /rw/w &&
  mount -t overlay -o lowerdir=/lower,upperdir=/rw/u,workdir=/rw/w ovl /root ||
  { echo "rdma-vm: cannot mount the host's root"; poweroff -f; }
R=/root
mount -t proc proc \$R/proc; mount -t sysfs sys \$R/sys; mount -t devtmpfs dev \$R/dev
mkdir -p \$R/dev/pts \$R/dev/shm; mount -t devpts pts \$R/dev/pts; mount -t tmpfs shm \$R/dev/shm
mount -t tmpfs tmp \$R/tmp; mount -t tmpfs run \$R/run; mkdir -p \$R/run/mep-vm
mount -t 9p -o \$o ctl \$R/run/mep-vm; S=\$(cat \$R/run/mep-vm/share)
[ "\$S" = / ] || { mkdir -p "\$R\$S"; mount -t 9p -o \$o,cache=mmap share "\$R\$S"; }
stty -F /dev/hvc0 raw -echo 2>/dev/null
chroot \$R /bin/bash /run/mep-vm/job.sh </dev/null >/dev/hvc0 2>&1
echo \$? >\$R/run/mep-vm/rc; sync; poweroff -f
EOF
  chmod +x "$1"
}

# Downloads the kernel package, keeps the modules rxe needs (with their
# dependencies) in an initramfs with busybox, and the kernel itself as an
# uncompressed ELF when it can be extracted (booting it through its PVH
# entry skips seconds of decompression under emulation).
build_cache() {
  local kpkg kver b
  kpkg=$(kernel_package)
  [ -n "$kpkg" ] || { apt-get update -qq >/dev/null 2>&1 </dev/null; kpkg=$(kernel_package); }
  [ -n "$kpkg" ] || die "cannot resolve linux-image-amd64 with apt-cache"
  kver=${kpkg#linux-image-}
  b=$(mktemp -d "$CACHE/build.XXXXXX")
  (cd "$b" && apt-get download -qq "$kpkg" >/dev/null 2>&1 </dev/null) || die "apt-get download $kpkg failed"
  dpkg-deb -x "$b"/linux-image-*.deb "$b/x" && depmod -b "$b/x" "$kver"
  local ir=$b/ir km
  km=$ir/lib/modules/$kver
  mkdir -p "$ir"/{bin,sbin,proc,sys,dev,lower,rw,root} "$km"
  cp /bin/busybox "$ir/bin/"
  for m in $MODS; do modprobe -d "$b/x" -S "$kver" --show-depends "$m"; done |
    awk '$1 == "insmod" {print $2}' | sort -u | while read -r f; do
      local rel=${f#"$b/x/lib/modules/$kver/"}
      mkdir -p "$km/$(dirname "$rel")" && cp "$f" "$km/$rel"
    done
  cp "$b/x/lib/modules/$kver"/modules.{order,builtin,builtin.modinfo} "$km/"
  depmod -b "$ir" "$kver"
  write_init "$ir/init"
  (cd "$ir" && find . | cpio -o -H newc --quiet | gzip -1) >"$b/initrd.gz"
  local vz=$b/x/boot/vmlinuz-$kver off
  off=$(LC_ALL=C grep -abo $'\xfd7zXZ' "$vz" | head -1 | cut -d: -f1)
  { tail -c +$((${off:-0} + 1)) "$vz" | xz -dcq >"$b/vmlinux"; } 2>/dev/null || true
  if [ "$(head -c4 "$b/vmlinux" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
    mv "$b/vmlinux" "$b/kernel"
  else
    cp "$vz" "$b/kernel"
  fi
  echo "$kver" >"$b/kver"
  mv -f "$b/kernel" "$b/initrd.gz" "$b/kver" "$CACHE/" # whole files: running VMs keep theirs
  rm -rf "$b"
}

mkdir -p "$CACHE"
STAMP=$(sha256sum <"$0" | cut -c1-16) # an edit of this script rebuilds the cache
exec 9>"$CACHE/lock"
flock -w 1800 9 || die "cannot lock $CACHE/lock"
install_packages
if [ "$(cat "$CACHE/stamp" 2>/dev/null)" != "$STAMP" ] || [ ! -s "$CACHE/kernel" ]; then
  say "building the guest kernel and initramfs in $CACHE"
  rm -rf "$CACHE"/build.*
  build_cache
  echo "$STAMP" >"$CACHE/stamp"
fi
exec 9>&-

# ------------------------------------------------------ the guest's job
CTL=$(mktemp -d /tmp/mep-rdma-vm.XXXXXX)
QPID=""
CPID=""
cleanup() {
  for p in $QPID $CPID; do kill "$p" 2>/dev/null || true; done
  rm -rf "$CTL"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
echo "$SHARE" >"$CTL/share"
{
  echo 'unset HOSTNAME SHLVL PWD OLDPWD _'
  export -p | { grep -v -E '^declare -x (HOSTNAME|SHLVL|PWD|OLDPWD|_|BASHOPTS|SHELLOPTS|UID|EUID|PPID|BASH_[A-Z_]*)=' || true; }
  cat <<EOF
ulimit -l unlimited; hostname mep-rdma-vm; ip link set lo up
ip link add eth0 type dummy && ip link set eth0 mtu $MTU && ip addr add 10.77.0.1/24 dev eth0 &&
  ip link set eth0 up && rdma link add rxe0 type rxe netdev eth0 ||
  { echo "rdma-vm: bringing up rxe0 failed"; exit 125; }
for i in \$(seq 50); do grep -q ffff /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null && break; sleep 0.1; done
grep -q ffff /sys/class/infiniband/rxe0/ports/1/gids/1 || { echo "rdma-vm: rxe0 has no IPv4 GID"; exit 125; }
EOF
  printf 'cd %q || exit 125\n' "$CWD"
  printf 'exec'
  printf ' %q' "$@"
  echo
} >"$CTL/job.sh"

if [ "$ACCEL" = auto ]; then
  # a /dev/kvm without vmx/svm (kvm_pvm) runs only kernels built as its
  # guests: the stock kernel stalls there, so emulate
  ACCEL=tcg
  if [ -w /dev/kvm ] && grep -qw -e vmx -e svm /proc/cpuinfo && [ ! -d /sys/module/kvm_pvm ]; then
    ACCEL=kvm
  fi
fi
if [ "$ACCEL" = kvm ]; then A=(-accel kvm -cpu host); else A=(-accel "tcg,thread=multi" -cpu max); fi
# Under TCG the guest finds its CPUs' TSCs "unsynchronized" and falls back
# to the HPET, whose every read is an emulated device access: a
# clock_gettime took 1.7-6.4 us there, against 0.3 us on the TSC. TCG
# derives every vCPU's TSC from one monotonic host clock, so they are in
# step; tsc=reliable lets the guest use it (perftest reads the TSC
# itself, so only the programs that ask the kernel for the time gain).
CLOCK=""
[ "$ACCEL" = tcg ] && CLOCK="tsc=reliable"
fsdev() { echo "local,path=${1//,/,,},mount_tag=$2,security_model=none,multidevs=remap${3:-}"; }
say "booting ($ACCEL, -smp $SMP -m $MEM, kernel $(cat "$CACHE/kver"))"
# hvc0 -> qemu's stdio -> a FIFO -> cat: qemu makes its stdout non-blocking,
# which must not leak to ours
mkfifo "$CTL/out"
cat "$CTL/out" &
CPID=$!
timeout -k 5 "$TIMEOUT" qemu-system-x86_64 -nodefaults -no-user-config -display none -no-reboot \
  "${A[@]}" -smp "$SMP" -m "$MEM" -nic none \
  -kernel "$CACHE/kernel" -initrd "$CACHE/initrd.gz" \
  -append "console=ttyS0 quiet loglevel=4 panic=-1 rdinit=/init $CLOCK${APPEND:+ $APPEND}" \
  -serial "file:$CTL/console.log" \
  -device virtio-serial-pci -chardev stdio,id=out -device virtconsole,chardev=out \
  -virtfs "$(fsdev / hostroot ,readonly=on)" -virtfs "$(fsdev "$CTL" ctl)" \
  -virtfs "$(fsdev "$SHARE" share)" </dev/null >"$CTL/out" &
QPID=$!
set +e
wait "$QPID"; QRC=$?; QPID=""
wait "$CPID"; CPID=""
set -e
if [ -s "$CTL/rc" ]; then exit "$(cat "$CTL/rc")"; fi
if [ "$QRC" = 124 ]; then
  echo "rdma-vm: timed out after ${TIMEOUT}s (MEP_VM_TIMEOUT)" >&2
  exit 124
fi
echo "rdma-vm: the VM ended without an exit status (qemu status $QRC); guest console:" >&2
tail -40 "$CTL/console.log" >&2 2>/dev/null || true
exit 125
