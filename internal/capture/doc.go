// Package capture runs the measurements that toggle probes over time: a
// trace (enable a selection, collect the runtime's event rings for a while,
// put the probes back) and the bursty latency profiler of Chamith et al.
// (section 9): each function collects at most K samples per epoch, then its
// probes are turned off until the next epoch, so the overhead stays bounded
// however hot the function is.
package capture
