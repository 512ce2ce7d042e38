/*
 * Synthetic BSP application in C: the same program, options, output and --report file as bsp.py, whose
 * docstring is the full description. Each iteration burns a fixed amount of CPU time, measured on this
 * thread's CPU clock (so that a rank that is preempted or stopped by a scheduler still does exactly the
 * requested work), then communicates: a ring of MPI_Sendrecv (right, then left), an MPI_Allreduce of one
 * double, an MPI_Barrier, or nothing. Every message is checked; rank 0 prints
 *   bsp: OK iterations=N ranks=P wall=X.XXXs granularity=G imbalance=F pattern=P
 * or "bsp: WRONG ..." (exit code 1 on every rank). Bad options exit with code 2 before MPI_Init.
 *
 * Build: mpicc -O2 -o bsp bsp.c -lm
 */
#include <mpi.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WARMUP 3
#define CHECK_EVERY 30e-6 /* CPU seconds of work between two reads of the CPU clock */
#define HEADER 8          /* ring message header: uint32 sender rank, uint32 iteration << 1 | flag */

enum pattern { RING, ALLREDUCE, BARRIER, NONE };
static const char *const PATTERNS[] = {"ring", "allreduce", "barrier", "none"};

struct options {
    double granularity, imbalance, seconds; /* seconds < 0: run --iterations */
    const char *slow, *report;
    int pattern;
    long message_bytes, iterations;
};

struct result { /* one rank's report line; gathered to rank 0 as bytes */
    double wall, cpu, comm, computed_per_iteration, target;
    int64_t rank, size, iterations, slow, errors;
    uint64_t checksum;
};

static const char OPTION_NAMES[] = " --granularity --imbalance --slow --pattern --message-bytes --iterations "
                                   "--seconds --report ";
static const char USAGE[] =
    "usage: bsp [-h] [--granularity T] [--imbalance F] [--slow WHICH] [--pattern P]\n"
    "           [--message-bytes N] [--iterations N | --seconds S] [--report PATH]\n";

