/* A stand-in for libnvidia-ml.so.1: one GPU with fixed readings, so tests and
 * the dashboard's GPU row run where no NVIDIA driver is. The readings are the
 * ones nvml_collector_test expects. TANDEM_FAKE_NVML_FAIL_INIT=1 makes
 * nvmlInit_v2 fail as it does without a driver. */
#include <stdlib.h>
#include <string.h>

typedef struct {
  unsigned int gpu, memory;
} Utilization;
typedef struct {
  unsigned long long total, free, used;
} Memory;

static int the_device;

int nvmlInit_v2(void) {
  return getenv("TANDEM_FAKE_NVML_FAIL_INIT") ? 9 /* DRIVER_NOT_LOADED */ : 0;
}
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = 1;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (index != 0) return 2; /* INVALID_ARGUMENT */
  *device = &the_device;
  return 0;
}
static int copy(char* out, unsigned int length, const char* text) {
  if (strlen(text) + 1 > length) return 7; /* INSUFFICIENT_SIZE */
  strcpy(out, text);
  return 0;
}
int nvmlDeviceGetName(void* device, char* name, unsigned int length) {
  return copy(name, length, "Fake GPU (tandem tests)");
}
int nvmlDeviceGetUUID(void* device, char* uuid, unsigned int length) {
  return copy(uuid, length, "GPU-00000000-0000-0000-0000-000000000000");
}
int nvmlDeviceGetUtilizationRates(void* device, Utilization* u) {
  u->gpu = 37;
  u->memory = 12;
  return 0;
}
int nvmlDeviceGetMemoryInfo(void* device, Memory* m) {
  m->total = 80ull << 30;
  m->used = 10ull << 30;
  m->free = m->total - m->used;
  return 0;
}
int nvmlDeviceGetTemperature(void* device, int sensor, unsigned int* celsius) {
  *celsius = 45;
  return 0;
}
int nvmlDeviceGetPowerUsage(void* device, unsigned int* milliwatts) {
  *milliwatts = 312500;
  return 0;
}
