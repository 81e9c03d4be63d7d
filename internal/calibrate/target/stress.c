/* stress.c: the cross-modification stress program. It is both the bundled
 * target of `hotpatch calibrate` (internal/calibrate embeds this file and
 * compiles it with the machine's cc at run time) and the stress fixture of
 * the tests (testdata/fixtures/stress.c is a symlink to this file: keep one
 * copy of the C).
 *
 * Global asm defines five functions stress_fn0..stress_fn4, each holding one
 * 5-byte `call stress_hookK` at a labelled, exported address stress_siteK
 * placed so that it straddles a 64-byte line boundary with the split K|5-K
 * (K=1..4); stress_site0 straddles nothing. Each hook counts into
 * stress_hits[K]; each function returns K whether or not its call ran.
 * Executor threads (argv[1], default 4) call all five in a loop; with argv[2]
 * = "churn" one more thread keeps creating short-lived threads that do the
 * same (clone/exit traffic for a tracer). SIGILL/SIGSEGV/SIGBUS/SIGTRAP/SIGFPE
 * are caught: a torn instruction is counted in stress_torn and reported on
 * stderr as one line
 *   torn sig=S pc=0xPC addr=0xA ret=0xR site=K code=b0 b1 .. b15
 * (S decimal; addr the fault address; ret the word at the stack pointer,
 * which is site+5 when a torn call jumped somewhere; site the stress_siteK
 * the PC or ret points into, or -; code the 16 bytes at PC as read in the
 * handler, ?? where unreadable), and the thread resumes its loop. An
 * iteration whose five return values do not add up (a torn instruction that
 * did not fault) is counted in stress_bad. The main thread prints
 * "ready <pid>" once all executors run, then reads stdin until EOF or a
 * "stop" line, joins, prints
 *   done iters=N torn=T eintr=E hits=a,b,c,d,e bad=B result=ok|BAD
 * and exits 0 only if every return-value checksum matched and nothing tore.
 * stress_progress[i] is executor i's loop count, for tools that must know
 * every executor has run the sites since some point.
 * With argv[2] = "fork" one more thread forks in a loop instead of churning
 * threads: each child (every fourth a vfork child, which shares the parent's
 * text) resets the fault signals to their defaults, as a program that never
 * caught them would have, runs the five sites and exits 0 if their return
 * values add up; a child killed by a signal (an inherited int3: SIGTRAP) or
 * exiting non-zero is counted, and the done line gains
 *   forks=F childdied=D childbad=B lastsig=S lastvfork=V (V: the last child that died was a vfork child)
 * (result=ok needs D = B = 0).
 * With argv[2] = "vforkhold" the forker's children are all vfork children
 * and the first runs the five sites from before "ready" until "stop" (it
 * shares stop_flag): a tracer that attaches finds it already running, its
 * parent thread blocked in vfork, and must trace it too.
 * With argv[2] = "vfork2hold" that first vfork child vforks in turn and it is
 * the grandchild that runs the sites (both share our text; the child sits
 * blocked in vfork): a tracer must find and trace the grandchild too. The
 * child dies of the signal the grandchild died of, if it did.
 * Build: gcc -O2 -g -pthread stress.c -o stress (no hooks.c needed). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#define NSITES 5
#define MAXEXEC 64

unsigned long stress_hits[NSITES];
unsigned long stress_torn;
unsigned long stress_bad; /* iterations whose return values did not add up */
unsigned long stress_iters;
volatile unsigned long stress_progress[MAXEXEC]; /* loops so far, per executor */
static atomic_int stop_flag, running;
static int bad;

#define HOOK(k) \
	__attribute__((used, noinline, visibility("hidden"))) void stress_hook##k(void) { \
		__atomic_fetch_add(&stress_hits[k], 1, __ATOMIC_RELAXED); \
	}
HOOK(0) HOOK(1) HOOK(2) HOOK(3) HOOK(4)

int stress_fn0(void), stress_fn1(void), stress_fn2(void), stress_fn3(void), stress_fn4(void);
extern char stress_site0[], stress_site1[], stress_site2[], stress_site3[], stress_site4[];

/* Each function: sub $8,%rsp (4 bytes, keeps the stack 16-aligned at the
 * call), long NOPs up to the call's offset, the call, add, mov $K,%eax, ret.
 * The call of stress_fnK starts at 64-K within a 64-byte aligned block. */
#define SITEFN(k, off) \
	".p2align 6\n" \
	".globl stress_fn" #k "\n.type stress_fn" #k ",@function\n" \
	"stress_fn" #k ":\n" \
	"  sub $8, %rsp\n" \
	"  .nops " #off " - 4\n" \
	".globl stress_site" #k "\n.type stress_site" #k ",@function\n" \
	"stress_site" #k ":\n" \
	"  call stress_hook" #k "\n" \
	"  add $8, %rsp\n" \
	"  mov $" #k ", %eax\n" \
	"  ret\n" \
	".size stress_fn" #k ", .-stress_fn" #k "\n" \
	".size stress_site" #k ", 5\n"

