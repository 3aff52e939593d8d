/*
 * A scriptable stand-in for libnvidia-ml.so.1, used by the tests and the NVML benchmark.
 *
 * It is compiled against the real nvml.h (pip package nvidia-nvml-dev), so every function
 * below is checked against NVML's own prototype. It implements exactly the NVML functions
 * the sidecar's NVML source calls, returns values read from a control file and injects the
 * faults the tests need: a lost GPU, an unsupported value, a failing or sleeping call, and a
 * profiler holding the GPM counters. It can also charge each call kind a CPU cost (a busy spin
 * of N µs of thread CPU time, `cost_us.<function>`), so a real driver's per-call costs (an H200
 * in a VM: milliseconds for the field values) can be reproduced on a CPU.
 *
 * Control file: its path is read from $FAKE_NVML_CONTROL at every nvmlInit*(). Without that
 * variable nvmlInit*() returns NVML_ERROR_LIBRARY_NOT_FOUND, so a process that loaded this
 * library in an earlier test behaves like a host without NVML afterwards. The file is re-read
 * whenever its inode, size or mtime changes (checked at most every 2 ms), so a test can change
 * readings and faults while the code under test runs. Format: one `key = value` per line,
 * `#` starts a comment. See tests/fake_nvml/control.py for the full list of keys.
 *
 * Built with -DFAKE_NVML_OLD_DRIVER it simulates an old driver: the newer functions are not
 * exported at all (pynvml raises NVMLError_FunctionNotFound) and field ids from
 * NVML_FI_DEV_POWER_AVERAGE up are rejected per field with NVML_ERROR_INVALID_ARGUMENT.
 */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define MAX_GPUS 64
#define MAX_PROCS 32
#define MAX_XIDS 256
#define MAX_RULES 64
#define MAX_SETS 16
#define FN_LEN 96
#define RECHECK_NS 2000000LL
#define SAMPLE_MAGIC 0x67706d73u

/* Scripted scalar values. The key names are the control-file names. */
enum slot {
    S_UTIL_GPU, S_UTIL_MEM, S_MEM_TOTAL, S_MEM_USED, S_MEM_RESERVED, S_TEMP_GPU, S_TEMP_MEM,
    S_CLOCK_SM, S_CLOCK_MEM, S_CLOCK_REASONS, S_POWER_MW, S_POWER_LIMIT_MW, S_ENERGY_MJ,
    S_PCIE_TX_BPS, S_PCIE_RX_BPS, S_ECC_SBE, S_ECC_DBE,
    S_GPM_SM_UTIL, S_GPM_SM_OCC, S_GPM_TENSOR, S_GPM_DRAM_BW, S_GPM_PCIE_TX, S_GPM_PCIE_RX,
    S_GPM_NVLINK_TX, S_GPM_NVLINK_RX, S_GPM_GRAPHICS,
    S_VIOL_POWER, S_VIOL_THERMAL, S_VIOL_SYNC_BOOST, S_VIOL_BOARD_LIMIT, S_VIOL_LOW_UTIL, S_VIOL_RELIABILITY,
    S_COUNT
};

static const char *const SLOT_NAMES[S_COUNT] = {
    "utilization_gpu", "utilization_memory", "memory_total", "memory_used", "memory_reserved",
    "temperature_gpu", "temperature_memory", "clock_sm_mhz", "clock_mem_mhz", "clock_reasons",
    "power_mw", "power_limit_mw", "energy_mj", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s",
    "ecc_sbe_volatile", "ecc_dbe_volatile",
    "gpm_sm_util", "gpm_sm_occupancy", "gpm_any_tensor_util", "gpm_dram_bw_util",
    "gpm_pcie_tx_mib_per_s", "gpm_pcie_rx_mib_per_s", "gpm_nvlink_tx_mib_per_s",
    "gpm_nvlink_rx_mib_per_s", "gpm_graphics_util",
    "violation_power", "violation_thermal", "violation_sync_boost", "violation_board_limit",
    "violation_low_utilization", "violation_reliability",
};

static const double SLOT_DEFAULTS[S_COUNT] = {
    50, 30, 85899345920.0, 10737418240.0, 536870912.0, 45, 50,
    1980, 2619, 0, 300000, 700000, 1e9, 1e9, 2e9, 0, 0,
    60, 25, 40, 35, 1000, 2000, 5000, 6000, 70,
    0, 0, 0, 0, 0, 0,
};

typedef struct {
    double value;
    nvmlReturn_t rc; /* NVML_SUCCESS, or the error every read of this value returns */
} slot_t;

typedef struct {
    char fn[FN_LEN];
    int gpu; /* -1: every call of fn */
    long value; /* milliseconds to sleep, or the nvmlReturn_t to fail with */
} rule_t;

typedef struct {
    slot_t slot[S_COUNT];
    int lost, gpm_supported, gpm_busy, events_supported;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char pci_bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    unsigned nprocs;
    unsigned proc_pid[MAX_PROCS];
    unsigned long long proc_mem[MAX_PROCS];
    unsigned nxids;
    unsigned long long xids[MAX_XIDS];
} gpu_t;

typedef struct {
    unsigned ngpus;
    char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    char nvml_version[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE];
    rule_t sleeps[MAX_RULES];
    unsigned nsleeps;
    rule_t fails[MAX_RULES];
    unsigned nfails;
    rule_t costs[MAX_RULES];
    unsigned ncosts;
    gpu_t gpu[MAX_GPUS];
} config_t;

