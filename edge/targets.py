"""The ``cloud`` setting read as gRPC targets: pure parsing, shared by the config's validation (a bad
target fails at start, naming the field) and the link that dials it."""

from __future__ import annotations

import ipaddress


def _host_port(entry: str) -> tuple[str, int]:
    host, sep, port = entry.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not host:
        raise ValueError(f"cloud: {entry!r} is not host:port")
    return host.strip("[]"), int(port)


def parse_targets(cloud: str) -> tuple[str, list[tuple[str, int]]]:
    """(gRPC channel target, (host, port) to resolve for the monitors) of the ``cloud`` setting:

    - ``host:port`` (a DNS name resolving to one or several replicas, or an IP),
    - ``dns:///host:port`` (the same, spelled as a gRPC URI),
    - ``IP:port,IP:port,...`` (a static list; gRPC's ``ipv4:`` / ``ipv6:`` target).
    """
    cloud = cloud.strip()
    if cloud.startswith("dns:"):
        name = cloud.split("/")[-1]
        return cloud, [_host_port(name)]
    entries = [e.strip() for e in cloud.split(",") if e.strip()]
    if len(entries) == 1:
        return entries[0], [_host_port(entries[0])]
    addrs = [_host_port(e) for e in entries]
    try:
        ips = [ipaddress.ip_address("127.0.0.1" if h == "localhost" else h) for h, _ in addrs]
    except ValueError:
        raise ValueError(
            "cloud: a list of replicas must be IP:port entries; for host names give one DNS name "
            "that resolves to every replica (e.g. a headless Service)"
        ) from None
    if len({ip.version for ip in ips}) > 1:
        raise ValueError("cloud: a replica list must be all IPv4 or all IPv6")
    scheme = "ipv4" if ips[0].version == 4 else "ipv6"
    fmt = (lambda ip, p: f"{ip}:{p}") if scheme == "ipv4" else (lambda ip, p: f"[{ip}]:{p}")
    return f"{scheme}:" + ",".join(fmt(ip, p) for ip, (_, p) in zip(ips, addrs)), [
        (str(ip), p) for ip, (_, p) in zip(ips, addrs)
    ]
