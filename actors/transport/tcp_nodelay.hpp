// TCP_NODELAY on the CAF middleman's connections. CAF 0.17 never sets it (its
// sockets get only SO_KEEPALIVE; checked with strace) and has no setting for
// it, so this marks every TCP socket the process holds: call it right after
// publishing (Linux hands the flag on from a listening socket to the
// connections it accepts) and after connecting to a peer. Idempotent; other
// sockets (Unix, UDP) are left alone.
//
// Measured (bench_messaging, bench/results/messaging.md, "Cross-process data plane
// II"): no change to a request/response round trip, where each side has
// nothing unacknowledged in flight when it writes, so Nagle never holds a
// write back. It is set anyway for back-to-back small messages to one peer,
// the case Nagle delays. TROUPE_TCP_NODELAY=0 leaves the sockets alone (for
// before/after measurements).
#pragma once

namespace troupe {

// Sets TCP_NODELAY on every TCP socket of this process; returns how many
// (0 when TROUPE_TCP_NODELAY=0).
int set_tcp_nodelay_on_all_sockets();

}  // namespace troupe
