/* edgeprobe_shm.h: the layout of the edgeprobe shared-memory region.
 *
 * This header is the single definition of the region; internal/shm mirrors it
 * in Go and its tests compile internal/shm/testdata/layout.c against this file
 * to check that every offset and size agrees. Bump EP_VERSION on any change.
 *
 * The region is one anonymous memfd ("/memfd:edgeprobe" in /proc/<pid>/fd),
 * mapped MAP_SHARED:
 *
 *   [0, 4096)                       struct ep_header
 *   [thread_off, +max_threads*thread_size) thread slots, each:
 *        struct ep_thread, then ep_local[local_funcs] at thread_local_off,
 *        then ep_frame[stack_depth] at thread_stack_off
 *   [ring_off, +max_threads*ring_stride)  ep_event[ring_events] per slot, of
 *        which the first ep_thread.ring_size are in use
 *   [keys_off, +max_funcs*8)        uint64_t keys[max_funcs]: the function table's keys
 *   [func_off, +max_funcs*func_size) struct ep_func[max_funcs]: their counters
 *   [maps_off, +maps_len)           output files only: a copy of /proc/self/maps
 *
 * The function table grows without moving (D35): it is a chain of segments
 * of open-addressed slots, segment 0 holding func_first slots [0, func_first)
 * and segment k >= 1 holding func_first << (k-1) slots from index
 * func_first << (k-1), so that the segments are contiguous and max_funcs (a
 * power of two, the cap) = func_first << (segments - 1). The file is sized
 * for all of them at start-up and untouched pages cost nothing; func_segs
 * counts the segments in use (only grows, CAS; slots beyond
 * func_first << (func_segs - 1) are all empty). A key's probe sequence is
 * max_probe slots from its home in segment 0, then max_probe slots from its
 * home in segment 1, and so on: home_k = (h_k >> 32) & (slots_k - 1),
 * h_0 = key * EP_HASH_MUL, h_(k+1) = (h_k ^ (h_k >> 29)) * EP_HASH_STEP. A key
 * is claimed (CAS from 0) in the first empty slot of its sequence, a segment
 * being counted in func_segs before any key is claimed in it; keys are never
 * removed, so a key is found at the one slot it was claimed in, and a reader
 * meeting an empty slot in the sequence knows the key is absent. An output
 * file keeps only the segments in use (its max_funcs = the slots in use).
 *
 * All multi-byte fields are little-endian, naturally aligned, and every
 * section starts on a 64-byte boundary. Offsets and sizes are in the header;
 * a reader must use them rather than recompute them.
 *
 * Counters are updated with relaxed atomics (RMW on shared fields, plain
 * load+store by the single owner on per-thread fields); readers use atomic
 * loads. Totals for a function are ep_func's counters plus, for every thread
 * slot, the ep_local entry whose gidx names that function.
 */
#ifndef EDGEPROBE_SHM_H
#define EDGEPROBE_SHM_H

#include <stdint.h>

