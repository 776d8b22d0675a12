#!/usr/bin/env python3
"""Writes a SimGrid platform of NODES nodes x PER_NODE ranks, and its hostfile (consecutive ranks per node).

Each rank is a simulated host of one core. Inside a node every rank has its own full-duplex link (--intra, --intra-lat:
NVLink-class for GPU nodes, shared memory for the emulated hosts) to a non-blocking node switch; each node has one
full-duplex NIC (--nic, --nic-lat) that all its ranks share, and the switch between the nodes never limits (a
non-blocking fat-tree): a message between nodes crosses its sender's NIC up and its receiver's NIC down.

usage: make_platform.py NODES PER_NODE --nic 100Gbps --nic-lat 2us --intra 400GBps --intra-lat 1us --out FILE.xml
       (writes FILE.xml and FILE.hosts)
"""
import argparse


def platform(nodes, per_node, nic, nic_lat, intra, intra_lat, comment):
    out = ["<?xml version='1.0'?>", '<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">',
           f"<!-- {comment} (bench/sim/platforms/make_platform.py) -->", '<platform version="4.1">',
           '  <zone id="world" routing="Full">']
    for n in range(nodes):
        out.append(f'    <cluster id="n{n}" prefix="n{n}-r" suffix="" radical="0-{per_node - 1}" speed="1Gf" '
                   f'bw="{intra}" lat="{intra_lat}" sharing_policy="SPLITDUPLEX" bb_bw="1000TBps" bb_lat="0us" '
                   f'bb_sharing_policy="FATPIPE" router_id="n{n}-gw"/>')
    for n in range(nodes):
        out.append(f'    <link id="n{n}-nic" bandwidth="{nic}" latency="{nic_lat}" sharing_policy="SPLITDUPLEX"/>')
    for a in range(nodes):
        for b in range(nodes):
            if a == b:
                continue
            out.append(f'    <zoneRoute src="n{a}" dst="n{b}" gw_src="n{a}-gw" gw_dst="n{b}-gw" symmetrical="NO">'
                       f'<link_ctn id="n{a}-nic" direction="UP"/><link_ctn id="n{b}-nic" direction="DOWN"/>'
                       '</zoneRoute>')
    out += ["  </zone>", "</platform>", ""]
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("nodes", type=int)
    parser.add_argument("per_node", type=int)
    parser.add_argument("--nic", required=True)
    parser.add_argument("--nic-lat", default="2us")
    parser.add_argument("--intra", required=True)
    parser.add_argument("--intra-lat", default="1us")
    parser.add_argument("--comment", default="")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    comment = args.comment or (f"{args.nodes} nodes x {args.per_node} ranks; NIC {args.nic} / {args.nic_lat} per node, "
                               f"{args.intra} / {args.intra_lat} per rank inside a node")
    with open(args.out, "w") as f:
        f.write(platform(args.nodes, args.per_node, args.nic, args.nic_lat, args.intra, args.intra_lat, comment))
    hosts = args.out[:-4] + ".hosts" if args.out.endswith(".xml") else args.out + ".hosts"
    with open(hosts, "w") as f:
        f.write("".join(f"n{n}-r{r}\n" for n in range(args.nodes) for r in range(args.per_node)))


if __name__ == "__main__":
    main()
