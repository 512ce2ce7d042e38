/*
 * mpihook: storm's MPI monitoring layer, a PMPI library that storm-nm loads into every rank with LD_PRELOAD
 * (compiled C programs and mpi4py alike, with no relinking). For each blocking communication call it
 * publishes, in the job's shared-memory segment (record.h), what FCS needs (paper, sections 2.3 and 2.6):
 * the number of blocking calls and of communication events, and the wall time spent in them; and it waits
 * the way storm-nm asks: busy polling, as MPICH does, or spin-block (spin for spin_ns, then stop using the
 * CPU until the call can complete), switching a waiting call from one to the other when storm-nm says so.
 *
 * This file: finding the MPI library, mapping the segment, publishing, blocking, MPI_Init/MPI_Finalize.
 * p2p.c wraps point-to-point calls and waits, coll.c the blocking collectives; hook.h says how a wrapper
 * works.
 *
 * Built by setuptools as the extension module storm.mpihook._hook (pyproject.toml) only to get a shared
 * library installed with the package: it is never imported by Python and uses no Python API.
 *
 * Environment (set by storm-nm in the ranks' environment only):
 *   STORM_HOOK_SEGMENT  shm_open name of the job's segment, e.g. /storm-hook-12-0-ab12cd
 *   STORM_HOOK_INDEX    this rank's record in it
 *   STORM_HOOK_GAP_NS   optional: the event gap (below), in nanoseconds
 * Without them, or with a segment that is missing or not of this version, every call passes straight
 * through without statistics.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "hook.h"

/*
 * Communication events (C_comm in the paper): "multiple communication events with no intervening
 * computation are considered to be a single communication event". A blocking call starts a new event when
 * more than STORM_HOOK_GAP_NS passed since the previous one returned. Wall time rather than CPU time because
 * a CPU clock read costs ~1.1 us against ~20 ns. The default, 200 us, sits above the time a program needs
 * between two back-to-back calls and well below the granularities FCS tells apart (CS below 2 ms; the
 * paper's own resolution was 2/HZ, ~0.5 ms at HZ=4096). Measured in bsp.py (mpi4py, 2 700 pairs of
 * back-to-back Sendrecv, polling and spin-blocking): median 1.2 us, p99 33 us, p99.9 62 us, max 103 us; the
 * slow ones come right after a rank wakes from a blocked wait, its caches cold (50 us split ~0.5% of the
 * events in two). In C: under 1 us. Computation shorter than the gap merges two events into one, as it did in
 * the paper where the OS could not register it; a preemption between two back-to-back calls can still split
 * one event in two.
 */
#define DEFAULT_GAP_NS 200000u

/*
 * Spin-block, past the spin phase: sleep between completion tests, starting at 20 us and doubling up to
 * 500 us. The added latency is thus never more than the time already spent blocked (plus the kernel's
 * 50 us default timer slack), and never more than ~0.55 ms: 0.5% of FCS's 100 ms time slice (measured:
 * +100 us on average for a 1 ms wait, +250-400 us for longer ones). A wake-up and its test cost ~15-20 us of
 * CPU on this VM (timer, context switch, an MPICH progress poll), so a long wait uses ~3-4% of a CPU at
 * 500 us; at 200 us it was ~8%.
 */
#define SLEEP_MIN_NS 20000u
#define SLEEP_MAX_NS 500000u
#define AWAKE_NS 10000u /* sched_yield below */
/* A gap in MPICH's wait loop this long is a stop by storm-nm (a time slice, 100 ms by default), not the
 * kernel running another process for a while. */
#define STOP_GAP_NS 20000000u

struct storm_state storm;
__thread struct storm_call *storm_current;
__thread int storm_depth;

static const char *const real_names[FN_COUNT] = {
#define STORM_NAME(name) "PMPI_" #name,
    STORM_REAL_FUNCTIONS(STORM_NAME)
#undef STORM_NAME
};

/* ------------------------------------------------------------------------------------ the MPI library */

/*
 * An MPICH-ABI library already loaded by the program. RTLD_NOLOAD finds it even when it was loaded with
 * RTLD_LOCAL (mpi4py's extension module pulls it in that way) and never loads an MPI into a program that
 * has none. Open MPI 1.10 also used the soname libmpi.so.12: its ompi_mpi_comm_world tells it apart.
 */