struct nvmlDevice_st { unsigned index; };

struct nvmlEventSet_st {
    int used;
    unsigned long long mask[MAX_GPUS];
    unsigned cursor[MAX_GPUS]; /* xids of that GPU delivered through this set */
};

struct nvmlGpmSample_st {
    unsigned magic;
    int gpu; /* -1 until filled */
    double taken_s;
    slot_t slot[S_COUNT];
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static config_t g_cfg;
static int g_have_cfg;
static int g_refcount;
static unsigned long long g_calls;
static char g_path[4096];
static struct stat g_stamp;
static int g_stamp_valid;
static long long g_next_check_ns;
static double g_t0 = -1;
static struct nvmlDevice_st g_devs[MAX_GPUS];
static struct nvmlEventSet_st g_sets[MAX_SETS];
static struct { const char *fn; unsigned long long calls; } g_per_fn[MAX_RULES];

/* ---------------------------------------------------------------- time, parsing helpers */

static long long mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static double elapsed_s(void)
{
    return (double)mono_ns() / 1e9 - g_t0;
}

static long long wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

/* Burns `us` microseconds of this thread's CPU time: a real driver's cost per call in a VM is CPU
 * (an ioctl round trip), so the spin counts thread CPU time, which a loaded machine cannot shrink. */
static void spin_cpu_us(long us)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    long long end = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec + (long long)us * 1000LL;
    do {
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    } while ((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec < end);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    char *end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r' || end[-1] == '\n')) end--;
    *end = '\0';
    return s;
}

static void copy_str(char *dst, size_t size, const char *src)
{
    snprintf(dst, size, "%s", src);
}

static void warn_key(const char *key)
{
    fprintf(stderr, "fake_nvml: unknown control key '%s' in %s (ignored)\n", key, g_path);
}

/* ---------------------------------------------------------------- control file */

static void config_defaults(config_t *c)
{
    memset(c, 0, sizeof(*c));
    c->ngpus = 8;
    copy_str(c->driver_version, sizeof(c->driver_version), "570.00.fake");
    copy_str(c->nvml_version, sizeof(c->nvml_version), "12.570.00.fake");
    for (unsigned i = 0; i < MAX_GPUS; i++) {
        gpu_t *g = &c->gpu[i];
        for (int s = 0; s < S_COUNT; s++) {
            g->slot[s].value = SLOT_DEFAULTS[s];
            g->slot[s].rc = NVML_SUCCESS;
        }
        g->gpm_supported = 1;
        g->events_supported = 1;
        snprintf(g->name, sizeof(g->name), "NVIDIA H100 80GB HBM3 (fake)");
        snprintf(g->uuid, sizeof(g->uuid), "GPU-fa4e0000-0000-4000-8000-%012u", i);
        snprintf(g->pci_bus_id, sizeof(g->pci_bus_id), "00000000:%02X:00.0", 0x18 + i);
    }
}

static void add_rule(rule_t *rules, unsigned *n, const char *fn, int gpu, long value)
{
    if (*n >= MAX_RULES) return;
    copy_str(rules[*n].fn, FN_LEN, fn);
    rules[*n].gpu = gpu;
    rules[*n].value = value;
    (*n)++;
}

static void parse_slot(slot_t *slot, const char *value)
{
    if (strcmp(value, "unsupported") == 0) {
        slot->rc = NVML_ERROR_NOT_SUPPORTED;
    } else if (strncmp(value, "error:", 6) == 0) {
        slot->rc = (nvmlReturn_t)strtol(value + 6, NULL, 10);
    } else {
        slot->rc = NVML_SUCCESS;
        slot->value = strtod(value, NULL);
    }
}

static void parse_procs(gpu_t *g, char *value)
{
    g->nprocs = 0;
    for (char *save = NULL, *tok = strtok_r(value, ",", &save); tok && g->nprocs < MAX_PROCS;
         tok = strtok_r(NULL, ",", &save)) {
        unsigned pid;
        unsigned long long mem;
        if (sscanf(tok, " %u : %llu", &pid, &mem) == 2) {
            g->proc_pid[g->nprocs] = pid;
            g->proc_mem[g->nprocs] = mem;
            g->nprocs++;
        }
    }
}

static void parse_xids(gpu_t *g, char *value)
{
    g->nxids = 0;
    for (char *save = NULL, *tok = strtok_r(value, ",", &save); tok && g->nxids < MAX_XIDS;
         tok = strtok_r(NULL, ",", &save))
        g->xids[g->nxids++] = strtoull(tok, NULL, 10);
}

/* Applies one `gpu.<i>.<rest> = value` setting to one GPU. */
static void apply_gpu_key(config_t *c, int index, const char *rest, char *value)
{
    gpu_t *g = &c->gpu[index];
    if (strcmp(rest, "lost") == 0) g->lost = atoi(value);
    else if (strcmp(rest, "gpm_supported") == 0) g->gpm_supported = atoi(value);
    else if (strcmp(rest, "gpm_busy") == 0) g->gpm_busy = atoi(value);
    else if (strcmp(rest, "events_supported") == 0) g->events_supported = atoi(value);
    else if (strcmp(rest, "name") == 0) copy_str(g->name, sizeof(g->name), value);
    else if (strcmp(rest, "uuid") == 0) copy_str(g->uuid, sizeof(g->uuid), value);
    else if (strcmp(rest, "pci_bus_id") == 0) copy_str(g->pci_bus_id, sizeof(g->pci_bus_id), value);
    else if (strcmp(rest, "processes") == 0) parse_procs(g, value);
    else if (strcmp(rest, "xids") == 0) parse_xids(g, value);
    else if (strncmp(rest, "sleep_ms.", 9) == 0) add_rule(c->sleeps, &c->nsleeps, rest + 9, index, atol(value));
    else if (strncmp(rest, "fail.", 5) == 0) add_rule(c->fails, &c->nfails, rest + 5, index, atol(value));
    else if (strncmp(rest, "cost_us.", 8) == 0) add_rule(c->costs, &c->ncosts, rest + 8, index, atol(value));
    else {
        for (int s = 0; s < S_COUNT; s++) {
            if (strcmp(rest, SLOT_NAMES[s]) == 0) {
                parse_slot(&g->slot[s], value);
                return;
            }
        }
        warn_key(rest);
    }
}

/* Applies one line. Pass 0 takes global keys and gpu.*, pass 1 takes gpu.<i> so that
 * per-GPU settings override gpu.* wherever they are in the file. */
static void apply_line(config_t *c, char *key, char *value, int pass)
{
    if (strncmp(key, "gpu.", 4) == 0) {
        char *rest = strchr(key + 4, '.');
        if (!rest) {
            warn_key(key);
            return;
        }
        *rest++ = '\0';
        if (strcmp(key + 4, "*") == 0) {
            if (pass != 0) return;
            /* sleep_ms/fail rules for gpu.* are one rule for every GPU, not one per GPU. */
            if (strncmp(rest, "sleep_ms.", 9) == 0) add_rule(c->sleeps, &c->nsleeps, rest + 9, -1, atol(value));
            else if (strncmp(rest, "fail.", 5) == 0) add_rule(c->fails, &c->nfails, rest + 5, -1, atol(value));
            else if (strncmp(rest, "cost_us.", 8) == 0) add_rule(c->costs, &c->ncosts, rest + 8, -1, atol(value));
            else for (int i = 0; i < MAX_GPUS; i++) {
                char copy[4096];
                copy_str(copy, sizeof(copy), value);
                apply_gpu_key(c, i, rest, copy);
            }
            return;
        }
        int index = atoi(key + 4);
        if (pass == 1 && index >= 0 && index < MAX_GPUS) apply_gpu_key(c, index, rest, value);
        return;
    }
    if (pass != 0) return;
    if (strcmp(key, "devices") == 0) {
        int n = atoi(value);
        c->ngpus = n < 0 ? 0 : (n > MAX_GPUS ? MAX_GPUS : (unsigned)n);
    } else if (strcmp(key, "driver_version") == 0) {
        copy_str(c->driver_version, sizeof(c->driver_version), value);
    } else if (strcmp(key, "nvml_version") == 0) {
        copy_str(c->nvml_version, sizeof(c->nvml_version), value);
    } else if (strncmp(key, "sleep_ms.", 9) == 0) {
        add_rule(c->sleeps, &c->nsleeps, key + 9, -1, atol(value));
    } else if (strncmp(key, "fail.", 5) == 0) {
        add_rule(c->fails, &c->nfails, key + 5, -1, atol(value));
    } else if (strncmp(key, "cost_us.", 8) == 0) {
        add_rule(c->costs, &c->ncosts, key + 8, -1, atol(value));
    } else {
        warn_key(key);
    }
}

static void parse_file(config_t *c, const char *path)
{
    config_defaults(c);
    FILE *f = fopen(path, "r");
    if (!f) return; /* a missing file means all defaults */
    char line[8192];
    for (int pass = 0; pass < 2; pass++) {
        rewind(f);
        while (fgets(line, sizeof(line), f)) {
            char *hash = strchr(line, '#');
            if (hash) *hash = '\0';
            char *eq = strchr(line, '=');
            if (!eq) continue;
            *eq = '\0';
            char *key = trim(line), *value = trim(eq + 1);
            if (*key) apply_line(c, key, value, pass);
        }
    }
    fclose(f);
}

/* Re-reads the control file if it changed. Caller holds g_lock. */
static void maybe_reload(int force)
{
    long long now = mono_ns();
    if (!force && g_have_cfg && now < g_next_check_ns) return;
    g_next_check_ns = now + RECHECK_NS;
    struct stat st;
    int exists = g_path[0] && stat(g_path, &st) == 0;
    if (g_have_cfg && !force && g_stamp_valid == exists &&
        (!exists || (st.st_ino == g_stamp.st_ino && st.st_size == g_stamp.st_size &&
                     st.st_mtim.tv_sec == g_stamp.st_mtim.tv_sec &&
                     st.st_mtim.tv_nsec == g_stamp.st_mtim.tv_nsec)))
        return;
    static config_t fresh; /* large: keep it off the stack; guarded by g_lock */
    parse_file(&fresh, g_path);
    g_cfg = fresh;
    g_have_cfg = 1;
    g_stamp_valid = exists;
    if (exists) g_stamp = st;
}

/* ---------------------------------------------------------------- call entry */

/* Counts one call of fn (a string literal). Caller holds g_lock. */
static void count_call(const char *fn)
{
    g_calls++;
    for (int i = 0; i < MAX_RULES; i++) {
        if (g_per_fn[i].fn == NULL) g_per_fn[i].fn = fn;
        if (strcmp(g_per_fn[i].fn, fn) == 0) {
            g_per_fn[i].calls++;
            return;
        }
    }
}

static long rule_for(const rule_t *rules, unsigned n, const char *fn, int gpu)
{
    for (unsigned i = 0; i < n; i++)
        if ((rules[i].gpu == -1 || rules[i].gpu == gpu) && strcmp(rules[i].fn, fn) == 0)
            return rules[i].value;
    return 0;
}

static int dev_index(nvmlDevice_t device)
{
    if (device < g_devs || device >= g_devs + MAX_GPUS) return -1;
    int index = (int)(device - g_devs);
    return (unsigned)index < g_cfg.ngpus ? index : -1;
}

/* Common prologue of every NVML function: counts the call, reloads the control file,
 * applies the scripted sleep (outside the lock, so other threads are not held up) and the
 * scripted failure, and checks initialization, the device handle and a lost GPU.
 * On success it returns NVML_SUCCESS and *index is the GPU index (or -1 for no device). */
static nvmlReturn_t enter(const char *fn, nvmlDevice_t device, int has_device, int *index)
{
    pthread_mutex_lock(&g_lock);
    count_call(fn);
    maybe_reload(0);
    int gpu = has_device ? dev_index(device) : -1;
    long ms = rule_for(g_cfg.sleeps, g_cfg.nsleeps, fn, gpu);
    long cost_us = rule_for(g_cfg.costs, g_cfg.ncosts, fn, gpu);
    nvmlReturn_t rc = (nvmlReturn_t)rule_for(g_cfg.fails, g_cfg.nfails, fn, gpu);
    if (rc == NVML_SUCCESS && g_refcount == 0) rc = NVML_ERROR_UNINITIALIZED;
    if (rc == NVML_SUCCESS && has_device && gpu < 0) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && gpu >= 0 && g_cfg.gpu[gpu].lost) rc = NVML_ERROR_GPU_IS_LOST;
    pthread_mutex_unlock(&g_lock);
    if (cost_us > 0) spin_cpu_us(cost_us);
    if (ms > 0) sleep_ms(ms);
    if (index) *index = gpu;
    return rc;
}

