/* Loading the CUDA plugin (kernels/cuda/plugin.h) with dlopen: first the file COHORT_CUDA_PLUGIN
 * names, then the one beside the running program (a build folder, or a bundle from
 * scripts/bundle), then the dynamic loader's own search (LD_LIBRARY_PATH, an installed copy). Once
 * per process: the answer, plugin or reason, is kept. */
#include "kernels/cuda/plugin.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const ch_cuda_plugin *loaded;
static char why[512];

static void *open_beside_program(void)
{
    char path[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n <= 0) return NULL;
    path[n] = '\0';
    char *slash = strrchr(path, '/');
    if (!slash || (size_t)(slash - path) + 1 + sizeof CH_CUDA_PLUGIN_FILE > sizeof path) return NULL;
    strcpy(slash + 1, CH_CUDA_PLUGIN_FILE);
    if (access(path, F_OK) != 0) return NULL;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    /* A plugin that is there but does not load (a missing CUDA library) is the reason to give. */
    if (!h) snprintf(why, sizeof why, "%s", dlerror());
    return h;
}

static void *open_plugin(void)
{
    const char *env = getenv("COHORT_CUDA_PLUGIN");
    if (env && *env) {
        void *h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (!h) snprintf(why, sizeof why, "%s", dlerror());
        return h;
    }
    void *h = open_beside_program();
    if (h || why[0]) return h;
    h = dlopen(CH_CUDA_PLUGIN_FILE, RTLD_NOW | RTLD_LOCAL);
    if (!h) snprintf(why, sizeof why, "%s", dlerror());
    return h;
}

static void load(void)
{
    void *h = open_plugin();
    if (!h) return;
    ch_cuda_plugin_entry_fn entry = NULL;
    *(void **)&entry = dlsym(h, CH_CUDA_PLUGIN_SYMBOL);
    const ch_cuda_plugin *p = entry ? entry() : NULL;
    if (!p || p->abi != CH_CUDA_PLUGIN_ABI || p->backend_size != sizeof(ch_backend) ||
        p->kernels_size != sizeof(ch_kernels) || p->ops_size != sizeof(ch_backend_ops) ||
        p->comm_size != sizeof(ch_comm) || p->comm_ops_size != sizeof(ch_comm_ops)) {
        snprintf(why, sizeof why, "%s is from another build of cohort (its interface differs); rebuild both",
                 CH_CUDA_PLUGIN_FILE);
        dlclose(h);
        return;
    }
    loaded = p;   /* kept open for the life of the process */
}

const ch_cuda_plugin *ch_cuda_plugin_load(ch_err *err)
{
    pthread_once(&once, load);
    if (!loaded)
        ch_fail(err, CH_STATUS_BAD_INPUT, "cuda: cannot load the CUDA plugin: %s", why[0] ? why : "not found");
    return loaded;
}
