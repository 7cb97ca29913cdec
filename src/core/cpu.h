/* CPU placement for replica threads (the public ch_cpu_count/ch_cpu_describe are in cohort.h). */
#ifndef CH_CORE_CPU_H
#define CH_CORE_CPU_H

#include <stdbool.h>

#include "core/status.h"

/* The CPU's maker as CPUID names it ("GenuineIntel", "AuthenticAMD"), NUL-terminated; false (and
 * "") where CPUID does not answer. */
bool ch_cpu_vendor(char vendor[13]);
/* The CPUs this process may run on, in increasing order: writes up to max ids, returns how many
 * there are (0 when the affinity mask cannot be read). */
int ch_cpu_allowed(int *cpus, int max);
/* Restrict the calling thread (and the threads it creates later, such as its OpenMP team) to the
 * given CPUs. */
ch_status ch_cpu_pin_self(const int *cpus, int n, ch_err *err);

#endif