#define ENTER_DEVICE(fn, device, index)                                   \
    int index;                                                            \
    do {                                                                  \
        nvmlReturn_t entry_rc_ = enter(fn, device, 1, &index);            \
        if (entry_rc_ != NVML_SUCCESS) return entry_rc_;                  \
    } while (0)

/* Reads one slot of one GPU under the lock. */
static slot_t slot_of(int gpu, enum slot s)
{
    pthread_mutex_lock(&g_lock);
    slot_t v = g_cfg.gpu[gpu].slot[s];
    pthread_mutex_unlock(&g_lock);
    return v;
}

/* Energy drawn so far (mJ) and when it was last brought up to date (CLOCK_MONOTONIC seconds). */
static double g_energy_mj[MAX_GPUS];
static double g_energy_at[MAX_GPUS]; /* 0 before the first read: integrate from boot */

/* Cumulative counters grow with real time: PCIe from the rates since load; energy like a real
 * driver's counter, which counts since the driver loaded, not since this process did: as if the
 * GPU had drawn power_mw since boot, integrated from the first read on (a change of power_mw
 * changes the slope from then), so a restarted daemon reads on where the last one left off. */
static unsigned long long counter_of(int gpu, enum slot s, nvmlReturn_t *rc)
{
    pthread_mutex_lock(&g_lock);
    const slot_t *slots = g_cfg.gpu[gpu].slot;
    double t = elapsed_s(), v = 0;
    *rc = slots[s].rc;
    if (s == S_ENERGY_MJ) {
        if (*rc == NVML_SUCCESS) *rc = slots[S_POWER_MW].rc;
        double now = (double)mono_ns() / 1e9;
        g_energy_mj[gpu] += slots[S_POWER_MW].value * (now - g_energy_at[gpu]);
        g_energy_at[gpu] = now;
        v = slots[S_ENERGY_MJ].value + g_energy_mj[gpu];
    } else {
        v = slots[s].value * t;
    }
    pthread_mutex_unlock(&g_lock);
    return (unsigned long long)v;
}