static void usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs(USAGE, stderr);
    fputs("bsp: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

/* Seconds with an optional unit: 0.001, 5e-3, 1ms, 100us, 2s. Returns -1 if invalid. */
static double parse_duration(const char *text)
{
    size_t n = strspn(text, "0123456789.eE+-");
    const char *unit = text + n;
    double scale = !strcmp(unit, "") || !strcmp(unit, "s") ? 1.0 : !strcmp(unit, "ms") ? 1e-3
                   : !strcmp(unit, "us")                    ? 1e-6 : -1.0;
    char number[64], *end;
    if (n == 0 || n >= sizeof number || scale < 0)
        return -1;
    memcpy(number, text, n);
    number[n] = '\0';
    double value = strtod(number, &end) * scale;
    return *end == '\0' && isfinite(value) && value >= 0 ? value : -1;
}

static double parse_factor(const char *text)
{
    char *end;
    double value = strtod(text, &end);
    return end != text && *end == '\0' && isfinite(value) && value >= 0 ? value : -1;
}

static long parse_count(const char *text)
{
    char *end;
    long value = strtol(text, &end, 10);
    return !text[strspn(text, "+0123456789")] && !*end && value >= 1 && value < (1L << 30) ? value : -1;
}

/* Whether `rank` is slow (1 or 0); -1 (and *bad set) if the list names a rank >= size; -2 if invalid. */
static int is_slow(const char *spec, int rank, int size, long *bad)
{
    if (!strcmp(spec, "odd") || !strcmp(spec, "even"))
        return rank % 2 == (spec[0] == 'o');
    if (!strcmp(spec, "none") || !strcmp(spec, "all"))
        return spec[0] == 'a';
    if (!strcmp(spec, "first-half") || !strcmp(spec, "second-half"))
        return (rank < size / 2) == (spec[0] == 'f');
    int slow = 0;
    *bad = -1;
    for (const char *p = spec;; p++) { /* a comma list of ranks such as 0,3 */
        char *end;
        if (strspn(p, "0123456789") == 0)
            return -2;
        long r = strtol(p, &end, 10);
        slow |= r == rank;
        if (r >= size && r > *bad)
            *bad = r;
        if (*end != ',')
            return *end ? -2 : *bad >= 0 ? -1 : slow;
        p = end;
    }
}

static struct options parse_options(int argc, char **argv)
{
    struct options o = {0.001, 1.0, -1.0, "odd", NULL, RING, 8, 1000};
    int iterations_given = 0;
    long bad;
    for (int i = 1; i < argc; i++) {
        char name[64];
        const char *arg = argv[i], *eq = strchr(arg, '='), *value;
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            fputs(USAGE, stdout);
            puts("\nA synthetic BSP application: see the docstring of storm/tools/apps/bsp.py.");
            exit(0);
        }
        size_t len = eq ? (size_t) (eq - arg) : strlen(arg);
        snprintf(name, sizeof name, " %.*s ", (int) len, arg); /* the option's name, as in OPTION_NAMES */
        if (len + 3 > sizeof name || strncmp(arg, "--", 2) != 0 || !strstr(OPTION_NAMES, name))
            usage_error("unrecognized arguments: %s", arg);
        name[len + 1] = '\0';
        const char *opt = name + 1;
        if (eq)
            value = eq + 1;
        else if (i + 1 < argc)
            value = argv[++i];
        else
            usage_error("argument %s: expected one argument", opt);
        if (!strcmp(opt, "--granularity")) {
            if ((o.granularity = parse_duration(value)) < 0)
                usage_error("argument --granularity: '%s' is not a duration >= 0 (such as 0.001, 1ms, "
                            "100us, 2s)", value);
        } else if (!strcmp(opt, "--imbalance")) {
            if ((o.imbalance = parse_factor(value)) < 0)
                usage_error("argument --imbalance: '%s' is not a number >= 0", value);
        } else if (!strcmp(opt, "--slow")) {
            if (is_slow(o.slow = value, 0, INT_MAX, &bad) == -2)
                usage_error("argument --slow: '%s' is not one of odd, even, none, all, first-half, "
                            "second-half or a list like 0,3", value);
        } else if (!strcmp(opt, "--pattern")) {
            o.pattern = -1;
            for (int p = RING; p <= NONE; p++)
                if (!strcmp(value, PATTERNS[p]))
                    o.pattern = p;
            if (o.pattern < 0)
                usage_error("argument --pattern: invalid choice: '%s' (choose from 'ring', 'allreduce', "
                            "'barrier', 'none')", value);
        } else if (!strcmp(opt, "--message-bytes")) {
            if ((o.message_bytes = parse_count(value)) < 0)
                usage_error("argument --message-bytes: '%s' is not an integer >= 1 (and < 2**30)", value);
            if (o.message_bytes < HEADER)
                usage_error("argument --message-bytes: must be at least %d", HEADER);
        } else if (!strcmp(opt, "--iterations")) {
            if ((o.iterations = parse_count(value)) < 0)
                usage_error("argument --iterations: '%s' is not an integer >= 1 (and < 2**30)", value);
            iterations_given = 1;
        } else if (!strcmp(opt, "--seconds")) {
            if ((o.seconds = parse_duration(value)) < 0)
                usage_error("argument --seconds: '%s' is not a duration >= 0 (such as 0.001, 1ms, 100us, 2s)",
                            value);
            if (o.seconds == 0)
                usage_error("argument --seconds: must be > 0");
        } else {
            o.report = value;
        }
    }
    if (iterations_given && o.seconds > 0)
        usage_error("argument --iterations: not allowed with argument --seconds");
    return o;
}

static double clock_seconds(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (double) t.tv_sec + (double) t.tv_nsec * 1e-9;
}

static double now(void) { return clock_seconds(CLOCK_MONOTONIC); }
static double thread_cpu(void) { return clock_seconds(CLOCK_THREAD_CPUTIME_ID); }
static uint64_t sink; /* keeps the busy loop's result alive */
static double rate;   /* steps of the busy loop per CPU second */
static long chunk;    /* steps between two clock reads */

static void spin(long n)
{
    uint64_t x = sink;
    for (long i = 0; i < n; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        __asm__ volatile("" : "+r"(x)); /* one real multiply-add per step: nothing to optimize away */
    }
    sink = x;
}

