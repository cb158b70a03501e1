"""Which network a rank's collectives crossed: NCCL's choice read from its own INFO log, gloo's
interface from the host's addresses. Pure: text and plain data in, a dict out; no torch.

The NCCL lines read here, as NCCL prints them (NVIDIA/nccl, src/):
- transport/net_ib/init.cc: "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB ib0:10.1.2.3<0>"
- transport/net_socket.cc: "NET/Socket : Using [0]ib0:10.1.2.3<0>"
- init.cc: "Using network IB" (the net plugin's name: IB, Socket, IBext_v8, ...)
- transport/net.cc: "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA" (net name, then its
  device index into the Using list); p2p.cc and shm.cc: "... via P2P/IPC/read", "... via SHM/direct"
NCCL_DEBUG_SUBSYS=INIT,NET prints them all (each is logged under INIT).
"""
from __future__ import annotations

import ipaddress
import re

_USING = re.compile(r"NCCL INFO NET/(IB|Socket) : Using(.*)$")
_DEVICE = re.compile(r"\[(\d+)\](\S+)")
_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")
_VIA_NET = re.compile(r"NCCL INFO Channel .* via NET/([^/\s]+)/(\d+)")
_VIA_LOCAL = re.compile(r"NCCL INFO Channel .* via (P2P|SHM)/")

# what the report calls each transport
IB, SOCKET, LOCAL = "IB", "Socket", "P2P/SHM"


def _devices(listing: str, kind: str) -> dict[int, str]:
    """{index: device} of a Using line: 'mlx5_0:1/IB' for IB, the interface 'ib0' for sockets."""
    listing = listing.split(";")[0]  # IB's "; OOB ib0:..." is the bootstrap socket, not a device
    found = {}
    for index, device in _DEVICE.findall(listing):
        found[int(index)] = device.split(":")[0] if kind == SOCKET else device
    return found


def _kind(net: str) -> str:
    """A net name as the transport it is: NCCL's IB and plugins built on verbs (IBext_v8) are IB."""
    if net.startswith("IB"):
        return IB
    return SOCKET if net == "Socket" else net


def parse_nccl_log(text: str) -> dict:
    """{transport, interface, network} of one rank's NCCL log.

    transport: the network its channels to other nodes use (IB, Socket, or a plugin's name), or
    P2P/SHM when every channel stays in the node, or None when the log shows no channel (the
    user's NCCL_DEBUG hid them, or NCCL never connected). interface: the devices those channels
    use (mlx5_0:1/IB; ib0 for sockets). network: what NCCL said it uses ("Using network").
    """
    devices: dict[str, dict[int, str]] = {}
    network, used, local = None, [], False
    for line in text.splitlines():
        if (found := _USING.search(line)) is not None:
            kind = IB if found[1] == "IB" else SOCKET
            devices[kind] = _devices(found[2], kind)
        elif (found := _NETWORK.search(line)) is not None:
            network = found[1]
        elif (found := _VIA_NET.search(line)) is not None:
            used.append((found[1], int(found[2])))
        elif _VIA_LOCAL.search(line):
            local = True
    if used:
        kinds = list(dict.fromkeys(_kind(net) for net, _ in used))
        names = [devices.get(_kind(net), {}).get(index, f"{net}/{index}") for net, index in used]
        return {"transport": "+".join(kinds), "interface": ", ".join(dict.fromkeys(names)), "network": network}
    return {"transport": LOCAL if local else None, "interface": None, "network": network}


def gloo_interface(ifname: str | None, resolved: list[str], interfaces: dict[str, list[tuple[str, str | None]]]) -> str:
    """The interface gloo's TCP transport uses on this host.

    ifname: GLOO_SOCKET_IFNAME, which wins when set. Else gloo binds to the first address this
    host's name resolves to that is local, and to the loopback when none is (c10d
    GlooDeviceFactory: "resolve this machine's hostname and bind to that address"). resolved: those
    addresses, in order; interfaces: {name: [(address, netmask)]} (psutil.net_if_addrs).
    """
    if ifname:
        return ifname
    for text in resolved:
        try:
            address = ipaddress.ip_address(text.split("%")[0])
        except ValueError:
            continue
        holders = [name for name, addrs in interfaces.items() if any(a.split("%")[0] == str(address) for a, _ in addrs)]
        # a loopback name such as 127.0.1.1 (Debian's /etc/hosts) is not an address of lo, but binds there
        holders = holders or [name for name, addrs in interfaces.items() for a, mask in addrs
                              if address.is_loopback and _contains(a, mask, address)]
        if holders:
            return holders[0]
    loopback = [name for name, addrs in interfaces.items() if any(a == "127.0.0.1" for a, _ in addrs)]
    return loopback[0] if loopback else "lo"


def _contains(address: str, netmask: str | None, wanted) -> bool:
    try:
        return wanted in ipaddress.ip_network(f"{address.split('%')[0]}/{netmask}", strict=False)
    except ValueError:
        return False