/* Violation counters grow with real time: the slot is the share of time the policy holds the
 * clocks down (0-1), so the counter is share * seconds since load, in ns (set it before load:
 * changing it later moves the counter at once, as counter_of's counters do). Policy 0-5 are
 * nvmlPerfPolicyType_t POWER .. RELIABILITY, the order of fields NVML_FI_DEV_PERF_POLICY_*. */
static unsigned long long violation_ns(int gpu, int policy, nvmlReturn_t *rc)
{
    pthread_mutex_lock(&g_lock);
    slot_t share = g_cfg.gpu[gpu].slot[S_VIOL_POWER + policy];
    double t = elapsed_s();
    pthread_mutex_unlock(&g_lock);
    *rc = share.rc;
    return share.rc == NVML_SUCCESS ? (unsigned long long)(share.value * t * 1e9) : 0;
}

/* ---------------------------------------------------------------- init, system */

static nvmlReturn_t do_init(const char *fn)
{
    const char *path = getenv("FAKE_NVML_CONTROL");
    pthread_mutex_lock(&g_lock);
    count_call(fn);
    if (g_t0 < 0) g_t0 = (double)mono_ns() / 1e9;
    if (!path || !*path) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    }
    if (strcmp(path, g_path) != 0) {
        copy_str(g_path, sizeof(g_path), path);
        memset(g_sets, 0, sizeof(g_sets));
    }
    maybe_reload(1);
    for (unsigned i = 0; i < MAX_GPUS; i++) g_devs[i].index = i;
    long ms = rule_for(g_cfg.sleeps, g_cfg.nsleeps, fn, -1);
    nvmlReturn_t rc = (nvmlReturn_t)rule_for(g_cfg.fails, g_cfg.nfails, fn, -1);
    if (rc == NVML_SUCCESS) g_refcount++;
    pthread_mutex_unlock(&g_lock);
    if (ms > 0) sleep_ms(ms);
    return rc;
}

