"""Pod Security Standards "restricted" (which includes "baseline"), version "latest", for one pod
spec (k8s.io/pod-security-admission policy/check_*.go). A namespace's policy, so a report."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torchjob.k8s.validate.tree import as_list

PodProblem = tuple[str, str]  # (field path, message)
CONTAINER_GROUPS = ("initContainers", "containers", "ephemeralContainers")
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL",
                         "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID",
                         "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t",
                 "container_engine_t"}
SECCOMP_OK = ("RuntimeDefault", "Localhost")
APPARMOR_TYPES = ("RuntimeDefault", "Localhost")
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def containers(pod: dict[str, Any], where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every container of the pod with its path, init and ephemeral ones too."""
    for group in CONTAINER_GROUPS:
        for i, c in enumerate(as_list(pod.get(group))):
            if isinstance(c, dict):
                yield f"{where}.{group}[{i}]", c


def restricted(pod: dict[str, Any], where: str, annotations: object = None,
               complete: bool = True) -> Iterator[PodProblem]:
    """Every break of "restricted" in one pod spec at ``where`` (``annotations``: the pod
    template's, for the AppArmor annotation). ``complete=False``: the spec is a patch over a
    pod spec not seen here (a TrainJob's runtimePatches), so only values present are judged,
    not fields left out."""
    psc = _dict(pod.get("securityContext"))
    sc_path = f"{where}.securityContext"
    windows = _dict(pod.get("os")).get("name") == "windows"
    # HostProcess
    if _dict(psc.get("windowsOptions")).get("hostProcess"):
        yield f"{sc_path}.windowsOptions.hostProcess", "(HostProcess) must not be true"
    # Host namespaces
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            yield f"{where}.{flag}", "(Host Namespaces) must not be true"
    # Volumes: hostPath (baseline), then the restricted allowlist
    for i, vol in enumerate(as_list(pod.get("volumes"))):
        kinds = sorted(set(_dict(vol)) - {"name"})
        bad = [k for k in kinds if k not in RESTRICTED_VOLUMES]
        if bad:
            yield f"{where}.volumes[{i}].{bad[0]}", (
                f"(Volume Types) {bad[0]} volumes are not allowed; allowed: "
                f"{', '.join(sorted(RESTRICTED_VOLUMES))}")
    # AppArmor annotations
    for key, value in _dict(annotations).items():
        if str(key).startswith(APPARMOR_ANNOTATION) and not (
                value == "runtime/default" or str(value).startswith("localhost/")):
            yield f"{where}.metadata.annotations[{key!r}]", (
                f"(AppArmor) is {value!r}: runtime/default or localhost/<profile>")
    # Sysctls
    for i, sysctl in enumerate(as_list(psc.get("sysctls"))):
        name = _dict(sysctl).get("name")
        if not isinstance(name, str) or name not in SAFE_SYSCTLS:
            yield f"{sc_path}.sysctls[{i}].name", (
                f"(Sysctls) {name!r} is not in the safe set: {', '.join(sorted(SAFE_SYSCTLS))}")
    yield from _context(psc, sc_path)
    # Running as non-root, at the pod or in every container
    pod_non_root = psc.get("runAsNonRoot")
    if pod_non_root is False:
        yield f"{sc_path}.runAsNonRoot", "(Running as Non-root) must not be false"
    pod_seccomp = _dict(psc.get("seccompProfile")).get("type")
    for path, c in containers(pod, where):
        yield from _container(c, path, pod_non_root is True or not complete,
                              pod_seccomp in SECCOMP_OK or not complete, windows, complete)


def _context(sc: dict[str, Any], path: str) -> Iterator[PodProblem]:
    """The controls that read the same fields in a pod's and a container's securityContext."""
    if sc.get("runAsUser") == 0:
        yield f"{path}.runAsUser", "(Running as Non-root user) must not be 0"
    seccomp = _dict(sc.get("seccompProfile")).get("type")
    if seccomp is not None and seccomp not in SECCOMP_OK:
        yield f"{path}.seccompProfile.type", (f"(Seccomp) is {seccomp!r}: RuntimeDefault or "
                                              "Localhost")
    apparmor = _dict(sc.get("appArmorProfile")).get("type")
    if apparmor is not None and apparmor not in APPARMOR_TYPES:
        yield f"{path}.appArmorProfile.type", (f"(AppArmor) is {apparmor!r}: RuntimeDefault "
                                               "or Localhost")
    selinux = _dict(sc.get("seLinuxOptions"))
    if str(selinux.get("type", "")) not in SELINUX_TYPES:
        yield f"{path}.seLinuxOptions.type", (
            f"(SELinux) is {selinux['type']!r}: one of "
            f"{', '.join(sorted(t for t in SELINUX_TYPES if t))}")
    for field in ("user", "role"):
        if selinux.get(field):
            yield f"{path}.seLinuxOptions.{field}", "(SELinux) must not be set"


def _container(c: dict[str, Any], where: str, pod_non_root: bool, pod_seccomp: bool,
               windows: bool, complete: bool) -> Iterator[PodProblem]:
    sc = _dict(c.get("securityContext"))
    path = f"{where}.securityContext"
    if _dict(sc.get("windowsOptions")).get("hostProcess"):
        yield f"{path}.windowsOptions.hostProcess", "(HostProcess) must not be true"
    if sc.get("privileged"):
        yield f"{path}.privileged", "(Privileged) must not be true"
    if sc.get("procMount", "Default") != "Default":  # compared, never hashed
        yield f"{path}.procMount", f"(/proc Mount Type) is {sc['procMount']!r}: Default"
    for j, port in enumerate(as_list(c.get("ports"))):
        if _dict(port).get("hostPort"):
            yield f"{where}.ports[{j}].hostPort", "(Host Ports) must be unset or 0"
    yield from _context(sc, path)
    non_root = sc.get("runAsNonRoot")
    if non_root is False or (non_root is None and not pod_non_root):
        yield f"{path}.runAsNonRoot", ("(Running as Non-root) must be true, here or in the "
                                       "pod's securityContext")
    caps = _dict(sc.get("capabilities"))
    added = [str(a) for a in as_list(caps.get("add"))]
    beyond = sorted(set(added) - BASELINE_CAPABILITIES)
    if beyond:
        yield f"{path}.capabilities.add", f"(Capabilities) {beyond} are beyond the baseline set"
    if windows:  # exempt from Privilege Escalation, Seccomp and Capabilities (1.25+ policy)
        return
    escalation = sc.get("allowPrivilegeEscalation")
    if escalation is True or (escalation is None and complete):
        yield f"{path}.allowPrivilegeEscalation", "(Privilege Escalation) must be false"
    if _dict(sc.get("seccompProfile")).get("type") is None and not pod_seccomp:
        yield f"{path}.seccompProfile.type", ("(Seccomp) must be RuntimeDefault or Localhost, "
                                              "here or in the pod's securityContext")
    if "ALL" not in [str(d) for d in as_list(caps.get("drop"))] and complete:
        yield f"{path}.capabilities.drop", "(Capabilities) must include ALL"
    more = sorted(set(added) - {"NET_BIND_SERVICE"} - set(beyond))
    if more:
        yield (f"{path}.capabilities.add",
               f"(Capabilities) may add only NET_BIND_SERVICE, not {more}")