static void calibrate(void)
{
    for (long n = 1000;; n *= 2) {
        double start = thread_cpu();
        spin(n);
        double elapsed = thread_cpu() - start;
        if (elapsed >= 0.005) {
            rate = (double) n / elapsed;
            chunk = (long) fmax(1.0, rate * CHECK_EVERY);
            return;
        }
    }
}

/* Run until this thread's CPU clock has advanced by `target`; return how far it advanced. */
static double burn(double target)
{
    double start = thread_cpu(), t = start, end = start + target;
    while (t < end) {
        long n = (long) ((end - t) * rate) + 1; /* the last stretch is sized to what remains */
        spin(n < chunk ? n : chunk);
        t = thread_cpu();
    }
    return t - start;
}

static unsigned char fill(int rank) { return (unsigned char) ((rank * 37 + 11) & 0xFF); }

struct state { /* what exchange() needs and what it counts */
    int rank, size, left, right, pattern;
    long nbytes;
    unsigned char *send, *from_left, *from_right;
    int64_t errors;
    uint64_t checksum;
    double comm; /* wall seconds inside MPI calls */
};

/* One iteration's communication, checked; returns whether a stop flag arrived. */
static int exchange(struct state *s, long it, int flag)
{
    double t0 = now();
    int seen = 0;
    if (s->pattern == RING) {
        uint32_t header[2] = {(uint32_t) s->rank, (uint32_t) it << 1 | (uint32_t) flag};
        memcpy(s->send, header, HEADER);
        MPI_Sendrecv(s->send, (int) s->nbytes, MPI_BYTE, s->right, 0, s->from_left, (int) s->nbytes, MPI_BYTE,
                     s->left, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Sendrecv(s->send, (int) s->nbytes, MPI_BYTE, s->left, 1, s->from_right, (int) s->nbytes, MPI_BYTE,
                     s->right, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        s->comm += now() - t0;
        const unsigned char *bufs[2] = {s->from_left, s->from_right};
        const int sources[2] = {s->left, s->right};
        for (int k = 0; k < 2; k++) {
            memcpy(header, bufs[k], HEADER);
            int bad = header[0] != (uint32_t) sources[k] || header[1] >> 1 != (uint32_t) it;
            for (long b = HEADER; b < s->nbytes; b++)
                bad |= bufs[k][b] != fill(sources[k]);
            s->errors += bad;
            s->checksum += header[0] + (header[1] >> 1);
            seen |= header[1] & 1;
        }
    } else if (s->pattern == ALLREDUCE) {
        double value = s->rank + 1 + (double) it + (flag ? 0.5 : 0.0), total; /* the flag travels as a half */
        MPI_Allreduce(&value, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        s->comm += now() - t0;
        seen = fmod(total, 1.0) == 0.5;
        int64_t result = (int64_t) total;
        s->errors += result != (int64_t) s->size * (s->size + 1) / 2 + (int64_t) s->size * it;
        s->checksum += (uint64_t) result;
    } else if (s->pattern == BARRIER) {
        MPI_Barrier(MPI_COMM_WORLD);
        s->comm += now() - t0;
    }
    return seen;
}

static struct result run(const struct options *o, int rank, int size, int slow)
{
    struct state s = {.rank = rank, .size = size, .left = (rank - 1 + size) % size, .right = (rank + 1) % size,
                      .pattern = o->pattern, .nbytes = o->message_bytes};
    if (s.pattern == RING && size == 1)
        s.pattern = NONE;
    if (s.pattern == BARRIER && o->seconds > 0)
        s.pattern = ALLREDUCE; /* a barrier that carries rank 0's decision to stop */
    if (!(s.send = calloc(3, (size_t) s.nbytes))) {
        fprintf(stderr, "bsp: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    s.from_left = s.send + s.nbytes;
    s.from_right = s.send + 2 * s.nbytes;
    memset(s.send, fill(rank), (size_t) s.nbytes);
    double target = o->granularity * (slow ? o->imbalance : 1.0);
    calibrate();
    for (long it = 0; it < WARMUP; it++)
        exchange(&s, it, 0);
    s.errors = 0, s.checksum = 0, s.comm = 0.0;
    MPI_Barrier(MPI_COMM_WORLD);

    int decides = s.pattern == NONE || rank == 0;
    long distance = rank < size - rank ? rank : size - rank, farthest = size / 2;
    long stop_at = -1; /* with --seconds: the last iteration, once known */
    double computed = 0.0, wall0 = now(), cpu0 = clock_seconds(CLOCK_PROCESS_CPUTIME_ID);
    double deadline = o->seconds > 0 ? wall0 + o->seconds : -1;
    long it = 0;
    for (;;) {
        computed += burn(target);
        if (deadline >= 0 && stop_at < 0 && decides && now() >= deadline)
            stop_at = s.pattern == RING ? it + farthest - 1 : it;
        if (exchange(&s, it, stop_at >= 0) && stop_at < 0)
            /* Ring: the flag moves one hop per iteration, so it reaches this rank `distance - 1`
             * iterations after rank 0 set it; everyone stops `farthest - 1` iterations after that. */
            stop_at = s.pattern == RING ? it - distance + farthest : it;
        it++;
        if (deadline < 0 ? it == o->iterations : stop_at >= 0 && it > stop_at)
            break;
    }
    struct result r = {now() - wall0, clock_seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0, s.comm,
                       computed / (double) it, target, rank, size, it, slow, s.errors,
                       o->pattern == RING || o->pattern == ALLREDUCE ? s.checksum : (uint64_t) it};
    free(s.send);
    return r;
}

/* A number as Python's json writes round(x, 9): fixed point, trailing zeros dropped, at least "x.0". */
static const char *num(char *buf, size_t len, double x)
{
    snprintf(buf, len, "%.9f", x);
    char *end = buf + strlen(buf) - 1;
    while (*end == '0' && end[-1] != '.')
        *end-- = '\0';
    return buf;
}

static int write_report(const char *path, const struct result *all, int size)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    for (const struct result *r = all; r < all + size; r++) {
        char a[40], b[40], c[40], d[40], e[40];
        fprintf(f,
                "{\"rank\": %lld, \"size\": %lld, \"iterations\": %lld, \"wall_seconds\": %s, "
                "\"cpu_seconds\": %s, \"comm_seconds\": %s, \"compute_cpu_per_iteration\": %s, "
                "\"target_cpu_per_iteration\": %s, \"slow\": %s, \"checksum\": %llu, \"errors\": %lld}\n",
                (long long) r->rank, (long long) r->size, (long long) r->iterations, num(a, 40, r->wall),
                num(b, 40, r->cpu), num(c, 40, r->comm), num(d, 40, r->computed_per_iteration),
                num(e, 40, r->target), r->slow ? "true" : "false", (unsigned long long) r->checksum,
                (long long) r->errors);
    }
    int failed = ferror(f);
    return fclose(f) == 0 && !failed ? 0 : -1;
}

int main(int argc, char **argv)
{
    struct options o = parse_options(argc, argv); /* before MPI_Init: every rank fails alike */
    int rank, size;
    long bad = -1;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int slow = is_slow(o.slow, rank, size, &bad);
    if (slow < 0) {
        if (rank == 0)
            fprintf(stderr, "bsp: error: --slow names rank %ld but there are only %d ranks\n", bad, size);
        MPI_Finalize();
        return 2;
    }
    struct result mine = run(&o, rank, size, slow), *all = NULL;
    if (rank == 0 && !(all = malloc((size_t) size * sizeof *all))) {
        fprintf(stderr, "bsp: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Gather(&mine, sizeof mine, MPI_BYTE, all, sizeof mine, MPI_BYTE, 0, MPI_COMM_WORLD);
    int status = 0;
    if (rank == 0) {
        int64_t errors = 0;
        double wall = 0.0;
        for (int i = 0; i < size; i++) {
            errors += all[i].errors;
            wall = all[i].wall > wall ? all[i].wall : wall;
        }
        status = errors != 0;
        if (o.report && write_report(o.report, all, size) != 0) {
            perror("bsp: cannot write the report");
            status = 1;
        }
        char extra[40] = "";
        if (errors)
            snprintf(extra, sizeof extra, " errors=%lld", (long long) errors);
        printf("bsp: %s iterations=%lld ranks=%d wall=%.3fs granularity=%g imbalance=%g pattern=%s%s\n",
               errors ? "WRONG" : "OK", (long long) mine.iterations, size, wall, o.granularity, o.imbalance,
               PATTERNS[o.pattern], extra);
        fflush(stdout);
        free(all);
    }
    MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return status;
}
