// Package probecache keeps, per user, the compact form (probelist.Index) of
// every probe list hotpatch has read and of every mapped object it has
// scanned, so a second call costs a lookup, not a JSON parse or an ELF
// scan, whatever the size of the program.
//
// Keys. A JSON list is keyed by the file's identity (device and inode) and
// an object's scan by its build-id, mapped path and file identity; every
// key also holds this program's own build identity, so a new hotpatch never
// reads an old one's entries. An entry is used only while the file's size,
// mtime and ctime are those recorded when it was read. The build-id alone
// would not do: coldpatch keeps it (a cold copy and the original share it)
// and a nop-cold copy scans differently.
//
// Racy entries. A file changed twice within one timestamp tick keeps its
// ctime, so an entry made less than racyMargin after the file's ctime is
// "racy" (git's word): it is used only after the file's content is hashed
// again and found equal to what was read, and rewritten as clean once the
// file is old enough. See docs/probe-list.md.
//
// Safety. The directory (DefaultDir) is created 0700 and used only if it
// is a real directory (opened O_NOFOLLOW) owned by the effective user with
// no group or other access, reached through directories and symlinks no
// other user can change (openPrivatePath walks the path one component at
// a time); otherwise nothing is cached and the caller is told why. Entries are opened O_NOFOLLOW relative to that directory and
// used only if they are regular files owned by the user, not writable by
// others; they are written to a temporary file (O_EXCL) and renamed into
// place. An entry that is not all of this, or that does not decode, is
// ignored and rebuilt; probelist.OpenCompact and Index.Probe check
// everything they decode, so no entry is trusted.
package probecache
