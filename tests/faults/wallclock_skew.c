/* A wall clock that is off: CLOCK_REALTIME (and gettimeofday, time) read
 * TIDEMQ_CLOCK_SKEW_MS milliseconds ahead (negative: behind) of the machine's.
 * Monotonic clocks are left alone, as on a machine whose clock is merely set wrong. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long long skew_ms(void) {
    const char *s = getenv("TIDEMQ_CLOCK_SKEW_MS");
    return s ? atoll(s) : 0;
}

static void shift(struct timespec *ts, long long ms) {
    long long ns = (long long)ts->tv_nsec + (ms % 1000) * 1000000LL;
    ts->tv_sec += ms / 1000 + ns / 1000000000LL;
    ns %= 1000000000LL;
    if (ns < 0) {
        ns += 1000000000LL;
        ts->tv_sec -= 1;
    }
    ts->tv_nsec = ns;
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real(clk, ts);
    if (rc == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) shift(ts, skew_ms());
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    (void)tz;
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
