"""A test DNS server for the podman run, in a container of its own on the run's internal network.

``python3 dns_server.py ADDRESS NAME=IPV4 ...`` answers A queries for the given names on UDP and TCP port 53 of
ADDRESS; every other name (and every other type of those names) is answered empty or NXDOMAIN. Control's
``--dns-server`` points at it, so no name is ever looked up through aardvark-dns or anything outside the
network. It runs on the image's own interpreter (/opt/openshell-sandbox/bin/python has dnspython).
"""

from __future__ import annotations

import socket
import struct
import sys
import threading

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset


def answer(wire: bytes, records: dict[str, str]) -> bytes:
    query = dns.message.from_wire(wire)
    reply = dns.message.make_response(query)
    question = query.question[0]
    name = question.name.to_text(omit_final_dot=True).lower()
    if name not in records:
        reply.set_rcode(dns.rcode.NXDOMAIN)
    elif question.rdtype == dns.rdatatype.A:
        reply.answer.append(dns.rrset.from_text(question.name, 0, "IN", "A", records[name]))
    return bytes(reply.to_wire())


def serve_tcp(sock: socket.socket, records: dict[str, str]) -> None:
    while True:
        conn, _ = sock.accept()
        with conn:
            try:
                head = conn.recv(2)
                (size,) = struct.unpack("!H", head)
                wire = b""
                while len(wire) < size:
                    chunk = conn.recv(size - len(wire))
                    if not chunk:
                        break
                    wire += chunk
                out = answer(wire, records)
                conn.sendall(struct.pack("!H", len(out)) + out)
            except Exception as exc:  # a bad query must not stop the server
                print(f"dns_server: tcp: {exc}", file=sys.stderr, flush=True)


def main() -> None:
    address = sys.argv[1]
    records = dict(arg.split("=", 1) for arg in sys.argv[2:])
    records = {k.lower().rstrip("."): v for k, v in records.items()}
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((address, 53))
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind((address, 53))
    tcp.listen(16)
    threading.Thread(target=serve_tcp, args=(tcp, records), daemon=True).start()
    print(f"dns_server: serving {sorted(records)} on {address}:53", flush=True)
    while True:
        wire, peer = udp.recvfrom(4096)
        try:
            udp.sendto(answer(wire, records), peer)
        except Exception as exc:
            print(f"dns_server: udp from {peer}: {exc}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
