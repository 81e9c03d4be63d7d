// Package probelist defines the probe list: the JSON document coldpatch writes
// and hotpatch reads, naming every hook site of one ELF object with the bytes of
// its active and inert forms, so hotpatch can work on a stripped copy with no
// further analysis. The format is documented in docs/probe-list.md; Read is
// strict (unknown fields, wrong version, inconsistent bytes are errors that say
// which probe and field), Write is deterministic.
package probelist