static void *find_mpich(void)
{
    static const char *const sonames[] = {"libmpi.so.12", "libmpich.so.12"};
    for (size_t i = 0; i < sizeof sonames / sizeof *sonames; i++) {
        void *lib = dlopen(sonames[i], RTLD_NOW | RTLD_NOLOAD);
        if (!lib)
            continue;
        if (dlsym(lib, "PMPI_Init") && !dlsym(lib, "ompi_mpi_comm_world"))
            return lib; /* kept open: the hook's pointers into it must stay valid */
        dlclose(lib);
    }
    return NULL;
}

struct loaded {
    const char *names[512];
    size_t count;
};

static int collect_name(struct dl_phdr_info *info, size_t size, void *data)
{
    struct loaded *loaded = data;
    (void) size;
    if (info->dlpi_name && info->dlpi_name[0] && loaded->count < sizeof loaded->names / sizeof *loaded->names)
        loaded->names[loaded->count++] = info->dlpi_name;
    return 0;
}

/* Any loaded library that defines PMPI_Init: another MPI loaded with RTLD_LOCAL, out of RTLD_NEXT's reach. */
static void *find_any_mpi(void)
{
    struct loaded loaded = {.count = 0};
    dl_iterate_phdr(collect_name, &loaded); /* no dlopen inside the callback: it holds the loader's lock */
    for (size_t i = 0; i < loaded.count; i++) {
        void *lib = dlopen(loaded.names[i], RTLD_LAZY | RTLD_NOLOAD);
        if (lib && dlsym(lib, "PMPI_Init"))
            return lib;
        if (lib)
            dlclose(lib);
    }
    return NULL;
}

static void resolve(void)
{
    void *lib = find_mpich();
    storm.abi = lib ? ABI_MPICH : ABI_FOREIGN;
    if (!lib && !dlsym(RTLD_NEXT, "PMPI_Init"))
        lib = find_any_mpi();
    for (int i = 0; i < FN_COUNT; i++)
        storm.fn[i] = dlsym(lib ? lib : RTLD_NEXT, real_names[i]);
}

int storm_missing(enum storm_fn_id id)
{
    static char reported[FN_COUNT];
    if (!reported[id]) {
        reported[id] = 1;
        fprintf(stderr, "storm mpihook: %s is not in this process's MPI library\n", real_names[id]);
    }
    return SM_ERR_UNSUPPORTED_OPERATION;
}

/* ------------------------------------------------------------------------------------------ the segment */

static int parse_u32(const char *text, uint32_t *value)
{
    char *end;
    if (!text || !*text || text[0] == '-' || text[0] == '+')
        return -1;
    errno = 0;
    unsigned long v = strtoul(text, &end, 10);
    if (errno || *end || v > UINT32_MAX)
        return -1;
    *value = (uint32_t) v;
    return 0;
}

/* This rank's record, or NULL (and why in *why) if the environment names no usable segment. */
static struct storm_hook_record *map_record(const char **why)
{
    const char *name = getenv("STORM_HOOK_SEGMENT");
    uint32_t index;
    *why = NULL;
    if (!name)
        return NULL;
    if (parse_u32(getenv("STORM_HOOK_INDEX"), &index) != 0) {
        *why = "STORM_HOOK_INDEX is missing or not a number";
        return NULL;
    }
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        *why = strerror(errno);
        return NULL;
    }
    struct stat st;
    void *map = MAP_FAILED;
    if (fstat(fd, &st) == 0 && (size_t) st.st_size >= sizeof(struct storm_hook_header))
        map = mmap(NULL, (size_t) st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        *why = "cannot map it";
        return NULL;
    }
    const struct storm_hook_header *header = map;
    size_t needed = sizeof *header + (size_t) header->nranks * sizeof(struct storm_hook_record);
    if (header->magic != STORM_HOOK_MAGIC || header->version != STORM_HOOK_VERSION ||
        header->record_size != sizeof(struct storm_hook_record) || index >= header->nranks ||
        (size_t) st.st_size < needed) {
        munmap(map, (size_t) st.st_size);
        *why = "not a storm hook segment of this version, or no record for STORM_HOOK_INDEX";
        return NULL;
    }
    return (struct storm_hook_record *) ((char *) map + sizeof *header) + index;
}