#define EP_MAGIC 0x3142525045474445ull /* "EDGEPRB1" as little-endian bytes */
#define EP_VERSION 9u /* 2: fentry_mode and the fentry_* counters (padding, zero, in version 1);
                        * 3: ep_func.gen in place of the 64th histogram bucket, ep_frame.gen;
                        * 4: ep_frame.sp (exits match entries by stack position), ep_func.deep_*
                        *    in place of histogram buckets 61 and 62, ep_thread loss counters;
                        * 5: the function table grows in segments (func_first, func_segs), its
                        *    keys in their own array (keys_off), placed after the rings;
                        *    header.argplan (argument / return-value capture, EP_CTL_ARGS),
                        *    EP_EV_DATA records in the rings; rings sized per capture
                        *    (ring_req, ring_def, ep_thread.ring_size); header.gen, ep_func.gen
                        *    takes its values (an exit compares the frame's generation with
                        *    one word on the control line); quotas: header.quota_k/quota_epoch,
                        *    ep_func.quota in place of histogram bucket 60,
                        *    ep_thread.quota_skips, hook_ticks, hook_samples; trace filters:
                        *    header.filter_depth, filter_tid, filter_min_ns, ep_frame.flags;
                        * 6: ep_local.frame_ids (padding before); ep_thread.filter_out_cg,
                        *    filter_lim_cg, filter_lim (D58): a thread's
                        *    verdict on the trace filters, valid only because every reader that
                        *    sets filters starts a new generation (a version-5 reader does not,
                        *    so it must not drive this runtime);
                        * 7: EP_DATA_GEN stamp records in the rings and ep_thread.ev_gen (padding
                        *    before, D79): each event says which control|gen word decided it;
                        * 8: header.inflight, inflight_max (D89): where the process keeps the
                        *    table of sites an int3 protocol has put an int3 on (struct
                        *    ep_inflight, in the runtime's own memory, not in the region);
                        * 9: ep_local is 64 bytes (padding after frame_ids), at home
                        *    (key >> 4) & (local_funcs - 1); ep_frame.loff, the byte offset of
                        *    the entry in the slot, in place of lidx (D98) */
#define EP_HEADER_SIZE 4096u
/* The function table's hash (see the layout above). */
#define EP_HASH_MUL 0x9E3779B97F4A7C15ull
#define EP_HASH_STEP 0xBF58476D1CE4E5B9ull
#define EP_HIST_BUCKETS 60u /* bucket b counts latencies in [2^b, 2^(b+1)) ns; bucket 0 is [0, 2);
                              * the last bucket also takes everything longer */

/* Key namespace: __cyg_profile_func_enter_bare (clang) passes no function
 * address; its hits are keyed by the caller's return address with this bit set. */
#define EP_KEY_BARE (1ull << 63)

/* header.fentry_mode: the -pg -mfentry provider (__fentry__) */
#define EP_FENTRY_USED 1u      /* a __fentry__ hook has run in this process */
#define EP_FENTRY_EXITS 2u     /* exit probes (return-address hijacking) are on */
#define EP_FENTRY_EXITS_OFF 4u /* EDGEPROBE_FENTRY_EXITS=0: entries only */
#define EP_FENTRY_SHSTK 8u     /* CET user shadow stack is on: exit probes refused, entries only */

/* header.clock_kind */
#define EP_CLOCK_TSC 1u  /* latency from rdtsc; ns = ticks * tsc_mult >> 32 */
#define EP_CLOCK_MONO 2u /* latency from clock_gettime(CLOCK_MONOTONIC); tsc_mult = 1<<32 */

/* header.state */
#define EP_STATE_RUNNING 1u
#define EP_STATE_EXITED 2u /* written by the exit handler; output files have it */

/* header.control: written by outside readers, read by every hook */
#define EP_CTL_TRACE 1u  /* append enter/exit events to the per-thread rings */
#define EP_CTL_NOTIME 2u /* count only: no clock reads, no latency */
#define EP_CTL_PAUSE 4u  /* record nothing (hooks return at once) */
#define EP_CTL_QUOTA 8u  /* per-function quotas: at most quota_k recorded calls per quota_epoch */
#define EP_CTL_FILTER 16u /* trace events only for calls within filter_depth and filter_tid */
#define EP_FILTER_TIDS 8u
/* ep_frame.flags (filter_min_ns): the call's enter event is held back until
 * its exit shows it lasted long enough; or it has been written; above them
 * the filter_epoch of the capture that set them (older marks mean nothing) */
#define EP_FR_PENDING 1u
#define EP_FR_EMITTED 2u
#define EP_FR_EPOCH_SHIFT 2
/* With EP_CTL_TRACE: after the ENTER (EXIT) event of a fentry function that
 * has a plan in header.argplan, append an EP_EV_DATA record with the argument
 * (return-value) registers the plan names. A bit of its own, far from the
 * low ones other features take. */
#define EP_CTL_ARGS 0x100u

/* ep_thread.state */
#define EP_SLOT_FREE 0u
#define EP_SLOT_OWNED 1u

/* ep_event.tsk: kind in the top two bits, CLOCK_MONOTONIC ns below */
#define EP_EV_ENTER 0u
#define EP_EV_EXIT 1u
#define EP_EV_THREAD 2u /* a thread claimed this slot; fn holds its tid */
#define EP_EV_DATA 3u   /* a payload record: see below */
#define EP_EV_KIND_SHIFT 62
#define EP_EV_TS_MASK ((1ull << 62) - 1)

/* EP_EV_DATA: the record right after the ENTER (args) or EXIT (return value)
 * event it belongs to, published with it in one head update by its thread:
 *     tsk = EP_EV_DATA << 62 | sub << 60 | slots << 52 | spec (the plan used)
 *     fn  = the function key
 * followed by `slots` 16-byte ring cells holding little-endian 64-bit words:
 *   args (sub 1): the integer argument registers of spec's mask (rdi, rsi,
 *     rdx, rcx, r8, r9 order), the low 8 bytes of the SSE registers of its
 *     mask (xmm0..xmm7), the stack argument bytes (from entry rsp + 8), then
 *     for each string register (rdi.. order) a status word (bits 0-7: bytes
 *     copied, bit 8: a NUL ended them, bit 9: unreadable) and the bytes,
 *     NUL excluded, zero-padded to whole words;
 *   return (sub 2): rax, rdx, xmm0, xmm1 as the mask says, then the string
 *     at rax (status word and bytes) when the plan asks for it.
 * Words past the last are zero up to the end of the last cell. */
#define EP_DATA_ARGS 1u
#define EP_DATA_RET 2u
/* A stamp (version 7, D79): the events after it in this ring, up to the next
 * stamp, were decided under a control|gen word whose gen is the stamp's spec
 * (its low 32 bits); fn is 0, slots 0. A hook writes one before an event
 * whose word's gen differs from the slot's last stamp (ep_thread.ev_gen),
 * published with the event in one head update. A capture keeps only events
 * stamped with a generation at least the one it started its events in, so
 * an event a hook decided under an earlier capture's word (a thread
 * preempted inside the hook across the switch) is dropped, and counted. */
#define EP_DATA_GEN 3u
#define EP_DATA_SUB_SHIFT 60
#define EP_DATA_SLOTS_SHIFT 52
#define EP_DATA_SPEC_MASK ((1ull << 52) - 1)
#define EP_STR_MAX 64u      /* bytes copied from a char * */
#define EP_STACK_MAX 64u    /* bytes of stack arguments copied */
#define EP_STR_COMPLETE 0x100u
#define EP_STR_FAULT 0x200u

/* A capture plan's spec word (header.argplan[].spec and EP_EV_DATA). */
#define EP_PLAN_INT(s) ((uint32_t)(s) & 0x3fu)           /* bits 0-5: rdi..r9 */
#define EP_PLAN_SSE(s) ((uint32_t)((s) >> 8) & 0xffu)    /* bits 8-15: xmm0..xmm7 */
#define EP_PLAN_STR(s) ((uint32_t)((s) >> 16) & 0x3fu)   /* bits 16-21: char * among rdi..r9 */
#define EP_PLAN_STACK(s) ((uint32_t)((s) >> 24) & 0x7fu) /* bits 24-30: stack bytes (<= 64) */
#define EP_PLAN_RINT(s) ((uint32_t)((s) >> 32) & 3u)     /* bits 32-33: rax, rdx */
#define EP_PLAN_RSSE(s) ((uint32_t)((s) >> 34) & 3u)     /* bits 34-35: xmm0, xmm1 */
#define EP_PLAN_RSTR (1ull << 36)                        /* the return value is a char * */
#define EP_PLAN_ENTRY (1ull << 40)                       /* record the arguments */
#define EP_PLAN_EXIT (1ull << 41)                        /* record the return value */

/* header.argplan: open addressing, home (key * golden ratio) >> 57 (top 7
 * bits), at most EP_ARGPLANS probes. Written by a capture while
 * EP_CTL_ARGS is clear (spec first, then key with release order), read by
 * hooks (key with acquire order, then spec); cleared after the bit is. */
#define EP_ARGPLANS 128u
struct ep_argplan {
	uint64_t key;  /* function key; 0 = empty */
	uint64_t spec; /* EP_PLAN_* */
};

struct ep_header {
	/* identity: immutable once magic is published */
	uint64_t magic;        /* 0: written last (release) at creation */
	uint32_t version;      /* 8 */
	uint32_t header_size;  /* 12 */
	uint64_t region_size;  /* 16: bytes of the live region (excl. maps copy) */
	int32_t pid;           /* 24 */
	int32_t ppid;          /* 28 */
	uint32_t hist_buckets; /* 32 */
	uint32_t clock_kind;   /* 36 */
	uint64_t tsc_mult;     /* 40: ns = ticks * tsc_mult >> 32 */
	uint64_t tsc0;         /* 48: tick count at calibration end */
	uint64_t mono0;        /* 56: CLOCK_MONOTONIC ns at tsc0 */
	/* geometry */
	uint64_t real0;            /* 64: CLOCK_REALTIME ns at mono0 */
	uint64_t func_off;         /* 72: ep_func[max_funcs] */
	uint32_t max_funcs;        /* 80: function-table slots over every segment, a power of two */
	uint32_t func_size;        /* 84 */
	uint64_t thread_off;       /* 88 */
	uint32_t max_threads;      /* 96 */
	uint32_t thread_size;      /* 100 */
	uint32_t thread_local_off; /* 104: offset of ep_local[] inside a slot */
	uint32_t local_funcs;      /* 108: per-thread counter cache entries, 0 or a power of two */
	uint32_t local_size;       /* 112 */
	uint32_t thread_stack_off; /* 116: offset of ep_frame[] inside a slot */
	uint32_t stack_depth;      /* 120 */
	uint32_t frame_size;       /* 124 */
	uint64_t ring_off;         /* 128 */
	uint64_t ring_stride;      /* 136: bytes per slot's ring */
	uint32_t ring_events;      /* 144: 0 (no tracing) or a power of two: each slot's ring
	                            * capacity (version 5; its pages are touched only as far
	                            * as the slot's ring_size reaches) */
	uint32_t event_size;       /* 148 */
	uint32_t max_probe;        /* 152: linear-probe limit in each function-table segment */
	uint32_t func_first;       /* 156: slots of the function table's segment 0, a power of two */
	uint64_t calib_ns;         /* 160: length of the TSC calibration */
	uint64_t maps_off;         /* 168: output files: offset of the /proc/self/maps copy, else 0 */
	uint64_t maps_len;         /* 176 */
	uint64_t init_mono;        /* 184: CLOCK_MONOTONIC ns when the region was created */
	/* lifecycle */
	uint32_t state;       /* 192 */
	uint32_t fentry_mode; /* 196: EP_FENTRY_* (version 2) */
	uint64_t exit_mono; /* 200: CLOCK_MONOTONIC ns at exit */
	uint64_t exit_tsc;  /* 208: ticks at exit (check the calibration against exit_mono) */
	uint64_t keys_off;  /* 216: uint64_t keys[max_funcs] (geometry, version 5) */
	uint32_t func_segs; /* 224: function-table segments in use, >= 1 (grows by CAS) */
	uint32_t filter_epoch; /* 228: bumped by each capture with filter_min_ns (ep_frame.flags) */
	/* 232: a --rate trace's quota epochs (D55): a call whose quota slot was
	 * taken in an epoch e with qtrace_lo <= e (and e <= qtrace_hi unless it
	 * is 0) writes its enter event whatever the control word it read said;
	 * outside them it writes none. qtrace_lo 0: no such trace (events
	 * follow EP_CTL_TRACE). One 8-byte word, read once after the take. */
	uint32_t qtrace_lo;
	uint32_t qtrace_hi; /* 236 */
	uint64_t _pad2[2];  /* 240 */
	/* control line: written by readers */
	uint32_t control;    /* 256 */
	uint32_t gen;        /* 260: process-wide generation (version 5): hotpatch adds 1 and stores
	                      * the result in ep_func.gen of each function it is about to turn on;
	                      * the hooks read control and gen as one 8-byte word: keep them together */
	uint32_t quota_k;     /* 264: EP_CTL_QUOTA: calls a function may record per quota epoch */
	uint32_t quota_epoch; /* 268: the current quota epoch (a reader adds 1 to start the next) */
	/* EP_CTL_FILTER (set by a capture before it turns tracing on) */
	uint32_t filter_depth;                /* 272: trace calls at shadow-stack depth < this (0: any) */
	int32_t filter_tid[EP_FILTER_TIDS];   /* 276: trace only these threads (first 0: every thread) */
	uint32_t filter_min_ns;               /* 308: trace only calls lasting at least this (0: any) */
	/* 312: the ring size (events, a power of two <= ring_events) a capture
	 * asks for; each thread switches to it at its next event once its ring
	 * is empty (ep_thread.ring_size). Version 5. */
	uint32_t ring_req;
	uint32_t ring_def;   /* 316: the size rings start with (EDGEPROBE_RING_EVENTS) */
	/* global counters (atomic RMW; only touched off the fast path) */
	uint64_t funcs_used;       /* 320: distinct keys in the function table */
	uint64_t func_drop_enters; /* 328: enters dropped: no slot in any segment up to max_funcs */
	uint64_t func_drop_exits;  /* 336 */
	uint64_t threads_claimed;  /* 344: slot claims since start */
	uint64_t threads_active;   /* 352 */
	uint64_t thread_overflows; /* 360: threads that found every slot taken */
	uint64_t thread_drop_hits; /* 368: hooks run by those threads */
	uint64_t preinit_drops;    /* 376: hooks before/during init, or while the region could not be made */
	uint64_t late_drops;       /* 384: hooks after the thread's slot was released (TLS destructors) */
	/* fentry provider (version 2) */
	uint64_t fentry_sites;     /* 392: distinct __fentry__ call sites decoded */
	uint64_t fentry_bad_sites; /* 400: sites whose call was not recognised (keyed EP_KEY_BARE, entries only) */
	uint64_t fentry_unwound;   /* 408: hijacked frames the unwinder walked through (exceptions, pthread_exit) */
	/* seccomp (D56): a reader that saw a thread of the process under
	 * seccomp sets nosys; from then on the hooks make no system call */
	uint32_t nosys;            /* 416 */
	uint32_t _pad5;            /* 420 */
	uint64_t nosys_threads;    /* 424: threads whose first hook came under nosys: not recorded */
	uint64_t nosys_skips;      /* 432: in-hook system calls left out under nosys (their decision made without them) */
	/* 440: the address, in the process, of its struct ep_inflight (version
	 * 8, D89): hotpatch writes there (through /proc/PID/mem) the sites it is
	 * about to put an int3 on; 0: no table (an older runtime's region reads
	 * 0 here) */
	uint64_t inflight;
	uint32_t inflight_max;     /* 448: its capacity (EP_INFLIGHT_MAX) */
	uint32_t _pad7;            /* 452 */
	uint64_t _pad4[199];       /* 456 .. 2048 */
	/* argument capture plans (version 5) */
	struct ep_argplan argplan[EP_ARGPLANS]; /* 2048 .. 4096 */
};

/* One function (hash-table slot): 576 bytes. */
struct ep_func {
	uint64_t addr;      /* 0: a copy of keys[i] (the table), written after the claim; 0 = not yet */
	uint64_t entries;   /* 8: enters counted here (threads without a local entry) */
	uint64_t exits;     /* 16 */
	uint64_t sum_ns;    /* 24: latency sum of exits counted here */
	uint64_t min_inv;   /* 32: ~(min latency ns); 0 means no sample */
	uint64_t max_ns;    /* 40 */
	uint64_t orphans;   /* 48: exits with no matching enter on the thread's stack */
	uint64_t unmatched; /* 56: frames found dead without their exit (longjmp, exceptions, toggles) */
	uint64_t hist[EP_HIST_BUCKETS]; /* 64: log2 ns latency histogram (all threads) */
	/* 544: quota state: quota_epoch << 32 | calls recorded in that epoch
	 * (EP_CTL_QUOTA; CAS by the enter hooks of every thread) */
	uint64_t quota;
	/* 552: entries deeper than the shadow stack: counted, given no frame, untimed */
	uint64_t deep_entries;
	/* 560: exits of such frames (matched by nesting, untimed) */
	uint64_t deep_exits;
	/* 568: generation: a reader (hotpatch) about to turn the function's
	 * probes on adds 1 to header.gen and stores the result here. A frame
	 * remembers header.gen at its enter; an exit matches only a frame at
	 * least as new as its function's generation, because a frame from before
	 * the probes were last off may be a call whose exit was never seen, at
	 * the very stack depth of the call now exiting. (Low 32 bits compared,
	 * modulo 2^32.) */
	uint64_t gen;
};

/* A thread slot's fixed part: 192 bytes; ep_local[] and ep_frame[] follow. */
struct ep_thread {
	uint32_t state;           /* 0: EP_SLOT_* (CAS to claim, release store to free) */
	int32_t tid;              /* 4: owner, or last owner when free */
	uint32_t generation;      /* 8: claims of this slot */
	uint32_t depth;           /* 12: shadow-stack depth; may exceed stack_depth */
	uint64_t claimed_mono;    /* 16 */
	uint64_t reentrant_drops; /* 24: hooks dropped because this thread was inside a hook (signals) */
	uint64_t stack_overflows; /* 32: enters deeper than stack_depth (not timed) */
	uint64_t orphans;         /* 40 */
	uint64_t unmatched;       /* 48 */
	uint64_t local_full;      /* 56: hits counted in ep_func because the local cache was full */
	/* ring producer line (owner) */
	uint64_t ring_head;       /* 64: events written */
	uint64_t ring_dropped;    /* 72: events lost because the ring was full */
	uint64_t ring_tail_cache; /* 80: owner's private copy of ring_tail */
	uint32_t index;           /* 88: this slot's index */
	uint32_t quota_busy;      /* 92: 1 from just before a quota take's CAS until the call's enter
	                           * event is written (the owner's; a --rate trace's end waits for 0, D55) */
	/* loss counters of the rare paths (owner) */
	uint64_t deep_lost;       /* 96: frames deeper than the shadow stack found dead (functions unknown) */
	uint64_t abandoned_hooks; /* 104: hooks that never finished (a signal handler longjmp'd out of one) */
	uint64_t fentry_restored; /* 112: dead hijacked fentry frames whose return slot was given back */
	uint64_t quota_skips;     /* 120: hooks that recorded nothing because their function's quota was used
	                           * up (enters over the quota, and the exits of those calls) */
	/* ring consumer line (readers) */
	uint64_t ring_tail;       /* 128: events consumed; only a consuming reader writes it */
	/* the owner's sampled timing of its own hooks while EP_CTL_QUOTA is on:
	 * one hook in EP_HOOK_SAMPLE is timed from its start to its end (TSC) */
	uint64_t hook_ticks;      /* 136: TSC ticks inside the sampled hooks */
	uint64_t hook_samples;    /* 144: hooks sampled */
	uint32_t sample_left;     /* 152: the owner's own: hooks until the next sampled one */
	/* 156: the gen of the last stamp record (EP_DATA_GEN) in this slot's ring
	 * (the owner's own, version 7; 0: none yet, and no capture's gen is 0) */
	uint32_t ev_gen;
	/* 160: the owner's own verdict on the trace filters (D58), made by the
	 * cyg hooks once per control|gen word (edgeprobe_cyg.S): under the word
	 * filter_out_cg the thread list leaves this thread out; under the word
	 * filter_lim_cg its calls at shadow-stack depth filter_lim or deeper are
	 * out (~0: none). Both 0 at each claim. */
	uint64_t filter_out_cg;
	uint64_t filter_lim_cg;   /* 168 */
	uint32_t filter_lim;      /* 176 */
	uint32_t _pad6;           /* 180 */
	/* 184: events this slot's ring holds now (a power of two <= ring_events;
	 * 0: not used yet). Written by the owner only while the ring is empty,
	 * before the head that publishes an event written with it (version 5);
	 * read by the owner at each event (this line changes only when a reader
	 * consumes) and by readers after the head. */
	uint32_t ring_size;
	uint32_t _pad5;           /* 188 */
};

/* Per-thread counter cache entry: 64 bytes (one cache line), written only by
 * the slot owner. Its home is (key >> 4) & (local_funcs - 1) (D98). */
struct ep_local {
	uint64_t addr;    /* 0: key, 0 = empty */
	uint32_t gidx;    /* 8: index of the function in the table */
	uint32_t hint;    /* 12: the owner's own: histogram bucket of its last latency (a branch hint) */
	uint64_t entries; /* 16 */
	uint64_t exits;   /* 24 */
	uint64_t sum_ns;  /* 32 */
	uint64_t frame_ids; /* 40: gidx | loff << 32: a frame's gidx and loff, one word
	                     * (set with gidx, before addr; the cyg hooks' assembly copies it) */
	/* 48: this function's frames pushed on this thread and parked since
	 * with a suspended context (edgeprobe_ctx.c, D102): added to `open` by
	 * readers. Written with atomic adds by any thread: +1 by the thread that
	 * parks a frame, -1 by the one that resumes it (zero in version 9
	 * regions of runtimes before D102: the field was padding) */
	uint64_t parked;
	uint64_t _pad;      /* 56 */
};

/* Shadow-stack frame: 48 bytes. */
struct ep_frame {
	uint64_t fn;   /* 0: key */
	uint64_t ts;   /* 8: clock ticks at enter; 0 = not timed */
	uint64_t sp;   /* 16: stack position of the call (cyg: the enter hook's frame address;
	                * fentry: the return slot); a frame below a later enter is dead */
	uint64_t site; /* 24: the enter hook's return address; a frame at a later enter's
	                * position with the same site is dead (inlined callees share positions) */
	uint32_t gidx; /* 32 */
	uint32_t loff; /* 36: byte offset of its ep_local in the thread slot
	                * (thread_local_off + index * 64), or 0 when counted in ep_func */
	uint32_t gen;  /* 40: header.gen at enter */
	uint32_t flags; /* 44: EP_FR_* (trace filters, the owner's own) */
};

/* Trace event: 16 bytes. */
struct ep_event {
	uint64_t tsk; /* 0: kind << 62 | CLOCK_MONOTONIC ns */
	uint64_t fn;  /* 8: key, or tid for EP_EV_THREAD */
};

/* The in-flight table (version 8, D89; docs/protocols.md, "SIGKILL and
 * repair"). It lives in the runtime's own memory (.bss), not in the region:
 * a forked child gets a copy of it together with the copy of the text it
 * describes, and a vfork child shares both. hotpatch writes it through
 * /proc/PID/mem while it traces the process: the sites first, then count,
 * before the first int3 of them is written; count 0 once no int3 of its
 * own is left. The runtime's SIGTRAP handler reads it when a trap at one
 * of these sites reaches the process, i.e. when no tracer took it (the
 * tracer was killed). */
#define EP_INFLIGHT_MAX 16384u
#define EP_SITE_MAX 16u
struct ep_inflight_site {
	uint64_t addr;   /* 0: the site's run-time address */
	uint32_t len;    /* 8: its length, 1..15 */
	uint32_t _pad;   /* 12 */
	uint8_t active[EP_SITE_MAX]; /* 16: its active form (len bytes) */
	uint8_t inert[EP_SITE_MAX];  /* 32: its inert form */
};
struct ep_inflight {
	uint64_t count;   /* 0: sites valid (hotpatch writes it after them) */
	/* 8: 0, or the tid of a thread whose SIGTRAP handler is repairing
	 * sites in-process; a hotpatch attaching waits for 0 before it reads a
	 * site, and a handler takes it (CAS from 0) only to write, and writes
	 * only when no tracer holds its thread */
	uint64_t lock;
	uint64_t traps;   /* 16: traps at a listed site the handler took (no tracer took them) */
	uint64_t repairs; /* 24: sites the handler made whole */
	uint64_t holds;   /* 32: traps the handler could not repair at once (waited) */
	uint64_t _pad[3]; /* 40 */
	struct ep_inflight_site site[EP_INFLIGHT_MAX]; /* 64 */
};

#define EP_STATIC_ASSERT(c, m) _Static_assert(c, m)
EP_STATIC_ASSERT(sizeof(struct ep_header) == EP_HEADER_SIZE, "header size");
EP_STATIC_ASSERT(sizeof(struct ep_func) == 576, "ep_func size");
EP_STATIC_ASSERT(sizeof(struct ep_thread) == 192, "ep_thread size");
EP_STATIC_ASSERT(sizeof(struct ep_local) == 64, "ep_local size");
EP_STATIC_ASSERT(sizeof(struct ep_frame) == 48, "ep_frame size");
EP_STATIC_ASSERT(sizeof(struct ep_event) == 16, "ep_event size");
EP_STATIC_ASSERT(sizeof(struct ep_inflight_site) == 48, "ep_inflight_site size");
EP_STATIC_ASSERT(sizeof(struct ep_inflight) == 64 + EP_INFLIGHT_MAX * 48, "ep_inflight size");

#endif
