"""The local sandbox backend: bubblewrap namespaces, seccomp and rlimits around one workspace per sandbox.

Every command runs in its own ``bwrap`` with fresh user/pid/net/ipc/uts/cgroup/mount
namespaces (network: loopback only, and nothing listens on it), no capabilities,
no nested user namespaces, a seccomp filter (:mod:`activities.sandbox.local.seccomp`),
a read-only ``/usr``, an empty environment, private ``/tmp`` and only
``/workspace`` writable and persistent. The command's pid namespace dies with it:
nothing it started survives ``run()``.

A root worker runs each sandbox's commands as an unprivileged host uid of its own
(``AGENT_SANDBOX_UID_BASE`` + a hash of the sandbox id, recorded in ``meta.json``),
which owns the workspace; any other worker runs them as its own uid. Inside, the
command always sees uid/gid 1000. When ``bwrap`` is missing or cannot create the
namespaces, :class:`SandboxUnavailable` is raised: this backend never runs anything
unsandboxed.

The workspace is held to ``AGENT_SANDBOX_DISK_MB`` (:mod:`activities.sandbox.local.quota`):
a root worker that can loop-mount gives each sandbox an ext4 image of that size
(``backend.quota_mechanism == "loop"``); otherwise the workspace is measured while
and after each command and before each ``write_file`` (``"measured"``).

The worker's own access to a workspace (``write_file``, ``read_file``, ``cwd``,
``meta.json``, creation, removal, measuring) never blocks on what the sandboxed
code left there, never follows a link it planted, runs on the backend's own
bounded thread pools and has a deadline (:mod:`activities.sandbox.local.hostfs`).

Known limit, ``/proc/self/mountinfo``: inside the sandbox it lists every mount of
the command's namespace. With the ``loop`` quota the workspace shows as ``/`` of
``/dev/loopN`` (no host path). With the ``measured`` quota the workspace is a bind
mount of a host directory, and a bind mount's line always carries the directory's
path inside its host filesystem (e.g. ``/var/lib/agent/sandboxes/<id>/workspace``):
without the right to mount a filesystem of its own the worker cannot hide it. In both
modes the ``uid=`` option of bubblewrap's own tmpfs mounts (``/``, ``/dev``, ``/tmp``)
shows the sandbox's host uid (the kernel prints a tmpfs owner as the initial user
namespace sees it, and unprivileged bubblewrap always builds its root on a tmpfs). Neither
is a secret that grants anything: the path is not reachable from inside, and the uid
is the sandbox's own unprivileged one.

The package's modules:

* :mod:`activities.sandbox.local.backend`: :class:`LocalSandboxBackend`, the sandboxes under its root
  (creating, opening, mounting, killing, listing; ``meta.json``);
* :mod:`activities.sandbox.local.sandbox`: :class:`LocalSandbox`, one sandbox's commands, files and
  checkpoint methods;
* :mod:`activities.sandbox.local.limits`: :class:`LocalLimits` and the uid settings;
* :mod:`activities.sandbox.local.bwrap`: the ``bwrap`` command line, the child's rlimits
  and uid switch (why a root worker does not run commands as root), the probe;
* :mod:`activities.sandbox.local.processes`: running a command to its end (output caps,
  timeout, emptying its pid namespace);
* :mod:`activities.sandbox.local.hostfs`: non-blocking, no-follow host-side file access, and
  :mod:`activities.sandbox.local.trees`: removing, measuring and walking a whole workspace;
* :mod:`activities.sandbox.local.checkpoints`: scanning, reading and rewriting the
  workspace for checkpoints (``LocalSandbox``'s ``Checkpointable`` methods are thin wrappers), and
  the checkpoint marker next to ``meta.json``;
* :mod:`activities.sandbox.local.quota`: the workspace quota.
"""