/* -------------------------------------------------------------------------------------------- publishing */

/*
 * An update as record.h prescribes: the update's new number in `seq_end` first, then the fields, then the
 * same number in `seq`, each a release store so that they become visible in that order (on x86-64 they are
 * plain stores: this only keeps the compiler from reordering them). The hook writes from its own copy and
 * never reads the record back.
 */
#define PUT(field, value) __atomic_store_n(&s->field, (value), __ATOMIC_RELEASE)

static inline struct storm_hook_stats *update_begin(void)
{
    struct storm_hook_stats *s = &storm.record->stats;
    PUT(seq_end, ++storm.seq);
    return s;
}

static inline void update_end(struct storm_hook_stats *s)
{
    PUT(seq, storm.seq);
}

static int env_rank(void)
{
    static const char *const names[] = {"PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK"};
    uint32_t rank;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (parse_u32(getenv(names[i]), &rank) == 0 && rank <= INT32_MAX)
            return (int) rank;
    return -1;
}

static void publish_identity(int rank, uint32_t flags)
{
    struct storm_hook_stats *s = update_begin();
    storm.flags |= flags;
    PUT(pid, (int32_t) getpid());
    PUT(rank, rank);
    PUT(flags, storm.flags);
    update_end(s);
}

/* The rank entered MPI: its statistics are live. */
static void storm_activate(void)
{
    int rank = -1;
    if (!storm.record || (storm.flags & STORM_HOOK_ACTIVE))
        return;
    if (storm.fn[FN_Comm_rank] && ((int (*)(hk_handle, int *)) storm.fn[FN_Comm_rank])(SM_COMM_WORLD, &rank))
        rank = -1;
    publish_identity(rank >= 0 ? rank : env_rank(), STORM_HOOK_ACTIVE);
}

void storm_publish_enter(uint64_t t0, int event, uint32_t call)
{
    if (__builtin_expect(!(storm.flags & STORM_HOOK_ACTIVE), 0))
        publish_identity(env_rank(), STORM_HOOK_ACTIVE); /* no MPI_Init seen (MPI sessions) */
    storm.calls++;
    storm.events += (uint64_t) event;
    struct storm_hook_stats *s = update_begin();
    PUT(in_call, 1);
    PUT(call, call);
    PUT(enter_ns, t0);
    PUT(calls, storm.calls);
    PUT(events, storm.events);
    update_end(s);
}

void storm_publish_exit(void)
{
    struct storm_hook_stats *s = update_begin();
    PUT(in_call, 0);
    PUT(exit_ns, storm.exit_ns);
    PUT(comm_ns, storm.comm_ns);
    PUT(spin_ns, storm.spin_ns);
    PUT(block_ns, storm.block_ns);
    update_end(s);
}

/* ------------------------------------------------------------------------------------------------ set-up */

/*
 * MPICH's shared-memory ("posix") algorithms for these collectives wait on flags in loops that never yield
 * the CPU, so a rank waiting in one cannot spin-block (measured: a rank waiting in MPI_Allreduce for a
 * stopped peer kept a CPU 100% busy in spin-block mode). With each set to "mpir" they run over
 * point-to-point messages and wait in MPICH's progress loop, which yields at every turn (2.9% of a CPU;
 * an 8-byte MPI_Allreduce between two local ranks then takes ~1.3 us instead of ~0.3 us).
 */
static const char *const yielding_collectives[] = {
    "MPIR_CVAR_BARRIER_POSIX_INTRA_ALGORITHM",    "MPIR_CVAR_BCAST_POSIX_INTRA_ALGORITHM",
    "MPIR_CVAR_REDUCE_POSIX_INTRA_ALGORITHM",     "MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM",
    "MPIR_CVAR_ALLGATHER_POSIX_INTRA_ALGORITHM",  "MPIR_CVAR_ALLGATHERV_POSIX_INTRA_ALGORITHM",
    "MPIR_CVAR_ALLTOALL_POSIX_INTRA_ALGORITHM",
};