nvmlReturn_t nvmlInit(void) { return do_init("nvmlInit"); }
nvmlReturn_t nvmlInit_v2(void) { return do_init("nvmlInit_v2"); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return do_init("nvmlInitWithFlags"); }

nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t rc = enter("nvmlShutdown", NULL, 0, NULL);
    if (rc != NVML_SUCCESS) return rc;
    pthread_mutex_lock(&g_lock);
    if (g_refcount > 0) g_refcount--;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_out(char *dst, unsigned int length, const char *src)
{
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    nvmlReturn_t rc = enter("nvmlSystemGetDriverVersion", NULL, 0, NULL);
    if (rc != NVML_SUCCESS) return rc;
    pthread_mutex_lock(&g_lock);
    rc = copy_out(version, length, g_cfg.driver_version);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    nvmlReturn_t rc = enter("nvmlSystemGetNVMLVersion", NULL, 0, NULL);
    if (rc != NVML_SUCCESS) return rc;
    pthread_mutex_lock(&g_lock);
    rc = copy_out(version, length, g_cfg.nvml_version);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* ---------------------------------------------------------------- devices */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    nvmlReturn_t rc = enter("nvmlDeviceGetCount_v2", NULL, 0, NULL);
    if (rc != NVML_SUCCESS) return rc;
    if (!deviceCount) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    *deviceCount = g_cfg.ngpus;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (index >= MAX_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
    ENTER_DEVICE("nvmlDeviceGetHandleByIndex_v2", &g_devs[index], gpu);
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_devs[gpu];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    ENTER_DEVICE("nvmlDeviceGetIndex", device, gpu);
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)gpu;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    ENTER_DEVICE("nvmlDeviceGetName", device, gpu);
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t rc = copy_out(name, length, g_cfg.gpu[gpu].name);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    ENTER_DEVICE("nvmlDeviceGetUUID", device, gpu);
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t rc = copy_out(uuid, length, g_cfg.gpu[gpu].uuid);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    ENTER_DEVICE("nvmlDeviceGetPciInfo_v3", device, gpu);
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof(*pci));
    pthread_mutex_lock(&g_lock);
    copy_str(pci->busId, sizeof(pci->busId), g_cfg.gpu[gpu].pci_bus_id);
    copy_str(pci->busIdLegacy, sizeof(pci->busIdLegacy), g_cfg.gpu[gpu].pci_bus_id + 4);
    pthread_mutex_unlock(&g_lock);
    unsigned domain = 0, bus = 0, dev = 0;
    sscanf(pci->busId, "%x:%x:%x", &domain, &bus, &dev);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = 0x233010DEu;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t device, nvmlPerfPolicyType_t perfPolicyType,
                                          nvmlViolationTime_t *violTime)
{
    ENTER_DEVICE("nvmlDeviceGetViolationStatus", device, gpu);
    if (!violTime) return NVML_ERROR_INVALID_ARGUMENT;
    if ((int)perfPolicyType < 0 || perfPolicyType > NVML_PERF_POLICY_RELIABILITY) return NVML_ERROR_NOT_SUPPORTED;
    nvmlReturn_t rc;
    unsigned long long ns = violation_ns(gpu, (int)perfPolicyType, &rc);
    if (rc != NVML_SUCCESS) return rc;
    violTime->referenceTime = (unsigned long long)wall_us();
    violTime->violationTime = ns;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    ENTER_DEVICE("nvmlDeviceGetUtilizationRates", device, gpu);
    slot_t g = slot_of(gpu, S_UTIL_GPU), m = slot_of(gpu, S_UTIL_MEM);
    if (g.rc != NVML_SUCCESS) return g.rc;
    if (m.rc != NVML_SUCCESS) return m.rc;
    utilization->gpu = (unsigned)g.value;
    utilization->memory = (unsigned)m.value;
    return NVML_SUCCESS;
}

/* Memory figures shared by both versions: used excludes the reserved part. */
static nvmlReturn_t memory_of(int gpu, unsigned long long *total, unsigned long long *used,
                              unsigned long long *reserved)
{
    slot_t t = slot_of(gpu, S_MEM_TOTAL), u = slot_of(gpu, S_MEM_USED), r = slot_of(gpu, S_MEM_RESERVED);
    if (t.rc != NVML_SUCCESS) return t.rc;
    if (u.rc != NVML_SUCCESS) return u.rc;
    *total = (unsigned long long)t.value;
    *used = (unsigned long long)u.value;
    *reserved = r.rc == NVML_SUCCESS ? (unsigned long long)r.value : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    ENTER_DEVICE("nvmlDeviceGetMemoryInfo", device, gpu);
    unsigned long long total, used, reserved;
    nvmlReturn_t rc = memory_of(gpu, &total, &used, &reserved);
    if (rc != NVML_SUCCESS) return rc;
    memory->total = total;
    memory->used = used + reserved; /* v1 counts the reserved memory as used */
    memory->free = total - used - reserved;
    return NVML_SUCCESS;
}

