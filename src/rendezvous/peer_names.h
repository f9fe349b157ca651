// NOTE [Store peers' names]: c10d names every store connection it opens with
// getnameinfo(). Its client connects over IPv6 first, so a store on 127.0.0.1 is reached
// at the IPv4-mapped address ::ffff:127.0.0.1, which no stock /etc/hosts names (glibc's
// files lookup compares IPv6 addresses only with IPv6 entries): every connection, one per
// rank and call, then waits for a reverse query to the DNS server, 150 ms on average on
// a machine measured, 5 s when a reply is lost.
//
// name_mapped_peers_as_ipv4() makes libtorch's own getnameinfo() calls ask for an
// IPv4-mapped address what they ask for the IPv4 address itself: ::ffff:127.0.0.1 is then
// named "localhost" from the stock `127.0.0.1 localhost` line, and a mapped address of
// another node resolves as that node's IPv4 address does. Every other address is asked as
// before. It rewrites the getnameinfo entries of the libtorch libraries loaded in this
// process (their relocation slots); idempotent, and a no-op when none is loaded yet. Each
// library is scanned once: a later call costs only a walk of the loaded objects' list.
#pragma once

namespace sgpu::rendezvous {

// How many relocation slots now lead to the mapped lookup (0: no libtorch loaded, or
// nothing of it calls getnameinfo).
int name_mapped_peers_as_ipv4();

}  // namespace sgpu::rendezvous
