/* edgeprobe_asm.h: the layout constants the assembly hooks use
 * (edgeprobe_cyg.S). Plain #defines, so that a .S file can include them;
 * edgeprobe_cyg.c checks every one against the C definitions at compile
 * time (_Static_assert), so the two cannot drift apart.
 */
#ifndef EDGEPROBE_ASM_H
#define EDGEPROBE_ASM_H

/* struct ep_tls (thread-local) */
#define EPA_TLS_SLOT 0
#define EPA_TLS_BUSY 8
#define EPA_TLS_BUSY_RET 16
#define EPA_TLS_FRAMES 24

/* struct ep_proc (the process's copy of the region's geometry, "edgeprobe_proc") */
#define EPA_PROC_HDR 0
#define EPA_PROC_FUNCS 8
#define EPA_PROC_TSC_MULT 16
#define EPA_PROC_LMASK 24
#define EPA_PROC_LMASK_OFF 44
#define EPA_PROC_FAST_DEPTH 28
#define EPA_PROC_STACK_OFF 36

/* struct ep_header: control (low half) and gen (high half), one aligned word */
#define EPA_HDR_CONTROL 256
#define EPA_HDR_FILTER_DEPTH 272
#define EPA_HDR_FILTER_TID 276
#define EPA_FILTER_TIDS 8

/* struct ep_thread; the thread's function cache (struct ep_local) follows it */
#define EPA_TH_TID 4
#define EPA_TH_DEPTH 12
#define EPA_TH_FILTER_OUT_CG 160
#define EPA_TH_FILTER_LIM_CG 168
#define EPA_TH_FILTER_LIM 176
#define EPA_TH_SIZE 192

/* struct ep_local */
#define EPA_LOCAL_SIZE 64
#define EPA_LOCAL_ADDR 0
#define EPA_LOCAL_GIDX 8
#define EPA_LOCAL_HINT 12
#define EPA_LOCAL_ENTRIES 16
#define EPA_LOCAL_EXITS 24
#define EPA_LOCAL_SUM_NS 32
#define EPA_LOCAL_FRAME_IDS 40

/* struct ep_frame */
#define EPA_FR_SIZE 48
#define EPA_FR_FN 0
#define EPA_FR_TS 8
#define EPA_FR_SP 16
#define EPA_FR_SITE 24
#define EPA_FR_GIDX 32
#define EPA_FR_LOFF 36
#define EPA_FR_GEN 40

/* struct ep_func (576 = 9 * 64 bytes) */
#define EPA_FUNC_SIZE 576
#define EPA_FUNC_MIN_INV 32
#define EPA_FUNC_MAX_NS 40
#define EPA_FUNC_HIST 64

#define EPA_SLOT_MIN 16
#define EPA_CTL_SLOWPATH 0xd /* EP_CTL_PAUSE | EP_CTL_TRACE | EP_CTL_QUOTA */
#define EPA_CTL_NOTIME 2
#define EPA_CTL_TRACE 1
#define EPA_CTL_FILTER 16
#define EPA_HIST_LAST 59 /* EP_HIST_BUCKETS - 1 */

#endif /* EDGEPROBE_ASM_H */
