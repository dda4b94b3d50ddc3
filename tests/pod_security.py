"""The Pod Security Standards' baseline and restricted checks, as the upstream admission evaluates them.

Written from the upstream rules (docs/reference/pod-security-standards.md has them, with their source): no
Go toolchain, kube-apiserver or evaluator package can be installed here, so the rules are encoded once and
applied to every pod template the renderer and the chart produce. `violations(pod)` returns one line per
failed check, named by the upstream check id, for the latest policy version.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

Pod = dict[str, Any]  # {"metadata": ..., "spec": ...}, a Pod or a pod template
Check = Callable[[Pod], list[str]]

BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
RESTRICTED_ADDABLE = frozenset({"NET_BIND_SERVICE"})
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
        "net.ipv4.tcp_slow_start_after_idle",
        "net.ipv4.tcp_notsent_lowat",
    }
)
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
RESTRICTED_VOLUME_SOURCES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "image",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
SECCOMP_TYPES = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_TYPES = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")


def _spec(pod: Pod) -> dict[str, Any]:
    return dict(pod.get("spec") or {})


def _containers(pod: Pod) -> Iterator[tuple[str, dict[str, Any]]]:
    """(kind/name, container) for containers, initContainers and ephemeralContainers."""
    spec = _spec(pod)
    for key in ("containers", "initContainers", "ephemeralContainers"):
        for container in spec.get(key) or []:
            yield f"{key}/{container.get('name')}", container


def _context(container: dict[str, Any]) -> dict[str, Any]:
    return dict(container.get("securityContext") or {})


def _pod_context(pod: Pod) -> dict[str, Any]:
    return dict(_spec(pod).get("securityContext") or {})


def _user_namespace(pod: Pod) -> bool:
    """hostUsers: false relaxes the non-root checks (the pod's root is not the node's)."""
    return _spec(pod).get("hostUsers") is False


# Baseline


def host_process(pod: Pod) -> list[str]:
    found = [
        where
        for where, ctx in [("pod", _pod_context(pod)), *((n, _context(c)) for n, c in _containers(pod))]
        if (ctx.get("windowsOptions") or {}).get("hostProcess") is True
    ]
    return [f"windowsOptions.hostProcess true: {', '.join(found)}"] if found else []


def host_namespaces(pod: Pod) -> list[str]:
    found = [key for key in ("hostNetwork", "hostPID", "hostIPC") if _spec(pod).get(key) is True]
    return [f"{key} true" for key in found]


def privileged(pod: Pod) -> list[str]:
    return [f"{name}: privileged" for name, c in _containers(pod) if _context(c).get("privileged") is True]


def capabilities_baseline(pod: Pod) -> list[str]:
    out = []
    for name, c in _containers(pod):
        extra = set((_context(c).get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES
        if extra:
            out.append(f"{name}: adds {sorted(extra)}")
    return out


def host_path_volumes(pod: Pod) -> list[str]:
    return [f"volume {v.get('name')}: hostPath" for v in _spec(pod).get("volumes") or [] if "hostPath" in v]


def host_ports(pod: Pod) -> list[str]:
    return [
        f"{name}: hostPort {p['hostPort']}"
        for name, c in _containers(pod)
        for p in c.get("ports") or []
        if p.get("hostPort")
    ]


def host_probes_and_lifecycle(pod: Pod) -> list[str]:
    out = []
    for name, c in _containers(pod):
        handlers = [(probe, c.get(probe) or {}) for probe in PROBES]
        handlers += [
            (f"lifecycle.{h}", (c.get("lifecycle") or {}).get(h) or {}) for h in ("postStart", "preStop")
        ]
        for where, handler in handlers:
            for kind in ("httpGet", "tcpSocket"):
                if (handler.get(kind) or {}).get("host"):
                    out.append(f"{name}: {where}.{kind}.host set")
    return out


def app_armor_profile(pod: Pod) -> list[str]:
    out = [
        f"annotation {key}: {value}"
        for key, value in ((pod.get("metadata") or {}).get("annotations") or {}).items()
        if key.startswith(APPARMOR_ANNOTATION)
        and value not in ("", "runtime/default")
        and not value.startswith("localhost/")
    ]
    for where, ctx in [("pod", _pod_context(pod)), *((n, _context(c)) for n, c in _containers(pod))]:
        kind = (ctx.get("appArmorProfile") or {}).get("type")
        if kind is not None and kind not in APPARMOR_TYPES:
            out.append(f"{where}: appArmorProfile {kind}")
    return out


def se_linux_options(pod: Pod) -> list[str]:
    out = []
    for where, ctx in [("pod", _pod_context(pod)), *((n, _context(c)) for n, c in _containers(pod))]:
        options = ctx.get("seLinuxOptions") or {}
        if options.get("type", "") not in SELINUX_TYPES:
            out.append(f"{where}: seLinuxOptions.type {options['type']}")
        if options.get("user") or options.get("role"):
            out.append(f"{where}: seLinuxOptions user/role set")
    return out


def proc_mount_baseline(pod: Pod) -> list[str]:
    if _user_namespace(pod):
        return []
    return proc_mount_restricted(pod)


def seccomp_profile_baseline(pod: Pod) -> list[str]:
    return [
        f"{where}: seccompProfile {kind}"
        for where, ctx in [("pod", _pod_context(pod)), *((n, _context(c)) for n, c in _containers(pod))]
        if (kind := (ctx.get("seccompProfile") or {}).get("type")) is not None and kind not in SECCOMP_TYPES
    ]


def sysctls(pod: Pod) -> list[str]:
    names = [s.get("name") for s in _pod_context(pod).get("sysctls") or []]
    return [f"sysctl {name}" for name in names if name not in SAFE_SYSCTLS]


# Restricted


def restricted_volumes(pod: Pod) -> list[str]:
    out = []
    for volume in _spec(pod).get("volumes") or []:
        sources = set(volume) - {"name"}
        if not sources <= RESTRICTED_VOLUME_SOURCES:
            out.append(f"volume {volume.get('name')}: {sorted(sources - RESTRICTED_VOLUME_SOURCES)}")
    return out


def allow_privilege_escalation(pod: Pod) -> list[str]:
    return [
        f"{name}: allowPrivilegeEscalation not false"
        for name, c in _containers(pod)
        if _context(c).get("allowPrivilegeEscalation") is not False
    ]


def run_as_non_root(pod: Pod) -> list[str]:
    if _user_namespace(pod):
        return []
    pod_level = _pod_context(pod).get("runAsNonRoot")
    out = ["pod: runAsNonRoot false"] if pod_level is False else []
    for name, c in _containers(pod):
        mine = _context(c).get("runAsNonRoot")
        if mine is False or (mine is None and pod_level is not True):
            out.append(f"{name}: runAsNonRoot not true")
    return out


def run_as_user(pod: Pod) -> list[str]:
    if _user_namespace(pod):
        return []
    return [
        f"{where}: runAsUser 0"
        for where, ctx in [("pod", _pod_context(pod)), *((n, _context(c)) for n, c in _containers(pod))]
        if ctx.get("runAsUser") == 0
    ]


def seccomp_profile_restricted(pod: Pod) -> list[str]:
    pod_kind = (_pod_context(pod).get("seccompProfile") or {}).get("type")
    out = (
        [f"pod: seccompProfile {pod_kind}"] if pod_kind is not None and pod_kind not in SECCOMP_TYPES else []
    )
    for name, c in _containers(pod):
        kind = (_context(c).get("seccompProfile") or {}).get("type")
        if kind is None and pod_kind is None:
            out.append(f"{name}: no seccompProfile (none on the pod either)")
        elif kind is not None and kind not in SECCOMP_TYPES:
            out.append(f"{name}: seccompProfile {kind}")
    return out


def capabilities_restricted(pod: Pod) -> list[str]:
    out = []
    for name, c in _containers(pod):
        caps = _context(c).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: capabilities.drop lacks ALL")
        extra = set(caps.get("add") or []) - RESTRICTED_ADDABLE
        if extra:
            out.append(f"{name}: adds {sorted(extra)}")
    return out


def proc_mount_restricted(pod: Pod) -> list[str]:
    return [
        f"{name}: procMount {kind}"
        for name, c in _containers(pod)
        if (kind := _context(c).get("procMount")) not in (None, "Default")
    ]


BASELINE: dict[str, Check] = {
    "windowsHostProcess": host_process,
    "hostNamespaces": host_namespaces,
    "privileged": privileged,
    "capabilities_baseline": capabilities_baseline,
    "hostPathVolumes": host_path_volumes,
    "hostPorts": host_ports,
    "hostProbesAndHostLifecycle": host_probes_and_lifecycle,
    "appArmorProfile": app_armor_profile,
    "seLinuxOptions": se_linux_options,
    "procMount_baseline": proc_mount_baseline,
    "seccompProfile_baseline": seccomp_profile_baseline,
    "sysctls": sysctls,
}
# Restricted is baseline plus these (its procMount and seccomp checks replace baseline's).
RESTRICTED: dict[str, Check] = {
    **{k: v for k, v in BASELINE.items() if k not in ("procMount_baseline", "seccompProfile_baseline")},
    "restrictedVolumes": restricted_volumes,
    "allowPrivilegeEscalation": allow_privilege_escalation,
    "runAsNonRoot": run_as_non_root,
    "runAsUser": run_as_user,
    "seccompProfile_restricted": seccomp_profile_restricted,
    "capabilities_restricted": capabilities_restricted,
    "procMount_restricted": proc_mount_restricted,
}
LEVELS = {"baseline": BASELINE, "restricted": RESTRICTED}


def violations(pod: Pod, level: str = "restricted") -> list[str]:
    """`check id: detail` for every check of `level` the pod (or pod template) fails; empty when admitted."""
    return [f"{check}: {detail}" for check, run in LEVELS[level].items() for detail in run(pod)]
