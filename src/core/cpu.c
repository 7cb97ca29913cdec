/* What machine we run on: core count and a CPU description for `cohort info`. */
#define _GNU_SOURCE
#include <cpuid.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cohort.h"
#include "core/cpu.h"

int ch_cpu_count(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

bool ch_cpu_vendor(char vendor[13])
{
    unsigned a, b, c, d;
    memset(vendor, 0, 13);
    if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
    memcpy(vendor, &b, 4);
    memcpy(vendor + 4, &d, 4);
    memcpy(vendor + 8, &c, 4);
    return true;
}

void ch_cpu_describe(char *buf, size_t len)
{
    unsigned a = 0, b = 0, c = 0, d = 0;
    char vendor[13];
    if (!ch_cpu_vendor(vendor)) {
        snprintf(buf, len, "unknown CPU");
        return;
    }
    __get_cpuid(1, &a, &b, &c, &d);
    const unsigned family = ((a >> 8) & 0xf) + (((a >> 8) & 0xf) == 0xf ? (a >> 20) & 0xff : 0);
    const unsigned model = ((a >> 4) & 0xf) | (((a >> 16) & 0xf) << 4);
    const char *isa = (c & bit_AVX) ? "AVX" : "SSE";
    unsigned a7, b7, c7, d7;
    if (__get_cpuid_count(7, 0, &a7, &b7, &c7, &d7)) {
        if (b7 & bit_AVX2) isa = "AVX2";
        if (b7 & bit_AVX512F) isa = "AVX-512";
    }
    snprintf(buf, len, "%s family %u model %u, %s, %d cores available", vendor, family, model,
             isa, ch_cpu_count());
}

int ch_cpu_allowed(int *cpus, int max)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
    int n = 0;
    for (int i = 0; i < CPU_SETSIZE; i++) {
        if (!CPU_ISSET(i, &set)) continue;
        if (n < max) cpus[n] = i;
        n++;
    }
    return n;
}

ch_status ch_cpu_pin_self(const int *cpus, int n, ch_err *err)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int i = 0; i < n; i++) {
        if (cpus[i] < 0 || cpus[i] >= CPU_SETSIZE)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "cpu %d outside 0..%d", cpus[i], CPU_SETSIZE - 1);
        CPU_SET(cpus[i], &set);
    }
    /* pid 0: the calling thread only. */
    if (sched_setaffinity(0, sizeof set, &set) != 0) return CH_SYS_FAIL(err, "sched_setaffinity");
    return CH_STATUS_OK;
}
