"""A seccomp BPF filter for the local sandbox, generated in pure Python (no libseccomp).

``filter_program()`` returns the raw ``struct sock_filter[]`` bytes that
``bwrap --seccomp FD`` loads right before it execs the sandboxed command. The
program:

1. kills the process if the syscall's architecture is not the host's native one
   (blocks the i386 ``int 0x80`` ABI on x86_64, and 32-bit compat on aarch64);
2. on x86_64, refuses every x32-ABI syscall number (``nr >= 0x40000000``), which
   would otherwise reach the same kernel entry points under different numbers;
3. refuses (``EPERM``) the syscalls in :data:`DENIED`: debugging other processes,
   the kernel keyring, every mount API, namespace creation and entry, io_uring,
   eBPF, perf, kexec, kernel modules, file handles, userfaultfd and a few
   administrative calls (all of which the sandbox needs no more than a program
   written by a model does);
4. refuses ``clone`` with any ``CLONE_NEW*`` flag (``EPERM``) and answers
   ``clone3`` with ``ENOSYS``: its flags live in a struct seccomp cannot read,
   and glibc falls back to ``clone`` on ``ENOSYS`` (Flatpak and Chromium do the same);
5. allows ``personality`` only with the default persona (``PER_LINUX``) or the
   ``0xffffffff`` query;
6. allows everything else.
"""

from __future__ import annotations

import errno
import platform
import struct
from dataclasses import dataclass

# --- classic BPF encoding (linux/filter.h, linux/seccomp.h) ---------------------------

_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x05 | 0x10 | 0x00  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x05 | 0x30 | 0x00  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x05 | 0x40 | 0x00  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06 | 0x00  # BPF_RET | BPF_K

SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000

# struct seccomp_data { int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; }
_OFF_NR = 0
_OFF_ARCH = 4


def _arg_lo(index: int) -> int:
    """Offset of the low 32 bits of ``args[index]`` (both supported arches are little-endian)."""
    return 16 + 8 * index


AUDIT_ARCH_X86_64 = 0xC000003E  # EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
AUDIT_ARCH_AARCH64 = 0xC00000B7  # EM_AARCH64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
X32_SYSCALL_BIT = 0x40000000

# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
CLONE_NEW_MASK = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
PERSONALITY_DEFAULT = 0x0  # PER_LINUX
PERSONALITY_QUERY = 0xFFFFFFFF

# The syscalls refused with EPERM, grouped by why.
DENIED: tuple[str, ...] = (
    # inspect or modify other processes
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "process_madvise",
    "pidfd_getfd",
    "kcmp",
    # the kernel keyring
    "add_key",
    "request_key",
    "keyctl",
    # mounts (classic and the new mount API) and root changes
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "open_tree_attr",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    # namespaces
    "unshare",
    "setns",
    # large kernel attack surface the sandbox does not need
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "open_by_handle_at",
    # the kernel itself
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "syslog",
    "quotactl",
    "quotactl_fd",
    "vhangup",
)

SYSCALLS: dict[str, dict[str, int]] = {
    # asm/unistd_64.h
    "x86_64": {
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "process_madvise": 440,
        "pidfd_getfd": 438,
        "kcmp": 312,
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "chroot": 161,
        "open_tree": 428,
        "open_tree_attr": 467,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "mount_setattr": 442,
        "unshare": 272,
        "setns": 308,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "bpf": 321,
        "perf_event_open": 298,
        "userfaultfd": 323,
        "open_by_handle_at": 304,
        "kexec_load": 246,
        "kexec_file_load": 320,
        "init_module": 175,
        "finit_module": 313,
        "delete_module": 176,
        "reboot": 169,
        "swapon": 167,
        "swapoff": 168,
        "acct": 163,
        "syslog": 103,
        "quotactl": 179,
        "quotactl_fd": 443,
        "vhangup": 153,
        "personality": 135,
        "clone": 56,
        "clone3": 435,
    },
    # asm-generic/unistd.h
    "aarch64": {
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "process_madvise": 440,
        "pidfd_getfd": 438,
        "kcmp": 272,
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "chroot": 51,
        "open_tree": 428,
        "open_tree_attr": 467,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "mount_setattr": 442,
        "unshare": 97,
        "setns": 268,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "bpf": 280,
        "perf_event_open": 241,
        "userfaultfd": 282,
        "open_by_handle_at": 265,
        "kexec_load": 104,
        "kexec_file_load": 294,
        "init_module": 105,
        "finit_module": 273,
        "delete_module": 106,
        "reboot": 142,
        "swapon": 224,
        "swapoff": 225,
        "acct": 89,
        "syslog": 116,
        "quotactl": 60,
        "quotactl_fd": 443,
        "vhangup": 58,
        "personality": 92,
        "clone": 220,
        "clone3": 435,
    },
}
AUDIT_ARCH = {"x86_64": AUDIT_ARCH_X86_64, "aarch64": AUDIT_ARCH_AARCH64}
_MACHINE_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