#ifndef FAKE_NVML_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    ENTER_DEVICE("nvmlDeviceGetMemoryInfo_v2", device, gpu);
    if (!memory || memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total, used, reserved;
    nvmlReturn_t rc = memory_of(gpu, &total, &used, &reserved);
    if (rc != NVML_SUCCESS) return rc;
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = total - used - reserved;
    return NVML_SUCCESS;
}
#endif

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp)
{
    ENTER_DEVICE("nvmlDeviceGetTemperature", device, gpu);
    if (sensorType != NVML_TEMPERATURE_GPU || !temp) return NVML_ERROR_INVALID_ARGUMENT;
    slot_t t = slot_of(gpu, S_TEMP_GPU);
    if (t.rc != NVML_SUCCESS) return t.rc;
    *temp = (unsigned)t.value;
    return NVML_SUCCESS;
}

#ifndef FAKE_NVML_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature)
{
    ENTER_DEVICE("nvmlDeviceGetTemperatureV", device, gpu);
    if (!temperature || temperature->version != nvmlTemperature_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    slot_t t = slot_of(gpu, S_TEMP_GPU);
    if (t.rc != NVML_SUCCESS) return t.rc;
    temperature->temperature = (int)t.value;
    return NVML_SUCCESS;
}
#endif

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    ENTER_DEVICE("nvmlDeviceGetClockInfo", device, gpu);
    if (!clock) return NVML_ERROR_INVALID_ARGUMENT;
    if (type != NVML_CLOCK_SM && type != NVML_CLOCK_MEM) return NVML_ERROR_NOT_SUPPORTED;
    slot_t c = slot_of(gpu, type == NVML_CLOCK_SM ? S_CLOCK_SM : S_CLOCK_MEM);
    if (c.rc != NVML_SUCCESS) return c.rc;
    *clock = (unsigned)c.value;
    return NVML_SUCCESS;
}

static nvmlReturn_t clock_reasons(int gpu, unsigned long long *reasons)
{
    if (!reasons) return NVML_ERROR_INVALID_ARGUMENT;
    slot_t r = slot_of(gpu, S_CLOCK_REASONS);
    if (r.rc != NVML_SUCCESS) return r.rc;
    *reasons = (unsigned long long)r.value;
    return NVML_SUCCESS;
}

#ifndef FAKE_NVML_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *clocksEventReasons)
{
    ENTER_DEVICE("nvmlDeviceGetCurrentClocksEventReasons", device, gpu);
    return clock_reasons(gpu, clocksEventReasons);
}
#endif

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *clocksThrottleReasons)
{
    ENTER_DEVICE("nvmlDeviceGetCurrentClocksThrottleReasons", device, gpu);
    return clock_reasons(gpu, clocksThrottleReasons);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    ENTER_DEVICE("nvmlDeviceGetPowerUsage", device, gpu);
    slot_t p = slot_of(gpu, S_POWER_MW);
    if (p.rc != NVML_SUCCESS) return p.rc;
    *power = (unsigned)p.value;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    ENTER_DEVICE("nvmlDeviceGetEnforcedPowerLimit", device, gpu);
    slot_t p = slot_of(gpu, S_POWER_LIMIT_MW);
    if (p.rc != NVML_SUCCESS) return p.rc;
    *limit = (unsigned)p.value;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy)
{
    ENTER_DEVICE("nvmlDeviceGetTotalEnergyConsumption", device, gpu);
    nvmlReturn_t rc;
    unsigned long long v = counter_of(gpu, S_ENERGY_MJ, &rc);
    if (rc != NVML_SUCCESS) return rc;
    *energy = v;
    return NVML_SUCCESS;
}