__asm__(".text\n"
	SITEFN(0, 8)
	SITEFN(1, 63)
	SITEFN(2, 62)
	SITEFN(3, 61)
	SITEFN(4, 60));

struct exec_state {
	sigjmp_buf jb;
	volatile unsigned long iters, sum;
	int id;
};
static __thread struct exec_state *self;

static void put(char **p, const char *s) { while (*s) *(*p)++ = *s++; }
static void puthex(char **p, unsigned long v) {
	char tmp[17]; int n = 0;
	do { tmp[n++] = "0123456789abcdef"[v & 15]; v >>= 4; } while (v);
	while (n) *(*p)++ = tmp[--n];
}

static void putdec(char **p, unsigned long v) {
	char tmp[21]; int n = 0;
	do { tmp[n++] = '0' + v % 10; v /= 10; } while (v);
	while (n) *(*p)++ = tmp[--n];
}

/* peek copies n bytes at addr without faulting (the PC of a torn
 * instruction may be anywhere, unmapped included); returns bytes read. */
static long peek(void *dst, unsigned long addr, unsigned long n) {
	struct iovec local = {dst, n}, remote = {(void *)addr, n};
	return process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
}

/* siteof names the site whose function the PC is in, or whose call pushed
 * ret; -1 if none. */
static int siteof(unsigned long pc, unsigned long ret) {
	char *sites[NSITES] = {stress_site0, stress_site1, stress_site2, stress_site3, stress_site4};
	for (int k = 0; k < NSITES; k++) {
		unsigned long a = (unsigned long)sites[k];
		if ((pc >= a - 64 && pc < a + 16) || ret == a + 5)
			return k;
	}
	return -1;
}

static void on_fault(int sig, siginfo_t *si, void *ucv) {
	ucontext_t *uc = ucv;
	char buf[256], *p = buf;
	unsigned char code[16];
	unsigned long pc = (unsigned long)uc->uc_mcontext.gregs[REG_RIP];
	unsigned long sp = (unsigned long)uc->uc_mcontext.gregs[REG_RSP];
	unsigned long ret = 0;
	int save = errno;
	__atomic_fetch_add(&stress_torn, 1, __ATOMIC_RELAXED);
	if (peek(&ret, sp, sizeof ret) != sizeof ret)
		ret = 0;
	long got = peek(code, pc, sizeof code);
	if (got < 0)
		got = 0;
	put(&p, "torn sig=");
	putdec(&p, (unsigned long)sig);
	put(&p, " pc=0x");
	puthex(&p, pc);
	put(&p, " addr=0x");
	puthex(&p, (unsigned long)si->si_addr);
	put(&p, " ret=0x");
	puthex(&p, ret);
	put(&p, " site=");
	int k = siteof(pc, ret);
	if (k < 0)
		put(&p, "-");
	else
		putdec(&p, (unsigned long)k);
	put(&p, " code=");
	for (int i = 0; i < 16; i++) {
		if (i)
			*p++ = ' ';
		if (i < got) {
			*p++ = "0123456789abcdef"[code[i] >> 4];
			*p++ = "0123456789abcdef"[code[i] & 15];
		} else
			put(&p, "??");
	}
	put(&p, "\n");
	write(2, buf, p - buf);
	errno = save;
	if (!self)
		_exit(4);
	siglongjmp(self->jb, 1);
}

static void run(struct exec_state *st, unsigned long limit) {
	self = st;
	sigsetjmp(st->jb, 1);
	while (!atomic_load_explicit(&stop_flag, memory_order_relaxed) && (!limit || st->iters < limit)) {
		unsigned long s = stress_fn0() + stress_fn1() + stress_fn2() + stress_fn3() + stress_fn4();
		if (s != 10)
			__atomic_fetch_add(&stress_bad, 1, __ATOMIC_RELAXED);
		st->sum += s;
		st->iters++;
		if (st->id >= 0)
			stress_progress[st->id] = st->iters;
	}
	if (st->sum != st->iters * 10)
		__atomic_store_n(&bad, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&stress_iters, st->iters, __ATOMIC_RELAXED);
}

static void *executor(void *arg) {
	struct exec_state *st = arg;
	atomic_fetch_add(&running, 1);
	run(st, 0);
	return NULL;
}

static void *shortlived(void *arg) {
	struct exec_state st = {.id = -1};
	(void)arg;
	run(&st, 2000);
	return NULL;
}

static void *churn(void *arg) {
	(void)arg;
	atomic_fetch_add(&running, 1);
	while (!atomic_load(&stop_flag)) {
		pthread_t t;
		if (pthread_create(&t, NULL, shortlived, NULL) == 0)
			pthread_join(t, NULL);
	}
	return NULL;
}

static unsigned long forks, childdied, childbad;
static int lastsig, lastvfork, vforkhold, vfork2;

static int child_sites(int loops) {
	int sigs[] = {SIGILL, SIGSEGV, SIGBUS, SIGTRAP, SIGFPE};
	for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
		signal(sigs[i], SIG_DFL);
	self = NULL;
	for (int i = 0; i < loops; i++)
		if (stress_fn0() + stress_fn1() + stress_fn2() + stress_fn3() + stress_fn4() != 10)
			return 5;
	return 0;
}