class UnsupportedArchitecture(RuntimeError):
    """No syscall table for this machine: the caller must fail closed."""


def host_arch() -> str:
    machine = platform.machine().lower()
    return _MACHINE_ALIASES.get(machine, machine)


@dataclass
class _Insn:
    code: int
    k: int
    jt: str | int = 0  # a label, or 0 for "next instruction"
    jf: str | int = 0


class _Assembler:
    """Classic BPF with symbolic forward jumps (resolved to the 8-bit relative offsets BPF uses)."""

    def __init__(self) -> None:
        self.insns: list[_Insn] = []
        self.labels: dict[str, int] = {}

    def emit(self, code: int, k: int, jt: str | int = 0, jf: str | int = 0) -> None:
        self.insns.append(_Insn(code, k, jt, jf))

    def label(self, name: str) -> None:
        if name in self.labels:
            raise ValueError(f"duplicate label {name!r}")
        self.labels[name] = len(self.insns)

    def _offset(self, at: int, target: str | int) -> int:
        if isinstance(target, int):
            return target
        offset = self.labels[target] - (at + 1)
        if not 0 <= offset <= 255:
            raise ValueError(f"jump to {target!r} out of range ({offset})")
        return offset

    def assemble(self) -> bytes:
        out = bytearray()
        for at, insn in enumerate(self.insns):
            out += struct.pack("=HBBI", insn.code, self._offset(at, insn.jt), self._offset(at, insn.jf), insn.k)
        return bytes(out)


def filter_program(arch: str | None = None) -> bytes:
    """The filter for ``arch`` (default: this host) as ``struct sock_filter[]`` bytes.

    Raises :class:`UnsupportedArchitecture` for anything but x86_64 and aarch64.
    """
    arch = arch or host_arch()
    table = SYSCALLS.get(arch)
    if table is None:
        raise UnsupportedArchitecture(f"no seccomp syscall table for architecture {arch!r} (x86_64 and aarch64 only)")
    eperm = SECCOMP_RET_ERRNO | errno.EPERM
    asm = _Assembler()
    asm.emit(_LD_W_ABS, _OFF_ARCH)
    asm.emit(_JEQ_K, AUDIT_ARCH[arch], jt=0, jf="kill")
    asm.emit(_LD_W_ABS, _OFF_NR)
    if arch == "x86_64":
        asm.emit(_JGE_K, X32_SYSCALL_BIT, jt="deny", jf=0)
    for name in DENIED:
        asm.emit(_JEQ_K, table[name], jt="deny", jf=0)
    asm.emit(_JEQ_K, table["clone"], jt="clone", jf=0)
    asm.emit(_JEQ_K, table["clone3"], jt="enosys", jf=0)
    asm.emit(_JEQ_K, table["personality"], jt="personality", jf=0)
    asm.emit(_RET_K, SECCOMP_RET_ALLOW)

    asm.label("clone")  # A = low 32 bits of the flags (all CLONE_NEW* bits live there)
    asm.emit(_LD_W_ABS, _arg_lo(0))
    asm.emit(_JSET_K, CLONE_NEW_MASK, jt="deny", jf=0)
    asm.emit(_RET_K, SECCOMP_RET_ALLOW)

    asm.label("personality")  # personality(unsigned int persona): only the low 32 bits count
    asm.emit(_LD_W_ABS, _arg_lo(0))
    asm.emit(_JEQ_K, PERSONALITY_DEFAULT, jt="allow", jf=0)
    asm.emit(_JEQ_K, PERSONALITY_QUERY, jt="allow", jf="deny")

    asm.label("allow")
    asm.emit(_RET_K, SECCOMP_RET_ALLOW)
    asm.label("enosys")
    asm.emit(_RET_K, SECCOMP_RET_ERRNO | errno.ENOSYS)
    asm.label("deny")
    asm.emit(_RET_K, eperm)
    asm.label("kill")
    asm.emit(_RET_K, SECCOMP_RET_KILL_PROCESS)
    return asm.assemble()


_cached: dict[str, bytes] = {}


def host_program() -> bytes:
    """``filter_program()`` for this host, built once per process."""
    arch = host_arch()
    if arch not in _cached:
        _cached[arch] = filter_program(arch)
    return _cached[arch]