static int collectives_yield(void)
{
    for (size_t i = 0; i < sizeof yielding_collectives / sizeof *yielding_collectives; i++) {
        const char *value = getenv(yielding_collectives[i]);
        if (!value || strcasecmp(value, "mpir") != 0)
            return 0;
    }
    return 1;
}

void storm_setup(void)
{
    const char *why;
    uint32_t gap;
    resolve();
    storm.multiple = 1; /* until MPI_Init(_thread) says otherwise: MPI sessions have no single thread level */
    storm.flags = STORM_HOOK_THREAD_MULTIPLE | (collectives_yield() ? 0 : STORM_HOOK_COLLECTIVES_POLL);
    storm.gap_ns = parse_u32(getenv("STORM_HOOK_GAP_NS"), &gap) == 0 ? gap : DEFAULT_GAP_NS;
    struct storm_hook_record *record = map_record(&why);
    if (why)
        fprintf(stderr, "storm mpihook: cannot use segment %s: %s; no statistics\n",
                getenv("STORM_HOOK_SEGMENT"), why);
    if (record) {
        /* Counters carry on from an earlier MPI program of the same rank, so that they never go back; pid
         * and flags are this process's. */
        const struct storm_hook_stats *s = &record->stats;
        storm.seq = s->seq > s->seq_end ? s->seq : s->seq_end;
        storm.calls = s->calls, storm.events = s->events, storm.comm_ns = s->comm_ns;
        storm.spin_ns = s->spin_ns, storm.block_ns = s->block_ns, storm.exit_ns = s->exit_ns;
        storm.record = record;
        if (storm.abi == ABI_FOREIGN) {
            storm.flags = 0; /* nothing of how the hook waits applies */
            publish_identity(env_rank(), STORM_HOOK_FOREIGN_MPI);
            storm.record = NULL; /* pass-through: this ABI's handles and statuses are not the hook's */
        }
    }
    storm.ready = 1;
}

/* ---------------------------------------------------------------------------------------------- blocking */

static uint64_t thread_cpu_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); /* a system call, ~1 us: only for calls that block */
    return (uint64_t) t.tv_sec * 1000000000u + (uint64_t) t.tv_nsec;
}

/*
 * Past the spin phase of a spin-block wait: sleep once (with the backoff above). Returns 0 instead if
 * storm-nm has switched the rank back to polling meanwhile: the caller then lets MPICH busy-wait.
 */
int storm_block(struct storm_call *c, uint64_t now)
{
    if (!c->block_start) {
        c->block_start = now;
        c->block_cpu = thread_cpu_ns();
        c->sleep_ns = SLEEP_MIN_NS;
    }
    if (__atomic_load_n(&storm.record->control.wait_mode, __ATOMIC_RELAXED) != STORM_WAIT_SPINBLOCK) {
        storm_block_end(c, now);
        return 0;
    }
    struct timespec t = {0, (long) c->sleep_ns};
    nanosleep(&t, NULL);
    c->sleep_ns = c->sleep_ns * 2 < SLEEP_MAX_NS ? c->sleep_ns * 2 : SLEEP_MAX_NS;
    return 1;
}

/*
 * The end of a block phase (at `now`, if it has not ended already): its block_ns, the wall time it did not
 * use the CPU, record.h says. Its wake-ups and tests do use some (~3-10% of short block phases), which
 * storm-nm would otherwise take for computation when it subtracts comm_ns - block_ns from the rank's CPU.
 */
uint64_t storm_block_end(struct storm_call *c, uint64_t now)
{
    if (!c->block_end) {
        c->block_end = now;
        c->block_cpu = thread_cpu_ns() - c->block_cpu;
    }
    uint64_t wall = c->block_end - c->block_start;
    return wall > c->block_cpu ? wall - c->block_cpu : 0;
}

/*
 * The calls that stay MPICH's own (collectives, MPI_Sendrecv_replace, every call under
 * MPI_THREAD_MULTIPLE, any call whose nonblocking form this MPI lacks) spin-block inside MPICH's wait loop,
 * which calls sched_yield() at every turn (measured: ~1 per microsecond). A polling call looks at the wait
 * mode then, so storm-nm can switch it to spin-block; past the spin phase each yield sleeps instead. After
 * a sleep MPICH polls for AWAKE_NS before the next one, since it yields more than once per turn (without
 * that window it noticed completion twice as late). Outside such a call this is sched_yield.
 */