/* One field of nvmlDeviceGetFieldValues. */
static void field_value(int gpu, nvmlFieldValue_t *out)
{
    slot_t s = {0, NVML_SUCCESS};
    out->timestamp = wall_us();
    out->latencyUsec = 0;
#ifdef FAKE_NVML_OLD_DRIVER
    if (out->fieldId >= NVML_FI_DEV_POWER_AVERAGE) {
        out->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
        return;
    }
#endif
    switch (out->fieldId) {
    case NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
    case NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
    case NVML_FI_DEV_PCIE_COUNT_RX_BYTES: {
        enum slot which = out->fieldId == NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION ? S_ENERGY_MJ
                          : out->fieldId == NVML_FI_DEV_PCIE_COUNT_TX_BYTES   ? S_PCIE_TX_BPS
                                                                              : S_PCIE_RX_BPS;
        out->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        out->value.ullVal = counter_of(gpu, which, &out->nvmlReturn);
        return;
    }
    case NVML_FI_DEV_PERF_POLICY_POWER:
    case NVML_FI_DEV_PERF_POLICY_THERMAL:
    case NVML_FI_DEV_PERF_POLICY_SYNC_BOOST:
    case NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT:
    case NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION:
    case NVML_FI_DEV_PERF_POLICY_RELIABILITY: {
#ifdef FAKE_NVML_OLD_DRIVER
        /* not a real driver's limit: lets the tests exercise nvmlDeviceGetViolationStatus */
        out->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
        return;
#else
        out->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        out->value.ullVal = violation_ns(gpu, (int)(out->fieldId - NVML_FI_DEV_PERF_POLICY_POWER), &out->nvmlReturn);
        return;
#endif
    }
    case NVML_FI_DEV_MEMORY_TEMP: s = slot_of(gpu, S_TEMP_MEM); break;
    case NVML_FI_DEV_POWER_INSTANT: s = slot_of(gpu, S_POWER_MW); break;
    case NVML_FI_DEV_POWER_CURRENT_LIMIT: s = slot_of(gpu, S_POWER_LIMIT_MW); break;
    case NVML_FI_DEV_ECC_SBE_VOL_TOTAL:
    case NVML_FI_DEV_ECC_DBE_VOL_TOTAL:
        s = slot_of(gpu, out->fieldId == NVML_FI_DEV_ECC_SBE_VOL_TOTAL ? S_ECC_SBE : S_ECC_DBE);
        out->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        out->nvmlReturn = s.rc;
        out->value.ullVal = (unsigned long long)s.value;
        return;
    default:
        out->nvmlReturn = out->fieldId < NVML_FI_MAX ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
        return;
    }
    out->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
    out->nvmlReturn = s.rc;
    out->value.uiVal = (unsigned)s.value;
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values)
{
    ENTER_DEVICE("nvmlDeviceGetFieldValues", device, gpu);
    if (valuesCount < 0 || (valuesCount > 0 && !values)) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < valuesCount; i++) field_value(gpu, &values[i]);
    return NVML_SUCCESS;
}

static nvmlReturn_t running_processes(int gpu, unsigned int *infoCount, nvmlProcessInfo_t *infos)
{
    if (!infoCount) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    const gpu_t *g = &g_cfg.gpu[gpu];
    unsigned n = g->nprocs, capacity = *infoCount;
    *infoCount = n;
    if (n > capacity || (n > 0 && !infos)) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        infos[i].pid = g->proc_pid[i];
        infos[i].usedGpuMemory = g->proc_mem[i];
        infos[i].gpuInstanceId = 0xFFFFFFFFu;
        infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

#ifndef FAKE_NVML_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos)
{
    ENTER_DEVICE("nvmlDeviceGetComputeRunningProcesses_v3", device, gpu);
    return running_processes(gpu, infoCount, infos);
}
#endif

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos)
{
    ENTER_DEVICE("nvmlDeviceGetComputeRunningProcesses_v2", device, gpu);
    return running_processes(gpu, infoCount, infos);
}

/* ---------------------------------------------------------------- events */

#define FAKE_EVENT_TYPES (nvmlEventTypeXidCriticalError | nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError)

