// Package elfnote is edgeprobe's one reader of the GNU build-id note: the
// scanner reads it from SHT_NOTE sections of a file, procmaps from PT_NOTE
// segments of a mapped object (present even when sections are stripped);
// both hand the note bytes here, so the identity a probe list records and
// the identity hotpatch matches it against are parsed the same way.
package elfnote
