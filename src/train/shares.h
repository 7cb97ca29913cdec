/* The ranks' shares of a global batch (--shares). Synchronous training runs at the slowest rank's
 * pace; giving a slow machine a smaller part of every batch evens the step out. Each replica's slice
 * is still weighted by its own count, so the mean-loss gradient is the same whatever the split.
 *
 * A share is a positive whole number per rank; a device's weight is its rank's share. A batch of n
 * is cut by largest remainders over the job's replicas (ties to the lower index), so equal shares
 * give exactly the even split (the first n % R replicas one more), parts always sum to n, and every
 * rank computes the same cut from the same integers. */
#ifndef CH_TRAIN_SHARES_H
#define CH_TRAIN_SHARES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define CH_SHARES_MAX 1000000     /* largest share a user may give */
#define CH_SHARES_PROBE 20      /* auto: steps measured (after an epoch's first two) before the first re-balance */
#define CH_SHARES_UNIT 1000       /* auto's equal share; shares are kept within [UNIT/16, UNIT*16] */

typedef struct ch_shares {
    int procs, devices;     /* the job: procs ranks of devices replicas each */
    bool given;             /* --shares was set (else the even split, never changed) */
    bool automatic;         /* --shares auto: re-balanced from measured step times */
    int64_t *w;             /* procs shares (owned) */
    /* Scratch of the cut, written through a const ch_shares (the pointers are const, not what
     * they point at); the trainer cuts on its main thread only. */
    int *order;             /* procs * devices indices (owned) */
    int64_t *rem;           /* scratch: procs * devices remainders (owned) */
    /* auto's measurement since the last re-balance (which may span an epoch's end), this rank's: seconds busy and samples */
    double busy_s, samples;
    int measured;           /* steps measured */
} ch_shares;

/* Parse --shares: NULL or "" (equal), "auto", or "W0,W1,..." with one whole number in
 * 1..CH_SHARES_MAX per rank. Allocates s's arrays; ch_shares_free releases them. */
ch_status ch_shares_init(ch_shares *s, const char *text, int procs, int devices, ch_err *err);
void ch_shares_free(ch_shares *s);
/* Cut n samples over the procs * devices replicas: count[g] for replica g (g = rank * devices + d). */
void ch_shares_split(const ch_shares *s, int n, int *count);
/* The most samples one replica can get from any batch of at most B samples with the current shares
 * (with auto, with any shares: a rank may come to hold the whole batch). */
int ch_shares_max_slice(const ch_shares *s, int B);
/* True when every share is the same (the even split). */
bool ch_shares_equal(const ch_shares *s);
/* "3,1" into out. */
void ch_shares_format(const ch_shares *s, char *out, size_t len);
/* Set the shares from a checkpoint's (n values): refused (false) when n is not the rank count or a
 * value is out of range, and the shares are left alone. */
bool ch_shares_set(ch_shares *s, const int64_t *w, int n);
/* auto: new shares from every rank's measured busy seconds and samples (procs each, the same on
 * every rank): each rank's share follows its speed, scaled to a mean of CH_SHARES_UNIT and kept
 * within [UNIT/16, UNIT*16]. Returns true when a share moved by more than 5% (then they are set). */
bool ch_shares_rebalance(ch_shares *s, const double *busy_s, const double *samples);

#endif
