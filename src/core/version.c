/* The library's version string. */
#include "cohort.h"

const char *ch_version(void) { return CH_VERSION; }
