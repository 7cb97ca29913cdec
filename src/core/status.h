/* Status codes and error messages: how every fallible function reports what went wrong.
 * A fallible function returns ch_status and, on failure, writes one line into a caller-owned ch_err.
 * Only main() turns a status into an exit code. */
#ifndef CH_STATUS_H
#define CH_STATUS_H

#include "cohort.h"

/* Fill err (may be NULL) with a printf-style message and return st. */
ch_status ch_fail(ch_err *err, ch_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* System failure: names the call site. Use through CH_SYS_FAIL. */
#define CH_SYS_FAIL(err, what) \
    ch_fail((err), CH_STATUS_SYSTEM, "%s failed (%s:%d)", (what), __FILE__, __LINE__)

/* Allocation check: returns CH_STATUS_SYSTEM from the enclosing function when p is NULL. */
#define CH_CHECK_ALLOC(err, p) \
    do { if (!(p)) return CH_SYS_FAIL((err), "allocation of " #p); } while (0)

/* Propagate a failed status. */
#define CH_TRY(expr) \
    do { ch_status ch_try_st_ = (expr); if (ch_try_st_ != CH_STATUS_OK) return ch_try_st_; } while (0)

/* A broken invariant: stays on in release builds. */
#define CH_ASSERT(cond) \
    do { if (!(cond)) ch_assert_fail(#cond, __FILE__, __LINE__); } while (0)
_Noreturn void ch_assert_fail(const char *cond, const char *file, int line);

#endif