static struct nvmlEventSet_st *event_set(nvmlEventSet_t set)
{
    if (set < g_sets || set >= g_sets + MAX_SETS || !set->used) return NULL;
    return set;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    nvmlReturn_t rc = enter("nvmlEventSetCreate", NULL, 0, NULL);
    if (rc != NVML_SUCCESS) return rc;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < MAX_SETS; i++) {
        if (!g_sets[i].used) {
            memset(&g_sets[i], 0, sizeof(g_sets[i]));
            g_sets[i].used = 1;
            *set = &g_sets[i];
            pthread_mutex_unlock(&g_lock);
            return NVML_SUCCESS;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return NVML_ERROR_MEMORY;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    nvmlReturn_t rc = enter("nvmlEventSetFree", NULL, 0, NULL);
    if (rc != NVML_SUCCESS) return rc;
    pthread_mutex_lock(&g_lock);
    struct nvmlEventSet_st *s = event_set(set);
    if (s) s->used = 0;
    pthread_mutex_unlock(&g_lock);
    return s ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    ENTER_DEVICE("nvmlDeviceGetSupportedEventTypes", device, gpu);
    if (!eventTypes) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    *eventTypes = g_cfg.gpu[gpu].events_supported ? FAKE_EVENT_TYPES : 0;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    ENTER_DEVICE("nvmlDeviceRegisterEvents", device, gpu);
    pthread_mutex_lock(&g_lock);
    struct nvmlEventSet_st *s = event_set(set);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (!s) rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (!g_cfg.gpu[gpu].events_supported || (eventTypes & ~FAKE_EVENT_TYPES)) rc = NVML_ERROR_NOT_SUPPORTED;
    else {
        s->mask[gpu] |= eventTypes;
        s->cursor[gpu] = g_cfg.gpu[gpu].nxids; /* like NVML: only events after registration */
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    nvmlReturn_t rc = enter("nvmlEventSetWait_v2", NULL, 0, NULL);
    if (rc != NVML_SUCCESS) return rc;
    if (!data) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    struct nvmlEventSet_st *s = event_set(set);
    if (!s) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (unsigned i = 0; i < g_cfg.ngpus; i++) {
        const gpu_t *g = &g_cfg.gpu[i];
        if (!(s->mask[i] & nvmlEventTypeXidCriticalError)) continue;
        if (s->cursor[i] > g->nxids) s->cursor[i] = g->nxids; /* the list was shortened */
        if (s->cursor[i] < g->nxids) {
            data->device = &g_devs[i];
            data->eventType = nvmlEventTypeXidCriticalError;
            data->eventData = g->xids[s->cursor[i]++];
            data->gpuInstanceId = 0xFFFFFFFFu;
            data->computeInstanceId = 0xFFFFFFFFu;
            pthread_mutex_unlock(&g_lock);
            return NVML_SUCCESS;
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (timeoutms > 0) sleep_ms(timeoutms);
    return NVML_ERROR_TIMEOUT;
}

/* ---------------------------------------------------------------- GPM */

#ifndef FAKE_NVML_OLD_DRIVER
static int gpm_slot(unsigned metric)
{
    switch (metric) {
    case NVML_GPM_METRIC_SM_UTIL: return S_GPM_SM_UTIL;
    case NVML_GPM_METRIC_SM_OCCUPANCY: return S_GPM_SM_OCC;
    case NVML_GPM_METRIC_ANY_TENSOR_UTIL: return S_GPM_TENSOR;
    case NVML_GPM_METRIC_DRAM_BW_UTIL: return S_GPM_DRAM_BW;
    case NVML_GPM_METRIC_PCIE_TX_PER_SEC: return S_GPM_PCIE_TX;
    case NVML_GPM_METRIC_PCIE_RX_PER_SEC: return S_GPM_PCIE_RX;
    case NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: return S_GPM_NVLINK_TX;
    case NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: return S_GPM_NVLINK_RX;
    case NVML_GPM_METRIC_GRAPHICS_UTIL: return S_GPM_GRAPHICS;
    default: return -1;
    }
}

nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport)
{
    ENTER_DEVICE("nvmlGpmQueryDeviceSupport", device, gpu);
    if (!gpmSupport || gpmSupport->version != NVML_GPM_SUPPORT_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    pthread_mutex_lock(&g_lock);
    gpmSupport->isSupportedDevice = (unsigned)g_cfg.gpu[gpu].gpm_supported;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample)
{
    nvmlReturn_t rc = enter("nvmlGpmSampleAlloc", NULL, 0, NULL);
    if (rc != NVML_SUCCESS) return rc;
    if (!gpmSample) return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlGpmSample_st *s = calloc(1, sizeof(*s));
    if (!s) return NVML_ERROR_MEMORY;
    s->magic = SAMPLE_MAGIC;
    s->gpu = -1;
    *gpmSample = s;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample)
{
    nvmlReturn_t rc = enter("nvmlGpmSampleFree", NULL, 0, NULL);
    if (rc != NVML_SUCCESS) return rc;
    if (!gpmSample || gpmSample->magic != SAMPLE_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    gpmSample->magic = 0;
    free(gpmSample);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample)
{
    ENTER_DEVICE("nvmlGpmSampleGet", device, gpu);
    if (!gpmSample || gpmSample->magic != SAMPLE_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    const gpu_t *g = &g_cfg.gpu[gpu];
    nvmlReturn_t rc = !g->gpm_supported ? NVML_ERROR_NOT_SUPPORTED : g->gpm_busy ? NVML_ERROR_IN_USE : NVML_SUCCESS;
    if (rc == NVML_SUCCESS) {
        gpmSample->gpu = gpu;
        gpmSample->taken_s = elapsed_s();
        memcpy(gpmSample->slot, g->slot, sizeof(gpmSample->slot));
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* Like NVML, the metrics come from two samples of the same GPU, the second one newer. */
nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet)
{
    nvmlReturn_t rc = enter("nvmlGpmMetricsGet", NULL, 0, NULL);
    if (rc != NVML_SUCCESS) return rc;
    if (!metricsGet || metricsGet->version != NVML_GPM_METRICS_GET_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    const struct nvmlGpmSample_st *a = metricsGet->sample1, *b = metricsGet->sample2;
    if (!a || !b || a->magic != SAMPLE_MAGIC || b->magic != SAMPLE_MAGIC || a->gpu < 0 || a->gpu != b->gpu ||
        !(b->taken_s > a->taken_s) || metricsGet->numMetrics > NVML_GPM_METRIC_MAX)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    int busy = g_cfg.gpu[b->gpu].gpm_busy;
    pthread_mutex_unlock(&g_lock);
    if (busy) return NVML_ERROR_IN_USE;
    for (unsigned i = 0; i < metricsGet->numMetrics; i++) {
        nvmlGpmMetric_t *m = &metricsGet->metrics[i];
        int s = gpm_slot(m->metricId);
        m->nvmlReturn = s < 0 ? NVML_ERROR_NOT_SUPPORTED : b->slot[s].rc;
        m->value = s < 0 ? 0 : b->slot[s].value;
        m->metricInfo.shortName = m->metricInfo.longName = m->metricInfo.unit = NULL;
    }
    return NVML_SUCCESS;
}
#endif

/* ---------------------------------------------------------------- test hooks (not NVML) */

/* Calls of one NVML function so far, or of all of them when fn is NULL or empty. */
unsigned long long fakeNvmlCallCount(const char *fn)
{
    unsigned long long n = 0;
    pthread_mutex_lock(&g_lock);
    if (!fn || !*fn) n = g_calls;
    for (int i = 0; fn && *fn && i < MAX_RULES && g_per_fn[i].fn; i++)
        if (strcmp(g_per_fn[i].fn, fn) == 0) n = g_per_fn[i].calls;
    pthread_mutex_unlock(&g_lock);
    return n;
}