int sched_yield(void)
{
    struct storm_call *c = storm_current;
    if (c && !c->test_loop && !c->block_end) {
        uint64_t now = storm_now();
        if ((c->spinblock || storm_turn_spinblock(c, now)) && now - c->spin_from >= c->spin_ns &&
            now >= c->awake_until && storm_block(c, now)) {
            c->awake_until = storm_now() + AWAKE_NS;
            return 0;
        }
    }
    if (!c || c->test_loop)
        return (int) syscall(SYS_sched_yield);
    uint64_t before = storm_now();
    if (!c->loop_from) {
        c->loop_from = c->last_yield = before;
        c->loop_cpu = thread_cpu_ns();
    }
    if (!c->spinblock && before - c->last_yield > STOP_GAP_NS)
        c->stopped_ns += before - c->last_yield;
    int rc = (int) syscall(SYS_sched_yield);
    c->last_yield = storm_now();
    if (!c->spinblock && c->last_yield - before > STOP_GAP_NS)
        c->stopped_ns += c->last_yield - before;
    return rc;
}

/*
 * The time a call that waited in MPICH's loop did not have the CPU, from its first yield to `now`: what the
 * yields gave other processes (under time sharing the PE's other ranks run then; counted as polling, it
 * would eat the rank's computation, since T_cpu is its CPU time less its polling: measured, a 2.2 ms-grain
 * rank sharing its PE showed T_cpu 0), its block phase, and its stops while spin-blocking. Its stops while
 * polling (gaps of STOP_GAP_NS or more) stay polling time: storm-nm takes those out itself (nm/monitor.py).
 */
uint64_t storm_loop_off_cpu(struct storm_call *c, uint64_t now)
{
    if (!c->spinblock && now - c->last_yield > STOP_GAP_NS)
        c->stopped_ns += now - c->last_yield;
    uint64_t used = thread_cpu_ns() - c->loop_cpu + c->stopped_ns;
    uint64_t wall = now - c->loop_from;
    return wall > used ? wall - used : 0;
}

/* ----------------------------------------------------------------------------------------- init, finalize */

/* MPI is up in the world model: at what thread level (MPI_Init may give MULTIPLE too, by a CVAR). */
static int initialized(int rc)
{
    int level = SM_THREAD_MULTIPLE;
    if (rc != SM_SUCCESS || storm.abi != ABI_MPICH)
        return rc;
    if (storm.fn[FN_Query_thread] && ((int (*)(int *)) storm.fn[FN_Query_thread])(&level) != SM_SUCCESS)
        level = SM_THREAD_MULTIPLE;
    storm.multiple = level == SM_THREAD_MULTIPLE;
    storm.flags &= ~STORM_HOOK_THREAD_MULTIPLE;
    storm.flags |= storm.multiple ? STORM_HOOK_THREAD_MULTIPLE : 0;
    storm_activate();
    return rc;
}

int MPI_Init(int *argc, char ***argv)
{
    if (!storm.ready)
        storm_setup();
    CHECK_REAL(Init);
    return initialized(REAL(Init)(argc, argv));
}

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided)
{
    if (!storm.ready)
        storm_setup();
    CHECK_REAL(Init_thread);
    return initialized(REAL(Init_thread)(argc, argv, required, provided));
}

/*
 * Not communication: its waiting is the end of the job. Whatever runs inside it (attribute callbacks on
 * MPI_COMM_SELF may communicate) is not counted either, and never spin-blocks.
 */
int MPI_Finalize(void)
{
    if (!storm.ready)
        storm_setup();
    CHECK_REAL(Finalize);
    storm_depth++;
    int rc = REAL(Finalize)();
    storm_depth--;
    if (storm.record && (storm.flags & STORM_HOOK_ACTIVE)) {
        struct storm_hook_stats *s = update_begin();
        storm.flags |= STORM_HOOK_FINALIZED;
        PUT(flags, storm.flags);
        update_end(s);
    }
    return rc;
}