/* The hold children run until stop_flag, which a killed parent never
 * sets: they die with their parent instead (a test binary killed outright
 * kills this program by its parent-death signal; the children would spin
 * on, orphaned). parent: the pid the child's parent had before the fork. */
static pid_t mypid; /* our pid, the forker's children's parent */

static void die_with(pid_t parent) {
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(9); /* the parent died before the prctl */
}

static void *forker(void *arg) {
	(void)arg;
	mypid = getpid();
	atomic_fetch_add(&running, 1);
	while (!atomic_load(&stop_flag)) {
		int isv = forks % 4 == 3 || vforkhold;
		pid_t c = isv ? vfork() : fork();
		if (c == 0 && vforkhold)
			die_with(mypid);
		if (c == 0 && vfork2) {
			/* A vfork child that vforks: its child runs the sites as
			 * below while it sits blocked in vfork. */
			pid_t mid = getpid();
			pid_t g = vfork();
			if (g == 0) {
				die_with(mid);
				int r = 0;
				atomic_fetch_add(&running, 1);
				while (!r && !atomic_load(&stop_flag))
					r = child_sites(1);
				_exit(r);
			}
			int gs = 0;
			if (g < 0)
				_exit(6);
			while (waitpid(g, &gs, 0) < 0 && errno == EINTR)
				;
			if (WIFSIGNALED(gs)) {
				signal(WTERMSIG(gs), SIG_DFL);
				raise(WTERMSIG(gs));
			}
			_exit(WEXITSTATUS(gs));
		}
		if (c == 0 && vforkhold) {
			/* Shares our memory: sees stop_flag, so it runs the sites
			 * for the whole run, from before "ready" to "stop". */
			int r = 0;
			atomic_fetch_add(&running, 1); /* "ready" waits for it */
			while (!r && !atomic_load(&stop_flag))
				r = child_sites(1);
			_exit(r);
		}
		if (c == 0)
			_exit(child_sites(200));
		if (c < 0)
			continue;
		forks++;
		int ws;
		while (waitpid(c, &ws, 0) < 0 && errno == EINTR)
			;
		if (WIFSIGNALED(ws)) {
			childdied++;
			lastsig = WTERMSIG(ws);
			lastvfork = isv;
		} else if (WEXITSTATUS(ws) != 0)
			childbad++;
	}
	return NULL;
}

int main(int argc, char **argv) {
	int n = argc > 1 ? atoi(argv[1]) : 4;
	int withchurn = argc > 2 && strcmp(argv[2], "churn") == 0;
	vfork2 = argc > 2 && strcmp(argv[2], "vfork2hold") == 0;
	vforkhold = vfork2 || (argc > 2 && strcmp(argv[2], "vforkhold") == 0);
	int withfork = vforkhold || (argc > 2 && strcmp(argv[2], "fork") == 0);
	if (n < 1 || n > MAXEXEC)
		n = 4;
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_fault;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	int sigs[] = {SIGILL, SIGSEGV, SIGBUS, SIGTRAP, SIGFPE};
	for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
		sigaction(sigs[i], &sa, NULL);

	static struct exec_state st[MAXEXEC];
	pthread_t th[MAXEXEC + 1];
	for (int i = 0; i < n; i++) {
		st[i].id = i;
		pthread_create(&th[i], NULL, executor, &st[i]);
	}
	if (withchurn)
		pthread_create(&th[n], NULL, churn, NULL);
	if (withfork) {
		pthread_create(&th[n], NULL, forker, NULL);
		withchurn = 1; /* one more thread to join */
	}
	while (atomic_load(&running) < n + withchurn + vforkhold)
		sched_yield();
	printf("ready %d\n", getpid());
	fflush(stdout);

	char buf[256];
	unsigned long eintr = 0;
	for (;;) {
		ssize_t r = read(0, buf, sizeof buf - 1);
		if (r < 0 && errno == EINTR) {
			eintr++;
			continue;
		}
		if (r <= 0)
			break;
		buf[r] = 0;
		if (strstr(buf, "stop"))
			break;
	}
	atomic_store(&stop_flag, 1);
	for (int i = 0; i < n + withchurn; i++)
		pthread_join(th[i], NULL);
	int ok = !bad && stress_torn == 0 && stress_bad == 0 && childdied == 0 && childbad == 0;
	char forkinfo[128] = "";
	if (withfork)
		snprintf(forkinfo, sizeof forkinfo, " forks=%lu childdied=%lu childbad=%lu lastsig=%d lastvfork=%d", forks, childdied, childbad, lastsig, lastvfork);
	printf("done iters=%lu torn=%lu eintr=%lu hits=%lu,%lu,%lu,%lu,%lu bad=%lu%s result=%s\n", stress_iters, stress_torn, eintr,
	       stress_hits[0], stress_hits[1], stress_hits[2], stress_hits[3], stress_hits[4], stress_bad, forkinfo, ok ? "ok" : "BAD");
	fflush(stdout);
	return ok ? 0 : 3;
}
